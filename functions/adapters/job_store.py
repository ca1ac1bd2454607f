"""Scale-out jobs in Firestore: ``jobs/{id}`` and the team's ``usage``, in ONE transaction.

Admitting a job (job.submitted) and ending it (job.finished) each read the job, the team
document and the ledger entry, decide with the pure ``functions.domain.jobs``, and write the
job, the team's usage counters, an audit entry and the ledger entry together or not at all:
two jobs of a team admitted at the same time can never both take its last TPU chips
(Firestore retries the loser against the winner's usage), and a redelivered event has one
effect. A team's admissions run one at a time in one instance (the per-team lock of
``firestore_store``), as for workspaces.

What the runtime must do afterwards (start a kubernetes job's JobSet, delete it once the
job ended) is the ledger entry's outbox, written in the same transaction: the entry stays
``pending`` until the handler sent it (:meth:`FirestoreJobStore.mark_done`), and a
redelivered event finds it pending and sends it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.cloud import firestore

from events import Event
from functions.adapters.firestore_store import (
    FirestoreStore,
    TxResult,
    _team_lock,
    ledger_key,
    mark_done,
    record_entry,
    stored_entry,
)
from functions.domain.jobs import Job, JobState
from functions.domain.quota import Usage

JOBS = "jobs"


@dataclass
class JobTx:
    """What a decide callback sees (read in the transaction) and asks to write."""

    job: Job | None
    team_doc: dict[str, Any] | None
    outcome: dict[str, Any] = field(default_factory=dict)
    new_job: Job | None = None
    new_usage: Usage | None = None
    audit: dict[str, Any] | None = None
    #: Runtime commands to send once committed (``{"start": {...}}``, ``{"release": id}``).
    outbox: list[dict[str, Any]] = field(default_factory=list)

    @property
    def usage(self) -> Usage:
        return Usage.from_dict((self.team_doc or {}).get("usage"))


class FirestoreJobStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    def transact(self, event: Event[Any], consumer: str, decide: Callable[[JobTx], Any], *,
                 job_id: str, team: str | None, now: datetime) -> TxResult:
        """Run ``decide(view)`` in one transaction guarded by the ledger; a duplicate event
        returns the stored ledger entry without calling ``decide``."""
        key = ledger_key(consumer, event)
        lock = _team_lock(team) if team else None
        if lock:
            lock.acquire()
        try:
            return FirestoreStore._run_with_backoff(
                lambda: self._once(event, consumer, key, decide, job_id, team, now))
        finally:
            if lock:
                lock.release()

    def _once(self, event: Event[Any], consumer: str, key: str,
              decide: Callable[[JobTx], Any], job_id: str, team: str | None,
              now: datetime) -> TxResult:
        ledger_ref = self.db.collection("processed").document(key)
        job_ref = self.db.collection(JOBS).document(job_id)

        @firestore.transactional
        def run(transaction: Any) -> TxResult:
            stored = stored_entry(transaction, ledger_ref)
            if stored is not None:
                return stored
            job_snap = job_ref.get(transaction=transaction)
            job = Job.from_doc(_aware(job_snap.to_dict())) if job_snap.exists else None
            team_id = team or (job.team if job else None)
            team_doc = None
            if team_id:
                snap = self.db.collection("teams").document(team_id).get(
                    transaction=transaction)
                team_doc = snap.to_dict() if snap.exists else None
            view = JobTx(job, team_doc)
            value = decide(view)
            if view.new_job is not None:
                transaction.set(job_ref, {**view.new_job.to_doc(), "updated_at": now})
            if view.new_usage is not None and team_id:
                transaction.set(self.db.collection("teams").document(team_id),
                                {"usage": view.new_usage.as_dict()}, merge=True)
            if view.audit is not None:
                transaction.set(self.db.collection("audit").document(), view.audit)
            return record_entry(transaction, ledger_ref, event, consumer,
                                outbox=view.outbox, outcome=view.outcome, now=now,
                                value=value, job_id=job_id)

        return run(self.db.transaction(max_attempts=3))  # type: ignore[no-any-return]

    def mark_done(self, key: str) -> None:
        mark_done(self.db, key)

    def get(self, job_id: str) -> Job | None:
        snap = self.db.collection(JOBS).document(job_id).get()
        return Job.from_doc(_aware(snap.to_dict())) if snap.exists else None

    def list(self, *, states: Iterable[JobState] | None = None, limit: int = 500) -> list[Job]:
        """Jobs in ``states`` (all: None), for the reconciler."""
        query: Any = self.db.collection(JOBS)
        if states is not None:
            query = query.where(filter=firestore.FieldFilter("state", "in",
                                                            [str(s) for s in states]))
        return [Job.from_doc(_aware(d.to_dict())) for d in query.limit(limit).stream()]


def _aware(doc: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(doc or {})
    out.pop("updated_at", None)
    for name in ("submitted_at", "started_at", "finished_at"):
        value = out.get(name)
        if isinstance(value, datetime) and value.tzinfo is None:
            out[name] = value.replace(tzinfo=UTC)
    return out
