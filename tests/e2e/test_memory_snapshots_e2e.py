"""Issue 17 §7 on the local stack: an environment that must not be snapshotted.

Its pause keeps only the home disk (no snapshot objects in the bucket) and says so; its
resume starts fresh kernels, the home as it was. Driven as a user would: the `stasis` CLI
and the workspace's JupyterLab over HTTP and the kernel websocket.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from google.cloud import storage

from harness.notebook import Notebook

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def private_environment(local_stack, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The example admin file, plus an environment whose memory is never snapshotted."""
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    base = next(e for e in config["environments"] if e["id"] == "python-3-11")
    private = copy.deepcopy(base)
    private.update(id="private-3-11", title="Python 3.11, never snapshotted",
                   memory_snapshots=False, warm_pool=0)
    config["environments"].append(private)
    for profile in config["profiles"]:
        if profile.get("environments"):
            profile["environments"].append("private-3-11")
    path = tmp_path_factory.mktemp("admin") / "private.yaml"
    path.write_text(yaml.safe_dump(config))
    local_stack.cli("admin", "apply", str(path))


def _status(stack, name: str) -> dict:
    return json.loads(stack.cli("ws", "status", name, "--team", "ml-a", "--json").stdout)


def test_a_never_snapshotted_workspace_pauses_home_only_and_resumes_fresh(local_stack):
    stack = local_stack
    stack.cli("ws", "create", "secret", "--team", "ml-a", "--env", "private-3-11", "--wait")
    info = _status(stack, "secret")
    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open("work.ipynb")
    nb.run(kernel, "secret_value = 'in memory only'\n"
                   "open('notes.txt', 'w').write('kept on disk')")

    out = stack.cli("ws", "pause", "secret", "--team", "ml-a")
    assert "keeps only the home disk: kernels start fresh on resume" in out.stdout
    doc = stack.wait_for(lambda: (d := stack.workspace("ml-a--secret")) and
                         d["state"] == "PAUSED" and d, timeout=60, what="PAUSED")
    assert doc["state_reason"] == "paused_home_only" and doc["current_snapshot"] is None
    assert "keeps only the home disk" in doc["state_message"]
    gcs = storage.Client.create_anonymous_client()
    assert list(gcs.list_blobs(stack.settings.snapshot_bucket,
                               prefix="snapshots/ml-a/ml-a--secret/")) == []
    assert json.loads(stack.cli("ws", "snapshots", "secret", "--team", "ml-a",
                                "--json").stdout) == []

    stack.cli("ws", "resume", "secret", "--team", "ml-a", "--wait")
    resumed = _status(stack, "secret")
    assert resumed["state"] == "RUNNING"
    nb = Notebook(resumed["direct_url"], resumed["token"])
    fresh = nb.open("work.ipynb")
    assert nb.run(fresh, "print('secret_value' in globals(), open('notes.txt').read())"
                  ).stdout.strip() == "False kept on disk"
