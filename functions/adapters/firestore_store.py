"""The Firestore store: workspace documents, the ledger every state change goes through,
deliveries and the audit log.

The ledger (``functions.ports.Ledger``): every transition of a workspace, a sandbox or a job
is read-decide-write in ONE Firestore transaction (:meth:`FirestoreStore.transact`): the
ledger entry ``processed/{key}`` and every document the decision writes (the workspace with
its version, the team's usage counters, the sandbox records and queue, the job, the
snapshot record, the audit entry) commit together or not at all. The entry makes an event
and a retried request have one effect; it also keeps the outbox (commands and events still
to send) and, while that is pending, the event that decided it, so a crash between commit
and side effects is repaired by the redelivery instead of losing the side effects, and an
outbox that outlived its deliveries is sent by the reconciler's relay (:meth:`pending`).

Contention is bounded by design: admission events carry the team as their Pub/Sub ordering
key (one at a time per team on GCP), one function instance decides one subject lock at a
time (a team's admissions, one sandbox's reports: ``Subject.lock``), transactions are short
(a handful of documents), and a contended commit is retried with jittered exponential
backoff.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from events import Event, from_pubsub, to_pubsub
from functions.domain.lifecycle import State, Workspace
from functions.ports import Committed, Entry, Pending, Subject, ledger_key

LEDGER = "processed"
LEDGER_TTL = timedelta(days=7)
_TX_ATTEMPTS = 8
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class _Tx:
    """``functions.ports.Tx`` over one Firestore transaction: reads go through it (cached,
    UTC-aware), writes are kept and applied at its end, with the ledger entry."""

    def __init__(self, db: firestore.Client, transaction: Any) -> None:
        self.db, self.transaction = db, transaction
        self._docs: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._writes: list[tuple[str, str, dict[str, Any], str]] = []

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        key = (collection, doc_id)
        if key not in self._docs:
            snap = self.db.collection(collection).document(doc_id).get(
                transaction=self.transaction)
            self._docs[key] = aware(snap.to_dict()) if snap.exists else None
        return copy.deepcopy(self._docs[key])

    def set(self, collection: str, doc_id: str, data: dict[str, Any], *,
            merge: bool = False) -> None:
        self._writes.append((collection, doc_id, data, "merge" if merge else "set"))

    def update(self, collection: str, doc_id: str, fields: dict[str, Any]) -> None:
        self._writes.append((collection, doc_id, fields, "update"))

    def find(self, collection: str, field: str, value: Any) -> list[tuple[str, dict[str, Any]]]:
        docs = self.db.collection(collection).where(
            filter=firestore.FieldFilter(field, "==", value)).stream(transaction=self.transaction)
        return [(d.id, aware(d.to_dict()) or {}) for d in docs]

    def apply(self) -> None:
        for collection, doc_id, data, how in self._writes:
            ref = self.db.collection(collection)
            target = ref.document(doc_id) if doc_id else ref.document()
            if how == "update":
                self.transaction.update(target, data)
            else:
                self.transaction.set(target, data, merge=how == "merge")


class FirestoreStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    # --- workspaces -----------------------------------------------------------------------
    def get_workspace(self, workspace_id: str) -> Workspace | None:
        snap = self.db.collection("workspaces").document(workspace_id).get()
        return workspace_from_doc(snap.to_dict()) if snap.exists else None

    def list_workspaces(self, *, team: str | None = None, states: Iterable[State] | None = None,
                        limit: int = 500) -> list[Workspace]:
        query: Any = self.db.collection("workspaces")
        if team:
            query = query.where(filter=firestore.FieldFilter("team", "==", team))
        if states is not None:
            query = query.where(filter=firestore.FieldFilter("state", "in",
                                                            [str(s) for s in states]))
        return [workspace_from_doc(d.to_dict()) for d in query.limit(limit).stream()]

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        snap = self.db.collection(collection).document(doc_id).get()
        return snap.to_dict() if snap.exists else None

    def query(self, collection: str, *, where: Iterable[tuple[str, str, Any]] = (),
              order_by: str | None = None, descending: bool = False,
              limit: int = 100) -> list[dict[str, Any]]:
        query: Any = self.db.collection(collection)
        for field, op, value in where:
            query = query.where(filter=firestore.FieldFilter(field, op, value))
        if order_by:
            direction = firestore.Query.DESCENDING if descending else firestore.Query.ASCENDING
            query = query.order_by(order_by, direction=direction)
        return [d.to_dict() for d in query.limit(limit).stream()]

    # --- the ledger -----------------------------------------------------------------------
    def transact(self, event: Event[Any], consumer: str, subject: Subject,
                 decide: Callable[[Any], Entry], *, now: datetime) -> Committed:
        """``functions.ports.Ledger.transact``: ``decide(tx)`` in one transaction with the
        ledger entry of (consumer, event type, requestid)."""
        key = ledger_key(consumer, event)
        with _lock(subject.lock):
            return _with_backoff(lambda: self._transact_once(event, consumer, key, subject,
                                                             decide, now))

    def _transact_once(self, event: Event[Any], consumer: str, key: str, subject: Subject,
                       decide: Callable[[Any], Entry], now: datetime) -> Committed:
        ledger_ref = self.db.collection(LEDGER).document(key)

        @firestore.transactional
        def run(transaction: Any) -> Committed:
            snap = ledger_ref.get(transaction=transaction)
            if snap.exists:  # a duplicate: nothing to decide again
                doc = snap.to_dict() or {}
                return Committed(key, doc["status"] == "pending", list(doc.get("outbox") or []))
            tx = _Tx(self.db, transaction)
            entry = decide(tx)
            tx.apply()
            doc = {
                "consumer": consumer, "type": event.type, "event_id": event.id,
                "requestid": event.requestid, f"{subject.kind}_id": subject.id,
                # pending: committed, outbox not yet sent
                "status": "pending" if entry.outbox else "done", "outbox": entry.outbox,
                "outcome": entry.outcome, "processed_at": now, "expire_at": now + LEDGER_TTL,
            }
            if entry.outbox:  # what the relay hands back to the consumer, until done
                data, attributes = to_pubsub(event)
                doc["event"] = {"data": data.decode(), "attributes": attributes}
            transaction.set(ledger_ref, doc)
            return Committed(key, bool(entry.outbox), list(entry.outbox), entry.decision)

        result: Committed = run(self.db.transaction(max_attempts=3))
        return result

    def mark_done(self, key: str) -> None:
        self.db.collection(LEDGER).document(key).update(
            {"status": "done", "outbox": [], "event": firestore.DELETE_FIELD})

    def pending(self, *, limit: int = 200) -> list[Pending]:
        """``functions.ports.Ledger.pending``. One equality filter (no composite index);
        pending entries are few (each is marked done once its outbox is sent)."""
        found = []
        query = self.db.collection(LEDGER).where(
            filter=firestore.FieldFilter("status", "==", "pending")).limit(limit)
        for snap in query.stream():
            doc = aware(snap.to_dict())
            stored = doc.get("event")
            if not stored:  # written before entries kept their event: redelivery only
                continue
            found.append(Pending(snap.id, doc["consumer"],
                                 from_pubsub(stored["data"].encode(), stored["attributes"]),
                                 doc["processed_at"]))
        return sorted(found, key=lambda p: p.processed_at)

    # --- deliveries, audit ------------------------------------------------------------------
    def count_failure(self, message_id: str, consumer: str, reason: str, now: datetime) -> int:
        """Record a failed delivery; returns how many times this message has failed here."""
        ref = self.db.collection("deliveries").document(
            hashlib.sha256(f"{consumer}|{message_id}".encode()).hexdigest())
        ref.set({"consumer": consumer, "message_id": message_id, "last_reason": reason,
                 "attempts": firestore.Increment(1), "updated_at": now,
                 "expire_at": now + LEDGER_TTL}, merge=True)
        return int((ref.get().to_dict() or {}).get("attempts", 1))

    def audit(self, entry: Mapping[str, Any]) -> None:
        self.db.collection("audit").document().set(dict(entry))

    def batch_write(self, writes: Iterable[tuple[str, str, dict[str, Any], bool]]) -> None:
        """Write (collection, id, data, merge) tuples atomically (admin apply)."""
        batch = self.db.batch()
        for collection, doc_id, data, merge in writes:
            batch.set(self.db.collection(collection).document(doc_id), data, merge=merge)
        batch.commit()


@contextlib.contextmanager
def _lock(name: str | None) -> Iterator[None]:
    """Transactions of one lock name run one at a time in this instance (none: no lock)."""
    if name is None:
        yield
        return
    with _locks_guard:
        lock = _locks.setdefault(name, threading.Lock())
    with lock:
        yield


def _with_backoff(fn: Callable[[], Committed]) -> Committed:
    for attempt in range(_TX_ATTEMPTS):
        try:
            return fn()
        except (gexc.Aborted, gexc.Conflict, ValueError) as exc:
            # ValueError: the client's own "Failed to commit transaction in N attempts".
            if isinstance(exc, ValueError) and "commit transaction" not in str(exc):
                raise
            if attempt == _TX_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0, 0.05 * 2**attempt))
    raise AssertionError("unreachable")


def aware(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """A document as read, its datetimes made sure to be UTC-aware (Firestore gives back
    aware ones; documents written elsewhere may not be)."""
    return {k: v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v
            for k, v in (doc or {}).items()}


def workspace_to_doc(ws: Workspace) -> dict[str, Any]:
    return ws.to_doc()


def workspace_from_doc(doc: Mapping[str, Any] | None) -> Workspace:
    assert doc is not None
    return Workspace.from_doc(aware(doc))
