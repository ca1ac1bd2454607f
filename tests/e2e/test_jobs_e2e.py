"""Scale-out jobs from a workspace's notebook on the local stack, driven as a user would:
``stasis.jobs.submit`` in a kernel of a workspace (JupyterLab over REST + websocket) is
admitted by the control plane (job.submitted -> ``on_job_submitted`` -> ``jobs/{id}`` and
the team's usage in one transaction), runs 4 processes that form one torch.distributed
group, streams their logs into the cell, and gives the chips back (job.finished); a job
over the team's TPU allowance is refused with the reason, before anything runs."""

from __future__ import annotations

import json

import pytest

from stack.notebook import Notebook

pytest.importorskip("torch")

CELL = '''
import json, stasis.jobs

def train(base):
    import torch, torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} ready", flush=True)
    t = torch.tensor([float(base + rank)])
    dist.all_reduce(t)
    return t.item()

job = stasis.jobs.submit(train, 10, profile="tpu-v5e-8", hosts=1)
for line in job.logs():
    print(line)
print("ONE", job.id, job.result(timeout=120), job.status())

job = stasis.jobs.submit(train, 10, profile="cpu-small", hosts=4)
for line in job.logs():
    print(line)
print("FOUR", job.id, job.result(timeout=120), job.status())

try:
    stasis.jobs.submit(train, 10, profile="tpu-v5e-8", hosts=2, job_id="job-too-big")
except stasis.jobs.JobRefused as exc:
    print("REFUSED", exc)
'''


def test_a_notebook_job_is_admitted_runs_on_four_hosts_and_is_refused_over_quota(
        local_stack) -> None:
    stack = local_stack
    stack.cli("ws", "create", "trainer", "--team", "ml-a", "--wait")
    info = json.loads(stack.cli("ws", "status", "trainer", "--team", "ml-a",
                                "--json").stdout)
    nb = Notebook(info["url"], info["token"])
    out = nb.run(nb.open("train.ipynb"), CELL, timeout=300).stdout
    lines = out.splitlines()
    one = next(line for line in lines if line.startswith("ONE ")).split()
    four = next(line for line in lines if line.startswith("FOUR ")).split()
    assert one[2:] == ["10.0", "SUCCEEDED"]
    assert four[2:] == [str(float(sum(10 + r for r in range(4)))), "SUCCEEDED"]
    for rank in range(4):
        assert f"[host {rank}] rank {rank} of 4 ready" in lines
    refused = next(line for line in lines if line.startswith("REFUSED "))
    assert "TPU chips and this workspace needs 16" in refused

    db = stack.db
    jobs = {j: db.collection("jobs").document(j).get().to_dict()
            for j in (one[1], four[1], "job-too-big")}
    assert jobs[one[1]]["state"] == "SUCCEEDED" and jobs[one[1]]["tpus"] == 8
    assert jobs[one[1]]["workspace_id"] == "ml-a--trainer"
    assert jobs[four[1]]["state"] == "SUCCEEDED" and jobs[four[1]]["hosts"] == 4
    assert jobs["job-too-big"]["state"] == "REFUSED"
    # every host's log, kept in Cloud Storage
    uri = jobs[four[1]]["log_uri"]
    assert uri == f"gs://{stack.settings.snapshot_bucket}/jobs/ml-a/{four[1]}/log.txt"
    from google.cloud import storage

    text = storage.Client.create_anonymous_client().bucket(stack.settings.snapshot_bucket) \
        .blob(uri.split("/", 3)[3]).download_as_text()
    assert all(f"[host {r}] rank {r} of 4 ready" in text for r in range(4))
    listing = stack.cli("jobs", "list", "--team", "ml-a").stdout
    assert "job-too-big" in listing and "REFUSED" in listing
    shown = json.loads(stack.cli("jobs", "show", four[1]).stdout)
    assert shown["state"] == "SUCCEEDED" and shown["hosts"] == 4
    stack.wait_for(lambda: db.collection("teams").document("ml-a").get().to_dict()
                   ["usage"].get("tpus", 0) == 0, timeout=30)
