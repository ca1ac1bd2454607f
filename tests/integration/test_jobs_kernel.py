"""Scale-out jobs from a real kernel (jupyter_client), on the local runtime: the same
function on 1 and on 4 hosts forms ONE torch.distributed group (gloo, loopback), or ONE
jax.distributed system (gloo CPU collectives, loopback coordinator), whose all-reduce /
psum is correct; every host's log lines arrive in the notebook, prefixed by host; the
workspace's home is importable on every host; a failing host fails the job with its log;
a cancelled job stops; a job whose kernel dies ends with it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

needs_torch = pytest.mark.skipif(find_spec("torch") is None,
                                 reason="torch is not installed (the jobs dependency group)")
needs_jax = pytest.mark.skipif(find_spec("jax") is None,
                               reason="jax is not installed (the jobs dependency group)")

ROOT = Path(__file__).resolve().parents[2]

TRAIN = '''
import stasis.jobs

def train(base):
    import os, torch, torch.distributed as dist
    import helpers                      # from the workspace's home, on every host
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} ready", flush=True)
    t = torch.tensor([float(helpers.contribution(rank, base))])
    dist.all_reduce(t)                  # sum over every host
    print(f"rank {rank} reduced {t.item()}", flush=True)
    return {"sum": t.item(), "world": world, "job": os.environ["STASIS_JOB_ID"]}

def train_jax(base):
    import jax, jax.numpy as jnp        # jax.distributed is joined before this runs
    import helpers
    rank, world = jax.process_index(), jax.process_count()
    print(f"process {rank} of {world} sees {jax.device_count()} devices", flush=True)
    x = jnp.array([float(helpers.contribution(rank, base))])   # one per local device
    total = jax.pmap(lambda v: jax.lax.psum(v, "hosts"), axis_name="hosts")(x)
    print(f"process {rank} psum {float(total[0])}", flush=True)
    return {"sum": float(total[0]), "world": world, "devices": jax.device_count()}
'''


class Kernel:
    def __init__(self, home: Path) -> None:
        # no control plane here (tests/e2e/test_jobs_e2e.py has one): jobs run unadmitted
        env = {k: v for k, v in os.environ.items()
               if k not in ("STASIS_PROJECT", "STASIS_WORKSPACE_ID", "STASIS_TEAM")}
        env["PYTHONPATH"] = str(ROOT)
        self.manager, self.client = start_new_kernel(kernel_name="python3", cwd=str(home),
                                                     env=env)

    def run(self, code: str, timeout: float = 120) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = self.client.execute_interactive(code, store_history=False, timeout=timeout,
                                                output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    home = tmp_path_factory.mktemp("home")
    (home / "helpers.py").write_text("def contribution(rank, base):\n"
                                     "    return base + rank\n")
    k = Kernel(home)
    k.run(TRAIN)
    yield k
    k.close()


@needs_torch
@pytest.mark.parametrize("hosts", [1, 4])
def test_all_reduce_on_one_and_on_four_hosts(kernel: Kernel, hosts: int) -> None:
    out = kernel.run(f'''
job = stasis.jobs.submit(train, 10, profile="cpu-small", hosts={hosts})
for line in job.logs():
    print(line)
print("RESULT", __import__("json").dumps(job.result(timeout=60)), job.status())
''')
    lines = out.splitlines()
    result = next(line for line in lines if line.startswith("RESULT "))
    value, status = result[len("RESULT "):].rsplit(" ", 1)
    assert status == "SUCCEEDED"
    got = json.loads(value)
    assert got["world"] == hosts and got["job"].startswith("job-")
    assert got["sum"] == sum(10 + r for r in range(hosts))
    for rank in range(hosts):
        assert f"[host {rank}] rank {rank} of {hosts} ready" in lines
        assert f"[host {rank}] rank {rank} reduced {got['sum']}" in lines


@needs_jax
@pytest.mark.parametrize("hosts", [1, 4])
def test_jax_psum_on_one_and_on_four_hosts(kernel: Kernel, hosts: int) -> None:
    out = kernel.run(f'''
job = stasis.jobs.submit(train_jax, 10, hosts={hosts}, framework="jax")
for line in job.logs():
    print(line)
print("RESULT", __import__("json").dumps(job.result(timeout=120)), job.status())
''', timeout=180)
    lines = out.splitlines()
    result = next(line for line in lines if line.startswith("RESULT "))
    value, status = result[len("RESULT "):].rsplit(" ", 1)
    assert status == "SUCCEEDED", out
    got = json.loads(value)
    assert got["world"] == got["devices"] == hosts  # one system: every host's devices
    assert got["sum"] == sum(10 + r for r in range(hosts))
    for rank in range(hosts):
        assert f"[host {rank}] process {rank} of {hosts} sees {hosts} devices" in lines
        assert f"[host {rank}] process {rank} psum {got['sum']}" in lines


@needs_jax
def test_a_function_may_join_jax_itself_and_torch_is_not_forced(kernel: Kernel) -> None:
    out = kernel.run('''
def own():
    import sys
    stasis.jobs.jax_initialize()
    stasis.jobs.jax_initialize()        # a second call is harmless
    import jax, jax.numpy as jnp
    total = jax.pmap(lambda v: jax.lax.psum(v, "h"), axis_name="h")(jnp.ones(1))
    return [float(total[0]), "torch" in sys.modules]

job = stasis.jobs.submit(own, hosts=2, framework="none")
print("OWN", job.result(timeout=120))
try:
    stasis.jobs.submit(own, framework="tensorflow")
except ValueError as exc:
    print("BAD", exc)
''', timeout=180)
    assert "OWN [2.0, False]" in out
    assert "BAD framework must be one of torch, jax, none, got 'tensorflow'" in out


@needs_torch
def test_a_failing_host_fails_the_job_with_its_log(kernel: Kernel) -> None:
    out = kernel.run('''
def flaky():
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    print(f"rank {rank} loading shard", flush=True)
    if rank == 2:
        raise ValueError("shard 2 is corrupt")
    t = torch.ones(1)
    dist.all_reduce(t)                  # the others wait here for host 2: they are stopped
    return t.item()

job = stasis.jobs.submit(flaky, hosts=4)
try:
    job.result(timeout=60)
except stasis.jobs.JobFailed as exc:
    print("FAILED", exc.failed_host, exc.exit_status, job.status())
    print(exc)
''')
    assert "FAILED 2 1 FAILED" in out
    assert "host 2 of 4 exited with status 1; its log:" in out
    assert "[host 2] rank 2 loading shard" in out
    assert "[host 2] ValueError: shard 2 is corrupt" in out
    assert "[host 0]" not in out.split("its log:")[1]  # only the failing host's log


def test_cancel_stops_every_host(kernel: Kernel) -> None:
    out = kernel.run('''
def forever():
    import time
    print("started", flush=True)
    time.sleep(600)

job = stasis.jobs.submit(forever, hosts=2)
next(iter(job.logs()))
print("STATE", job.cancel(), job.done())
''')
    assert "STATE CANCELLED True" in out


def test_a_job_ends_when_its_kernel_dies(tmp_path: Path) -> None:
    """A kernel restart or crash (and a pause, which stops the kernel) leaves no host
    behind: each host watches the kernel that started it."""
    k = Kernel(tmp_path)
    try:
        out = k.run('''
import stasis.jobs

def forever():
    import time
    print("started", flush=True)
    time.sleep(600)

job = stasis.jobs.submit(forever, hosts=2, framework="none")
next(iter(job.logs()))
print("PIDS", *job.pids)
''')
        pids = [int(p) for p in next(line for line in out.splitlines()
                                     if line.startswith("PIDS ")).split()[1:]]
        hosts = [psutil.Process(pid) for pid in pids]
        assert len(hosts) == 2 and all(h.is_running() for h in hosts)
    finally:
        k.close()  # the kernel is killed, as a crash would
    _, alive = psutil.wait_procs(hosts, timeout=60)
    assert alive == []
