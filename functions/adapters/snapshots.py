"""Snapshot objects in Cloud Storage and their records in Firestore (the control plane's side).

The node agent writes snapshots; the control plane only deletes them: the partial objects of
a failed snapshot, an orphan, and every snapshot of a deleted workspace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from datetime import UTC, datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore, storage

from functions.domain.retention import (
    SNAPSHOT_ROOT,
    StoredSnapshot,
    parse_object_name,
)


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
            if record.get("status", "ready") != "ready":
                continue  # expired or deleted already: its bytes were released then
            self._delete_prefix(self.prefix(workspace_id, doc.id))
            doc.reference.update({"status": "deleted", "deleted_at": datetime.now(UTC)})
            released += int(record.get("bytes", 0))
        return released

    def _delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix`` (one already gone is fine); how many."""
        bucket = self.gcs.bucket(self.bucket)
        blobs = list(self.gcs.list_blobs(bucket, prefix=prefix))
        for blob in blobs:
            with contextlib.suppress(gexc.NotFound):
                blob.delete()
        return len(blobs)

    # --- the janitor's view -------------------------------------------------------------
    def stored(self) -> list[StoredSnapshot]:
        """Every snapshot prefix under ``snapshots/`` with its object count, bytes and
        newest write (one listing of the bucket; objects elsewhere are not ours)."""
        found: dict[tuple[str, str, str], StoredSnapshot] = {}
        try:
            blobs = list(self.gcs.list_blobs(self.gcs.bucket(self.bucket),
                                             prefix=SNAPSHOT_ROOT + "/"))
        except gexc.NotFound:
            return []
        for blob in blobs:
            key = parse_object_name(blob.name)
            if key is None:
                continue
            seen = found.get(key) or StoredSnapshot(*key)
            updated = blob.updated
            newest = max((t for t in (seen.updated, updated) if t is not None), default=None)
            found[key] = dataclasses.replace(seen, objects=seen.objects + 1,
                                             bytes=seen.bytes + int(blob.size or 0),
                                             updated=newest)
        return sorted(found.values(), key=lambda s: s.prefix)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under one snapshot prefix; returns how many. Refuses a
        prefix that is not one snapshot's (it would empty much more)."""
        if parse_object_name(prefix.rstrip("/") + "/x") is None or prefix.count("/") != 4:
            raise ValueError(f"{prefix!r} is not a snapshot prefix "
                             "(snapshots/<team>/<workspace>/<snapshot>/)")
        return self._delete_prefix(prefix)
