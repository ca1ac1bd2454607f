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

from events import WorkspaceRequested, new_event
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.publishers import OPERATOR
from harness.notebook import Notebook
from stack import local, processes

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
    """Live processes whose command line names this workspace's home or runtime dir, or
    that run in its home (an adopted warm server keeps the command line it was started
    with: ``python -m runtime.local.prewarm``)."""
    marker = str(stack.settings.data_dir)
    home = str(stack.settings.data_dir / "homes" / ws_id)
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "cwd"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
            cwd = proc.info["cwd"] or ""
        except (psutil.Error, TypeError):
            continue
        runtime_dir = env.get("JUPYTER_RUNTIME_DIR", "")
        ours = (("jupyter" in cmd or "ipykernel" in cmd)
                and (ws_id in cmd or ws_id in runtime_dir)
                and (marker in cmd or marker in runtime_dir))
        if (ours or ("runtime.local.prewarm" in cmd and cwd == home)) \
                and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_pause_releases_the_server_and_resume_brings_the_kernel_back(local_stack):
    stack = local_stack
    stack.cli("ws", "create", "story", "--team", "ml-a", "--wait")
    info = _status(stack, "story")
    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open("work.ipynb")
    digest = nb.run(kernel, BUILD).stdout.strip()
    assert _server_processes(stack, "ml-a--story"), "the server should be running"
    # The example admin file keeps one JupyterLab of python-3-11 imported ahead.
    pools = json.loads(stack.cli("status", "--json").stdout)["warm_pools"]
    assert pools["environments"]["python-3-11"]["size"] == 1, pools
    assert pools["kernels"]["environments"]["python-3-11"]["size"] == 1, pools  # and a kernel

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
    nb = Notebook(resumed["direct_url"], resumed["token"])
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
    Notebook(left["direct_url"], left["token"]).run(
        Notebook(left["direct_url"], left["token"]).open("a.ipynb"), "x = 'left'")
    stack.cli("ws", "pause", "left", "--team", "ml-a", "--wait")
    assert _status(stack, "right")["state"] == "RUNNING"
    nb = Notebook(right["direct_url"], right["token"])
    assert nb.run(nb.open("b.ipynb"), "print('x' in globals())").stdout.strip() == "False"
    stack.cli("ws", "resume", "left", "--team", "ml-a", "--wait")
    left = _status(stack, "left")
    nb = Notebook(left["direct_url"], left["token"])
    assert nb.run(nb.open("a.ipynb"), "print(x)").stdout.strip() == "left"


def test_delete_keeps_home_only_when_asked_and_deletes_snapshots(local_stack):
    stack = local_stack
    home = Path(stack.settings.data_dir) / "homes"
    for name, keep in (("keeper", True), ("goner", False)):
        stack.cli("ws", "create", name, "--team", "ml-a", "--wait")
        info = _status(stack, name)
        nb = Notebook(info["direct_url"], info["token"])
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
    # The CLI's preview refuses it at once (exit 2), in the domain's words; nothing is published.
    assert out.returncode == 2, out
    assert "needs 1 x nvidia-l4 but this host has no GPU" in out.stderr


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
    nb = Notebook(info["direct_url"], info["token"])
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
    partial = [b.name for b in gcs.list_blobs(stack.settings.snapshot_bucket,
                                              prefix="snapshots/ml-a/ml-a--crash/")]
    # No snapshot is left (no manifest); parts it had sent stay in the workspace's pool,
    # recorded by no snapshot: the janitor deletes them once they are an hour old (a part
    # may be shared, so a failed capture deletes none).
    assert [n for n in partial if "/_parts/" not in n] == []
    assert json.loads(stack.cli("ws", "snapshots", "crash", "--team", "ml-a",
                                "--json").stdout) == []
    # The workspace is untouched: its variable is still there.
    nb = Notebook(info["direct_url"], info["token"])
    assert nb.run(nb.open("c.ipynb"), "print(big.size)").stdout.strip() == str(192 * 2**20 // 8)


@pytest.mark.timeout(300)
def test_provision_with_the_node_agent_down_is_retried_then_dead_lettered(local_stack):
    stack = local_stack
    processes.stop("node-agent", data_dir=stack.settings.data_dir)
    try:
        # The CLI's preview asks the runtime first: unavailable (exit 4), nothing requested.
        out = stack.cli("ws", "create", "nowhere", "--team", "ml-a", check=False)
        assert out.returncode == 4 and "nothing was requested" in out.stderr, out
        # A request that got past the preview (the agent went down after it) is retried by
        # Pub/Sub, then dead-lettered with the reason.
        PubSubBus(stack.settings.project, origin=OPERATOR).publish(new_event(
            WorkspaceRequested(team="ml-a", owner="dev", name="nowhere", profile="cpu-small"),
            source="//test"))
        rows = stack.wait_for(lambda: [r for r in json.loads(stack.cli("dlq", "--json").stdout)
                                       if r["consumer"] == "on_workspace_requested"],
                              timeout=180, what="dead letter")
        assert rows[0]["attempts"] == 5
        assert "RuntimeUnavailable" in rows[0]["reason"]
    finally:
        processes.start(local.agent_spec(stack.settings))


PLANTED = """
import builtins
class Planted:
    def __reduce__(self):
        return (builtins.exec, ("open({marker!r}, 'w').write('the planted code ran')",))
"""


def test_a_snapshot_rewritten_in_the_bucket_is_refused_and_its_code_never_runs(local_stack):
    """A teammate with write access to the team's snapshot prefix rewrites the victim's
    latest snapshot: a part that runs code when unpickled, and a manifest consistent with
    it (digests, sizes, offsets all right). Only the sha256 the control plane recorded
    tells it apart, and the resume is refused on it before a byte is unpickled."""
    import pickle

    from runtime.snapshot import read_manifest
    from runtime.snapshot.layout import pool_prefix
    from runtime.snapshot.storage import ObjectStore
    from runtime.snapshot.transfer import new_hasher

    stack = local_stack
    stack.cli("ws", "create", "victim", "--team", "ml-a", "--wait")
    info = _status(stack, "victim")
    nb = Notebook(info["direct_url"], info["token"])
    nb.run(nb.open("v.ipynb"), "import numpy as np\nweights = np.ones(4 * 1024 * 1024)\nstep = 1")
    stack.cli("ws", "pause", "victim", "--team", "ml-a", "--wait")
    stack.cli("ws", "resume", "victim", "--team", "ml-a", "--wait")
    info = _status(stack, "victim")
    nb = Notebook(info["direct_url"], info["token"])
    nb.run(nb.open("v.ipynb"), "step = 2")
    stack.cli("ws", "pause", "victim", "--team", "ml-a", "--wait")
    paused = _status(stack, "victim")
    [first, second] = sorted(json.loads(stack.cli(
        "ws", "snapshots", "victim", "--team", "ml-a", "--json").stdout),
        key=lambda s: s["created_at"])
    # The second pause sent what changed (the pickle stream), not the 32 MiB of weights.
    assert second["uploaded_bytes"] < 2**20 < second["bytes"], second
    assert first["uploaded_bytes"] == first["bytes"]

    # The teammate's rewrite, through nothing but the bucket.
    marker = Path(stack.settings.data_dir) / "planted-marker"
    namespace: dict = {}
    exec(PLANTED.format(marker=str(marker)), namespace)
    stream = pickle.dumps(("weights", namespace["Planted"]()), protocol=5)
    store = ObjectStore(emulator_host=stack.env["STORAGE_EMULATOR_HOST"])
    bucket = stack.settings.snapshot_bucket
    prefix = f"snapshots/ml-a/ml-a--victim/{paused['current_snapshot']}"
    manifest = read_manifest(bucket, prefix, store=store)
    digest = new_hasher("blake3")
    digest.update(stream)
    part = f"{pool_prefix(prefix)}/{digest.hexdigest()}"
    store.upload_chunks(bucket, part, [memoryview(stream)])
    entry = manifest["kernels"][0]["entry"]
    entry.update(segments=[len(stream)], placements=[None], variables=[], total_bytes=len(stream),
                 objects=[{"name": part, "offset": 0, "bytes": len(stream),
                           "blake3": digest.hexdigest()}])
    store.put_bytes(bucket, f"{prefix}/manifest.json", json.dumps(manifest).encode(),
                    "application/json")
    assert read_manifest(bucket, prefix, store=store)["kernels"][0]["entry"]["objects"][0][
        "name"] == part  # a valid manifest: only the recorded sha256 says it is not ours

    resumed = stack.cli("ws", "resume", "victim", "--team", "ml-a", "--wait", check=False)

    assert resumed.returncode != 0
    doc = _status(stack, "victim")
    assert (doc["state"], doc["state_reason"]) == ("PAUSED", "snapshot_integrity"), doc
    assert "changed after it was written" in doc["state_message"]
    assert not marker.exists(), "the planted code ran"
    assert doc["current_snapshot"] == paused["current_snapshot"]  # kept for inspection
    snaps = json.loads(stack.cli("ws", "snapshots", "victim", "--team", "ml-a", "--json").stdout)
    assert {s["id"]: s["status"] for s in snaps}[paused["current_snapshot"]] == "ready"
    assert store.list_objects(bucket, f"{prefix}/manifest.json")
    audit = [a.to_dict() for a in stack.db.collection("audit").where(
        "target", "==", "ml-a--victim").stream()]
    assert any(a["action"] == "workspace.runtime_failed"
               and a["outcome"] == "accepted: snapshot_integrity" for a in audit), audit
    assert _server_processes(stack, "ml-a--victim") == []
