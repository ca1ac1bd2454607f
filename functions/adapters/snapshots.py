"""Snapshot objects in Cloud Storage and their records in Firestore (the control plane's side).

The node agent writes snapshots; the control plane only deletes them: the partial objects of
a failed snapshot, an orphan, every snapshot of a deleted workspace, and the parts of a
workspace's pool that no snapshot uses any more (``functions.domain.retention`` decides
which; a part is deleted only at the generation the listing saw, so one written again
since, by a capture that needs it, stays).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from datetime import UTC, datetime

from google.api_core import exceptions as gexc
from google.cloud import firestore, storage

from functions.domain.retention import (
    SNAPSHOT_ROOT,
    SnapshotRecord,
    SnapshotStatus,
    StoredPart,
    StoredSnapshot,
    held_bytes,
    parse_object_name,
    parse_part_name,
    stored_key,
    workspace_root,
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

    def discard_all(self, workspace_id: str, *, by: str) -> int:
        """Delete every object of the workspace's snapshots (its part pool too) and mark
        its live records deleted ``by`` (the id of the event whose decision deletes them);
        returns the bytes to release (shared parts once).

        The records already marked deleted by the same event count again: a redelivery
        after a crash between this and the release of the bytes must release them, not 0
        (the chaos test found 36 bytes counted for good so). Records another event deleted
        (an earlier workspace of the same name) released theirs then."""
        docs = list(self.db.collection("snapshots").where(
            filter=firestore.FieldFilter("workspace", "==", workspace_id)).stream())
        mine = []
        for doc in docs:
            data = doc.to_dict() or {}
            record = SnapshotRecord.from_doc(doc.id, data)
            if record.live:
                mine.append((doc, record))
            elif record.status == SnapshotStatus.DELETED and data.get("deleted_by") == by:
                mine.append((doc, dataclasses.replace(record, status=SnapshotStatus.READY)))
        released = sum(held_bytes([record for _, record in mine]).values())
        self._delete_prefix(workspace_root(workspace_id))
        for _doc, record in mine:  # a Pod Snapshot's objects are under GKE's own path
            if record.method == "pod":
                self._delete_prefix(record.prefix)
        for doc, _record in mine:
            doc.reference.update({"status": SnapshotStatus.DELETED.value, "deleted_by": by,
                                  "deleted_at": datetime.now(UTC)})
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
        """Every snapshot prefix under ``snapshots/``: ``inventory()[0]``."""
        return self.inventory()[0]

    def inventory(self) -> tuple[list[StoredSnapshot], list[StoredPart]]:
        """Every snapshot prefix under ``snapshots/`` with its object count, bytes and
        newest write, and every part of the workspaces' pools, from one listing of the
        bucket (objects elsewhere are not ours)."""
        return self._inventory(SNAPSHOT_ROOT + "/")

    def parts(self, workspace_id: str) -> list[StoredPart]:
        """The parts of one workspace's pool, with their generations."""
        return self._inventory(f"{workspace_root(workspace_id)}_parts/")[1]

    def delete_parts(self, parts: list[StoredPart]) -> int:
        """Delete pool parts, each only at the generation listed (a part written again
        since, by a capture that needs it, is kept); returns how many were deleted."""
        bucket = self.gcs.bucket(self.bucket)
        deleted = 0
        for part in parts:
            try:
                bucket.blob(part.name).delete(if_generation_match=part.generation)
                deleted += 1
            except (gexc.NotFound, gexc.PreconditionFailed):
                continue
        return deleted

    def _inventory(self, prefix: str) -> tuple[list[StoredSnapshot], list[StoredPart]]:
        found: dict[tuple[str, str, str], StoredSnapshot] = {}
        parts: list[StoredPart] = []
        try:
            blobs = list(self.gcs.list_blobs(self.gcs.bucket(self.bucket), prefix=prefix))
        except gexc.NotFound:
            return [], []
        for blob in blobs:
            owner = parse_part_name(blob.name)
            if owner is not None:
                parts.append(StoredPart(*owner, name=blob.name, bytes=int(blob.size or 0),
                                        updated=blob.updated, generation=blob.generation))
                continue
            parsed = stored_key(blob.name)
            if parsed is None:
                continue
            team, ws_id, snapshot_id, pod = parsed
            key = (team, ws_id, snapshot_id)
            seen = found.get(key) or StoredSnapshot(team, ws_id, snapshot_id, object_prefix=pod)
            updated = blob.updated
            newest = max((t for t in (seen.updated, updated) if t is not None), default=None)
            found[key] = dataclasses.replace(seen, objects=seen.objects + 1,
                                             bytes=seen.bytes + int(blob.size or 0),
                                             updated=newest)
        return sorted(found.values(), key=lambda s: s.prefix), parts

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under one snapshot prefix; returns how many. Refuses a
        prefix that is not one snapshot's (it would empty much more)."""
        if parse_object_name(prefix.rstrip("/") + "/x") is None or prefix.count("/") != 4:
            raise ValueError(f"{prefix!r} is not a snapshot prefix "
                             "(snapshots/<team>/<workspace>/<snapshot>/)")
        return self._delete_prefix(prefix)
