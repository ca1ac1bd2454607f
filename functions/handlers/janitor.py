"""The janitor: snapshot retention, orphans both ways, and processes without a workspace.

Runs on a schedule (Cloud Scheduler -> the ``janitor`` HTTP function, daily) and on demand
(``stasis janitor [--fix]``). It reads every workspace and snapshot record, lists the
snapshot objects once, asks the runtime what it runs, and acts on the pure plans of
``functions.domain.retention`` and ``functions.domain.reconcile``:

========= ================================================================================
mode      what it changes
========= ================================================================================
report    nothing (``stasis janitor``): what retention would expire, every orphan
policy    retention is enforced: each expiring snapshot becomes a snapshot.expired event
          (the scheduled run; Firestore TTL does not run on the emulator, and even on GCP
          it would drop the record without deleting objects or releasing bytes), and the
          pool parts no live snapshot uses any more are deleted
fix       policy, and orphans are repaired (``stasis janitor --fix``): objects without a
          live record are deleted, live records without objects expire (their bytes are
          released), servers without a live workspace are released
========= ================================================================================

snapshot.expired is handled by :func:`handle_expired`: check the record may go (it is not
the snapshot a live workspace resumes from), delete its folder (the manifest), mark the
record expired and release the bytes no other snapshot of the workspace shares from the
team's usage counter in one transaction, then delete the pool parts no live snapshot uses
(``retention.deletable_parts``: not those written in the last hour, which a capture in
progress may need). Each step is idempotent, so a redelivery finishes what a crash
interrupted; parts left behind are the next janitor pass's.

Servers without a live workspace come from the reconciler's own plan
(``functions.domain.reconcile.plan``, its release repairs): one rule, two callers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from events import Event, InvalidEvent, SnapshotExpired, new_event
from functions.domain import reconcile, retention
from functions.domain.retention import Expiry, ExpiryReason, SnapshotRecord
from functions.handlers.deps import Deps
from functions.ports import RuntimeUnavailable

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/janitor"
MODES = ("report", "policy", "fix")


def run(deps: Deps, *, mode: str = "report") -> dict[str, Any]:
    """One pass; returns the report (JSON-ready) of what was found and what was done."""
    if mode not in MODES:
        raise ValueError(f"unknown janitor mode {mode!r}: one of {', '.join(MODES)}")
    assert deps.fleet is not None, "the janitor needs deps.fleet"
    started = time.monotonic()
    now = deps.clock()
    catalog = deps.catalog()
    workspaces = {ws.id: ws for ws in deps.fleet.workspaces()}
    records: list[SnapshotRecord] = deps.fleet.snapshot_records()
    stored, parts = deps.snapshots.inventory()
    expiring = retention.plan(records, workspaces, catalog, now)
    orphans = retention.find_orphans(records, stored, workspaces, now, parts=parts)
    unused = retention.deletable_parts(parts, records, now)
    errors: list[str] = []
    try:
        views = {s.workspace_id: reconcile.RuntimeView(s.running, s.operation)
                 for s in deps.runtime.list()}
        processes = [r for r in reconcile.plan(workspaces.values(), views, now).repairs
                     if r.release]
    except RuntimeUnavailable as exc:
        processes = []
        errors.append(f"runtime: {exc}")
    done: dict[str, int] = {"expiry_events": 0, "objects_deleted": 0, "parts_deleted": 0,
                            "released": 0}
    if mode in ("policy", "fix"):
        done["expiry_events"] += _publish(deps, expiring.expiries, errors)
        done["parts_deleted"] += deps.snapshots.delete_parts(unused)
    if mode == "fix":
        done["expiry_events"] += _publish(deps, orphans.records, errors)
        for snap in orphans.objects:
            done["objects_deleted"] += deps.snapshots.delete_prefix(snap.prefix)
        for repair in processes:
            try:
                deps.runtime.release(repair.workspace_id)
                done["released"] += 1
            except RuntimeUnavailable as exc:
                errors.append(f"release {repair.workspace_id}: {exc}")
    counted = retention.held_bytes(records)
    by_workspace: dict[str, dict[str, int]] = {}
    for part in unused:
        summary = by_workspace.setdefault(part.workspace_id, {"parts": 0, "bytes": 0})
        summary["parts"] += 1
        summary["bytes"] += part.bytes
    teams = deps.fleet.teams()
    drift = {team: {"usage": int(((doc.get("usage") or {}).get("snapshot_bytes")) or 0),
                    "records": counted.get(team, 0)}
             for team, doc in sorted(teams.items())
             if int(((doc.get("usage") or {}).get("snapshot_bytes")) or 0)
             != counted.get(team, 0)}
    return {
        "mode": mode, "time": now.isoformat(),
        "expire": [_expiry(e) for e in expiring.expiries],
        "kept": [{"snapshot_id": k.record.id, "would_be": str(k.would_be), "why": k.why}
                 for k in expiring.kept],
        "over_cap": expiring.over_cap,
        "orphan_objects": [{"prefix": s.prefix, "objects": s.objects, "bytes": s.bytes}
                           for s in orphans.objects],
        "orphan_records": [_expiry(e) for e in orphans.records],
        # Pool parts no live snapshot uses (deleted in policy and fix modes).
        "unused_parts": by_workspace,
        "unresumable": [{"workspace_id": w, "snapshot_id": s} for w, s in orphans.unresumable],
        "orphan_processes": [{"workspace_id": r.workspace_id, "why": r.why} for r in processes],
        # Records and counters that disagree: reported only; the counters move in the
        # transactions of the lifecycle and of handle_expired, so a moment's disagreement
        # can be a deletion in flight.
        "usage_drift": drift,
        "done": done, "errors": errors,
        "seconds": round(time.monotonic() - started, 3),
    }


def handle_expired(event: Event[Any], deps: Deps, consumer: str) -> int:
    """snapshot.expired -> objects deleted, record marked, team bytes released; returns
    the bytes released (0 when there was nothing left to do or the snapshot must stay)."""
    assert deps.fleet is not None, "snapshot.expired needs deps.fleet"
    payload: SnapshotExpired = event.payload
    record = deps.fleet.snapshot_record(payload.snapshot_id)
    ws = deps.store.get_workspace(payload.workspace_id)
    if record is None:
        # Objects that never had a record: nothing to mark, nothing counted.
        if ws is None or payload.snapshot_id != ws.pending_snapshot:
            deps.snapshots.delete_prefix(retention.snapshot_prefix(payload.workspace_id,
                                                                   payload.snapshot_id))
        return 0
    refusal = retention.protection(record, ws)
    if refusal is not None:
        log.warning("snapshot.expired for %s refused: %s", record.id, refusal)
        return 0
    deps.snapshots.delete_prefix(record.prefix)
    forget = getattr(deps.runtime, "forget_snapshot", None)
    if record.method == "pod" and forget is not None:
        # GKE's PodSnapshot object goes with its objects, through the API.
        forget(record.workspace_id, record.id)
    released = deps.fleet.expire_snapshot(
        record.id, reason=payload.reason, message=_message(payload), now=deps.clock(),
        guard=retention.protection)
    if record.parts is not None:
        pool = deps.snapshots.parts(record.workspace_id)
        siblings = [r for r in deps.fleet.snapshot_records(record.team)
                    if r.workspace_id == record.workspace_id]
        deps.snapshots.delete_parts(retention.deletable_parts(pool, siblings, deps.clock()))
    log.info("snapshot %s expired (%s): %d bytes released", record.id, payload.reason, released)
    return released


def _publish(deps: Deps, expiries: list[Expiry], errors: list[str]) -> int:
    sent = 0
    for expiry in expiries:
        record = expiry.record
        event_id = f"expire-{record.id}"
        try:
            event = new_event(SnapshotExpired(
                snapshot_id=record.id, workspace_id=record.workspace_id, team=record.team,
                uri=record.uri or f"gs://{deps.snapshot_bucket}/{record.prefix}",
                bytes=record.bytes, reason=str(expiry.reason)),
                source=SOURCE, id=event_id, requestid=event_id)
        except InvalidEvent as exc:
            errors.append(f"snapshot {record.id}: {exc}")
            continue
        deps.bus.publish(event)
        sent += 1
    return sent


def _expiry(expiry: Expiry) -> dict[str, Any]:
    record = expiry.record
    return {"snapshot_id": record.id, "workspace_id": record.workspace_id, "team": record.team,
            "bytes": record.bytes, "reason": str(expiry.reason), "why": expiry.message}


def _message(payload: SnapshotExpired) -> str:
    try:
        return f"expired: {ExpiryReason(payload.reason)}"
    except ValueError:
        return f"expired: {payload.reason}"
