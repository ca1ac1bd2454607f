"""The portal's Firestore store against the real emulator: the one-time sign-in consumed in
a transaction (once, even when two browsers race), a page's audit history read once per
workspace version, a team's pages, snapshots by workspace, and the ledger check that makes
a double submit one request."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import firestore

from events import WorkspacePauseRequested, new_event
from functions.adapters.firestore_store import ledger_key, workspace_to_doc
from functions.adapters.portal_store import FirestorePortalStore
from functions.domain.lifecycle import State, Workspace
from functions.portal import signin

NOW = datetime.now(UTC).replace(microsecond=0)


def _store(project: str) -> tuple[FirestorePortalStore, firestore.Client]:
    db = firestore.Client(project=project)
    return FirestorePortalStore(db, lambda: None), db


def _ws(i: int, **extra: Any) -> Workspace:
    return Workspace(id=f"ml-a--ws{i:02d}", team="ml-a", owner="alice" if i % 2 else "bob",
                     name=f"ws{i:02d}", profile="cpu-small", state=State.RUNNING,
                     created_at=NOW - timedelta(minutes=i), version=1, **extra)


def test_a_signin_is_consumed_once_even_when_raced(emulator_env: dict[str, str]) -> None:
    store, db = _store(emulator_env["STASIS_PROJECT"])
    token = signin.new_token()
    store.create_signin(signin.token_hash(token), signin.record("alice", NOW))
    stored = db.collection(signin.COLLECTION).document(signin.token_hash(token)).get()
    assert token not in str(stored.to_dict())
    results: list[signin.Verdict] = []

    def use() -> None:
        results.append(store.consume_signin(signin.token_hash(token),
                                            lambda doc: signin.consume(doc, NOW)))

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.outcome for r in results) == sorted(
        [signin.Outcome.SIGNED_IN] + [signin.Outcome.USED] * 3)
    assert store.consume_signin("0" * 64, lambda doc: signin.consume(doc, NOW)).outcome == \
        signin.Outcome.UNKNOWN


def test_pages_snapshots_and_history_by_version(emulator_env: dict[str, str]) -> None:
    store, db = _store(emulator_env["STASIS_PROJECT"])
    workspaces = [_ws(i) for i in range(7)]
    for ws in workspaces:
        db.collection("workspaces").document(ws.id).set(workspace_to_doc(ws))
        db.collection("audit").add({"target": ws.id, "action": "workspace.ready",
                                    "outcome": "accepted: ready", "time": NOW, "actor": "x"})
    db.collection("snapshots").document("s1").set({"workspace": "ml-a--ws01", "bytes": 5})
    assert {w.id for w in store.owned("ml-a", "alice")} == {w.id for w in workspaces[1::2]}
    first, cursor = store.team_page("ml-a", 4, None)
    rest, end = store.team_page("ml-a", 4, cursor)
    assert [w.id for w in first + rest] == [w.id for w in workspaces] and end is None
    assert [s["id"] for s in store.snapshots_of([w.id for w in workspaces])] == ["s1"]

    since = NOW - timedelta(days=1)
    assert len(store.audit_of(workspaces, since)) == 7
    db.collection("audit").add({"target": "ml-a--ws00", "action": "workspace.pause_requested",
                                "outcome": "accepted: pause_started", "time": NOW,
                                "actor": "x"})
    # Same version: the history is the one read before (it cannot have moved).
    assert len(store.audit_of(workspaces, since)) == 7
    moved = [Workspace(**{**workspaces[0].__dict__, "version": 2}), *workspaces[1:]]
    assert len(store.audit_of(moved, since)) == 8


def test_handled_reads_the_consumers_ledger(emulator_env: dict[str, str]) -> None:
    store, db = _store(emulator_env["STASIS_PROJECT"])
    event = new_event(WorkspacePauseRequested(workspace_id="ml-a--ws01", actor="alice"),
                      requestid="a" * 32, id="a" * 32)
    assert store.handled(event) is False
    assert store.verdict_key(event) == ledger_key("on_pause_requested", event)
    db.collection("processed").document(ledger_key("on_pause_requested", event)).set(
        {"status": "done"})
    assert store.handled(event) is True
