"""An in-memory portal store and a portal app over it, for the portal's unit tests (and the
benchmark's shape check): the same ``PortalStore`` port the Firestore adapter implements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request

from functions.domain.lifecycle import Workspace
from functions.portal.ports import PortalDeps
from functions.portal.signin import Verdict
from functions.portal.web import handle
from functions.ports import ledger_key
from functions.routes import consumer_of


class MemoryPortalStore:
    def __init__(self) -> None:
        self.workspaces: dict[str, Workspace] = {}
        self.docs: dict[str, dict[str, dict[str, Any]]] = {}
        self.audit: list[dict[str, Any]] = []
        self.objects: dict[str, bytes] = {}
        self.handled_requests: set[tuple[str, str]] = set()
        self.signins: dict[str, dict[str, Any]] = {}

    def put(self, ws: Workspace) -> None:
        self.workspaces[ws.id] = ws

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        return self.workspaces.get(workspace_id)

    def owned(self, team: str, owner: str) -> list[Workspace]:
        return [w for w in self.workspaces.values() if w.team == team and w.owner == owner]

    def team_page(self, team: str, limit: int,
                  cursor: str | None) -> tuple[list[Workspace], str | None]:
        rows = sorted((w for w in self.workspaces.values() if w.team == team),
                      key=lambda w: (w.created_at or datetime.min, w.id), reverse=True)
        if cursor:
            ids = [w.id for w in rows]
            rows = rows[ids.index(cursor) + 1:] if cursor in ids else rows
        more = len(rows) > limit
        return rows[:limit], rows[limit - 1].id if more else None

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return self.docs.get(collection, {}).get(doc_id)

    def workspaces_in(self, states: Sequence[str]) -> list[Workspace]:
        return [w for w in self.workspaces.values() if str(w.state) in states]

    def teams(self) -> dict[str, dict[str, Any]]:
        return dict(self.docs.get("teams", {}))

    def get_many(self, collection: str, doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {i: d for i in doc_ids if (d := self.get(collection, i)) is not None}

    def snapshots_of(self, workspace_ids: Sequence[str]) -> list[dict[str, Any]]:
        return [{"id": i, **d} for i, d in self.docs.get("snapshots", {}).items()
                if d.get("workspace") in workspace_ids]

    def audit_of(self, workspaces: Sequence[Workspace],
                 since: datetime) -> list[dict[str, Any]]:
        ids = {w.id for w in workspaces}
        return [e for e in self.audit if e.get("target") in ids and e["time"] >= since]

    def audit_before(self, workspace_id: str, before: datetime,
                     limit: int = 20) -> list[dict[str, Any]]:
        rows = [e for e in self.audit if e.get("target") == workspace_id and e["time"] < before]
        return sorted(rows, key=lambda e: e["time"], reverse=True)[:limit]

    def sandboxes(self, team: str, requester: str | None) -> list[dict[str, Any]]:
        return [d for d in self.docs.get("sandboxes", {}).values() if d.get("team") == team
                and (requester is None or d.get("requester") == requester)]

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]:
        data = self.objects[uri]
        return data[:limit], len(data) > limit

    def handled(self, event: Any) -> bool:
        return (event.type, event.requestid) in self.handled_requests

    def verdict_key(self, event: Any) -> str:
        return ledger_key(consumer_of(event.name), event)

    def create_signin(self, token_hash: str, doc: Mapping[str, Any]) -> None:
        assert token_hash not in self.signins
        self.signins[token_hash] = dict(doc)

    def consume_signin(self, token_hash: str,
                       decide: Callable[[dict[str, Any] | None], Verdict]) -> Verdict:
        doc = self.signins.get(token_hash)
        verdict = decide(dict(doc) if doc is not None else None)
        if verdict.ok:
            self.signins[token_hash]["used_at"] = "now"
        return verdict


def portal_app(deps: PortalDeps, handler: Callable[[Any, PortalDeps], Any] = handle
               ) -> Callable[..., Any]:
    """The portal (or another function on its deps: the ``cli`` function) as a WSGI app at
    the root (as deployed behind IAP)."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        return handler(Request(environ), deps)(environ, start_response)

    return app


def replace(ws: Workspace, **changes: Any) -> Workspace:
    return dataclasses.replace(ws, **changes)
