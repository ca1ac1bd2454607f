"""What the sandbox handler needs from the outside world, beyond ``Deps``.

``Deps.sandboxes`` holds a :class:`SandboxDeps`; ``bootstrap.py`` builds it from the
adapters (``functions.adapters.sandbox_store``, ``functions.adapters.sandbox_runtime``).
A runtime's ``start`` returns once the sandbox is accepted; the outcome comes back as a
sandbox.finished event. ``start`` is idempotent per sandbox id and request, so an outbox
sent again after a crash starts nothing twice. A runtime that holds an idle sandbox says so
with sandbox.suspended; ``resume`` lets it go on (idempotent too: resuming a sandbox that
runs already changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from events import Event
from functions.domain.sandboxes import RunSpec, Sandbox, SandboxState, TeamQueue


class SandboxView(Protocol):
    """What the decide callback reads and writes inside the store's transaction."""

    outcome: dict[str, Any]

    def sandbox(self, sandbox_id: str) -> Sandbox | None: ...

    def queue(self, team: str) -> TeamQueue: ...

    def policy_section(self) -> Mapping[str, Any] | None:
        """The ``sandboxes`` section of the applied admin config (None: not set)."""
        ...

    def set(self, collection: str, doc_id: str, data: dict[str, Any]) -> None:
        """Write a whole document (an empty id: a new generated id)."""
        ...

    def update(self, collection: str, doc_id: str, fields: dict[str, Any]) -> None: ...


class SandboxStore(Protocol):
    def transact(self, event: Event[Any], consumer: str,
                 decide: Callable[[SandboxView], tuple[list[dict[str, Any]], Any]], *,
                 subject: str, now: datetime) -> Any:
        """Run ``decide`` in one transaction guarded by the ledger (one effect per
        consumer, event type and requestid). ``decide`` returns (outbox, value); a
        duplicate returns the stored ledger entry without calling it. The result has
        ``.ledger.key``, ``.ledger.status``, ``.ledger.outbox`` and ``.value``."""
        ...

    def mark_done(self, key: str) -> None: ...

    def get(self, sandbox_id: str) -> Sandbox | None: ...

    def list(self, *, team: str | None = None, states: tuple[SandboxState, ...] | None = None,
             limit: int = 200) -> list[Sandbox]: ...


class SandboxRuntime(Protocol):
    name: str

    def start(self, spec: RunSpec) -> None:
        """Accept the sandbox (RuntimeUnavailable: retry; RuntimeRefused: never)."""
        ...

    def resume(self, spec: RunSpec) -> None:
        """Let a suspended sandbox go on (RuntimeUnavailable: retry; RuntimeRefused: the
        runtime no longer has it)."""
        ...

    def cancel(self, sandbox_id: str) -> None: ...

    def cleanup(self, sandbox_id: str, *, team: str) -> None:
        """Free what an ended sandbox still holds on the runtime (a cluster's Pod, Secret,
        policies and bundle; nothing locally, where the monitor exits with the task).
        Idempotent: a redelivered outbox cleans up again."""
        ...

    def release(self, sandbox_id: str, *, team: str) -> None:
        """Free the compute of a suspended sandbox whose method keeps it elsewhere (a Pod
        Snapshot: the Pod is deleted); nothing for a local freeze."""
        ...

    def suspend(self, sandbox_id: str, *, team: str, sequence: int, idle_seconds: int) -> None:
        """Hold a running sandbox that a runtime reported idle (sandbox.idle_detected): its
        ``sequence``-th suspension, reported back as sandbox.suspended. Idempotent per
        sequence (RuntimeUnavailable: retry; RuntimeRefused: nothing to suspend, or a
        runtime that suspends by itself)."""
        ...


@dataclass
class SandboxDeps:
    store: SandboxStore
    runtime: SandboxRuntime
