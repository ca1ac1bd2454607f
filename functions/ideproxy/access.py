"""Who the browser is, whether it may use a workspace's IDE now, and the watch that ends
the WebSockets of those who may not any more.

Identity (:func:`functions.ideproxy.wiring.identify_from_env` picks one, failing closed):

- **the portal's session** (locally): the ``stasis_session`` cookie of
  ``functions/portal/session.py``, verified with ``STASIS_SESSION_SECRET``; it expires
  with the session, open WebSockets included.
- **IAP** (a deployment): the signed ``x-goog-iap-jwt-assertion``, verified as the
  dashboard and the links proxy verify it (``functions/adapters/iap.py``), the e-mail
  mapped to a Stasis user as the dashboard maps it (``STASIS_DASHBOARD_EMAIL_DOMAIN``).

The decision is :func:`functions.domain.ide.check_session` on what the proxy knows of the
workspace (``workspaces/{id}``: team, owner, state, version) and of its team's members
(``teams/{team}``), read through the links proxy's :class:`ReadCache`: an entry is never
older than ``cache_seconds`` (1.5 s), so the event loop asks the cache first and reads (in
a thread) only on a miss, or when what it knows is a workspace paused or on its way (a
state about to change: a request right after a resume must not be told "resuming"). A
request is therefore let in or refused on what was true at most 1.5 s ago.

Open WebSockets are re-authorized by :class:`Watch` every ``interval`` (0.5 s): it re-reads,
in one batch, the documents of the open connections that are half-way to expiry
(``ReadCache.refresh``: so each about once a second), decides again for each connection
right after, and closes (code 1008, with the reason) those no longer allowed: a user
removed from the team or demoted, a workspace pausing, paused, deleted or given to another
owner, an expired session. A change is seen within one second plus one read. The cost: one
read a second of each workspace with an open WebSocket and of its team (one batched read
per second in all), none while no WebSocket is open. An idle JupyterLab tab keeps its
WebSockets open, so an open tab costs about 86,400 reads of its workspace a day (about
0.05 USD at Firestore's list price of 0.06 USD per 100,000), plus its team's, shared by
the team's tabs. Firestore listeners on those documents would cost reads only on change,
at the price of a stream (and, in the Python client, a thread) per listened document; the
polling watch was chosen for its small, fixed code and its bounded latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from functions.dashboard.access import user_for_email
from functions.domain.ide import check_session
from functions.domain.links import Outcome, Reason, Target, Verdict, deny, role_in
from functions.portal import session as sessions
from functions.proxy.access import ReadCache
from functions.proxy.ports import Identity, LinkStore, Unauthenticated

log = logging.getLogger(__name__)
#: How long the proxy trusts what it read about a workspace or a team.
CACHE_SECONDS = 1.5
#: How often every open WebSocket is authorized again.
WATCH_SECONDS = 0.5
#: WebSocket close code of a connection whose access ended (RFC 6455: policy violation).
POLICY_CLOSE = 1008


@dataclass(frozen=True)
class Visitor:
    """A verified browser: the Stasis user, how it was verified, and until when."""

    user: str
    via: str  # "session" or "iap"
    session: sessions.Session | None = None
    expires_at: float | None = None


class Identify(Protocol):
    def __call__(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Visitor:
        """The verified visitor; raises Unauthenticated."""
        ...


class SessionCookies:
    """The portal's signed session cookie (the local stack)."""

    def __init__(self, secret: bytes, *, clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("session cookies need STASIS_SESSION_SECRET")
        self.secret = secret
        self.clock = clock

    def __call__(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Visitor:
        found = sessions.verify(cookies.get(sessions.COOKIE), self.secret, self.clock())
        if found is None:
            raise Unauthenticated("not signed in" if not cookies.get(sessions.COOKIE)
                                  else "the session is expired or not valid")
        return Visitor(found.user, "session", found, float(found.expires_at))


class IapVisitors:
    """Identity-Aware Proxy's signed identity (a deployment)."""

    def __init__(self, identity: Identity, email_domain: str | None) -> None:
        self.identity = identity
        self.email_domain = email_domain

    def __call__(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Visitor:
        caller = self.identity.caller(headers)
        return Visitor(user_for_email(caller.user, self.email_domain), "iap")


class Refusing:
    """No identity source configured: every request is refused, saying what to set."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Visitor:
        raise Unauthenticated(self.why)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    target: Target | None = None


class Gate:
    """The per-request decision on cached reads."""

    def __init__(self, store: LinkStore, *, cache_seconds: float = CACHE_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.cache = ReadCache(store, cache_seconds, monotonic=monotonic)

    def decide(self, user: str, workspace_id: str) -> Decision:
        """Decide, reading what the cache lacks (blocking: call it off the event loop)."""
        target: Target | None = self.cache.get("workspace", workspace_id)
        members = self.cache.get("team", target.team) if target is not None else None
        return self._decision(user, workspace_id, target, members)

    def peek(self, user: str, workspace_id: str) -> Decision | None:
        """Decide from the cache alone, or None if it lacks something."""
        fresh, target = self.cache.peek("workspace", workspace_id)
        if not fresh:
            return None
        members = None
        if target is not None:
            fresh, members = self.cache.peek("team", target.team)
            if not fresh:
                return None
        return self._decision(user, workspace_id, target, members)

    async def check(self, user: str, workspace_id: str) -> Decision:
        known = self.peek(user, workspace_id)
        if known is not None and known.verdict.outcome in (Outcome.ALLOW, Outcome.DENY):
            return known
        if known is not None:
            # Paused or on its way: a state about to change, read afresh rather than show a
            # stale "resuming" page (or refuse a request just after the resume finished).
            self.cache.forget("workspace", workspace_id)
        return await asyncio.to_thread(self.decide, user, workspace_id)

    @staticmethod
    def _decision(user: str, workspace_id: str, target: Target | None,
                  members: list[Mapping[str, object]] | None) -> Decision:
        role = role_in(members or [], user) if target is not None else None
        return Decision(check_session(user, role=role, workspace=target,
                                      workspace_id=workspace_id), target)


@dataclass(eq=False)
class Connection:
    """An open WebSocket through the proxy, and how to end it."""

    visitor: Visitor
    workspace_id: str
    close: Callable[[int, str], Awaitable[None]]
    opened: float = field(default_factory=time.monotonic)


class Watch:
    """Re-authorizes every open WebSocket each ``interval`` and closes the refused ones."""

    def __init__(self, gate: Gate, *, interval: float = WATCH_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.gate = gate
        self.interval = interval
        self.clock = clock
        self.connections: set[Connection] = set()

    def add(self, connection: Connection) -> None:
        self.connections.add(connection)

    def discard(self, connection: Connection) -> None:
        self.connections.discard(connection)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except Exception:  # a failed read must not end the watch: the next tick retries
                log.exception("re-authorizing the open WebSockets failed")

    async def sweep(self) -> int:
        """One round: refresh the cache, decide for every connection, close the refused;
        returns how many were closed."""
        if not self.connections:
            return 0
        await asyncio.to_thread(self.gate.cache.refresh)
        now = self.clock()
        ending: list[tuple[Connection, Verdict]] = []
        for connection in list(self.connections):
            visitor = connection.visitor
            if visitor.expires_at is not None and now >= visitor.expires_at:
                ending.append((connection, deny(Reason.UNAUTHENTICATED, "the session expired: "
                                                "sign in again")))
                continue
            decision = await self.gate.check(visitor.user, connection.workspace_id)
            if not decision.verdict.allowed:
                ending.append((connection, decision.verdict))
        for connection, verdict in ending:
            self.discard(connection)
            log.info("closing a WebSocket of %s to %s: %s", connection.visitor.user,
                     connection.workspace_id, verdict.reason)
        await asyncio.gather(*(_closed(c, v) for c, v in ending))
        return len(ending)


async def _closed(connection: Connection, verdict: Verdict) -> None:
    with contextlib.suppress(Exception):
        await connection.close(POLICY_CLOSE, verdict.message or str(verdict.reason))
