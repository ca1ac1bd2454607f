"""What the proxy and the link issuer need from the outside world (adapters implement it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from events import Event
from functions.domain.links import Link, Refused, Target


class Unauthenticated(Exception):
    """The caller's identity could not be established (no or a bad IAP assertion)."""


@dataclass(frozen=True)
class Caller:
    """Who is calling: an IAP-verified principal in a deployment, the dev identity locally."""

    user: str
    via: str  # "iap" or "dev"


class Identity(Protocol):
    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The verified caller; raises Unauthenticated."""
        ...


class LinkStore(Protocol):
    def get_link(self, token_hash: str) -> Link | None: ...

    def find_link(self, link_id: str) -> tuple[str, Link] | None:
        """(token hash, link) of a link id, or None."""
        ...

    def list_links(self, *, workspace: str | None = None, team: str | None = None,
                   creator: str | None = None) -> list[tuple[Link, Mapping[str, Any]]]:
        """Links matching every given filter, each with its usage (uses, last_used_at)."""
        ...

    def count_active(self, workspace: str, now: datetime) -> int: ...

    def create_link(self, token_hash: str, link: Link, audit: Mapping[str, Any]) -> None:
        """Write the link document and its audit entry together; fails if it exists."""
        ...

    def revoke_link(self, token_hash: str, decide: Callable[[Link | None], Link | Refused],
                    audit: Callable[[Link], Mapping[str, Any]]) -> Link | Refused:
        """Read the link, ``decide``, and write the revoked link with its audit entry, in one
        transaction. Returns what ``decide`` returned."""
        ...

    def team_members(self, team: str) -> list[Mapping[str, Any]] | None:
        """The ``members`` of a team document, or None if there is no such team."""
        ...

    def target(self, workspace_id: str) -> Target | None: ...

    def read_many(self, token_hashes: Sequence[str], teams: Sequence[str],
                  workspaces: Sequence[str]) -> tuple[dict[str, Link | None],
                                                      dict[str, list[Mapping[str, Any]] | None],
                                                      dict[str, Target | None]]:
        """Links, team members and workspaces in one batch read (the proxy's read-ahead)."""
        ...

    def record_uses(self, uses: Mapping[str, int], now: datetime) -> None: ...

    def audit(self, entry: Mapping[str, Any]) -> None: ...

    def resume_outcome(self, event: Event[Any]) -> Mapping[str, Any] | None:
        """The lifecycle's verdict on a resume request, once it has one."""
        ...


class GatewayError(RuntimeError):
    """The workspace's Jupyter server could not be reached or refused the request."""


@dataclass(frozen=True)
class Server:
    """Where a running workspace's Jupyter server is, and its token (never shown to agents)."""

    base_url: str
    token: str


@dataclass(frozen=True)
class KernelChoice:
    kernel_id: str
    notebook: str | None
    created: bool = False


@dataclass(frozen=True)
class Forwarded:
    status: int
    content_type: str
    body: bytes


class Execution(Protocol):
    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next output of the cell as a message dict (``stream``, ``result``,
        ``error``, then one ``done`` with the cell's status), or None if nothing came
        within ``timeout`` seconds. Raises GatewayError if the kernel connection is lost."""
        ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


class KernelGateway(Protocol):
    def server(self, workspace_id: str, version: int) -> Server | None:
        """The running server of a workspace (None if the runtime runs none)."""
        ...

    def choose_kernel(self, server: Server, *, notebook: str | None,
                      kernel_id: str | None) -> KernelChoice: ...

    def execute(self, server: Server, kernel_id: str, code: str) -> Execution: ...

    def forward(self, server: Server, method: str, path: str, query: str, body: bytes,
                content_type: str | None) -> Forwarded: ...


class SandboxResults(Protocol):
    """What the proxy's sandbox endpoint reads (``functions.adapters.sandbox_results``)."""

    def sandbox(self, sandbox_id: str) -> Mapping[str, Any] | None:
        """The ``sandboxes/{id}`` document, or None."""
        ...

    def list_sandboxes(self, team: str, requester: str,
                       limit: int = 50) -> list[Mapping[str, Any]]: ...

    def request_outcome(self, event: Event[Any]) -> Mapping[str, Any] | None:
        """The sandbox handler's verdict on a sandbox.requested or .resume_requested, once
        it has one."""
        ...

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]:
        """At most ``limit`` bytes of a ``gs://`` object (its end when ``tail``), and whether
        it holds more. Raises on a storage error."""
        ...
