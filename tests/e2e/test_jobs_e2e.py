"""Scale-out jobs from a workspace's notebook on the local stack, driven as a user would:
``stasis.jobs.submit`` in a kernel of a workspace (JupyterLab over REST + websocket) is
admitted by the control plane (job.submitted -> ``on_job_submitted`` -> ``jobs/{id}`` and
the team's usage in one transaction), runs 4 processes that form one torch.distributed
group (or 2 that form one jax.distributed system), streams their logs into the cell, and
reports its end (job.finished); a TPU job is refused with the reason before anything runs,
because this node has no TPU. Pausing the workspace ends a running job's processes, and
the reconciler then ends the job ``runtime_lost``."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from harness.notebook import Notebook

pytest.importorskip("torch")
pytest.importorskip("jax")

CELL = '''
import json, stasis.jobs

def train(base):
    import torch, torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} ready", flush=True)
    t = torch.tensor([float(base + rank)])
    dist.all_reduce(t)
    return t.item()

job = stasis.jobs.submit(train, 10, profile="cpu-small", hosts=1)
for line in job.logs():
    print(line)
print("ONE", job.id, job.result(timeout=120), job.status())

job = stasis.jobs.submit(train, 10, profile="cpu-small", hosts=4)
for line in job.logs():
    print(line)
print("FOUR", job.id, job.result(timeout=120), job.status())

def train_jax(base):
    import jax, jax.numpy as jnp
    rank = jax.process_index()
    x = jnp.array([float(base + rank)])
    total = jax.pmap(lambda v: jax.lax.psum(v, "hosts"), axis_name="hosts")(x)
    print(f"process {rank} of {jax.process_count()} psum {float(total[0])}", flush=True)
    return float(total[0])

job = stasis.jobs.submit(train_jax, 10, profile="cpu-small", hosts=2, framework="jax")
for line in job.logs():
    print(line)
print("JAX", job.id, job.result(timeout=120), job.status())

try:
    stasis.jobs.submit(train, 10, profile="tpu-v5e-8", hosts=1, job_id="job-no-tpu")
except stasis.jobs.JobRefused as exc:
    print("REFUSED", exc)
'''


def test_a_notebook_job_is_admitted_runs_on_four_hosts_and_a_tpu_job_is_refused_here(
        local_stack) -> None:
    stack = local_stack
    stack.cli("ws", "create", "trainer", "--team", "ml-a", "--wait")
    info = json.loads(stack.cli("ws", "status", "trainer", "--team", "ml-a",
                                "--json").stdout)
    nb = Notebook(info["direct_url"], info["token"])
    out = nb.run(nb.open("train.ipynb"), CELL, timeout=300).stdout
    lines = out.splitlines()
    one = next(line for line in lines if line.startswith("ONE ")).split()
    four = next(line for line in lines if line.startswith("FOUR ")).split()
    jax_ = next(line for line in lines if line.startswith("JAX ")).split()
    assert one[2:] == ["10.0", "SUCCEEDED"]
    assert four[2:] == [str(float(sum(10 + r for r in range(4)))), "SUCCEEDED"]
    assert jax_[2:] == ["21.0", "SUCCEEDED"]
    for rank in range(4):
        assert f"[host {rank}] rank {rank} of 4 ready" in lines
    for rank in range(2):
        assert f"[host {rank}] process {rank} of 2 psum 21.0" in lines
    refused = next(line for line in lines if line.startswith("REFUSED "))
    assert ("job job-no-tpu (1 x tpu-v5e-8) needs 8 x tpu-v5-lite-podslice on this node, "
            "which has no TPU") in refused

    db = stack.db
    jobs = {j: db.collection("jobs").document(j).get().to_dict()
            for j in (one[1], four[1], jax_[1], "job-no-tpu")}
    assert jobs[one[1]]["state"] == "SUCCEEDED" and jobs[one[1]]["tpus"] == 0
    assert jobs[one[1]]["workspace_id"] == "ml-a--trainer"
    assert jobs[four[1]]["state"] == "SUCCEEDED" and jobs[four[1]]["hosts"] == 4
    assert jobs[jax_[1]]["state"] == "SUCCEEDED" and jobs[jax_[1]]["hosts"] == 2
    assert jobs["job-no-tpu"]["state"] == "REFUSED"
    assert jobs["job-no-tpu"]["message"] == refused[len("REFUSED "):]
    # every host's log, kept in Cloud Storage
    uri = jobs[four[1]]["log_uri"]
    assert uri == f"gs://{stack.settings.snapshot_bucket}/jobs/ml-a/{four[1]}/log.txt"
    from google.cloud import storage

    text = storage.Client.create_anonymous_client().bucket(stack.settings.snapshot_bucket) \
        .blob(uri.split("/", 3)[3]).download_as_text()
    assert all(f"[host {r}] rank {r} of 4 ready" in text for r in range(4))
    listing = stack.cli("jobs", "list", "--team", "ml-a").stdout
    assert "job-no-tpu" in listing and "REFUSED" in listing
    shown = json.loads(stack.cli("jobs", "show", four[1]).stdout)
    assert shown["state"] == "SUCCEEDED" and shown["hosts"] == 4
    stack.wait_for(lambda: db.collection("teams").document("ml-a").get().to_dict()
                   ["usage"].get("tpus", 0) == 0, timeout=30)


def test_pausing_the_workspace_ends_its_running_job_and_the_reconciler_reports_it(
        local_stack) -> None:
    stack = local_stack
    stack.cli("ws", "create", "pauser", "--team", "ml-a", "--wait")
    info = json.loads(stack.cli("ws", "status", "pauser", "--team", "ml-a",
                                "--json").stdout)
    nb = Notebook(info["direct_url"], info["token"])
    out = nb.run(nb.open("long.ipynb"), '''
import stasis.jobs

def forever():
    import time
    print("training", flush=True)
    time.sleep(3600)

job = stasis.jobs.submit(forever, profile="cpu-small", hosts=2, framework="none")
next(iter(job.logs()))
print("JOB", job.id, *job.pids)
''', timeout=120).stdout
    job_id, *pids = next(line for line in out.splitlines() if line.startswith("JOB ")).split()[1:]
    hosts = [psutil.Process(int(pid)) for pid in pids]
    assert len(hosts) == 2 and all(h.is_running() for h in hosts)
    doc = stack.db.collection("jobs").document(job_id)
    assert doc.get().to_dict()["state"] == "RUNNING"

    stack.cli("ws", "pause", "pauser", "--team", "ml-a", "--wait")
    _, alive = psutil.wait_procs(hosts, timeout=60)
    assert alive == []  # the job did not outlive its workspace's server
    # nobody is left to report it but the reconciler, once the grace has passed
    assert doc.get().to_dict()["state"] == "RUNNING"

    def reconciled() -> bool:
        # a run may fail on a busy machine (the node agent slow to answer); the scheduled
        # reconciler would simply run again, and so does this
        stack.cli("reconcile", check=False)
        if doc.get().to_dict()["state"] == "FAILED":
            return True
        time.sleep(3)  # pace the runs: the grace counts from the pause
        return False

    stack.wait_for(reconciled, timeout=180, what="the reconciler to end the job")
    ended = doc.get().to_dict()
    assert "workspace ml-a--pauser is PAUSED" in ended["message"]
    assert "runtime lost" in ended["message"]
