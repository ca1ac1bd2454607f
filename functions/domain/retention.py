"""Snapshot retention and orphans: which snapshots expire, which objects or records lost
their other half. Pure; the janitor passes the records, the workspaces, what Cloud Storage
holds, the catalog and ``now``.

Retention, per team and profile (``Catalog.retention_for``: the profile's retention with
the team's override), first reason wins for each snapshot record:

1. ``workspace_deleted``: its workspace is gone and the policy deletes snapshots with it
   (they normally go with the workspace; this catches a deletion that died half-way).
2. protected: the current (or pending) snapshot of a workspace that is not DELETED is never
   expired. It is what resume restores: expiring it would silently turn a pause into a
   loss. It still counts towards ``keep_last`` and the team's bytes.
3. ``max_age``: past ``expires_at`` (the Firestore TTL field, set when the snapshot was
   recorded) or past ``created_at + max_age_days`` under today's policy, whichever is
   earlier, so an admin who shortens retention is obeyed at once.
4. ``keep_last``: beyond the newest ``keep_last`` of its workspace.
5. ``team_bytes``: the team still holds more snapshot bytes than its ``snapshot_bytes``
   quota: its oldest unprotected snapshots expire until it fits. What cannot be freed
   (only protected snapshots are left) is reported as ``over_cap``.

Shared parts: a ``kernel`` snapshot's data lives in its workspace's part pool
(``snapshots/<team>/<workspace>/_parts/<digest>``), where the snapshots of that workspace
share every part whose bytes did not change; the record lists the parts it uses. So a
workspace holds the *distinct* bytes of its live records' parts, and that is what its team
is charged (:func:`unshared_bytes` when a record is added or expires, :func:`held_bytes`
in total); a record of the older format (no part list) holds its own ``bytes``. A part is
deleted only when no live record uses it (:func:`deletable_parts`) and it was last written
more than ``ORPHAN_MIN_AGE`` ago: a capture in progress writes every part it does not take
from its base again (the base is the workspace's current snapshot, which cannot expire
while it is), so a part it relies on is either referenced, or fresh. Deletions carry the
generation the listing saw, so a part written again since is not deleted.

Orphans, both ways (:func:`find_orphans`): objects under ``snapshots/<team>/<workspace>/
<snapshot>/`` with no live record (never recorded, or a deletion that stopped half-way), and
live records whose objects (manifest or parts) are gone.

GKE Pod Snapshots (method ``pod``) are written where the team's PodSnapshotStorageConfig
says, ``snapshots/<team>/pod/``, each under its own directory: the PodSnapshot's
``status.storageStatus.gcs.observedGCSPath``, which is the record's ``uri``. A pod record's
objects (:attr:`SnapshotRecord.prefix`) are there, measured there (its ``bytes``), expired
and deleted there, and objects in that tree no live record points at are orphans like any
other (:func:`stored_key` reads both layouts). Objects younger than ``ORPHAN_MIN_AGE`` and the
snapshot a PAUSING workspace is writing are never orphans: the record of a snapshot is
written after its objects. A protected record whose objects are gone is not expired but
reported as ``unresumable``: an admin has to decide (the owner cannot resume it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from events.payloads import WORKSPACE_SEPARATOR
from functions.domain.catalog import Catalog, Retention, human_bytes
from functions.domain.lifecycle import State, Workspace

#: Objects and records younger than this are never orphans (a snapshot being written).
ORPHAN_MIN_AGE = timedelta(hours=1)
SNAPSHOT_ROOT = "snapshots"
#: The folder of a workspace's shared parts (``runtime.snapshot.layout.POOL``).
PART_POOL = "_parts"
_OLDEST = datetime.min.replace(tzinfo=UTC)


class SnapshotStatus(StrEnum):
    READY = "ready"
    #: Retention expired it (or its objects were found gone); objects deleted, bytes released.
    EXPIRED = "expired"
    #: Deleted with its workspace.
    DELETED = "deleted"


class ExpiryReason(StrEnum):
    """Why a snapshot expires; str values so a typo is a NameError, not a new reason."""

    WORKSPACE_DELETED = "workspace_deleted"
    MAX_AGE = "max_age"
    KEEP_LAST = "keep_last"
    TEAM_BYTES = "team_bytes"
    OBJECTS_MISSING = "objects_missing"


@dataclass(frozen=True)
class SnapshotRecord:
    """A ``snapshots/{id}`` document, as retention sees it."""

    id: str
    workspace_id: str
    team: str
    bytes: int = 0
    created_at: datetime | None = None
    expires_at: datetime | None = None
    status: str = SnapshotStatus.READY
    profile: str | None = None
    uri: str | None = None
    #: When it stopped using storage (expired or deleted); None while live.
    ended_at: datetime | None = None
    #: The pool parts it uses, ``{name under the workspace's folder: bytes}``; None for a
    #: record of the older format, whose objects are its own and weigh ``bytes``.
    parts: Mapping[str, int] | None = None
    manifest_sha256: str | None = None
    #: ``kernel`` (the kernel agent's layout) or ``pod`` (GKE's, under ``uri``).
    method: str = "kernel"

    @property
    def live(self) -> bool:
        """Its objects are meant to exist and its bytes are counted in the team's usage."""
        return self.status == SnapshotStatus.READY

    @property
    def prefix(self) -> str:
        """Where its objects are: a Pod Snapshot's directory (its ``uri``), else the
        kernel agent's ``snapshots/<team>/<workspace>/<snapshot>/``."""
        if self.method == "pod" and self.uri:
            found = pod_prefix(self.uri)
            if found is not None:
                return found
        return snapshot_prefix(self.workspace_id, self.id)

    def units(self) -> dict[str, int]:
        """What it holds in storage, ``{object name: bytes}``: its parts, or its whole
        folder as one unit (older format)."""
        if self.parts is None:
            return {self.prefix: self.bytes}
        root = workspace_root(self.workspace_id)
        return {root + name: int(size) for name, size in self.parts.items()}

    @classmethod
    def from_doc(cls, snapshot_id: str, doc: Mapping[str, Any]) -> SnapshotRecord:
        ws_id = str(doc.get("workspace") or "")
        return cls(id=snapshot_id, workspace_id=ws_id,
                   team=str(doc.get("team") or ws_id.split(WORKSPACE_SEPARATOR)[0]),
                   bytes=int(doc.get("bytes") or 0), created_at=_aware(doc.get("created_at")),
                   expires_at=_aware(doc.get("expires_at")),
                   status=str(doc.get("status") or SnapshotStatus.READY),
                   profile=doc.get("profile"), uri=doc.get("uri"),
                   ended_at=_aware(doc.get("expired_at") or doc.get("deleted_at")),
                   parts=doc.get("parts"), manifest_sha256=doc.get("manifest_sha256"),
                   method=str(doc.get("method") or "kernel"))


@dataclass(frozen=True)
class StoredSnapshot:
    """What Cloud Storage holds under one snapshot's prefix."""

    team: str
    workspace_id: str
    snapshot_id: str
    objects: int = 0
    bytes: int = 0
    #: When the newest of its objects was written.
    updated: datetime | None = None
    #: A Pod Snapshot's directory (``snapshots/<team>/pod/<dir>/``; its workspace is not
    #: in the name); None: the kernel agent's layout.
    object_prefix: str | None = None

    @property
    def prefix(self) -> str:
        return self.object_prefix or snapshot_prefix(self.workspace_id, self.snapshot_id)


@dataclass(frozen=True)
class StoredPart:
    """One object of a workspace's part pool, as the listing saw it."""

    team: str
    workspace_id: str
    name: str
    bytes: int = 0
    updated: datetime | None = None
    #: The object's generation when listed: a deletion is conditional on it.
    generation: int | None = None


@dataclass(frozen=True)
class Expiry:
    record: SnapshotRecord
    reason: ExpiryReason
    message: str


@dataclass(frozen=True)
class Kept:
    """A snapshot the policy would expire, kept because a workspace still needs it."""

    record: SnapshotRecord
    would_be: ExpiryReason
    why: str


@dataclass
class RetentionPlan:
    expiries: list[Expiry] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    #: Teams still over their snapshot bytes after every allowed expiry: bytes over.
    over_cap: dict[str, int] = field(default_factory=dict)


@dataclass
class Orphans:
    #: Objects with no live record: deleted by ``stasis janitor --fix``.
    objects: list[StoredSnapshot] = field(default_factory=list)
    #: Live records whose objects are gone: expired (reason ``objects_missing``).
    records: list[Expiry] = field(default_factory=list)
    #: (workspace id, snapshot id): a workspace's current snapshot whose objects are gone.
    unresumable: list[tuple[str, str]] = field(default_factory=list)


def workspace_root(workspace_id: str) -> str:
    """``snapshots/<team>/<workspace>/``: every snapshot object of a workspace."""
    team = workspace_id.split(WORKSPACE_SEPARATOR)[0]
    return f"{SNAPSHOT_ROOT}/{team}/{workspace_id}/"


def snapshot_prefix(workspace_id: str, snapshot_id: str) -> str:
    """``snapshots/<team>/<workspace>/<snapshot>/``: where the runtime writes a snapshot."""
    return f"{workspace_root(workspace_id)}{snapshot_id}/"


def part_names(parts: Mapping[str, int], workspace_id: str) -> dict[str, int]:
    """``parts`` as a record keeps them: names relative to the workspace's folder (a
    manifest names them in full; a record of a few thousand parts stays small)."""
    root = workspace_root(workspace_id)
    return {name.removeprefix(root): int(size) for name, size in parts.items()}


#: The directory of a team's Pod Snapshots under ``snapshots/<team>/`` (the storage config's
#: path, ``functions.kubernetes.objects.podsnapshot``); no workspace id is this (ids are
#: ``<team>--<name>``).
POD_DIR = "pod"


def pod_prefix(uri: str) -> str | None:
    """The object prefix of a Pod Snapshot's ``gs://<bucket>/snapshots/<team>/pod/<dir>``,
    or None for a URI outside a team's Pod Snapshot tree."""
    path = uri.removeprefix("gs://").partition("/")[2].strip("/")
    parts = path.split("/")
    if len(parts) != 4 or parts[0] != SNAPSHOT_ROOT or parts[2] != POD_DIR or not all(parts):
        return None
    return path + "/"


def stored_key(name: str) -> tuple[str, str, str, str | None] | None:
    """(team, workspace id, snapshot id, Pod Snapshot prefix or None) of an object under
    ``snapshots/``: a Pod Snapshot's ``snapshots/<team>/pod/<dir>/...`` (no workspace, the
    directory as its id), else the kernel layout (:func:`parse_object_name`)."""
    parts = name.split("/")
    if len(parts) >= 5 and parts[0] == SNAPSHOT_ROOT and parts[2] == POD_DIR and \
            parts[1] and parts[3]:
        return parts[1], "", parts[3], "/".join(parts[:4]) + "/"
    found = parse_object_name(name)
    return (*found, None) if found is not None else None


def parse_object_name(name: str) -> tuple[str, str, str] | None:
    """(team, workspace id, snapshot id) of an object under ``snapshots/``, else None
    (a part of a workspace's pool is no snapshot's: :func:`parse_part_name`)."""
    parts = name.split("/")
    if len(parts) < 5 or parts[0] != SNAPSHOT_ROOT or not all(parts[1:4]):
        return None
    if parts[3] == PART_POOL:
        return None
    return parts[1], parts[2], parts[3]


def parse_part_name(name: str) -> tuple[str, str] | None:
    """(team, workspace id) of an object of a workspace's part pool, else None."""
    parts = name.split("/")
    if len(parts) != 5 or parts[0] != SNAPSHOT_ROOT or parts[3] != PART_POOL:
        return None
    return (parts[1], parts[2]) if all(parts[1:5]) else None


def deletes_with_workspace(catalog: Catalog, team: str, profile: str) -> bool:
    """Whether deleting a workspace deletes its snapshots (the default, and for a profile
    the catalog no longer has)."""
    if profile not in catalog.profiles:
        return True
    return catalog.retention_for(team, profile).delete_with_workspace


def protection(record: SnapshotRecord, ws: Workspace | None) -> str | None:
    """Why ``record`` must not expire, or None. A live workspace's current or pending
    snapshot is what its resume restores."""
    if ws is None or ws.state == State.DELETED:
        return None
    if record.id == ws.current_snapshot:
        return f"current snapshot of {ws.id} ({ws.state}), which resume restores"
    if record.id == ws.pending_snapshot:
        return f"snapshot {ws.id} is writing"
    return None


def may_expire(record: SnapshotRecord | None, ws: Workspace | None) -> str | None:
    """None if ``record`` may be expired now, else why not (the handler's last check)."""
    if record is None:
        return "no such snapshot record"
    if not record.live:
        return f"already {record.status}"
    return protection(record, ws)


def plan(records: Iterable[SnapshotRecord], workspaces: Mapping[str, Workspace],
         catalog: Catalog, now: datetime) -> RetentionPlan:
    """Every live snapshot that retention expires at ``now``, with its reason."""
    result = RetentionPlan()
    live = [r for r in records if r.live]
    expired: set[str] = set()

    def expire(record: SnapshotRecord, reason: ExpiryReason, message: str) -> None:
        ws = workspaces.get(record.workspace_id)
        why = protection(record, ws)
        if why is not None:
            result.kept.append(Kept(record, reason, why))
            return
        expired.add(record.id)
        result.expiries.append(Expiry(record, reason, message))

    by_workspace: dict[str, list[SnapshotRecord]] = defaultdict(list)
    for record in live:
        by_workspace[record.workspace_id].append(record)
    for ws_id, group in sorted(by_workspace.items()):
        group.sort(key=_oldest_first, reverse=True)  # newest first: rank 0 is kept first
        ws = workspaces.get(ws_id)
        for rank, record in enumerate(group):
            retention = _retention(catalog, record, ws)
            gone = ws is None or ws.state == State.DELETED
            if gone and (retention is None or retention.delete_with_workspace):
                expire(record, ExpiryReason.WORKSPACE_DELETED, f"workspace {ws_id} was deleted")
                continue
            deadline = _deadline(record, retention)
            if deadline is not None and now >= deadline:
                expire(record, ExpiryReason.MAX_AGE, _age_message(record, retention, now))
            elif retention is not None and rank >= retention.keep_last:
                expire(record, ExpiryReason.KEEP_LAST,
                       f"{ws_id} keeps its last {retention.keep_last}; this is number "
                       f"{rank + 1}")
    _cap_team_bytes(live, expired, workspaces, catalog, expire, result)
    return result


def find_orphans(records: Iterable[SnapshotRecord], stored: Iterable[StoredSnapshot],
                 workspaces: Mapping[str, Workspace], now: datetime,
                 min_age: timedelta = ORPHAN_MIN_AGE,
                 parts: Iterable[StoredPart] = ()) -> Orphans:
    """Objects without a live record, and live records without their objects (their
    folder, or one of the pool ``parts`` they use)."""
    result = Orphans()
    by_id = {r.id: r for r in records}
    by_prefix = {r.prefix: r for r in by_id.values() if r.live}
    pooled = {p.name for p in parts}
    present: set[str] = set()
    for snap in stored:
        record = by_prefix.get(snap.prefix)
        if record is not None:
            present.add(record.id)
            continue
        ws = workspaces.get(snap.workspace_id)
        if ws is not None and snap.snapshot_id == ws.pending_snapshot:
            continue  # being written: its record comes when the snapshot finishes
        if snap.updated is not None and now - snap.updated < min_age:
            continue
        result.objects.append(snap)
    for record in by_id.values():
        if not record.live:
            continue
        missing = [] if record.id in present else [record.prefix]
        if record.parts is not None:
            missing += [name for name in record.units() if name not in pooled]
        if not missing:
            continue
        if record.created_at is not None and now - record.created_at < min_age:
            continue
        ws = workspaces.get(record.workspace_id)
        if protection(record, ws) is not None:
            result.unresumable.append((record.workspace_id, record.id))
            continue
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        result.records.append(Expiry(record, ExpiryReason.OBJECTS_MISSING,
                                     f"no objects at {missing[0]}{more}"))
    return result


def _units_of_others(record: SnapshotRecord, others: Iterable[SnapshotRecord]) -> set[str]:
    return {name for other in others
            if other.live and other.id != record.id and other.workspace_id == record.workspace_id
            for name in other.units()}


def unshared_bytes(record: SnapshotRecord, others: Iterable[SnapshotRecord]) -> int:
    """Bytes of ``record``'s objects that no other live record of its workspace uses:
    what recording it adds to its team's usage, and what expiring it releases."""
    shared = _units_of_others(record, others)
    return sum(size for name, size in record.units().items() if name not in shared)


def held_bytes(records: Iterable[SnapshotRecord]) -> dict[str, int]:
    """Snapshot bytes each team holds according to its live records, each shared part
    counted once: what the usage counters should say."""
    units: dict[str, dict[str, int]] = defaultdict(dict)
    for record in records:
        if record.live:
            units[record.team].update(record.units())
    return {team: sum(found.values()) for team, found in units.items()}


def deletable_parts(parts: Iterable[StoredPart], records: Iterable[SnapshotRecord],
                    now: datetime, min_age: timedelta = ORPHAN_MIN_AGE) -> list[StoredPart]:
    """The pool parts no live record uses, last written more than ``min_age`` ago (a
    capture in progress writes the parts it needs again; see the module docstring)."""
    used = {name for record in records if record.live for name in record.units()}
    return [part for part in parts
            if part.name not in used
            and (part.updated is None or now - part.updated >= min_age)]


def _cap_team_bytes(live: list[SnapshotRecord], expired: set[str],
                    workspaces: Mapping[str, Workspace], catalog: Catalog,
                    expire: Any, result: RetentionPlan) -> None:
    remaining: dict[str, list[SnapshotRecord]] = defaultdict(list)
    for record in live:
        if record.id not in expired:
            remaining[record.team].append(record)
    for team_id, group in sorted(remaining.items()):
        team = catalog.teams.get(team_id)
        if team is None:
            continue
        cap = team.quotas.snapshot_bytes
        total = held_bytes(group).get(team_id, 0)
        left = list(group)
        for record in sorted(group, key=_oldest_first):
            if total <= cap:
                break
            if protection(record, workspaces.get(record.workspace_id)) is not None:
                continue
            freed = unshared_bytes(record, left)
            if freed == 0:
                continue  # every byte of it is used by another snapshot: nothing to gain
            expire(record, ExpiryReason.TEAM_BYTES,
                   f"team {team_id} holds {human_bytes(total)} of snapshots, more than its "
                   f"{human_bytes(cap)}; the oldest go first")
            left.remove(record)
            total -= freed
        if total > cap:
            result.over_cap[team_id] = total - cap


def _retention(catalog: Catalog, record: SnapshotRecord, ws: Workspace | None) -> Retention | None:
    profile = record.profile or (ws.profile if ws is not None else None)
    if profile is None or profile not in catalog.profiles:
        return None
    return catalog.retention_for(record.team, profile)


def _deadline(record: SnapshotRecord, retention: Retention | None) -> datetime | None:
    candidates = [record.expires_at] if record.expires_at is not None else []
    if retention is not None and record.created_at is not None:
        candidates.append(record.created_at + timedelta(days=retention.max_age_days))
    return min(candidates) if candidates else None


def _age_message(record: SnapshotRecord, retention: Retention | None, now: datetime) -> str:
    kept = f"; snapshots are kept {retention.max_age_days} days" if retention else ""
    if record.created_at is None:
        return f"past its expiry{kept}"
    return f"{(now - record.created_at).days} days old{kept}"


def _oldest_first(record: SnapshotRecord) -> tuple[datetime, str]:
    return (record.created_at or _OLDEST, record.id)


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


__all__ = [
    "ORPHAN_MIN_AGE",
    "PART_POOL",
    "Expiry",
    "ExpiryReason",
    "Kept",
    "Orphans",
    "RetentionPlan",
    "SnapshotRecord",
    "SnapshotStatus",
    "StoredPart",
    "StoredSnapshot",
    "deletable_parts",
    "deletes_with_workspace",
    "find_orphans",
    "held_bytes",
    "may_expire",
    "parse_object_name",
    "parse_part_name",
    "part_names",
    "plan",
    "pod_prefix",
    "protection",
    "snapshot_prefix",
    "stored_key",
    "unshared_bytes",
    "workspace_root",
]
