"""The pod command of a kubernetes job, for real: ``python -m runtime.kubernetes.job_host``
as N processes of this machine, each with exactly the environment the JobSet gives its pod
(``functions.kubernetes.objects.jobset``: the completion index resolved, as the kubelet
does), against fake-gcs-server (``job_pods``: the pods' DNS names are 127.0.0.1 here, the
rendezvous ports free ones).

A torch all-reduce over gloo with 1 and 4 hosts gives the right sum, every host's lines
are in its log chunks, host 0's result is stored; a JAX psum over 2 hosts
(``framework="jax"`` in the job's settings) joins from the same environment; one failing
host exits non-zero and leaves its traceback and exit record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import yaml
from job_pods import start_hosts

from functions.domain.catalog import Catalog
from functions.kubernetes.objects import jobset as js
from runtime.snapshot.storage import ObjectStore
from stasis.jobs import payload_bytes

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))

pytest.importorskip("torch")


def all_reduce(scale: int) -> int:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(t)
    print(f"rank {rank} of {dist.get_world_size()} sum {int(t.item())}", flush=True)
    if os.environ.get("FAIL_RANK") == str(rank):
        raise RuntimeError(f"rank {rank} gives up")
    return int(t.item())


@pytest.fixture
def gcs(emulator_env: dict[str, str]) -> Any:
    store = ObjectStore(emulator_host=emulator_env["STORAGE_EMULATOR_HOST"])
    bucket = emulator_env["STASIS_SNAPSHOT_BUCKET"]
    store.client.create_bucket(bucket)
    return store, bucket, emulator_env


def psum_jax(base: int) -> float:
    import jax
    import jax.numpy as jnp  # the host joined jax.distributed before this runs

    rank = jax.process_index()
    total = jax.pmap(lambda v: jax.lax.psum(v, "h"), axis_name="h")(
        jnp.array([float(base + rank)]))
    print(f"process {rank} of {jax.process_count()} psum {float(total[0])}", flush=True)
    return float(total[0])


def run_hosts(gcs: Any, job_id: str, hosts: int, extra: dict[str, str] | None = None,
              scale: int = 10, fn: Any = all_reduce,
              framework: str | None = None) -> tuple[list[subprocess.Popen[bytes]], str]:
    store, bucket, emulator_env = gcs
    prefix = js.job_prefix("ml-a", job_id)
    # as stasis.jobs ships it: this module is the notebook's "home" and travels by value
    store.put_bytes(bucket, f"{prefix}/{js.PAYLOAD}",
                    payload_bytes(fn, (scale,), {}, HERE), "application/octet-stream")
    if framework:
        store.put_bytes(bucket, f"{prefix}/{js.JOB_SETTINGS}",
                        json.dumps({"framework": framework}).encode(), "application/json")
    spec = js.JobSpec(job_id=job_id, team="ml-a", namespace="stasis-ml-a",
                      image="python:3.11", command=js.HOST_COMMAND,
                      profile=CATALOG.profiles["cpu-small"], hosts=hosts,
                      env={"STASIS_JOB_URI": f"gs://{bucket}/{prefix}", "STASIS_TEAM": "ml-a",
                           "STORAGE_EMULATOR_HOST": emulator_env["STORAGE_EMULATOR_HOST"],
                           "STASIS_JOB_LOG_INTERVAL": "0.5"})
    procs = start_hosts(js.jobset(spec), extra)
    return procs, prefix


def logs(gcs: Any, prefix: str, host: int) -> list[str]:
    store, bucket, _ = gcs
    names = sorted(n for n in store.list_objects(bucket, f"{prefix}/logs/host-{host}/"))
    return [line for n in names for line in store.get_bytes(bucket, n).decode().splitlines()]


@pytest.mark.parametrize("hosts", [1, 4])
def test_hosts_form_one_system_and_ship_their_logs(gcs: Any, hosts: int) -> None:
    procs, prefix = run_hosts(gcs, f"job-ar-{hosts}", hosts)
    codes = [p.wait(timeout=240) for p in procs]
    outputs = [p.stdout.read().decode() if p.stdout else "" for p in procs]
    assert codes == [0] * hosts, (outputs, [logs(gcs, prefix, h) for h in range(hosts)])
    store, bucket, _ = gcs
    expected = 10 * hosts * (hosts + 1) // 2
    assert cloudpickle.loads(store.get_bytes(bucket, f"{prefix}/{js.RESULT}")) == expected
    for host in range(hosts):
        assert f"rank {host} of {hosts} sum {expected}" in logs(gcs, prefix, host)
        record = json.loads(store.get_bytes(bucket, f"{prefix}/{js.exit_record(host)}"))
        assert record["exit_status"] == 0 and record["host"] == host
    assert not [n for n in store.list_objects(bucket, prefix) if "traceback" in n]


def test_jax_hosts_join_from_the_jobset_environment(gcs: Any) -> None:
    pytest.importorskip("jax")
    procs, prefix = run_hosts(gcs, "job-jax", 2, scale=10, fn=psum_jax, framework="jax")
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0, 0], [logs(gcs, prefix, h) for h in range(2)]
    store, bucket, _ = gcs
    assert cloudpickle.loads(store.get_bytes(bucket, f"{prefix}/{js.RESULT}")) == 21.0
    for host in range(2):
        assert f"process {host} of 2 psum 21.0" in logs(gcs, prefix, host)


def test_a_failing_host_exits_non_zero_with_its_traceback(gcs: Any) -> None:
    procs, prefix = run_hosts(gcs, "job-fail", 4, extra={"FAIL_RANK": "2"})
    codes = [p.wait(timeout=240) for p in procs]
    assert codes[2] != 0
    store, bucket, _ = gcs
    tb = store.get_bytes(bucket, f"{prefix}/{js.traceback_object(2)}").decode()
    assert tb.startswith("Traceback (most recent call last):")
    assert "RuntimeError: rank 2 gives up" in tb
    assert "rank 2 gives up" in "\n".join(logs(gcs, prefix, 2))
    record = json.loads(store.get_bytes(bucket, f"{prefix}/{js.exit_record(2)}"))
    assert record["exit_status"] == codes[2]
    # the others fail because host 2 left (the barrier after the function): the exit
    # records name host 2 as the first failure, and no result is stored
    records = [js.HostExit(**{k: v for k, v in json.loads(store.get_bytes(
        bucket, f"{prefix}/{js.exit_record(h)}")).items()}) for h in range(4)]
    assert [r.exit_status for r in records] == codes
    first = js.first_failure(records, [])
    assert first is not None and first.host == 2
    assert js.RESULT not in {n.rsplit("/", 1)[-1] for n in store.list_objects(bucket, prefix)}


def test_a_missing_payload_fails_the_host_with_the_reason(gcs: Any) -> None:
    store, bucket, emulator_env = gcs
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "RANK": "0",
           "WORLD_SIZE": "1", "STASIS_JOB_URI": f"gs://{bucket}/jobs/ml-a/job-none",
           "STORAGE_EMULATOR_HOST": emulator_env["STORAGE_EMULATOR_HOST"]}
    proc = subprocess.run([sys.executable, "-m", "runtime.kubernetes.job_host"], env=env,
                          cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode != 0
    tb = store.get_bytes(bucket, f"jobs/ml-a/job-none/{js.traceback_object(0)}").decode()
    assert "not found" in tb and "payload.pkl" in tb


def test_modules_from_home_travel_with_the_function(tmp_path: Path) -> None:
    """The hosts do not mount the workspace's disk: a module the notebook imported from its
    home directory is pickled by value; elsewhere it stays a reference."""
    import importlib

    home = tmp_path / "home"
    home.mkdir()
    (home / "h2_train_module.py").write_text("def train(x):\n    return x * 3\n")
    sys.path.insert(0, str(home))
    try:
        module = importlib.import_module("h2_train_module")
        shipped = payload_bytes(module.train, (4,), {}, home)
        referenced = payload_bytes(module.train, (4,), {}, tmp_path / "elsewhere")
    finally:
        sys.path.remove(str(home))
        sys.modules.pop("h2_train_module", None)
    load = ("import sys, cloudpickle; fn, a, k = cloudpickle.loads(sys.stdin.buffer.read()); "
            "print(fn(*a, **k))")
    ok = subprocess.run([sys.executable, "-c", load], input=shipped, capture_output=True,
                        cwd=tmp_path, timeout=60)
    assert ok.stdout.strip() == b"12", ok.stderr
    missing = subprocess.run([sys.executable, "-c", load], input=referenced,
                             capture_output=True, cwd=tmp_path, timeout=60)
    assert missing.returncode != 0 and b"h2_train_module" in missing.stderr
