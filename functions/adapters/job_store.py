"""Scale-out jobs in Firestore: ``jobs/{id}``, read outside the transactions that change it.

Admitting a job (job.submitted) and ending it (job.finished) are each ONE transaction of the
ledger (``FirestoreStore.transact``, decided in ``functions.handlers.jobs``): the job, the
team's usage counters, an audit entry and the ledger entry are written together or not at
all, so two jobs of a team admitted at the same time can never both take its last TPU chips
(Firestore retries the loser against the winner's usage), and a redelivered event has one
effect. A team's admissions run one at a time in one instance (the team's lock), as for
workspaces.

What the runtime must do afterwards (start a kubernetes job's JobSet, delete it once the
job ended) is the ledger entry's outbox, written in the same transaction: the entry stays
``pending`` until the handler sent it, and a redelivered event finds it pending and sends
it again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.cloud import firestore

from functions.adapters.firestore_store import aware
from functions.domain.jobs import Job, JobState

JOBS = "jobs"


class FirestoreJobStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    def get(self, job_id: str) -> Job | None:
        snap = self.db.collection(JOBS).document(job_id).get()
        return Job.from_doc(aware(snap.to_dict())) if snap.exists else None

    def list(self, *, states: Iterable[JobState] | None = None, limit: int = 500) -> list[Job]:
        """Jobs in ``states`` (all: None), for the reconciler."""
        query: Any = self.db.collection(JOBS)
        if states is not None:
            query = query.where(filter=firestore.FieldFilter("state", "in",
                                                            [str(s) for s in states]))
        return [Job.from_doc(aware(d.to_dict())) for d in query.limit(limit).stream()]
