"""What the access proxy reads about agent sandboxes: ``sandboxes/{id}``, the sandbox
handler's ledger outcome of a request, and the patch and log in Cloud Storage
(``functions.proxy.ports.SandboxResults``). Read only: the proxy requests a sandbox by
publishing sandbox.requested, like every other front door.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import firestore

from events import Event
from functions.ports import ledger_key
from functions.routes import consumer_of


class FirestoreSandboxResults:
    def __init__(self, db: firestore.Client, storage: Callable[[], Any]) -> None:
        self.db = db
        self._storage = storage
        self._gcs: Any = None
        self._lock = threading.Lock()

    def sandbox(self, sandbox_id: str) -> Mapping[str, Any] | None:
        snap = self.db.collection("sandboxes").document(sandbox_id).get()
        return snap.to_dict() if snap.exists else None

    def list_sandboxes(self, team: str, requester: str,
                       limit: int = 50) -> list[Mapping[str, Any]]:
        query = (self.db.collection("sandboxes")
                 .where(filter=firestore.FieldFilter("team", "==", team))
                 .where(filter=firestore.FieldFilter("requester", "==", requester)))
        return [d.to_dict() or {} for d in query.limit(limit).stream()]

    def request_outcome(self, event: Event[Any]) -> Mapping[str, Any] | None:
        snap = self.db.collection("processed").document(
            ledger_key(consumer_of(event.name), event)).get()
        if not snap.exists:
            return None
        outcome: Mapping[str, Any] | None = (snap.to_dict() or {}).get("outcome")
        return outcome or None

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]:
        if not uri.startswith("gs://"):
            raise ValueError(f"not a Cloud Storage URI: {uri}")
        bucket, _, name = uri[len("gs://"):].partition("/")
        blob = self._client().bucket(bucket).blob(name)
        if tail:
            blob.reload()
            start = max(0, int(blob.size or 0) - limit)
            data: bytes = blob.download_as_bytes(start=start) if blob.size else b""
            return data, start > 0
        data = blob.download_as_bytes(start=0, end=limit)  # end is inclusive: one byte more
        return data[:limit], len(data) > limit

    def _client(self) -> Any:
        with self._lock:
            if self._gcs is None:
                self._gcs = self._storage()
            return self._gcs
