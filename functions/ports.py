"""The ports of the control plane: what handlers need from the outside world.

Handlers depend on these protocols only; ``bootstrap.py`` picks the adapters. Every state
change goes through the :class:`Ledger` (``functions.adapters.firestore_store``, or the
in-memory one of the tests), whatever family it is about. A runtime
works asynchronously: ``provision``, ``snapshot`` and ``restore`` return once the work is
accepted, and the runtime reports the outcome as an event (workspace.ready,
snapshot.finished, workspace.runtime_failed). ``release`` and ``destroy`` are synchronous
and idempotent: calling them for a workspace that is already gone is not an error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from events import Event


class CatalogSource(Protocol):
    """Where a handler or a front door gets the applied catalog (``bootstrap``'s cache)."""

    @property
    def catalog(self) -> Callable[[], Any]:
        """The catalog as cached (re-read every few seconds)."""

    @property
    def refresh_catalog(self) -> Callable[[], Any] | None:
        """Reads it again now (rate-limited); None where ``catalog`` is always current."""


def catalog_knowing(source: CatalogSource, knows: Callable[[Any], bool]) -> Any:
    """The catalog, read again once if the cached one does not ``know`` what a request
    names (a team, a profile, a member): an admin may have applied it since the cache was
    read, and the request must not be refused, or ignored, for the cache's age. What the
    fresh catalog does not know either is the caller's to refuse."""
    catalog = source.catalog()
    if knows(catalog) or source.refresh_catalog is None:
        return catalog
    return source.refresh_catalog()


class RuntimeUnavailable(RuntimeError):
    """The runtime could not be reached: a temporary failure, the event is retried."""


class RuntimeRefused(RuntimeError):
    """The runtime will never do this (e.g. hardware it lacks): a permanent failure."""


class InvalidWorkspaceToken(Exception):
    """A workspace's Kubernetes token failed verification (signature, issuer, audience,
    expiry), with the reason; ``temporary``: the cluster's keys could not be read."""

    def __init__(self, reason: str, *, temporary: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.temporary = reason, temporary


@dataclass(frozen=True)
class WorkspaceSpec:
    """Everything a runtime needs to run one workspace."""

    workspace_id: str
    team: str
    owner: str
    name: str
    ide: str
    environment: Mapping[str, Any]
    profile: Mapping[str, Any]
    snapshot_bucket: str
    snapshot_prefix: str
    requestid: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def snapshot_path(self, snapshot_id: str) -> str:
        """Where a snapshot's objects live: ``snapshots/<team>/<workspace>/<snapshot>``."""
        return f"{self.snapshot_prefix}/{snapshot_id}"


@dataclass(frozen=True)
class RuntimeStatus:
    """What a runtime knows about one workspace, for the reconciler and the CLI."""

    workspace_id: str
    running: bool
    operation: str | None = None
    url: str | None = None
    token: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


class Runtime(Protocol):
    name: str

    def capabilities(self) -> Mapping[str, Any]:
        """{"accelerators": {"nvidia-l4": 1}, "cpus": 2, "memory_bytes": N, "ides": [...]}."""
        ...

    def provision(self, spec: WorkspaceSpec) -> None: ...

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        """Snapshot the workspace; ``base`` (the current snapshot, its manifest's sha256)
        has parts the capture need not send again."""
        ...

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None,
                device_arrays_to_cpu: bool = False) -> None:
        """Restore a snapshot whose manifest must hash to ``manifest_sha256``; the outcome
        comes back as workspace.ready or workspace.runtime_failed."""
        ...

    def release(self, workspace_id: str) -> None: ...

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None: ...

    def status(self, workspace_id: str) -> RuntimeStatus | None: ...

    def list(self) -> list[RuntimeStatus]: ...

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        """How far the operation in flight on the workspace has got (``phase``,
        ``started_at``, ``first_byte_at``, ``done_bytes``, ``total_bytes``,
        ``observed_at``; read by ``functions.domain.progress.describe``), or None when
        nothing is in flight or the runtime cannot tell. A read: never changes anything."""
        ...


class Bus(Protocol):
    def publish(self, event: Event[Any]) -> str:
        """Publish an event; returns the message id. Raises on failure (retried)."""
        ...


class Clock(Protocol):
    def now(self) -> Any: ...


# --- the ledger: every state change is one transaction through it --------------------------
@dataclass(frozen=True)
class Subject:
    """What one transaction is about: it names the ledger entry (``<kind>_id``), and
    transactions of the same ``lock`` run one at a time in an instance (a team's
    admissions, one sandbox's reports), which keeps contended commits rare."""

    kind: str
    id: str
    lock: str | None = None


class Tx(Protocol):
    """The documents a decision reads and writes inside its transaction.

    Reads see the documents as they were when the transaction began (never its own
    writes) and are cached; writes are applied together with the ledger entry at commit,
    or not at all. Datetimes read back are UTC-aware.
    """

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None: ...

    def set(self, collection: str, doc_id: str, data: dict[str, Any], *,
            merge: bool = False) -> None:
        """Write a whole document (``merge``: only these fields); an empty id: a new
        document with a generated id."""
        ...

    def update(self, collection: str, doc_id: str, fields: dict[str, Any]) -> None:
        """Change fields of a document that exists (the commit fails if it does not)."""
        ...

    def find(self, collection: str, field: str, value: Any) -> list[tuple[str, dict[str, Any]]]:
        """``(id, document)`` of every document whose ``field`` equals ``value``, read in
        the transaction (recording a snapshot reads its workspace's other records)."""
        ...


@dataclass(frozen=True)
class Entry:
    """What a decision leaves in its ledger entry besides the documents it wrote."""

    #: The encoded commands and events, sent once committed (``functions.handlers.pipeline``).
    outbox: list[dict[str, Any]]
    #: What whoever waits on the request reads back (``stasis ws ... --wait``).
    outcome: dict[str, Any]
    #: Handed back to the caller of ``transact``; not stored.
    decision: Any = None


@dataclass(frozen=True)
class Committed:
    """A ledger entry after ``transact``: this request's, committed now (``decision`` set)
    or earlier (a duplicate: ``decision`` None). ``pending``: its outbox is not sent yet."""

    key: str
    pending: bool
    outbox: list[dict[str, Any]]
    decision: Any = None


@dataclass(frozen=True)
class Pending:
    """A ledger entry whose outbox is still unsent: what the reconciler's relay hands back to
    its consumer (``functions.handlers.reconciler``)."""

    key: str
    consumer: str
    #: The event that decided it, as delivered.
    event: Event[Any]
    processed_at: datetime


class OutboxUnsent(Exception):
    """A decision committed but its outbox could not be sent (the runtime or the bus did not
    answer): the entry stays pending. Its event's redelivery sends it again; once the
    deliveries are spent, the reconciler's relay does (``Ledger.pending``), so the delivery
    guard acknowledges it instead of dead-lettering a request that was decided."""

    def __init__(self, key: str, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.key = key


def ledger_key(consumer: str, event: Event[Any]) -> str:
    """The id of the ledger entry of (consumer, event type, requestid): one effect per
    request, a retried request reusing its requestid. Whoever waits on a request reads
    the entry's ``outcome`` under this id (``stasis_cli.client.outcome``)."""
    return hashlib.sha256(f"{consumer}|{event.type}|{event.requestid}".encode()).hexdigest()


class Ledger(Protocol):
    """One effect per (consumer, event type, requestid), with the outbox of that effect."""

    def transact(self, event: Event[Any], consumer: str, subject: Subject,
                 decide: Callable[[Tx], Entry], *, now: datetime) -> Committed:
        """Run ``decide`` in one transaction with the ledger entry of this request. A
        duplicate does not call ``decide`` and returns the stored entry, whose outbox is
        still to be sent while it is pending."""
        ...

    def mark_done(self, key: str) -> None:
        """The outbox of entry ``key`` was sent."""
        ...

    def pending(self, *, limit: int = 200) -> list[Pending]:
        """The entries whose outbox is not sent yet, oldest first (at most ``limit``)."""
        ...


@dataclass(frozen=True)
class JobRun:
    """Everything a job runtime needs to start one admitted job (a kubernetes job: one
    JobSet); the function travels pickled at ``payload_uri``."""

    job_id: str
    team: str
    owner: str
    profile: str
    hosts: int
    payload_uri: str
    requestid: str
    workspace_id: str | None = None
    topology: str | None = None
    #: The job's image (the workspace's environment); None: the runtime's default.
    image: str | None = None


class JobRuntime(Protocol):
    """Where admitted jobs run when the control plane starts them (the local runtime's
    jobs are the kernel's own children and need none). ``start`` returns once the job is
    accepted and is idempotent per job id; the end comes back as job.finished. ``cancel``
    stops the job and releases its hosts; a job already gone is not an error."""

    name: str

    def start(self, run: JobRun) -> None: ...

    def cancel(self, job_id: str, *, team: str) -> None: ...

    def job_ids(self) -> set[str]:
        """The jobs that have objects in the runtime (the reconciler's check)."""
        ...
