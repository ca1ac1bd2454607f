"""What the sandbox handler needs from the outside world, beyond ``Deps``.

``Deps.sandboxes`` holds a :class:`SandboxDeps`; ``bootstrap.py`` builds it from the
adapters (``functions.adapters.sandbox_store``, ``functions.adapters.sandbox_runtime``).
Their transitions go through the one ledger (``Deps.store``), like every family's.
A runtime's ``start`` returns once the sandbox is accepted; the outcome comes back as a
sandbox.finished event. ``start`` is idempotent per sandbox id and request, so an outbox
sent again after a crash starts nothing twice. A runtime that holds an idle sandbox says so
with sandbox.suspended; ``resume`` lets it go on (idempotent too: resuming a sandbox that
runs already changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from functions.domain.sandboxes import RunSpec, Sandbox, SandboxState


class SandboxStore(Protocol):
    """Sandbox records read outside a transaction (the ledger changes them)."""

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
