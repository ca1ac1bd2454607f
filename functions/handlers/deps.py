"""The dependencies a handler receives: ports and settings, nothing concrete."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from functions.ports import Bus, Runtime


class Store(Protocol):
    def transition(self, event: Any, consumer: str, workspace_id: str, decide: Any, *,
                   team: str | None = None, now: datetime) -> Any: ...

    def mark_done(self, key: str) -> None: ...

    def get_workspace(self, workspace_id: str) -> Any: ...

    def list_workspaces(self, *, team: str | None = None, states: Any = None,
                        limit: int = 500) -> list[Any]: ...

    def count_failure(self, message_id: str, consumer: str, reason: str,
                      now: datetime) -> int: ...


class Snapshots(Protocol):
    def discard(self, workspace_id: str, snapshot_id: str) -> None:
        """Delete one snapshot's objects (a partial one after a failure, or an orphan)."""
        ...

    def discard_all(self, workspace_id: str) -> int:
        """Delete every snapshot of a workspace; returns the bytes released."""
        ...


class DeadLetters(Protocol):
    def dead_letter(self, consumer: str, data: bytes, attributes: dict[str, str], *,
                    reason: str, attempts: int, message_id: str = "") -> str: ...


@dataclass
class Deps:
    store: Store
    bus: Bus
    runtime: Runtime
    snapshots: Snapshots
    catalog: Callable[[], Any]
    clock: Callable[[], datetime]
    snapshot_bucket: str
    dead_letters: DeadLetters
