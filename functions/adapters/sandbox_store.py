"""Sandboxes in Firestore: ``sandboxes/{id}``, ``sandbox_queues/{team}``, the ledger, audit.

Admission and completion are each ONE transaction: the ledger entry, the sandbox
document(s), the team's queue document and the audit entry commit together or not at all.
The queue document holds the ids running and waiting, in order: the concurrency counter is
``len(running)``, a queue position is an index, and admitting or promoting reads and writes
one small document. It is kept apart from ``teams/{team}`` so that sandbox churn never
contends with workspace admission on the team document.

The policy is the ``sandboxes`` section of ``catalog/current`` (the applied admin config),
read inside the transaction so a decision and the policy it used are consistent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.cloud import firestore

from events import Event
from functions.adapters.firestore_store import (
    FirestoreStore,
    TxResult,
    ledger_key,
    mark_done,
    record_entry,
    stored_entry,
)
from functions.domain.sandboxes import Sandbox, SandboxState, TeamQueue

SANDBOXES = "sandboxes"
QUEUES = "sandbox_queues"
_subject_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@dataclass
class SandboxTx:
    """The view a decide callback gets: reads go through the transaction (cached), writes
    are collected and committed with the ledger entry."""

    db: Any
    transaction: Any
    outcome: dict[str, Any] = field(default_factory=dict)
    writes: list[tuple[str, str, dict[str, Any], bool]] = field(default_factory=list)
    _docs: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)

    def _read(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        key = (collection, doc_id)
        if key not in self._docs:
            snap = self.db.collection(collection).document(doc_id).get(
                transaction=self.transaction)
            self._docs[key] = snap.to_dict() if snap.exists else None
        return self._docs[key]

    def sandbox(self, sandbox_id: str) -> Sandbox | None:
        doc = self._read(SANDBOXES, sandbox_id)
        return Sandbox.from_doc(_aware(doc)) if doc else None

    def queue(self, team: str) -> TeamQueue:
        return TeamQueue.from_doc(self._read(QUEUES, team))

    def policy_section(self) -> Mapping[str, Any] | None:
        section = (self._read("catalog", "current") or {}).get("sandboxes")
        return section if isinstance(section, Mapping) else None

    def set(self, collection: str, doc_id: str, data: dict[str, Any]) -> None:
        self.writes.append((collection, doc_id, data, False))

    def update(self, collection: str, doc_id: str, fields: dict[str, Any]) -> None:
        self.writes.append((collection, doc_id, fields, True))


class FirestoreSandboxStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    def transact(self, event: Event[Any], consumer: str,
                 decide: Callable[[SandboxTx], tuple[list[dict[str, Any]], Any]], *,
                 subject: str, now: datetime) -> TxResult:
        key = ledger_key(consumer, event)
        with _guard:
            lock = _subject_locks.setdefault(subject, threading.Lock())
        with lock:  # one instance decides one sandbox at a time; others retry on conflict
            return FirestoreStore._run_with_backoff(
                lambda: self._once(event, consumer, key, subject, decide, now))

    def _once(self, event: Event[Any], consumer: str, key: str, subject: str,
              decide: Callable[[SandboxTx], tuple[list[dict[str, Any]], Any]],
              now: datetime) -> TxResult:
        ledger_ref = self.db.collection("processed").document(key)

        @firestore.transactional
        def run(transaction: Any) -> TxResult:
            stored = stored_entry(transaction, ledger_ref)
            if stored is not None:
                return stored
            view = SandboxTx(self.db, transaction)
            outbox, value = decide(view)
            for collection, doc_id, data, merge in view.writes:
                ref = self.db.collection(collection)
                target = ref.document(doc_id) if doc_id else ref.document()
                if merge:
                    transaction.update(target, data)
                else:
                    transaction.set(target, data)
            return record_entry(transaction, ledger_ref, event, consumer, outbox=outbox,
                                outcome=view.outcome, now=now, value=value,
                                sandbox_id=subject)

        return run(self.db.transaction(max_attempts=3))  # type: ignore[no-any-return]

    def mark_done(self, key: str) -> None:
        mark_done(self.db, key)

    def get(self, sandbox_id: str) -> Sandbox | None:
        snap = self.db.collection(SANDBOXES).document(sandbox_id).get()
        return Sandbox.from_doc(_aware(snap.to_dict())) if snap.exists else None

    def list(self, *, team: str | None = None, states: tuple[SandboxState, ...] | None = None,
             limit: int = 200) -> list[Sandbox]:
        query: Any = self.db.collection(SANDBOXES)
        if team:
            query = query.where(filter=firestore.FieldFilter("team", "==", team))
        if states:
            query = query.where(filter=firestore.FieldFilter("state", "in",
                                                            [str(s) for s in states]))
        return [Sandbox.from_doc(_aware(d.to_dict())) for d in query.limit(limit).stream()]


def _aware(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """Firestore gives back timezone-aware datetimes (DatetimeWithNanoseconds); make sure."""
    from datetime import UTC

    out = dict(doc or {})
    for name in ("requested_at", "started_at", "finished_at", "suspended_at"):
        value = out.get(name)
        if isinstance(value, datetime) and value.tzinfo is None:
            out[name] = value.replace(tzinfo=UTC)
    return out
