"""The ledger's contract, checked against the Firestore emulator and the in-memory fake
(``tests/store_fakes.py``) alike, so that the handler unit tests run on the same rules as
production: one effect per (consumer, event type, requestid); a decision's documents and
its ledger entry commit together or not at all; a pending outbox is handed back until it
is marked done; reads inside a transaction see what was committed before it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from google.api_core.exceptions import NotFound
from store_fakes import MemoryStore

from events import WorkspaceReady, new_event
from functions.adapters.firestore_store import FirestoreStore, ledger_key
from functions.ports import Entry, Subject, Tx

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SUBJECT = Subject("workspace", "ml-a--nb", lock="team:ml-a")


@dataclass
class Backend:
    """A ledger and a way to read back what it holds, outside any transaction."""

    ledger: Any
    read: Callable[[str, str], dict[str, Any] | None]
    write: Callable[[str, str, dict[str, Any]], None]


@pytest.fixture(params=["memory", "firestore"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        store = MemoryStore()
        yield Backend(store, store.db.get, store.db.put)
        return
    from google.cloud import firestore

    env = request.getfixturevalue("emulator_env")
    db = firestore.Client(project=env["STASIS_PROJECT"])

    def read(collection: str, doc_id: str) -> dict[str, Any] | None:
        snap = db.collection(collection).document(doc_id).get()
        return snap.to_dict() if snap.exists else None

    yield Backend(FirestoreStore(db), read,
                  lambda c, i, d: db.collection(c).document(i).set(d))


def _event(requestid: str = "req-1") -> Any:
    return new_event(WorkspaceReady("ml-a--nb", url="http://x", runtime_handle="h"),
                     source="//test", requestid=requestid)


def _entry(outbox: list[dict[str, Any]] | None = None, decision: Any = "decided") -> Entry:
    return Entry(outbox if outbox is not None else [{"command": "Release",
                                                     "fields": {"workspace_id": "ml-a--nb"}}],
                 {"accepted": True, "state": "RUNNING"}, decision)


def test_one_effect_per_request_and_the_pending_outbox_comes_back(backend: Backend) -> None:
    calls: list[int] = []

    def decide(tx: Tx) -> Entry:
        calls.append(1)
        tx.set("workspaces", "ml-a--nb", {"state": "RUNNING", "version": len(calls)})
        return _entry()

    event = _event()
    first = backend.ledger.transact(event, "on_ready", SUBJECT, decide, now=NOW)
    assert (first.key, first.pending, first.decision) == (ledger_key("on_ready", event), True,
                                                          "decided")
    assert first.outbox == [{"command": "Release", "fields": {"workspace_id": "ml-a--nb"}}]
    # The same request again (a redelivery, or a retry with a new event id): not decided
    # again, and the outbox that was not marked sent comes back to be sent.
    again = backend.ledger.transact(_event(), "on_ready", SUBJECT, decide, now=NOW)
    assert (again.key, again.pending, again.outbox, again.decision) == (
        first.key, True, first.outbox, None)
    assert calls == [1]
    backend.ledger.mark_done(first.key)
    done = backend.ledger.transact(event, "on_ready", SUBJECT, decide, now=NOW)
    assert (done.pending, done.outbox, done.decision) == (False, [], None)
    # Another consumer of the same event is another effect.
    other = backend.ledger.transact(event, "notify", SUBJECT, decide, now=NOW)
    assert other.decision == "decided" and calls == [1, 1]
    assert backend.read("workspaces", "ml-a--nb") == {"state": "RUNNING", "version": 2}


def test_pending_entries_hand_back_their_event_until_marked_done(backend: Backend) -> None:
    """What the reconciler's relay reads: the entries whose outbox is unsent, oldest
    first, each with the event that decided it; none with an empty outbox or marked done."""
    later, first, empty = _event("req-later"), _event("req-first"), _event("req-empty")
    backend.ledger.transact(later, "on_ready", SUBJECT, lambda tx: _entry(),
                            now=NOW.replace(minute=5))
    backend.ledger.transact(first, "on_ready", SUBJECT, lambda tx: _entry(), now=NOW)
    backend.ledger.transact(empty, "on_ready", SUBJECT, lambda tx: _entry([]), now=NOW)
    pending = backend.ledger.pending()
    assert [(p.consumer, p.event.id, p.event.requestid) for p in pending] == [
        ("on_ready", first.id, "req-first"), ("on_ready", later.id, "req-later")]
    assert pending[0].event.payload == first.payload and pending[0].processed_at == NOW
    backend.ledger.mark_done(pending[0].key)
    assert [p.event.requestid for p in backend.ledger.pending()] == ["req-later"]
    assert "event" not in (backend.read("processed", pending[0].key) or {})


def test_the_entry_records_the_request_and_its_outcome(backend: Backend) -> None:
    event = _event("req-entry")
    committed = backend.ledger.transact(event, "on_ready", SUBJECT, lambda tx: _entry([]),
                                        now=NOW)
    assert not committed.pending  # nothing to send: done at once
    entry = backend.read("processed", committed.key)
    assert entry is not None
    assert {k: entry[k] for k in ("consumer", "type", "event_id", "requestid", "workspace_id",
                                  "status", "outbox", "outcome")} == {
        "consumer": "on_ready", "type": "dev.stasis.workspace.ready", "event_id": event.id,
        "requestid": "req-entry", "workspace_id": "ml-a--nb", "status": "done", "outbox": [],
        "outcome": {"accepted": True, "state": "RUNNING"}}
    assert entry["processed_at"] == NOW and entry["expire_at"] > NOW


def test_a_decision_that_raises_writes_nothing(backend: Backend) -> None:
    def decide(tx: Tx) -> Entry:
        tx.set("workspaces", "ml-a--nb", {"state": "RUNNING"})
        raise ConnectionError("the runtime did not answer")

    with pytest.raises(ConnectionError):
        backend.ledger.transact(_event("req-raise"), "on_ready", SUBJECT, decide, now=NOW)
    assert backend.read("workspaces", "ml-a--nb") is None
    assert backend.read("processed", ledger_key("on_ready", _event("req-raise"))) is None


def test_writes_set_merge_update_and_generate_ids(backend: Backend) -> None:
    backend.write("teams", "ml-a", {"id": "ml-a", "usage": {"gpus": 1, "workspaces": 1}})
    backend.write("jobs", "job-1", {"id": "job-1", "state": "RUNNING", "tpus": 8})
    seen: dict[str, Any] = {}

    def decide(tx: Tx) -> Entry:
        seen["team"] = tx.get("teams", "ml-a")
        seen["missing"] = tx.get("teams", "nobody")
        tx.update("teams", "ml-a", {"usage": {"gpus": 0, "workspaces": 1}})
        tx.set("jobs", "job-1", {"state": "SUCCEEDED"}, merge=True)
        tx.set("sandboxes", "sbx-1", {"files_changed": ("a.py", "b.py"), "at": NOW})
        tx.update("sandboxes", "sbx-1", {"queue_position": 1})  # written just before
        tx.set("audit", "", {"action": "workspace.ready"})
        # A read after a write still sees the document as it was.
        seen["again"] = tx.get("teams", "ml-a")
        return _entry([])

    backend.ledger.transact(_event("req-writes"), "on_ready", SUBJECT, decide, now=NOW)
    assert seen["team"] == seen["again"] == {"id": "ml-a", "usage": {"gpus": 1, "workspaces": 1}}
    assert seen["missing"] is None
    assert backend.read("teams", "ml-a") == {"id": "ml-a", "usage": {"gpus": 0, "workspaces": 1}}
    assert backend.read("jobs", "job-1") == {"id": "job-1", "state": "SUCCEEDED", "tpus": 8}
    sandbox = backend.read("sandboxes", "sbx-1")
    assert sandbox == {"files_changed": ["a.py", "b.py"], "at": NOW, "queue_position": 1}
    assert sandbox["at"].tzinfo is not None


def test_an_update_of_a_missing_document_fails_the_whole_commit(backend: Backend) -> None:
    def decide(tx: Tx) -> Entry:
        tx.set("workspaces", "ml-a--nb", {"state": "RUNNING"})
        tx.update("teams", "nobody", {"usage": {}})
        return _entry([])

    with pytest.raises(NotFound):
        backend.ledger.transact(_event("req-missing"), "on_ready", SUBJECT, decide, now=NOW)
    assert backend.read("workspaces", "ml-a--nb") is None
    assert backend.read("processed", ledger_key("on_ready", _event("req-missing"))) is None


def test_naive_times_are_read_back_in_utc(backend: Backend) -> None:
    backend.write("workspaces", "ml-a--nb", {"updated_at": datetime(2026, 6, 1, 11, 0)})
    seen: dict[str, Any] = {}

    def decide(tx: Tx) -> Entry:
        seen.update(tx.get("workspaces", "ml-a--nb") or {})
        return _entry([])

    backend.ledger.transact(_event("req-time"), "on_ready", SUBJECT, decide, now=NOW)
    assert seen["updated_at"] == datetime(2026, 6, 1, 11, 0, tzinfo=UTC)


def test_find_reads_the_documents_whose_field_matches(backend: Backend) -> None:
    for snap, ws in (("a-v1", "ml-a--a"), ("a-v2", "ml-a--a"), ("b-v1", "ml-a--b")):
        backend.write("snapshots", snap, {"workspace": ws, "bytes": 1})
    seen: list[tuple[str, dict[str, Any]]] = []

    def decide(tx: Tx) -> Entry:
        seen.extend(tx.find("snapshots", "workspace", "ml-a--a"))
        tx.set("snapshots", "a-v3", {"workspace": "ml-a--a", "bytes": 2})
        seen.extend(tx.find("snapshots", "workspace", "ml-a--a"))  # not its own write
        return _entry([])

    backend.ledger.transact(_event("req-find"), "on_ready", SUBJECT, decide, now=NOW)
    assert sorted(i for i, _ in seen) == ["a-v1", "a-v1", "a-v2", "a-v2"]
    assert all(doc == {"workspace": "ml-a--a", "bytes": 1} for _, doc in seen)
