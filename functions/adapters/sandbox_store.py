"""Sandboxes in Firestore: ``sandboxes/{id}`` and ``sandbox_queues/{team}``, read outside
the transactions that change them.

Admission, completion, suspension and resume are each ONE transaction of the ledger
(``FirestoreStore.transact``): the ledger entry, the sandbox document(s), the team's queue
document and the audit entry commit together or not at all (``functions.handlers.sandboxes``
says what each one reads and writes). The queue document holds the ids running and
waiting, in order: the concurrency counter is ``len(running)``, a queue position is an
index, and admitting or promoting reads and writes one small document. It is kept apart
from ``teams/{team}`` so that sandbox churn never contends with workspace admission on the
team document.

The policy is the ``sandboxes`` section of ``catalog/current`` (the applied admin config),
read inside the transaction so a decision and the policy it used are consistent.
"""

from __future__ import annotations

from typing import Any

from google.cloud import firestore

from functions.adapters.firestore_store import aware
from functions.domain.sandboxes import Sandbox, SandboxState

SANDBOXES = "sandboxes"


class FirestoreSandboxStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    def get(self, sandbox_id: str) -> Sandbox | None:
        snap = self.db.collection(SANDBOXES).document(sandbox_id).get()
        return Sandbox.from_doc(aware(snap.to_dict())) if snap.exists else None

    def list(self, *, team: str | None = None, states: tuple[SandboxState, ...] | None = None,
             limit: int = 200) -> list[Sandbox]:
        query: Any = self.db.collection(SANDBOXES)
        if team:
            query = query.where(filter=firestore.FieldFilter("team", "==", team))
        if states:
            query = query.where(filter=firestore.FieldFilter("state", "in",
                                                            [str(s) for s in states]))
        return [Sandbox.from_doc(aware(d.to_dict())) for d in query.limit(limit).stream()]
