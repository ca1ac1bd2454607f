"""A workspace's identity on the local stack (issue 17 §3): its kernel reaches the control
plane only through the ``workspace_api`` function, with the token the node agent gave it;
team and owner are the workspace's, never the request's."""

from __future__ import annotations

import json

from harness.notebook import Notebook

CELL = '''
import json, os, urllib.request, urllib.error
import stasis.jobs

url, token = os.environ["STASIS_WORKSPACE_URL"], os.environ["STASIS_WORKSPACE_TOKEN"]
def call(payload, token=token):
    body = json.dumps({"type": "job.submitted", "payload": payload}).encode()
    request = urllib.request.Request(url + "/events", method="POST", data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
job = {"job_id": "job-stolen", "profile": "cpu-small", "hosts": 1, "function": "f"}
forged = "ml-b--victim." + token.rsplit(".", 1)[1]
print("CALLS", call({**job, "team": "ml-b"}), call(job, token=""), call(job, token=forged))
print("KEY", "STASIS_WORKSPACE_KEY" in os.environ)

def square(x):
    return x * x
done = stasis.jobs.submit(square, 7, profile="cpu-small", hosts=1, framework="none",
                          job_id="job-own")
print("JOB", done.result(timeout=120), done.status())
'''


def test_a_kernel_submits_jobs_only_as_its_workspace(local_stack) -> None:
    stack = local_stack
    stack.cli("ws", "create", "ident", "--team", "ml-a", "--wait")
    info = json.loads(stack.cli("ws", "status", "ident", "--team", "ml-a", "--json").stdout)
    nb = Notebook(info["direct_url"], info["token"])
    out = nb.run(nb.open("identity.ipynb"), CELL, timeout=240).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line}
    # another team's job: refused; no token or a forged one: not a workspace
    assert lines["CALLS"] == ["403", "401", "401"], out
    assert lines["KEY"] == ["False"], out
    assert lines["JOB"] == ["49", "SUCCEEDED"], out
    db = stack.db
    assert not db.collection("jobs").document("job-stolen").get().exists
    job = db.collection("jobs").document("job-own").get().to_dict()
    ws = db.collection("workspaces").document("ml-a--ident").get().to_dict()
    assert (job["team"], job["owner"], job["workspace_id"]) == (
        "ml-a", ws["owner"], "ml-a--ident")


def test_status_says_how_the_runtime_keeps_workspaces_apart(local_stack) -> None:
    """Root here, but the default environment's interpreter lives under /root: its
    workspaces share the agent's user, and `stasis status` says so, and why."""
    view = json.loads(local_stack.cli("status", "--json").stdout)["tenancy"]
    text = local_stack.cli("status").stdout
    assert f"runtime: {view['mode']}" in text
    if view["mode"] == "single-tenant":
        assert view["reason"] in text
    for python, why in view["single_tenant"].items():
        assert f"single-tenant on {python}: {why}" in text
