"""The ports of the control plane: what handlers need from the outside world.

Handlers depend on these protocols only; ``bootstrap.py`` picks the adapters. A runtime
works asynchronously: ``provision``, ``snapshot`` and ``restore`` return once the work is
accepted, and the runtime reports the outcome as an event (workspace.ready,
snapshot.finished, workspace.runtime_failed). ``release`` and ``destroy`` are synchronous
and idempotent: calling them for a workspace that is already gone is not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from events import Event


class RuntimeUnavailable(RuntimeError):
    """The runtime could not be reached: a temporary failure, the event is retried."""


class RuntimeRefused(RuntimeError):
    """The runtime will never do this (e.g. hardware it lacks): a permanent failure."""


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

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str) -> None: ...

    def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None: ...

    def release(self, workspace_id: str) -> None: ...

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None: ...

    def status(self, workspace_id: str) -> RuntimeStatus | None: ...

    def list(self) -> list[RuntimeStatus]: ...


class Bus(Protocol):
    def publish(self, event: Event[Any]) -> str:
        """Publish an event; returns the message id. Raises on failure (retried)."""
        ...


class Clock(Protocol):
    def now(self) -> Any: ...


class Transaction(Protocol):
    """What a decision callback sees inside a store transaction, and what it writes."""

    workspace: Any
    outcome: dict[str, Any]

    def team(self, team_id: str) -> dict[str, Any] | None: ...

    def usage(self, team_id: str) -> dict[str, Any]: ...

    def set(self, collection: str, doc_id: str, data: dict[str, Any]) -> None: ...


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
