"""The dependencies a handler receives: ports and settings, nothing concrete."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from functions.ports import Bus, Ledger, Runtime


class Store(Ledger, Protocol):
    """The workspace documents, the delivery counts, and the ledger through which every
    state change of every family commits (``functions.handlers.pipeline``)."""

    def get_workspace(self, workspace_id: str) -> Any: ...

    def list_workspaces(self, *, team: str | None = None, states: Any = None,
                        limit: int = 500) -> list[Any]: ...

    def count_failure(self, message_id: str, consumer: str, reason: str,
                      now: datetime) -> int: ...

    def audit(self, entry: Mapping[str, Any]) -> None:
        """One audit entry outside any transaction (a refusal before any handler ran)."""


class Snapshots(Protocol):
    def discard(self, workspace_id: str, snapshot_id: str) -> None:
        """Delete one snapshot's objects (a partial one after a failure, or an orphan)."""
        ...

    def discard_all(self, workspace_id: str, *, by: str) -> int:
        """Delete every snapshot of a workspace, as the event ``by`` decided; returns the
        bytes to release (the same again for a redelivery of that event)."""
        ...

    def stored(self) -> list[Any]:
        """What Cloud Storage holds, per snapshot prefix (the janitor's orphan check)."""
        ...

    def inventory(self) -> tuple[list[Any], list[Any]]:
        """``(stored(), every pool part)`` from one listing."""
        ...

    def parts(self, workspace_id: str) -> list[Any]:
        """The parts of one workspace's pool (``retention.StoredPart``)."""
        ...

    def delete_parts(self, parts: list[Any]) -> int:
        """Delete pool parts at the generation listed; returns how many."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete the objects under one snapshot prefix; returns how many."""
        ...


class Fleet(Protocol):
    """Fleet-wide reads and writes of the idle sweep, the janitor and the cost rollup
    (``functions.adapters.fleet_store``)."""

    def workspaces_in(self, states: Any, fields: Any = None) -> list[Any]: ...

    def workspaces(self, team: str | None = None) -> list[Any]: ...

    def teams(self) -> dict[str, dict[str, Any]]: ...

    def snapshot_records(self, team: str | None = None) -> list[Any]: ...

    def snapshot_record(self, snapshot_id: str) -> Any: ...

    def expire_snapshot(self, snapshot_id: str, *, reason: str, message: str, now: datetime,
                        guard: Any = None) -> int: ...

    def audit_since(self, team: str, start: datetime) -> list[dict[str, Any]]: ...

    def audit_before(self, workspace_id: str, before: datetime,
                     limit: int = 20) -> list[dict[str, Any]]: ...

    def put_rollup(self, team: str, doc: dict[str, Any]) -> bool: ...


class DeadLetters(Protocol):
    def dead_letter(self, consumer: str, data: bytes, attributes: dict[str, str], *,
                    reason: str, attempts: int, message_id: str = "") -> str: ...


@dataclass
class Deps:
    #: The workspaces and the ledger (``functions.adapters.firestore_store.FirestoreStore``).
    store: Store
    bus: Bus
    runtime: Runtime
    snapshots: Snapshots
    #: The applied catalog, as cached (``bootstrap``: re-read every few seconds).
    catalog: Callable[[], Any]
    clock: Callable[[], datetime]
    snapshot_bucket: str
    dead_letters: DeadLetters
    #: The idle sweep, the janitor and the cost rollup (None where they do not run).
    fleet: Fleet | None = None
    #: The chat front door (``functions.chatops.ports.ChatDeps``; None where chat is off).
    chat: Any = None
    #: Agent sandboxes (``functions.handlers.sandbox_ports.SandboxDeps``; None: not run).
    sandboxes: Any = None
    #: Scale-out jobs' reads (``functions.adapters.job_store.FirestoreJobStore``; None:
    #: not run).
    jobs: Any = None
    #: Where admitted kubernetes jobs run (``functions.ports.JobRuntime``; None: nowhere).
    job_runtime: Any = None
    #: The IDE access proxy's public URL (``STASIS_IDE_PROXY_URL``): a running workspace's
    #: ``url`` is ``<it>/w/<id>/``. None: the runtime's own URL.
    ide_proxy_url: str | None = None
    #: Verifies a workspace pod's Kubernetes token for ``workspace_api``
    #: (``functions.adapters.kubernetes_tokens.KubernetesTokens``; None: not on GKE).
    workspace_tokens: Any = None
    #: The event functions' handlers by consumer name (``functions.routes``, given by
    #: ``bootstrap``): where the reconciler's relay hands a pending entry's event back.
    consumers: Mapping[str, Callable[[Any, Any, str], Any]] = field(default_factory=dict)
    #: Reads the applied catalog again now (rate-limited), for ``ports.catalog_knowing``. None:
    #: ``catalog`` is always current (a test's fixed catalog).
    refresh_catalog: Callable[[], Any] | None = None
