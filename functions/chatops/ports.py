"""What the chat handlers need from the outside world; ``bootstrap.py`` picks the adapters.

- :class:`ChatReads`: plain reads of workspaces, snapshots and teams (the Firestore store
  has them all). The slash command never opens a transaction.
- :class:`ChatRecords`: one record per chat request (``chat_requests/{requestid}``: where
  to reply, how often the response_url was used) and the marks that make a notification
  go out once (``chat_notified/{key}``).
- :class:`Notifier`: Slack's two ways to speak after the ack (response_url, Web API).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from functions.ports import Bus


@dataclass(frozen=True)
class SlashRequest:
    """A verified slash command, as Slack sent it, with its deterministic request id."""

    text: str
    user: str
    requestid: str
    team: str | None = None
    channel: str | None = None
    response_url: str | None = None
    retry: bool = False


class NotifyRefused(RuntimeError):
    """Slack will never take this message (unknown channel, revoked token): permanent."""


class ChatReads(Protocol):
    def get_workspace(self, workspace_id: str) -> Any: ...

    def list_workspaces(self, *, team: str | None = None, states: Any = None,
                        limit: int = 500) -> list[Any]: ...

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None: ...

    def snapshots(self, workspace_id: str) -> list[dict[str, Any]]:
        """The workspace's snapshot records, oldest first, each with its ``id``."""
        ...

    def list_sandboxes(self, team: str, limit: int = 200) -> list[dict[str, Any]]:
        """A team's ``sandboxes/{id}`` records (any order)."""
        ...


class ChatRecords(Protocol):
    def remember(self, requestid: str, record: Mapping[str, Any]) -> None:
        """Store (or overwrite with the same content, on a retry) a request's record."""
        ...

    def recall(self, requestid: str) -> dict[str, Any] | None: ...

    def use_response_url(self, requestid: str, now: datetime) -> bool:
        """Claim one of the response_url's uses (Slack: 5 within 30 minutes); False when
        none is left or it expired."""
        ...

    def notified(self, key: str) -> bool: ...

    def mark_notified(self, key: str, detail: Mapping[str, Any], now: datetime) -> None: ...

    def claim_notification(self, key: str, detail: Mapping[str, Any], now: datetime) -> bool:
        """Create the mark if there is none (atomically); False: someone has it."""
        ...

    def release_notification(self, key: str) -> None:
        """Drop a claimed mark whose message could not be sent."""
        ...


class Notifier(Protocol):
    def respond(self, response_url: str, message: Mapping[str, Any]) -> bool:
        """Post to a response_url. True: delivered; False: Slack no longer takes messages
        there (expired, used up). Raises on a temporary failure (retried)."""
        ...

    def post(self, channel: str, message: Mapping[str, Any]) -> None:
        """chat.postMessage (a user id posts to their direct messages with the app).
        Raises NotifyRefused on a permanent Slack error, anything else when temporary."""
        ...


@dataclass
class ChatDeps:
    reads: ChatReads
    records: ChatRecords
    notifier: Notifier
    bus: Bus
    catalog: Callable[[], Any]
    clock: Callable[[], datetime]
    #: Reads the applied catalog again now (``functions.ports.catalog_knowing``).
    refresh_catalog: Callable[[], Any] | None = None
