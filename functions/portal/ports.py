"""What the portal needs from the outside world; ``bootstrap.py`` picks the adapters
(``functions/adapters/portal_store.py`` for Firestore and Cloud Storage; the control plane's
bus and runtime; the links function's own issuer)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from events import Event
from functions.domain.lifecycle import Workspace
from functions.portal.signin import Verdict
from functions.ports import Bus, Runtime


class PortalStore(Protocol):
    def get_workspace(self, workspace_id: str) -> Workspace | None: ...

    def owned(self, team: str, owner: str) -> list[Workspace]:
        """``owner``'s workspaces in ``team`` (DELETED ones included)."""
        ...

    def team_page(self, team: str, limit: int,
                  cursor: str | None) -> tuple[list[Workspace], str | None]:
        """One page of a team's workspaces, newest first, and the next page's cursor."""
        ...

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None: ...

    def workspaces_in(self, states: Sequence[str]) -> list[Workspace]:
        """Every workspace in one of ``states`` (the queue, and what holds hardware)."""
        ...

    def teams(self) -> dict[str, dict[str, Any]]:
        """Every team document (the usage counters), by id."""
        ...

    def get_many(self, collection: str, doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The documents that exist, by id, in one batched read."""
        ...

    def snapshots_of(self, workspace_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Every snapshot record of these workspaces, each with its ``id``."""
        ...

    def audit_of(self, workspaces: Sequence[Workspace],
                 since: datetime) -> list[dict[str, Any]]:
        """The audit entries of these workspaces since ``since`` (an adapter may keep them
        per workspace version: a workspace's history moves only with its version)."""
        ...

    def audit_before(self, workspace_id: str, before: datetime,
                     limit: int = 20) -> list[dict[str, Any]]: ...

    def sandboxes(self, team: str, requester: str | None) -> list[dict[str, Any]]:
        """A team's sandboxes (one requester's, unless None)."""
        ...

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]: ...

    def handled(self, event: Event[Any]) -> bool:
        """Whether the consuming function's ledger already holds this request (a double
        submit, or a refresh of its answer)."""
        ...

    def verdict_key(self, event: Event[Any]) -> str:
        """The id of the consuming function's ledger entry for this request, where whoever
        waits on it reads the verdict (the CLI's ``--wait``)."""
        ...

    def create_signin(self, token_hash: str, doc: Mapping[str, Any]) -> None: ...

    def consume_signin(self, token_hash: str,
                       decide: Callable[[dict[str, Any] | None], Verdict]) -> Verdict:
        """Read ``portal_signins/{hash}``, ``decide``, and mark it used when it signs in,
        in one transaction."""
        ...


class Identity(Protocol):
    def caller(self, headers: Mapping[str, str]) -> Any:
        """An object with ``.user``; raises on a missing or bad IAP assertion."""


@dataclass(frozen=True)
class PortalDeps:
    store: PortalStore
    bus: Bus
    runtime: Runtime
    catalog: Callable[[], Any]
    clock: Callable[[], datetime]
    #: The links function's issuer (``functions.proxy.issuer.LinkIssuer``), built lazily.
    links: Callable[[], Any]
    #: The IAP verifier for (audience, certs URL); called only in IAP mode.
    iap: Callable[[str, str], Identity]
    environ: Callable[[], Mapping[str, str]] = field(default=lambda: os.environ)
    #: Reads the applied catalog again now (``functions.ports.catalog_knowing``).
    refresh_catalog: Callable[[], Any] | None = None
