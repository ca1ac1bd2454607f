"""An in-memory Firestore for handler tests: the ledger, the stores, and recording runtimes.

:class:`MemoryDb` is one dict of documents; :class:`MemoryStore` is the ledger
(``functions.ports.Ledger``) and the workspace store over it, as
``functions.adapters.firestore_store.FirestoreStore`` is over Firestore, and
``tests/integration/test_ledger_contract.py`` runs the same checks against both, so the two
cannot drift. The sandbox, job and fleet stores read the same documents. The runtimes and
the snapshot store only record what they were asked (and refuse when told to).
:func:`handler_deps` wires them all into a ``Deps`` with a recording bus, cosmicpython's
``FakeUnitOfWork`` in the shape of this code base.

Importable from any test module (``tests/`` is on sys.path through its conftest).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.api_core.exceptions import NotFound

from events import Event, from_pubsub, to_pubsub
from functions.domain.catalog import Catalog
from functions.domain.jobs import Job, JobState
from functions.domain.lifecycle import Workspace
from functions.domain.retention import SnapshotRecord, SnapshotStatus, unshared_bytes
from functions.domain.sandboxes import RunSpec, Sandbox, SandboxState
from functions.handlers.deps import Deps
from functions.handlers.sandbox_ports import SandboxDeps
from functions.ports import (
    Committed,
    Entry,
    JobRun,
    Pending,
    RuntimeRefused,
    RuntimeStatus,
    Subject,
    WorkspaceSpec,
    ledger_key,
)
from runtime.local.publisher import RecordingPublisher

LEDGER = "processed"
LEDGER_TTL = timedelta(days=7)


def _stored(value: Any) -> Any:
    """A value as Firestore keeps it: tuples become lists, a naive time is UTC, nothing
    is shared."""
    if isinstance(value, Mapping):
        return {str(k): _stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stored(v) for v in value]
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return copy.deepcopy(value)


class MemoryDb:
    """Documents by (collection, id)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        doc = self.docs.get((collection, doc_id))
        return copy.deepcopy(doc) if doc is not None else None

    def put(self, collection: str, doc_id: str, data: Mapping[str, Any]) -> None:
        self.docs[(collection, doc_id)] = _stored(data)

    def collection(self, collection: str) -> dict[str, dict[str, Any]]:
        return {i: copy.deepcopy(d) for (c, i), d in self.docs.items() if c == collection}


class _MemoryTx:
    """``functions.ports.Tx``: reads see the documents as they were (never its own
    writes), writes wait for the commit, which fails whole, with Firestore's NotFound, when
    a document to update does not exist."""

    def __init__(self, db: MemoryDb) -> None:
        self.db = db
        self.writes: list[tuple[str, str, dict[str, Any], str]] = []

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return self.db.get(collection, doc_id)

    def set(self, collection: str, doc_id: str, data: dict[str, Any], *,
            merge: bool = False) -> None:
        self.writes.append((collection, doc_id, _stored(data), "merge" if merge else "set"))

    def update(self, collection: str, doc_id: str, fields: dict[str, Any]) -> None:
        self.writes.append((collection, doc_id, _stored(fields), "update"))

    def find(self, collection: str, field: str, value: Any) -> list[tuple[str, dict[str, Any]]]:
        return [(i, d) for i, d in self.db.collection(collection).items()
                if d.get(field) == value]

    def commit(self) -> None:
        """Apply the writes in order (an update may follow a set of the same document),
        all of them or none."""
        staged = dict(self.db.docs)
        for collection, doc_id, data, how in self.writes:
            key = (collection, doc_id or uuid.uuid4().hex)
            if how == "update" and key not in staged:
                raise NotFound(f"no document to update: {collection}/{doc_id}")
            staged[key] = data if how == "set" else {**staged.get(key, {}), **data}
        self.db.docs.clear()
        self.db.docs.update(staged)


class MemoryStore:
    """The ledger and the workspace store (``Deps.store``) over a :class:`MemoryDb`."""

    def __init__(self, db: MemoryDb | None = None) -> None:
        self.db = db or MemoryDb()
        #: How often a decide callback ran (a duplicate runs none).
        self.decisions = 0

    # --- the ledger -----------------------------------------------------------------------
    def transact(self, event: Event[Any], consumer: str, subject: Subject,
                 decide: Callable[[Any], Entry], *, now: datetime) -> Committed:
        key = ledger_key(consumer, event)
        stored = self.db.get(LEDGER, key)
        if stored is not None:
            return Committed(key, stored["status"] == "pending", list(stored["outbox"]))
        tx = _MemoryTx(self.db)
        self.decisions += 1
        entry = decide(tx)
        tx.commit()
        doc = {
            "consumer": consumer, "type": event.type, "event_id": event.id,
            "requestid": event.requestid, f"{subject.kind}_id": subject.id,
            "status": "pending" if entry.outbox else "done", "outbox": entry.outbox,
            "outcome": entry.outcome, "processed_at": now, "expire_at": now + LEDGER_TTL,
        }
        if entry.outbox:
            data, attributes = to_pubsub(event)
            doc["event"] = {"data": data.decode(), "attributes": attributes}
        self.db.put(LEDGER, key, doc)
        return Committed(key, bool(entry.outbox), _stored(entry.outbox), entry.decision)

    def mark_done(self, key: str) -> None:
        entry = self.db.docs[(LEDGER, key)]
        entry.update(status="done", outbox=[])
        entry.pop("event", None)

    def pending(self, *, limit: int = 200) -> list[Pending]:
        found = [Pending(key, doc["consumer"],
                         from_pubsub(doc["event"]["data"].encode(), doc["event"]["attributes"]),
                         doc["processed_at"])
                 for key, doc in self.db.collection(LEDGER).items()
                 if doc["status"] == "pending"]
        return sorted(found, key=lambda p: p.processed_at)[:limit]

    def entries(self) -> list[dict[str, Any]]:
        return list(self.db.collection(LEDGER).values())

    # --- workspaces, deliveries -------------------------------------------------------------
    def get_workspace(self, workspace_id: str) -> Workspace | None:
        doc = self.db.get("workspaces", workspace_id)
        return Workspace.from_doc(doc) if doc is not None else None

    def list_workspaces(self, *, team: str | None = None, states: Any = None,
                        limit: int = 500) -> list[Workspace]:
        wanted = {str(s) for s in states} if states is not None else None
        found = [Workspace.from_doc(d) for d in self.db.collection("workspaces").values()
                 if (team is None or d.get("team") == team)
                 and (wanted is None or d.get("state") in wanted)]
        return found[:limit]

    def put_workspace(self, ws: Workspace) -> None:
        self.db.put("workspaces", ws.id, ws.to_doc())

    def count_failure(self, message_id: str, consumer: str, reason: str,
                      now: datetime) -> int:
        key = f"{consumer}|{message_id}"
        doc = self.db.get("deliveries", key) or {"attempts": 0}
        self.db.put("deliveries", key, {**doc, "attempts": doc["attempts"] + 1,
                                        "last_reason": reason})
        return int(doc["attempts"]) + 1

    def audit(self, entry: Mapping[str, Any]) -> None:
        self.db.put("audit", f"audit-{len(self.db.collection('audit'))}", entry)


class MemorySandboxStore:
    def __init__(self, db: MemoryDb) -> None:
        self.db = db

    def get(self, sandbox_id: str) -> Sandbox | None:
        doc = self.db.get("sandboxes", sandbox_id)
        return Sandbox.from_doc(doc) if doc is not None else None

    def list(self, *, team: str | None = None, states: tuple[SandboxState, ...] | None = None,
             limit: int = 200) -> list[Sandbox]:
        wanted = {str(s) for s in states} if states else None
        return [Sandbox.from_doc(d) for d in self.db.collection("sandboxes").values()
                if (team is None or d["team"] == team)
                and (wanted is None or d["state"] in wanted)][:limit]


class MemoryJobStore:
    def __init__(self, db: MemoryDb) -> None:
        self.db = db

    def get(self, job_id: str) -> Job | None:
        doc = self.db.get("jobs", job_id)
        return Job.from_doc(doc) if doc is not None else None

    def list(self, *, states: Iterable[JobState] | None = None, limit: int = 500) -> list[Job]:
        wanted = {str(s) for s in states} if states is not None else None
        return [Job.from_doc(d) for d in self.db.collection("jobs").values()
                if wanted is None or d["state"] in wanted][:limit]


class MemoryFleet:
    """What the idle sweep and the janitor read and write (``functions.adapters.fleet_store``)."""

    def __init__(self, db: MemoryDb) -> None:
        self.db = db

    def workspaces_in(self, states: Any, fields: Any = None) -> list[Workspace]:
        wanted = {str(s) for s in states}
        return [Workspace.from_doc(d) for d in self.db.collection("workspaces").values()
                if d["state"] in wanted]

    def workspaces(self, team: str | None = None) -> list[Workspace]:
        return [Workspace.from_doc(d) for d in self.db.collection("workspaces").values()
                if team is None or d["team"] == team]

    def teams(self) -> dict[str, dict[str, Any]]:
        return self.db.collection("teams")

    def snapshot_records(self, team: str | None = None) -> list[SnapshotRecord]:
        return [SnapshotRecord.from_doc(i, d) for i, d in self.db.collection("snapshots").items()
                if team is None or d.get("team") == team]

    def snapshot_record(self, snapshot_id: str) -> SnapshotRecord | None:
        doc = self.db.get("snapshots", snapshot_id)
        return SnapshotRecord.from_doc(snapshot_id, doc) if doc is not None else None

    def expire_snapshot(self, snapshot_id: str, *, reason: str, message: str, now: datetime,
                        guard: Any = None) -> int:
        record = self.snapshot_record(snapshot_id)
        if record is None or not record.live:
            return 0
        ws_doc = self.db.get("workspaces", record.workspace_id)
        ws = Workspace.from_doc(ws_doc) if ws_doc is not None else None
        if guard is not None and guard(record, ws) is not None:
            return 0
        released = unshared_bytes(record, self.snapshot_records(record.team))
        self.db.docs[("snapshots", snapshot_id)].update(
            status=str(SnapshotStatus.EXPIRED), expired_at=now, expired_reason=reason,
            expired_message=message)
        team = self.db.docs.get(("teams", record.team))
        if team is not None:
            usage = team.setdefault("usage", {})
            usage["snapshot_bytes"] = max(0, int(usage.get("snapshot_bytes", 0)) - released)
        return released


class RecordingRuntime:
    """A workspace runtime that records what it is asked; ``refuse`` makes every
    provision, snapshot and restore a permanent refusal."""

    name = "recording"

    def __init__(self, *, accelerators: Mapping[str, int] | None = None,
                 refuse: str | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.accelerators = dict(accelerators or {})
        self.refuse = refuse
        self.activities: dict[str, dict[str, Any]] = {}
        #: What each snapshot was based on and what each restore had to match.
        self.bases: list[tuple[str | None, str | None]] = []
        self.anchors: list[tuple[str | None, bool]] = []

    def capabilities(self) -> Mapping[str, Any]:
        return {"accelerators": self.accelerators, "cpus": 64, "memory_bytes": 2**40,
                "ides": ["jupyterlab", "vscode"]}

    def _asked(self, *call: str) -> None:
        self.calls.append(call)
        if self.refuse and call[0] in ("provision", "snapshot", "restore"):
            raise RuntimeRefused(self.refuse)

    def provision(self, spec: WorkspaceSpec) -> None:
        self._asked("provision", spec.workspace_id)

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        self._asked("snapshot", spec.workspace_id, snapshot_id)
        self.bases.append((base, base_manifest_sha256))

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None,
                device_arrays_to_cpu: bool = False) -> None:
        self._asked("restore", spec.workspace_id, snapshot_id)
        self.anchors.append((manifest_sha256, device_arrays_to_cpu))

    def release(self, workspace_id: str) -> None:
        self._asked("release", workspace_id)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        self._asked("destroy", workspace_id, "keep_home" if keep_home else "")

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        return None

    def list(self) -> list[RuntimeStatus]:
        return []

    def activity(self, workspace_id: str) -> Mapping[str, Any] | None:
        return self.activities.get(workspace_id)

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        return None  # nothing in flight to report


@dataclass
class RecordingSnapshots:
    """Snapshot objects: ``objects`` maps a prefix to its size; deletions are recorded."""

    objects: dict[str, int] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    discarded: list[tuple[str, str]] = field(default_factory=list)

    def discard(self, workspace_id: str, snapshot_id: str) -> None:
        self.discarded.append((workspace_id, snapshot_id))

    def discard_all(self, workspace_id: str, *, by: str) -> int:
        self.discarded.append((workspace_id, "*"))
        return 0

    def stored(self) -> list[Any]:
        return []

    def inventory(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def parts(self, workspace_id: str) -> list[Any]:
        return []

    def delete_parts(self, parts: list[Any]) -> int:
        self.deleted.extend(p.name for p in parts)
        return len(parts)

    def delete_prefix(self, prefix: str) -> int:
        self.deleted.append(prefix)
        return 1 if self.objects.pop(prefix, None) is not None else 0


class RecordingSandboxRuntime:
    """A sandbox runtime that records what it is asked; ``refuse`` refuses start, resume
    and suspend for good."""

    name = "recording"

    def __init__(self, refuse: bool = False) -> None:
        self.started: list[RunSpec] = []
        self.resumed: list[RunSpec] = []
        self.cleaned: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []
        self.suspended: list[tuple[str, str, int, int]] = []
        self.refuse = refuse

    def start(self, spec: RunSpec) -> None:
        if self.refuse:
            raise RuntimeRefused("no such repository on this node")
        self.started.append(spec)

    def resume(self, spec: RunSpec) -> None:
        if self.refuse:
            raise RuntimeRefused(f"sandbox {spec.sandbox_id} is not known on this node")
        self.resumed.append(spec)

    def cancel(self, sandbox_id: str) -> None: ...

    def cleanup(self, sandbox_id: str, *, team: str) -> None:
        self.cleaned.append((sandbox_id, team))

    def release(self, sandbox_id: str, *, team: str) -> None:
        self.released.append((sandbox_id, team))

    def suspend(self, sandbox_id: str, *, team: str, sequence: int, idle_seconds: int) -> None:
        if self.refuse:
            raise RuntimeRefused(f"sandbox {sandbox_id} has no running pod to suspend")
        self.suspended.append((sandbox_id, team, sequence, idle_seconds))


class RecordingJobRuntime:
    """A job runtime (a cluster's JobSets) that records starts and cancels; ``fail`` raises
    it once from the next start (an API server that is unreachable, say)."""

    name = "kubernetes"

    def __init__(self) -> None:
        self.started: list[JobRun] = []
        self.cancelled: list[tuple[str, str]] = []
        self.fail: Exception | None = None

    def start(self, run: JobRun) -> None:
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        self.started.append(run)

    def cancel(self, job_id: str, *, team: str) -> None:
        self.cancelled.append((job_id, team))

    def job_ids(self) -> set[str]:
        return {r.job_id for r in self.started} - {j for j, _ in self.cancelled}


NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


def handler_deps(catalog: Catalog, *, db: MemoryDb | None = None,
                 runtime: RecordingRuntime | None = None,
                 sandbox_runtime: RecordingSandboxRuntime | None = None,
                 job_runtime: RecordingJobRuntime | None = None,
                 clock: Clock | None = None) -> Deps:
    """Every port of ``Deps`` over one in-memory database, recording what they are asked."""
    db = db or MemoryDb()
    return Deps(
        store=MemoryStore(db), bus=RecordingPublisher(), runtime=runtime or RecordingRuntime(),
        snapshots=RecordingSnapshots(), catalog=lambda: catalog, clock=clock or Clock(),
        snapshot_bucket="bucket", dead_letters=None,  # type: ignore[arg-type]
        fleet=MemoryFleet(db),
        sandboxes=SandboxDeps(MemorySandboxStore(db),
                              sandbox_runtime or RecordingSandboxRuntime()),
        jobs=MemoryJobStore(db), job_runtime=job_runtime, consumers=_consumers())


def _consumers() -> dict[str, Any]:
    """The event functions' handlers, as bootstrap gives them (the reconciler's relay)."""
    from functions.routes import ROUTES, Route

    return {name: route.handler for name, route in ROUTES.items() if isinstance(route, Route)}


def published(deps: Deps, name: str) -> list[Any]:
    """The payloads of the events of type ``name`` the bus has seen, in order."""
    bus: RecordingPublisher = deps.bus  # type: ignore[assignment]
    return [e.payload for e in bus.events if e.name == name]


__all__ = [
    "NOW",
    "Clock",
    "MemoryDb",
    "MemoryFleet",
    "MemoryJobStore",
    "MemorySandboxStore",
    "MemoryStore",
    "RecordingJobRuntime",
    "RecordingRuntime",
    "RecordingSandboxRuntime",
    "RecordingSnapshots",
    "handler_deps",
    "ledger_key",
    "published",
]
