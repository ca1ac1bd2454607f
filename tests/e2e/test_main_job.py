"""The main job on the local stack: pause with live kernels, resume into them.

Driven as a user would: the `stasis` CLI for lifecycle requests, the workspace's JupyterLab
over HTTP and the kernel websocket (URL + token only) for code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
from google.cloud import storage

from stack import local, processes
from stack.notebook import Notebook

BUILD = """
import hashlib, numpy as np
rng = np.random.default_rng(7)
big = rng.standard_normal(4 * 1024 * 1024)          # 32 MiB
table = {"rows": list(range(1000)), "name": "alpha"}
def double(x):
    return 2 * x
class Model:
    def __init__(self): self.w = big[:10].copy()
m = Model()
import threading
lock = threading.Lock()                            # cannot be captured
print(hashlib.sha256(big).hexdigest())
"""
CHECK = """
import hashlib
print(hashlib.sha256(big).hexdigest(), table["name"], double(21), float(m.w[0]) == float(big[0]),
      "lock" in globals())
"""


def _status(stack, name: str) -> dict:
    return json.loads(stack.cli("ws", "status", name, "--team", "ml-a", "--json").stdout)


def _server_processes(stack, ws_id: str) -> list[psutil.Process]:
    """Live processes whose command line names this workspace's home or runtime dir."""
    marker = str(stack.settings.data_dir)
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
        except (psutil.Error, TypeError):
            continue
        runtime_dir = env.get("JUPYTER_RUNTIME_DIR", "")
        if (("jupyter" in cmd or "ipykernel" in cmd)
                and (ws_id in cmd or ws_id in runtime_dir)
                and (marker in cmd or marker in runtime_dir)
                and proc.status() != psutil.STATUS_ZOMBIE):
            found.append(proc)
    return found


def test_pause_releases_the_server_and_resume_brings_the_kernel_back(local_stack):
    stack = local_stack
    stack.cli("ws", "create", "story", "--team", "ml-a", "--wait")
    info = _status(stack, "story")
    nb = Notebook(info["url"], info["token"])
    kernel = nb.open("work.ipynb")
    digest = nb.run(kernel, BUILD).stdout.strip()
    assert _server_processes(stack, "ml-a--story"), "the server should be running"

    out = stack.cli("ws", "pause", "story", "--team", "ml-a", "--wait")
    assert "PAUSED" in out.stdout
    assert _server_processes(stack, "ml-a--story") == []  # hardware released
    paused = _status(stack, "story")
    assert paused["state"] == "PAUSED" and paused["last_pause_ms"] > 0
    assert paused["snapshot_bytes"] >= 32 * 2**20
    snaps = json.loads(stack.cli("ws", "snapshots", "story", "--team", "ml-a",
                                 "--json").stdout)
    [snap] = snaps
    assert [s["name"] for s in snap["skipped"]] == ["lock"]
    assert "cannot pickle" in snap["skipped"][0]["reason"]

    stack.cli("ws", "resume", "story", "--team", "ml-a", "--wait")
    resumed = _status(stack, "story")
    assert resumed["state"] == "RUNNING" and resumed["last_resume_ms"] > 0
    nb = Notebook(resumed["url"], resumed["token"])
    restored_kernel = nb.open("work.ipynb")  # the session was re-created for the notebook
    assert restored_kernel != kernel
    assert nb.run(restored_kernel, CHECK).stdout.split() == [digest, "alpha", "42", "True",
                                                             "False"]


def test_several_workspaces_of_one_user_are_independent(local_stack):
    stack = local_stack
    for name in ("left", "right"):
        stack.cli("ws", "create", name, "--team", "ml-a", "--wait")
    left, right = _status(stack, "left"), _status(stack, "right")
    assert left["url"] != right["url"]
    Notebook(left["url"], left["token"]).run(
        Notebook(left["url"], left["token"]).open("a.ipynb"), "x = 'left'")
    stack.cli("ws", "pause", "left", "--team", "ml-a", "--wait")
    assert _status(stack, "right")["state"] == "RUNNING"
    nb = Notebook(right["url"], right["token"])
    assert nb.run(nb.open("b.ipynb"), "print('x' in globals())").stdout.strip() == "False"
    stack.cli("ws", "resume", "left", "--team", "ml-a", "--wait")
    left = _status(stack, "left")
    nb = Notebook(left["url"], left["token"])
    assert nb.run(nb.open("a.ipynb"), "print(x)").stdout.strip() == "left"


def test_delete_keeps_home_only_when_asked_and_deletes_snapshots(local_stack):
    stack = local_stack
    home = Path(stack.settings.data_dir) / "homes"
    for name, keep in (("keeper", True), ("goner", False)):
        stack.cli("ws", "create", name, "--team", "ml-a", "--wait")
        info = _status(stack, name)
        nb = Notebook(info["url"], info["token"])
        nb.run(nb.open("n.ipynb"), "open('notes.txt', 'w').write('mine')")
        stack.cli("ws", "pause", name, "--team", "ml-a", "--wait")
        args = ["ws", "delete", name, "--team", "ml-a", "--wait"]
        stack.cli(*([*args, "--keep-home"] if keep else args))
        assert _status(stack, name)["state"] == "DELETED"
        assert (home / f"ml-a--{name}" / "notes.txt").exists() is keep
        gcs = storage.Client.create_anonymous_client()
        left = list(gcs.list_blobs(stack.settings.snapshot_bucket,
                                   prefix=f"snapshots/ml-a/ml-a--{name}/"))
        assert left == []
        snap = json.loads(stack.cli("ws", "snapshots", name, "--team", "ml-a",
                                    "--json").stdout)
        assert [s["status"] for s in snap] == ["deleted"]


def test_gpu_profile_refused_clearly_on_a_host_without_gpu(local_stack):
    out = local_stack.cli("ws", "create", "gpu", "--team", "ml-a", "--profile", "gpu-small",
                          "--wait", check=False)
    assert out.returncode == 1
    assert "needs 1 x nvidia-l4 but this host has no GPU" in out.stdout


def test_environment_redirect_is_followed_and_deprecation_warns(local_stack):
    out = local_stack.cli("ws", "create", "old", "--team", "ml-a", "--env", "python-3-9",
                          "--wait")
    assert "python-3-9 was replaced by python-3-11" in out.stdout
    assert _status(local_stack, "old")["environment"] == "python-3-11"
    out = local_stack.cli("ws", "create", "dep", "--team", "ml-a", "--env", "python-3-10",
                          "--wait")
    assert "python-3-10 is deprecated" in out.stdout


def test_bad_admin_file_is_rejected_with_every_bad_path(local_stack, tmp_path):
    bad = Path(__file__).parents[1] / "data" / "config" / "bad-many-problems.yaml"
    out = local_stack.cli("admin", "apply", str(bad), check=False)
    assert out.returncode == 2 and "nothing applied" in out.stderr
    assert out.stderr.count("\n  /") >= 5


def test_killing_the_node_agent_mid_snapshot_leaves_the_workspace_running(local_stack):
    stack = local_stack
    stack.cli("ws", "create", "crash", "--team", "ml-a", "--wait")
    info = _status(stack, "crash")
    nb = Notebook(info["url"], info["token"])
    nb.run(nb.open("c.ipynb"), "import numpy as np\nbig = np.ones(192 * 2**20 // 8)")
    stack.cli("ws", "pause", "crash", "--team", "ml-a")  # no wait
    stack.wait_for(lambda: (stack.workspace("ml-a--crash") or {}).get("state") == "PAUSING",
                   what="PAUSING")
    time.sleep(0.3)  # let the snapshot start streaming
    agent = processes.load("node-agent", data_dir=stack.settings.data_dir)
    assert agent is not None
    victim = psutil.Process(agent.pid)
    victim.kill()  # kill -9 the agent only; its servers, in their own sessions, live on
    victim.wait(10)
    processes.stop("node-agent", data_dir=stack.settings.data_dir)  # forget the pid file
    processes.start(local.agent_spec(stack.settings))  # the agent comes back
    doc = stack.wait_for(lambda: (d := stack.workspace("ml-a--crash")) and d["state"] ==
                         "RUNNING" and d, timeout=120, what="back to RUNNING")
    assert doc["state_reason"] == "snapshot_failed"
    assert doc["state_message"]
    gcs = storage.Client.create_anonymous_client()
    partial = gcs.list_blobs(stack.settings.snapshot_bucket, prefix="snapshots/ml-a/ml-a--crash/")
    assert list(partial) == []
    # The workspace is untouched: its variable is still there.
    nb = Notebook(info["url"], info["token"])
    assert nb.run(nb.open("c.ipynb"), "print(big.size)").stdout.strip() == str(192 * 2**20 // 8)


@pytest.mark.timeout(300)
def test_provision_with_the_node_agent_down_is_retried_then_dead_lettered(local_stack):
    stack = local_stack
    processes.stop("node-agent", data_dir=stack.settings.data_dir)
    try:
        stack.cli("ws", "create", "nowhere", "--team", "ml-a")
        rows = stack.wait_for(lambda: [r for r in json.loads(stack.cli("dlq", "--json").stdout)
                                       if r["consumer"] == "on_workspace_requested"],
                              timeout=180, what="dead letter")
        assert rows[0]["attempts"] == 5
        assert "RuntimeUnavailable" in rows[0]["reason"]
    finally:
        processes.start(local.agent_spec(stack.settings))
