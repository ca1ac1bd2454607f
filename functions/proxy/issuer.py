"""The ``links`` HTTP function: create, list and revoke agent links.

``POST /`` ``{"workspace_id", "scope"?, "ttl"?}`` creates a link and answers its URL and
token, once (201); ``GET /?workspace=&team=`` lists links (a user sees the links they
created; a team admin, with ``team=`` or ``workspace=``, every link of the team);
``DELETE /<link_id>`` (or ``POST /<link_id>/revoke``) revokes one. The caller is the
verified identity (IAP; locally the explicit dev identity), never a field of the body.

Why a function writes the link document, and not a handler on link.created: the token
must exist in exactly one place besides the creator's screen, and that is nowhere. The
function that draws the 256 random bits hashes them, stores the hash (with the audit
entry, in one write) and answers the token to the caller over the same HTTPS request; a
handler would need the token or its lookup key in a Pub/Sub message, and the link would
not work until the event had been delivered. Revocation is synchronous for the same
reason: it is effective once the document says so (the proxy re-reads within 0.5 s),
whatever Pub/Sub's delivery latency. link.created and link.revoked are published after
the write, for the consumers that react to links (notifications, audit exports); neither
carries the token or its hash.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from events import LinkCreated, LinkRevoked, new_event
from events.payloads import WORKSPACE_SEPARATOR
from functions.domain.catalog import Role
from functions.domain.links import (
    DEFAULT_POLICY,
    TOKEN_BYTES,
    TOKEN_PREFIX,
    Issue,
    Link,
    LinkPolicy,
    Reason,
    Refused,
    Scope,
    Target,
    check_create,
    check_revoke,
    is_link_id,
    link_id_from,
    link_url,
    parse_ttl,
    role_in,
    token_hash,
)
from functions.ports import Bus
from functions.proxy.ports import Identity, LinkStore, Unauthenticated

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/links"
PROXY_ACTOR = "stasis-proxy"


def new_token() -> str:
    """A fresh link token: 256 random bits, URL-safe, with the recognisable prefix."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


class LinkIssuer:
    def __init__(self, store: LinkStore, bus: Bus, identity: Identity, *,
                 clock: Callable[[], datetime], proxy_url: Callable[[Request], str],
                 policy: LinkPolicy = DEFAULT_POLICY,
                 token: Callable[[], str] = new_token,
                 link_id: Callable[[], str] = lambda: link_id_from(secrets.token_hex(8))
                 ) -> None:
        self.store = store
        self.bus = bus
        self.identity = identity
        self.clock = clock
        self.proxy_url = proxy_url
        self.policy = policy
        self.new_token = token
        self.new_link_id = link_id
        #: Called with a token hash after a revocation (the proxy of this process forgets it).
        self.revoked_listeners: list[Callable[[str], Any]] = []

    def __call__(self, request: Request) -> Response:
        try:
            caller = self.identity.caller(request.headers)
        except Unauthenticated as exc:
            return _json({"error": str(Reason.UNAUTHENTICATED), "message": str(exc)}, 401)
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if not parts and method == "POST":
            return self.create(caller.user, request.get_json(silent=True), request)
        if not parts and method == "GET":
            return self.list(caller.user, request.args)
        if (len(parts) == 1 and method == "DELETE") or (
                len(parts) == 2 and parts[1] == "revoke" and method == "POST"):
            return self.revoke(caller.user, parts[0])
        return _json({"error": "not_found", "message": "POST /, GET /, DELETE /<link_id>"},
                     404)

    # --- create ---------------------------------------------------------------------------------
    def create(self, user: str, body: Any, request: Request) -> Response:
        if not isinstance(body, dict) or not isinstance(body.get("workspace_id"), str):
            return _json({"error": "bad_request", "message":
                          'send {"workspace_id": "<team>--<name>", '
                          '"scope": "exec"|"read"|"sandbox", "ttl": "1h"}'}, 400)
        workspace_id = body["workspace_id"]
        scope = str(body.get("scope") or Scope.EXEC)
        try:
            ttl = _ttl(body.get("ttl"))
        except ValueError as exc:
            return _json({"error": str(Reason.BAD_TTL), "message": str(exc)}, 400)
        now = self.clock()
        target = self.store.target(workspace_id)
        team = target.team if target else workspace_id.split(WORKSPACE_SEPARATOR)[0]
        role = self._role(team, user)
        decision = check_create(creator=user, creator_role=role, workspace_id=workspace_id,
                                workspace=target, scope=scope, ttl_seconds=ttl,
                                active_links=self.store.count_active(workspace_id, now)
                                if target else 0, now=now, policy=self.policy)
        if isinstance(decision, Refused):
            log.info("link for %s refused to %s: %s", workspace_id, user, decision.reason)
            return _json({"error": str(decision.reason), "message": decision.message},
                         decision.status)
        assert target is not None
        return self._issue(user, target, Scope(scope), decision, now, request)

    def _issue(self, user: str, target: Target, scope: Scope, issue: Issue,
               now: datetime, request: Request) -> Response:
        token = self.new_token()
        digest = token_hash(token)
        workspace_id, team = target.id, target.team
        link = Link(link_id=self.new_link_id(), workspace=workspace_id, team=team,
                    creator=user, scope=scope, created_at=now, expires_at=issue.expires_at,
                    incarnation=target.incarnation)
        event = new_event(LinkCreated(link_id=link.link_id, workspace_id=workspace_id,
                                      team=team, creator=user, scope=str(scope),
                                      expires_at=_rfc3339(issue.expires_at)),
                          source=SOURCE)
        self.store.create_link(digest, link, _audit(link, user, "link.created", "accepted",
                                                    event.id, now, ttl=issue.ttl_seconds))
        try:
            self.bus.publish(event)
        except Exception as exc:
            # No event, no link: a link nobody was told about must not stay usable.
            log.error("publishing link.created for %s failed, revoking it: %s",
                      link.link_id, exc)
            self._revoke(digest, PROXY_ACTOR, "link.created could not be published",
                         force=True)
            return _json({"error": str(Reason.UNAVAILABLE), "message":
                          "the link could not be announced; try again"}, 503)
        log.info("link %s created by %s for %s (%s, until %s)", link.link_id, user,
                 workspace_id, scope, _rfc3339(issue.expires_at))
        return _json({
            "link_id": link.link_id, "url": link_url(self.proxy_url(request), workspace_id,
                                                     token),
            "token": token, "workspace_id": workspace_id, "team": team, "scope": str(scope),
            "expires_at": _rfc3339(issue.expires_at), "ttl_seconds": issue.ttl_seconds,
            "notices": list(issue.notices), "event_id": event.id}, 201)

    # --- list -----------------------------------------------------------------------------------
    def list(self, user: str, args: Mapping[str, str]) -> Response:
        workspace, team = args.get("workspace") or None, args.get("team") or None
        if workspace and not team:
            team = workspace.split(WORKSPACE_SEPARATOR)[0]
        if team and self._role(team, user) == Role.ADMIN:
            rows = self.store.list_links(workspace=workspace, team=team)
        else:
            rows = self.store.list_links(workspace=workspace, team=team, creator=user)
        if args.get("all") not in ("1", "true"):
            now = self.clock()
            rows = [(link, usage) for link, usage in rows if link.status(now) == "active"]
        now = self.clock()
        return _json({"links": [_row(link, usage, now) for link, usage in
                                sorted(rows, key=lambda r: r[0].created_at)]}, 200)

    # --- revoke ---------------------------------------------------------------------------------
    def revoke(self, user: str, link_id: str) -> Response:
        if not is_link_id(link_id):
            return _json({"error": str(Reason.UNKNOWN_LINK), "message":
                          f"{link_id!r} is not a link id (lnk-...)"}, 404)
        found = self.store.find_link(link_id)
        if found is None:
            return _json({"error": str(Reason.UNKNOWN_LINK), "message":
                          f"no link {link_id}"}, 404)
        digest, _ = found
        result = self._revoke(digest, user, "revoked")
        if isinstance(result, Refused):
            status = 200 if result.reason == Reason.ALREADY_REVOKED else (
                404 if result.reason == Reason.UNKNOWN_LINK else result.status)
            return _json({"error": str(result.reason), "message": result.message,
                          "link_id": link_id}, status)
        return _json({"link_id": link_id, "revoked_at": _rfc3339(result.revoked_at),
                      "revoked_by": user, "workspace_id": result.workspace}, 200)

    def revoke_exposed(self, digest: str) -> None:
        """The proxy saw this link's token in a URL: revoke it (no rights needed)."""
        self._revoke(digest, PROXY_ACTOR, "token exposed in a URL", force=True)

    def _revoke(self, digest: str, actor: str, reason: str, *,
                force: bool = False) -> Link | Refused:
        now = self.clock()
        event_box: list[Any] = []

        def decide(link: Link | None) -> Link | Refused:
            role = Role.ADMIN if force else (self._role(link.team, actor) if link else None)
            result = check_revoke(link, actor=actor, actor_role=role, now=now)
            if isinstance(result, Link):
                result = dataclasses.replace(result, revoke_reason=reason)
                event_box[:] = [new_event(LinkRevoked(link_id=result.link_id,
                                                      workspace_id=result.workspace,
                                                      actor=actor), source=SOURCE)]
            return result

        def audit(link: Link) -> Mapping[str, Any]:
            return _audit(link, actor, "link.revoked", f"accepted: {reason}",
                          event_box[0].id, now)

        result = self.store.revoke_link(digest, decide, audit)
        if isinstance(result, Link):
            for listener in self.revoked_listeners:
                listener(digest)
            log.info("link %s revoked by %s (%s)", result.link_id, actor, reason)
            try:
                self.bus.publish(event_box[0])
            except Exception:
                # The revocation is in effect (the document says so); the event is news.
                log.exception("publishing link.revoked for %s failed", result.link_id)
        return result

    def _role(self, team: str, user: str) -> Role | None:
        return role_in(self.store.team_members(team) or [], user)


def _ttl(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("ttl is a duration such as 1h")
    if isinstance(value, int):
        return value
    return parse_ttl(str(value))


def _rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def _audit(link: Link, actor: str, action: str, outcome: str, event_id: str, now: datetime,
           **extra: Any) -> dict[str, Any]:
    return {"actor": actor, "action": action, "target": link.workspace, "outcome": outcome,
            "link_id": link.link_id, "scope": str(link.scope), "team": link.team,
            "expires_at": link.expires_at, "event_id": event_id, "requestid": event_id,
            "time": now, **extra}


def _row(link: Link, usage: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    last = usage.get("last_used_at")
    return {"link_id": link.link_id, "workspace_id": link.workspace, "team": link.team,
            "creator": link.creator, "scope": str(link.scope), "status": link.status(now),
            "created_at": _rfc3339(link.created_at), "expires_at": _rfc3339(link.expires_at),
            "revoked_at": _rfc3339(link.revoked_at), "revoked_by": link.revoked_by,
            "revoke_reason": link.revoke_reason, "uses": usage.get("uses", 0),
            "last_used_at": _rfc3339(last) if isinstance(last, datetime) else None}


def _json(body: Mapping[str, Any], status: int) -> Response:
    return Response(json.dumps(body, default=str), status=status, mimetype="application/json",
                    headers={"Cache-Control": "no-store"})
