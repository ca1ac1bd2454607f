"""The Firestore store: workspace documents, snapshots, teams, the ledger and the audit log.

Every lifecycle transition is read-decide-write in ONE Firestore transaction: the ledger
entry, the workspace document (with its version), the team's usage counters when they
change, the snapshot record and the audit entry commit together or not at all. The ledger
(``processed/{key}``) makes an event and a retried request have one effect; it also keeps
the outbox (commands and events still to send), so a crash between commit and side effects
is repaired by the redelivery instead of losing the side effects.

Contention on a team document is bounded by design: admission events carry the team as
their Pub/Sub ordering key (one at a time per team on GCP), one function instance admits a
team's requests one at a time (a per-team lock), transactions are short (a handful of
documents), and a contended commit is retried with jittered exponential backoff.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from events import Event
from functions.domain.lifecycle import State, Workspace

LEDGER_TTL = timedelta(days=7)
_TX_ATTEMPTS = 8
_team_locks: dict[str, threading.Lock] = {}
_team_locks_guard = threading.Lock()


@dataclass
class LedgerEntry:
    key: str
    status: str  # "pending": committed, outbox not yet sent; "done"
    outbox: list[dict[str, Any]]


@dataclass
class TxView:
    """What a decide callback sees inside the transaction, and what it asks to write."""

    workspace: Workspace | None
    transaction: Any
    store: FirestoreStore
    writes: list[tuple[str, str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    outcome: dict[str, Any] = dataclasses.field(default_factory=dict)
    _teams: dict[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)
    _usage: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def team(self, team_id: str) -> dict[str, Any] | None:
        """The team document, read inside the transaction (only when it is needed)."""
        if team_id not in self._teams:
            snap = self.store.db.collection("teams").document(team_id).get(
                transaction=self.transaction)
            self._teams[team_id] = snap.to_dict() if snap.exists else None
        return self._teams[team_id]

    def usage(self, team_id: str) -> dict[str, Any]:
        """The team's usage counters; changes to the returned dict are committed."""
        if team_id not in self._usage:
            self._usage[team_id] = dict((self.team(team_id) or {}).get("usage") or {})
        return self._usage[team_id]

    def set(self, collection: str, doc_id: str, data: dict[str, Any]) -> None:
        """Write a document in the transaction; an empty id means a new generated id."""
        self.writes.append((collection, doc_id, data))

    def changed_usage(self) -> dict[str, dict[str, Any]]:
        return {team_id: usage for team_id, usage in self._usage.items()
                if usage != dict((self._teams.get(team_id) or {}).get("usage") or {})}


@dataclass
class TxResult:
    duplicate: bool
    ledger: LedgerEntry
    value: Any = None


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

    # --- the transition -------------------------------------------------------------------
    def transition(self, event: Event[Any], consumer: str, workspace_id: str,
                   decide: Callable[[TxView], tuple[Workspace | None, list[dict[str, Any]], Any]],
                   *, team: str | None = None, now: datetime) -> TxResult:
        """Run ``decide`` in one transaction guarded by the ledger.

        ``decide(view)`` returns (workspace to write or None, outbox, value). The outbox is
        stored on the ledger entry; the caller sends it and then calls ``mark_done``. A
        duplicate (same consumer, type and requestid) returns the stored ledger entry and
        does not call ``decide``.
        """
        key = ledger_key(consumer, event)
        lock = _team_lock(team) if team else None
        if lock:
            lock.acquire()
        try:
            return self._run_with_backoff(lambda: self._transition_once(
                event, consumer, key, workspace_id, decide, now))
        finally:
            if lock:
                lock.release()

    def _transition_once(self, event: Event[Any], consumer: str, key: str, workspace_id: str,
                         decide: Callable[[TxView], tuple[Workspace | None,
                                                         list[dict[str, Any]], Any]],
                         now: datetime) -> TxResult:
        ledger_ref = self.db.collection("processed").document(key)
        ws_ref = self.db.collection("workspaces").document(workspace_id)

        @firestore.transactional
        def run(transaction: Any) -> TxResult:
            stored = stored_entry(transaction, ledger_ref)
            if stored is not None:
                return stored
            ws_snap = ws_ref.get(transaction=transaction)
            view = TxView(workspace_from_doc(ws_snap.to_dict()) if ws_snap.exists else None,
                          transaction, self)
            new_ws, outbox, value = decide(view)
            if new_ws is not None:
                transaction.set(ws_ref, workspace_to_doc(new_ws))
            for collection, doc_id, data in view.writes:
                ref = self.db.collection(collection)
                transaction.set(ref.document(doc_id) if doc_id else ref.document(), data)
            for team_id, usage in view.changed_usage().items():
                transaction.update(self.db.collection("teams").document(team_id),
                                   {"usage": usage})
            return record_entry(transaction, ledger_ref, event, consumer, outbox=outbox,
                                outcome=view.outcome, now=now, value=value,
                                workspace_id=workspace_id)

        return run(self.db.transaction(max_attempts=3))

    def mark_done(self, key: str) -> None:
        mark_done(self.db, key)

    @staticmethod
    def _run_with_backoff(fn: Callable[[], TxResult]) -> TxResult:
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


def ledger_key(consumer: str, event: Event[Any]) -> str:
    """One effect per (consumer, event type, request): a retried request reuses its requestid."""
    return hashlib.sha256(f"{consumer}|{event.type}|{event.requestid}".encode()).hexdigest()


def stored_entry(transaction: Any, ledger_ref: Any) -> TxResult | None:
    """Inside a transaction: the ledger entry already recorded for this request (a
    duplicate: nothing to decide again), else None."""
    snap = ledger_ref.get(transaction=transaction)
    if not snap.exists:
        return None
    doc = snap.to_dict() or {}
    return TxResult(True, LedgerEntry(ledger_ref.id, doc["status"], doc.get("outbox", [])))


def record_entry(transaction: Any, ledger_ref: Any, event: Event[Any], consumer: str, *,
                 outbox: list[dict[str, Any]], outcome: dict[str, Any], now: datetime,
                 value: Any, **subject: str) -> TxResult:
    """Inside the same transaction as the decision: the ledger entry (``pending`` while
    the outbox is unsent), named by ``subject`` (e.g. ``workspace_id=``)."""
    status = "pending" if outbox else "done"
    transaction.set(ledger_ref, {
        "consumer": consumer, "type": event.type, "event_id": event.id,
        "requestid": event.requestid, **subject, "status": status, "outbox": outbox,
        "outcome": outcome, "processed_at": now, "expire_at": now + LEDGER_TTL,
    })
    return TxResult(False, LedgerEntry(ledger_ref.id, status, list(outbox)), value)


def mark_done(db: firestore.Client, key: str) -> None:
    """The outbox of ledger entry ``key`` was sent."""
    db.collection("processed").document(key).update({"status": "done", "outbox": []})


def _team_lock(team: str) -> threading.Lock:
    with _team_locks_guard:
        return _team_locks.setdefault(team, threading.Lock())


_TIME_FIELDS = {f.name for f in dataclasses.fields(Workspace)
                if "datetime" in str(f.type)}


def workspace_to_doc(ws: Workspace) -> dict[str, Any]:
    doc = dataclasses.asdict(ws)
    doc["state"] = str(ws.state)
    return doc


def workspace_from_doc(doc: Mapping[str, Any] | None) -> Workspace:
    assert doc is not None
    known = {f.name for f in dataclasses.fields(Workspace)}
    data = {k: v for k, v in doc.items() if k in known}
    data["state"] = State(data.get("state", State.REQUESTED))
    for name in _TIME_FIELDS:
        value = data.get(name)
        if isinstance(value, datetime) and value.tzinfo is None:
            data[name] = value.replace(tzinfo=UTC)
    return Workspace(**data)
