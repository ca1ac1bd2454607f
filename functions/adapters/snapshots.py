"""Snapshot objects in Cloud Storage and their records in Firestore (the control plane's side).

The node agent writes snapshots; the control plane only deletes them: the partial objects of
a failed snapshot, an orphan, and every snapshot of a deleted workspace.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from google.cloud import firestore, storage


def storage_client(project: str) -> storage.Client:
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client.create_anonymous_client()
    return storage.Client(project=project)


class SnapshotStore:
    def __init__(self, db: firestore.Client, gcs: storage.Client, bucket: str) -> None:
        self.db = db
        self.gcs = gcs
        self.bucket = bucket

    def prefix(self, workspace_id: str, snapshot_id: str) -> str:
        team = workspace_id.split("--")[0]
        return f"snapshots/{team}/{workspace_id}/{snapshot_id}/"

    def discard(self, workspace_id: str, snapshot_id: str) -> None:
        self._delete_prefix(self.prefix(workspace_id, snapshot_id))

    def discard_all(self, workspace_id: str) -> int:
        released = 0
        docs = self.db.collection("snapshots").where(
            filter=firestore.FieldFilter("workspace", "==", workspace_id)).stream()
        for doc in docs:
            record: dict[str, Any] = doc.to_dict() or {}
            if record.get("status") == "deleted":
                continue
            self._delete_prefix(self.prefix(workspace_id, doc.id))
            doc.reference.update({"status": "deleted", "deleted_at": datetime.now(UTC)})
            released += int(record.get("bytes", 0))
        return released

    def _delete_prefix(self, prefix: str) -> None:
        bucket = self.gcs.bucket(self.bucket)
        for blob in list(self.gcs.list_blobs(bucket, prefix=prefix)):
            blob.delete()
