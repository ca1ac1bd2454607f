"""`--wait` against the real Firestore emulator: the follower is woken by the workspace's
document changing (a listener), not by its own reading schedule."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from google.cloud import firestore

from functions.ports import ledger_key
from functions.routes import consumer_of
from stasis_cli import client, door


@pytest.fixture
def db(emulator_env: dict[str, str], project_id: str,
       monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("STASIS_PROJECT", project_id)
    client._db.cache_clear()
    yield firestore.Client(project=project_id)
    client._db.cache_clear()


def test_a_follower_wakes_when_the_workspace_changes_not_when_its_poll_is_due(
    db: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the listener the follower would next read 60 s after its first read.
    monkeypatch.setattr(client, "_FIRST_POLL_S", 60.0)
    monkeypatch.setattr(client, "_MAX_POLL_S", 60.0)
    requested = door.Requested(id="e1", type="dev.stasis.workspace.requested",
                               name="workspace.requested", requestid="r1",
                               subject="ml-a--nb", team="ml-a")
    consumer = consumer_of(requested.name)
    db.collection("processed").document(ledger_key(consumer, requested)).set(  # type: ignore[arg-type]
        {"outcome": {"accepted": True}})
    doc = db.collection("workspaces").document("ml-a--nb")
    doc.set({"state": "REQUESTED"})
    result: dict[str, Any] = {}
    follower = threading.Thread(daemon=True, target=lambda: result.update(
        client.follow(None, requested, until={"RUNNING"}, timeout=120)))  # type: ignore[arg-type]
    follower.start()
    time.sleep(2)  # the follower has read REQUESTED and waits
    assert follower.is_alive()
    doc.set({"state": "RUNNING"})
    follower.join(timeout=30)
    assert not follower.is_alive(), "the change did not wake the follower"
    assert result["ok"] is True and result["workspace"]["state"] == "RUNNING"
