"""Firestore reads and writes of the fleet-wide jobs: the idle sweep, the janitor, the cost
rollup. The lifecycle's own transitions stay in ``firestore_store``.

Reads are queries on indexed fields, never a scan of everything: the idle sweep reads the
workspaces with ``state == RUNNING`` (a single-field index, automatic in Firestore), the
rollup reads one team's audit entries since the first of the month and, rarely, one
workspace's entries before it (both declared in :data:`QUERIES`: composite indexes).
Writes happen only when something changes: an expired snapshot (record and team counter in
one transaction) and a rollup whose figures moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from google.cloud import firestore

from functions.adapters.firestore_query import declared
from functions.adapters.firestore_store import workspace_from_doc
from functions.domain.lifecycle import State, Workspace
from functions.domain.retention import SnapshotRecord, SnapshotStatus, unshared_bytes
from functions.queries import IndexedQuery

#: The queries of this store that need a composite index (``deploy/indexes.py``).
AUDIT_SINCE = IndexedQuery("audit", equal=("team",), ranges=("time",))
AUDIT_BEFORE = IndexedQuery("audit", equal=("target",), ranges=("time",),
                            order=(("time", "desc"),))
QUERIES = (AUDIT_SINCE, AUDIT_BEFORE)
_AUDIT_FIELDS = ["target", "action", "outcome", "time", "actor"]

_WORKSPACE_FIELDS = [f.name for f in dataclasses.fields(Workspace)]
_REQUIRED_FIELDS = [f.name for f in dataclasses.fields(Workspace)
                    if f.default is dataclasses.MISSING]
_ROLLUP_VOLATILE = ("computed_at", "hours_elapsed")


class FleetStore:
    def __init__(self, client: firestore.Client) -> None:
        self.db = client

    # --- workspaces -------------------------------------------------------------------------
    def workspaces_in(self, states: Iterable[State],
                      fields: Iterable[str] | None = None) -> list[Workspace]:
        """Every workspace in one of ``states`` (an ``==``/``in`` query on the indexed
        ``state``, streamed: no limit, no scan of the other states). ``fields``: only these
        (plus what a Workspace needs) are fetched; the rest keep their defaults."""
        wanted = [str(s) for s in states]
        op, value = ("==", wanted[0]) if len(wanted) == 1 else ("in", wanted)
        mask = (_WORKSPACE_FIELDS if fields is None
                else sorted({*_REQUIRED_FIELDS, "state", *fields}))
        query = self.db.collection("workspaces").where(
            filter=firestore.FieldFilter("state", op, value)).select(mask)
        return [workspace_from_doc(d.to_dict()) for d in query.stream()]

    def workspaces(self, team: str | None = None) -> list[Workspace]:
        """Every workspace (of one team), DELETED ones included."""
        query: Any = self.db.collection("workspaces")
        if team:
            query = query.where(filter=firestore.FieldFilter("team", "==", team))
        return [workspace_from_doc(d.to_dict())
                for d in query.select(_WORKSPACE_FIELDS).stream()]

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        snap = self.db.collection("workspaces").document(workspace_id).get()
        return workspace_from_doc(snap.to_dict()) if snap.exists else None

    # --- teams --------------------------------------------------------------------------------
    def teams(self) -> dict[str, dict[str, Any]]:
        return {d.id: d.to_dict() or {} for d in self.db.collection("teams").stream()}

    # --- snapshots ----------------------------------------------------------------------------
    def snapshot_records(self, team: str | None = None) -> list[SnapshotRecord]:
        query: Any = self.db.collection("snapshots")
        if team:
            query = query.where(filter=firestore.FieldFilter("team", "==", team))
        return [SnapshotRecord.from_doc(d.id, d.to_dict() or {}) for d in query.stream()]

    def snapshot_record(self, snapshot_id: str) -> SnapshotRecord | None:
        snap = self.db.collection("snapshots").document(snapshot_id).get()
        return SnapshotRecord.from_doc(snap.id, snap.to_dict() or {}) if snap.exists else None

    def expire_snapshot(self, snapshot_id: str, *, reason: str, message: str, now: datetime,
                        guard: Any = None) -> int:
        """Mark a live record expired and release its bytes from its team's usage counter,
        in ONE transaction; returns the bytes released (0: it was not live, or ``guard``
        refused). Only the bytes no other live record of the workspace holds are released
        (parts are shared); the siblings are read in the same transaction, as the
        lifecycle reads them when it records a snapshot. ``guard(record, workspace) -> str
        | None`` is checked inside the transaction, on the documents it will change."""
        record_ref = self.db.collection("snapshots").document(snapshot_id)

        @firestore.transactional
        def run(transaction: Any) -> int:
            snap = record_ref.get(transaction=transaction)
            if not snap.exists:
                return 0
            record = SnapshotRecord.from_doc(snap.id, snap.to_dict() or {})
            if not record.live:
                return 0
            team_ref = self.db.collection("teams").document(record.team)
            team = team_ref.get(transaction=transaction)
            if guard is not None:
                ws_snap = self.db.collection("workspaces").document(
                    record.workspace_id).get(transaction=transaction)
                ws = workspace_from_doc(ws_snap.to_dict()) if ws_snap.exists else None
                if guard(record, ws) is not None:
                    return 0
            siblings = self.db.collection("snapshots").where(filter=firestore.FieldFilter(
                "workspace", "==", record.workspace_id)).stream(transaction=transaction)
            released = unshared_bytes(record, [SnapshotRecord.from_doc(d.id, d.to_dict() or {})
                                               for d in siblings])
            transaction.update(record_ref, {
                "status": str(SnapshotStatus.EXPIRED), "expired_at": now,
                "expired_reason": reason, "expired_message": message})
            if team.exists:
                usage = (team.to_dict() or {}).get("usage") or {}
                held = int(usage.get("snapshot_bytes", 0))
                transaction.update(team_ref, {
                    "usage.snapshot_bytes": max(0, held - released)})
            return released

        result: int = run(self.db.transaction(max_attempts=8))
        return result

    # --- audit (cost history) -----------------------------------------------------------------
    def audit_since(self, team: str, start: datetime) -> list[dict[str, Any]]:
        query = declared(self.db, AUDIT_SINCE, (("team", "==", team), ("time", ">=", start)))
        return [d.to_dict() or {} for d in query.select(_AUDIT_FIELDS).stream()]

    def audit_before(self, workspace_id: str, before: datetime,
                     limit: int = 20) -> list[dict[str, Any]]:
        """A workspace's latest audit entries before ``before``, newest first."""
        query = declared(self.db, AUDIT_BEFORE,
                         (("target", "==", workspace_id), ("time", "<", before)))
        return [d.to_dict() or {} for d in query.select(_AUDIT_FIELDS).limit(limit).stream()]

    # --- cost rollups -------------------------------------------------------------------------
    def get_rollup(self, team: str) -> dict[str, Any] | None:
        snap = self.db.collection("costs").document(team).get()
        return snap.to_dict() if snap.exists else None

    def put_rollup(self, team: str, doc: dict[str, Any]) -> bool:
        """Write ``costs/{team}`` unless only its timestamps would change; True if written."""
        ref = self.db.collection("costs").document(team)
        current = ref.get()
        if current.exists and _same_figures(current.to_dict() or {}, doc):
            return False
        ref.set(doc)
        return True


def _same_figures(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def strip(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc.items() if k not in _ROLLUP_VOLATILE}

    return strip(a) == strip(b)
