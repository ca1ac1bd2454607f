"""The local stack's control-plane state across `stasis down` and `stasis up`.

The Firestore emulator keeps its data in memory, and fake-gcs-server keeps objects on disk.
Without this module a `stasis down` would forget every workspace, team and snapshot
record while their homes and snapshot objects stayed on disk. So:

- `down` first pauses every RUNNING workspace through the control plane, like a user
  would (`pause_running`: the kernels go to the snapshot bucket, which is on disk), then
  exports the Firestore emulator (`export`: its own HTTP export, into
  ``<data dir>/firestore/``), then stops the processes;
- `up` starts the emulator with ``--import-data`` of the last export (`import_file`), so
  the workspaces come back PAUSED and `stasis ws resume NAME` gives their kernels back;
- `stasis up --fresh` forgets the export (`forget`) and starts empty (the example catalog
  is applied again).

The Pub/Sub emulator keeps nothing; `up` recreates topics and subscriptions, and a pause
still in flight when `down` gives up waiting is repaired by the reconciler after `up`
(PAUSING past its limit becomes a failed snapshot: the workspace stays RUNNING in
Firestore with no server, and the next pause or delete proceeds from there).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from stack.settings import Settings

#: Only these states are paused on the way down; the rest hold no running server.
_PAUSABLE = "RUNNING"
_SETTLED = frozenset({"PAUSED", "FAILED", "DELETED"})


def _root(settings: Settings) -> Path:
    return settings.data_dir / "firestore"


def import_file(settings: Settings) -> Path | None:
    """The metadata file of the last complete export, for ``--import-data``; None if none."""
    current = _root(settings) / "current"
    if not current.is_dir():
        return None
    found = sorted(current.glob("*/*.overall_export_metadata"))
    return found[-1] if found else None


def forget(settings: Settings) -> None:
    shutil.rmtree(_root(settings), ignore_errors=True)


def export(settings: Settings, timeout: float = 60.0) -> Path:
    """Export the stack's project into ``firestore/current`` (a fresh directory swapped in
    only once the emulator answered: a failed export keeps the previous one)."""
    root = _root(settings)
    staging = root / f"staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    project = settings.project
    response = requests.post(
        f"{settings.url('firestore')}/emulator/v1/projects/{project}:export",
        json={"database": f"projects/{project}/databases/(default)",
              "export_directory": str(staging)},
        timeout=timeout)
    if response.status_code != 200:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"the Firestore emulator refused the export: {response.status_code} "
                           f"{response.text[:300]}")
    current, old = root / "current", root / "previous"
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        current.rename(old)
    staging.rename(current)
    shutil.rmtree(old, ignore_errors=True)
    return current


def pause_running(settings: Settings, *, timeout: float = 600.0,
                  say: Callable[[str], Any] = lambda _m: None) -> dict[str, str]:
    """Ask the control plane to pause every RUNNING workspace and wait until each settles
    (PAUSED, or FAILED/RUNNING with the reason); returns workspace id -> final state."""
    from google.cloud import firestore

    from events import WorkspacePauseRequested, new_event
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import OPERATOR

    db = firestore.Client(project=settings.project)
    versions = {d.id: (d.to_dict() or {}).get("version", 0) for d in db.collection("workspaces")
                .where(filter=firestore.FieldFilter("state", "==", _PAUSABLE)).stream()}
    running = sorted(versions)
    if not running:
        return {}
    say(f"pausing {len(running)} running workspace(s) so their kernels survive the stop: "
        + ", ".join(running))
    bus = PubSubBus(settings.project, origin=OPERATOR)
    for ws_id in running:
        bus.publish(new_event(WorkspacePauseRequested(workspace_id=ws_id, actor="stasis-down"),
                              source="//stasis/cli/down", requestid=uuid.uuid4().hex))
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    started = time.monotonic()
    pending = set(running)
    while pending and time.monotonic() < deadline:
        time.sleep(0.5)
        for ws_id in sorted(pending):
            doc = db.collection("workspaces").document(ws_id).get().to_dict() or {}
            state = str(doc.get("state"))
            states[ws_id] = state
            if doc.get("version", 0) == versions[ws_id]:
                continue  # the pause request has not been processed yet
            # Back to RUNNING after PAUSING means the snapshot failed (the reason is on it).
            if state in _SETTLED or (state == "RUNNING" and doc.get("state_reason")
                                     == "snapshot_failed"):
                pending.discard(ws_id)
                say(f"  {ws_id}: {state} ({time.monotonic() - started:.1f}s)"
                    + (f" — {doc['state_message']}" if doc.get("state_message") else ""))
    for ws_id in sorted(pending):
        say(f"  {ws_id}: still {states.get(ws_id)} after {timeout:.0f}s; stopping anyway "
            "(the reconciler repairs it after the next `stasis up`)")
    return states
