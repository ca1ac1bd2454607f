"""The IDE access proxy's aiohttp application.

Paths:

=============================== ===========================================================
``*  /w/<workspace id>/...``    the workspace's IDE, HTTP and WebSocket (``/w/<id>`` alone
                                redirects to ``/w/<id>/``); ``GET /w/<id>/?resume=1`` on a
                                paused workspace resumes it (the portal's "Open" may ask)
``POST /_stasis/resume/<id>``   the paused page's "Resume" (CSRF token of the session)
``GET /healthz``                the proxy answers
=============================== ===========================================================

Every request and every WebSocket upgrade is decided (``access.Gate``) before anything is
forwarded. Refusals: 401 without a valid identity (a page saying how to sign in, for a
browser), 403 for another team's user, a member without rights, or a cross-origin request
(an ``Origin`` that is not this host, on a WebSocket or a non-GET request), 409 for a paused
workspace (a page with "Resume"; through the WebSocket or an API call a JSON body),
503 with Retry-After while it is on its way to RUNNING, 410 for one that is gone. What is
forwarded and what comes back is filtered by ``upstream`` (no credential either way).

The stack: aiohttp serves and forwards both HTTP and WebSocket in one well-kept library
(server, client, streaming bodies, subprotocols, ping/pong), with no ASGI server, HTTP
client and WebSocket library to assemble and keep in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import WSMsgType, web

from events import WorkspaceResumeRequested, new_event
from events.payloads import ide_path
from functions.domain.ide import resume_requestid, sign_in_hint, split_path
from functions.domain.links import Outcome, Reason, Verdict
from functions.ideproxy import pages
from functions.ideproxy.access import Connection, Decision, Gate, Identify, Visitor, Watch
from functions.ideproxy.upstream import (
    VSCODE,
    Masker,
    Upstream,
    UpstreamError,
    Upstreams,
    client_timeout,
    request_headers,
    response_headers,
)
from functions.portal import session as sessions
from functions.ports import Bus, RuntimeStatus
from functions.proxy.ports import Unauthenticated

log = logging.getLogger(__name__)
SOURCE = "//stasis/ideproxy"
RESUME_PREFIX = "/_stasis/resume/"
#: The largest WebSocket message passed either way (large notebook outputs, uploads).
MAX_MESSAGE_BYTES = 64 << 20
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WAIT_SECONDS = 2
_QUEUED_SECONDS = 15

_STATE_WORDS = {"PAUSED": "paused", "PAUSING": "pausing", "RESUMING": "resuming",
                "PROVISIONING": "starting", "REQUESTED": "starting",
                "QUEUED": "queued for capacity"}


class IdeProxy:
    def __init__(self, gate: Gate, identify: Identify,
                 status: Callable[[str], RuntimeStatus | None], bus: Bus, *,
                 portal_url: str | None = None, session_secret: bytes = b"") -> None:
        self.gate = gate
        self.identify = identify
        self.status = status
        self.bus = bus
        self.portal_url = portal_url
        self.session_secret = session_secret
        self.watch = Watch(gate)
        self.http: aiohttp.ClientSession | None = None
        self.upstreams: Upstreams | None = None
        self._watching: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, app: web.Application) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=client_timeout(),
            trust_env=False, cookie_jar=aiohttp.DummyCookieJar())
        self.upstreams = Upstreams(self.status, self.http)
        self._watching = asyncio.create_task(self.watch.run())

    async def stop(self, app: web.Application) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
        await asyncio.gather(*(c.close(1001, "the IDE proxy is stopping")
                               for c in list(self.watch.connections)),
                             return_exceptions=True)
        if self.http is not None:
            await self.http.close()

    # --- the one route ------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path
        if path == "/healthz":
            return web.Response(text="ok")
        if path.startswith(RESUME_PREFIX) and request.method == "POST":
            return await self._resume_form(request, path[len(RESUME_PREFIX):])
        parts = split_path(path)
        if parts is None:
            return self._refusal(request, 404, "Not found", "The IDE proxy serves "
                                 "/w/<workspace id>/ only.", reason="not_found")
        workspace_id, rest = parts
        if not rest:
            query = request.rel_url.raw_query_string
            raise web.HTTPPermanentRedirect(ide_path(workspace_id) + ("?" + query if query
                                                                      else ""))
        upgrade = _is_upgrade(request)
        try:
            visitor = self.identify(request.headers, request.cookies)
        except Unauthenticated as exc:
            return self._signed_out(request, exc)
        if (upgrade or request.method not in _SAFE_METHODS) and not _same_origin(request):
            return self._refusal(request, 403, "Refused", "a request from another site",
                                 reason="cross_origin", user=visitor.user)
        decision = await self.gate.check(visitor.user, workspace_id)
        verdict = decision.verdict
        if verdict.allowed:
            return await self._forward(request, visitor, decision, workspace_id, rest, upgrade)
        if verdict.outcome == Outcome.RESUME and decision.target is not None:
            if request.method == "GET" and request.query.get("resume") == "1" and not upgrade:
                await self._request_resume(visitor, decision)
                return self._waiting(request, visitor, workspace_id, "RESUMING",
                                     f"Resuming {workspace_id}: its kernels come back as "
                                     "they were.")
            return self._paused(request, visitor, workspace_id)
        if (verdict.outcome == Outcome.WAIT or verdict.reason == Reason.WORKSPACE_QUEUED) \
                and decision.target is not None:
            # QUEUED too: the page waits (and refreshes) until its hardware frees.
            return self._waiting(request, visitor, workspace_id, decision.target.state,
                                 verdict.message)
        return self._refusal(request, verdict.status, _title(verdict), verdict.message,
                             reason=str(verdict.reason), user=visitor.user,
                             state=decision.target.state if decision.target else None)

    # --- forwarding ---------------------------------------------------------------------------
    async def _forward(self, request: web.Request, visitor: Visitor, decision: Decision,
                       workspace_id: str, rest: str, upgrade: bool) -> web.StreamResponse:
        assert self.upstreams is not None and decision.target is not None
        try:
            upstream = await self.upstreams.get(workspace_id, decision.target.version)
        except UpstreamError as exc:
            return self._refusal(request, 502, "The IDE does not answer", str(exc),
                                 reason=str(Reason.UNAVAILABLE), user=visitor.user)
        if upstream is None:
            return self._waiting(request, visitor, workspace_id, "RUNNING",
                                 f"{workspace_id} is running; its IDE is not there yet.")
        try:
            if upgrade:
                return await self._websocket(request, visitor, upstream, rest)
            return await self._http(request, upstream, rest)
        except UpstreamError as exc:
            self.upstreams.forget(workspace_id)
            return self._refusal(request, 502, "The IDE does not answer", str(exc),
                                 reason=str(Reason.UNAVAILABLE), user=visitor.user)

    async def _http(self, request: web.Request, upstream: Upstream,
                    rest: str) -> web.StreamResponse:
        assert self.http is not None and self.upstreams is not None
        headers = request_headers(request.headers, request.cookies,
                                  await self.upstreams.credentials(upstream))
        url = upstream.url(rest, request.rel_url.raw_query_string)
        mask = Masker(self.upstreams.secrets(upstream))
        try:
            async with self.http.request(request.method, url, headers=headers,
                                         data=request.content if request.body_exists else None,
                                         allow_redirects=False) as answer:
                if upstream.kind == VSCODE and answer.status in (302, 303) and \
                        answer.headers.get("Location", "").endswith("login"):
                    self.upstreams.logged_out(upstream)
                out = web.StreamResponse(status=answer.status, reason=answer.reason)
                out.headers.extend(response_headers(
                    answer.headers.items(), mask, upstream=upstream,
                    public_base=ide_path(upstream.workspace_id).rstrip("/")))
                if "Content-Encoding" in answer.headers:
                    out.headers.popall("Content-Length", None)  # decoded on the way
                await out.prepare(request)
                async for chunk in answer.content.iter_any():
                    await out.write(mask.feed(chunk))
                await out.write(mask.flush())
                await out.write_eof()
                return out
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"the IDE of {upstream.workspace_id} did not answer: "
                                f"{exc}") from exc

    async def _websocket(self, request: web.Request, visitor: Visitor, upstream: Upstream,
                         rest: str) -> web.StreamResponse:
        assert self.http is not None and self.upstreams is not None
        headers = request_headers(request.headers, request.cookies,
                                  await self.upstreams.credentials(upstream))
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "")
                   .split(",") if p.strip()]
        url = upstream.url(rest, request.rel_url.raw_query_string)
        try:
            inner = await self.http.ws_connect("ws" + url.removeprefix("http"),
                                               headers=headers, protocols=offered,
                                               max_msg_size=MAX_MESSAGE_BYTES, compress=0)
        except aiohttp.WSServerHandshakeError as exc:
            # The IDE refused the upgrade itself (a kernel that is gone: 404): say so.
            return _json(exc.status, {"error": "upstream_refused",
                                      "message": f"the IDE answered {exc.status}"})
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"the IDE of {upstream.workspace_id} did not answer the "
                                f"WebSocket: {exc}") from exc
        outer = web.WebSocketResponse(protocols=[inner.protocol] if inner.protocol else (),
                                      max_msg_size=MAX_MESSAGE_BYTES, compress=False)
        try:
            await outer.prepare(request)
        except Exception:
            await inner.close()
            raise
        mask = Masker(self.upstreams.secrets(upstream))

        async def close(code: int, message: str) -> None:
            await outer.close(code=code, message=message.encode()[:120])
            await inner.close()

        connection = Connection(visitor, upstream.workspace_id, close)
        self.watch.add(connection)
        try:
            pumps = [asyncio.create_task(_pump(outer, inner, None)),
                     asyncio.create_task(_pump(inner, outer, mask))]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self.watch.discard(connection)
            code = inner.close_code if inner.closed and inner.close_code else 1000
            if not outer.closed:
                await outer.close(code=code)
            if not inner.closed:
                await inner.close()
        return outer

    # --- resume -------------------------------------------------------------------------------
    async def _resume_form(self, request: web.Request, workspace_id: str) -> web.StreamResponse:
        try:
            visitor = self.identify(request.headers, request.cookies)
        except Unauthenticated as exc:
            return self._signed_out(request, exc)
        form = await request.post()
        if not request.headers.get("Origin") or not _same_origin(request) or not (
                visitor.session is None or sessions.csrf_ok(
                    visitor.session, self.session_secret, str(form.get("csrf") or ""))):
            return self._refusal(request, 403, "Refused", "the form's CSRF token is missing "
                                 "or wrong: open the workspace again", reason="csrf",
                                 user=visitor.user)
        decision = await asyncio.to_thread(self.gate.decide, visitor.user, workspace_id)
        if decision.verdict.outcome == Outcome.DENY:
            return self._refusal(request, decision.verdict.status, _title(decision.verdict),
                                 decision.verdict.message, reason=str(decision.verdict.reason),
                                 user=visitor.user)
        if decision.verdict.outcome != Outcome.RESUME:
            raise web.HTTPSeeOther(ide_path(workspace_id))  # already on its way, or back
        await self._request_resume(visitor, decision)
        # Through ?resume=1: until the lifecycle's move shows, the workspace still reads
        # PAUSED, and that page resumes (the same request again) and waits.
        raise web.HTTPSeeOther(ide_path(workspace_id) + "?resume=1")

    async def _request_resume(self, visitor: Visitor, decision: Decision) -> None:
        target = decision.target
        assert target is not None
        event = new_event(WorkspaceResumeRequested(workspace_id=target.id,
                                                   actor=visitor.user),
                          source=SOURCE, requestid=resume_requestid(target))
        await asyncio.to_thread(self.bus.publish, event)
        log.info("%s resumed %s from the IDE proxy", visitor.user, target.id)

    # --- pages ----------------------------------------------------------------------------------
    def _paused(self, request: web.Request, visitor: Visitor,
                workspace_id: str) -> web.StreamResponse:
        message = (f"{workspace_id} is paused: its kernels' state is saved and its hardware "
                   "is released. Resume it to carry on where you left off.")
        if not _wants_html(request):
            return _json(409, {"error": str(Reason.WORKSPACE_PAUSED), "state": "PAUSED",
                               "message": message})
        csrf = (sessions.csrf_token(visitor.session, self.session_secret)
                if visitor.session is not None and self.session_secret else None)
        return _page(409, title=f"{workspace_id} is paused", message=message, state="PAUSED",
                     user=visitor.user, resume_action=RESUME_PREFIX + workspace_id, csrf=csrf)

    def _waiting(self, request: web.Request, visitor: Visitor, workspace_id: str, state: str,
                 message: str) -> web.StreamResponse:
        # A queued workspace may wait for hours: its page looks again less often.
        seconds = _QUEUED_SECONDS if state == "QUEUED" else _WAIT_SECONDS
        headers = {"Retry-After": str(seconds)}
        if not _wants_html(request):
            return _json(503, {"error": str(Reason.WAITING), "state": state,
                               "message": message}, headers)
        word = _STATE_WORDS.get(state, state.lower())
        return _page(503, headers, title=f"{workspace_id} is {word}", message=message,
                     state=state, user=visitor.user, refresh=seconds,
                     refresh_to=ide_path(workspace_id))

    def _signed_out(self, request: web.Request, exc: Exception) -> web.StreamResponse:
        link = {"href": self.portal_url, "text": "Sign in"} if self.portal_url else None
        return self._refusal(request, 401, "Sign in", f"{exc}: {sign_in_hint(self.portal_url)}",
                             reason=str(Reason.UNAUTHENTICATED), link=link)

    def _refusal(self, request: web.Request, status: int, title: str, message: str, *,
                 reason: str, user: str | None = None, state: str | None = None,
                 link: Any = None) -> web.StreamResponse:
        if not _wants_html(request):
            return _json(status, {"error": reason, "message": message})
        return _page(status, title=title, message=message, user=user, state=state,
                     link=link or None)


def make_app(proxy: IdeProxy) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", proxy.handle)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    return app


async def _pump(source: Any, sink: Any, mask: Masker | None) -> None:
    async for message in source:
        if message.type == WSMsgType.TEXT:
            await sink.send_str(mask.text(message.data) if mask else message.data)
        elif message.type == WSMsgType.BINARY:
            await sink.send_bytes(mask.data(message.data) if mask else message.data)
        elif message.type == WSMsgType.ERROR:
            break


def _is_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"




def _same_origin(request: web.Request) -> bool:
    """No Origin (not a browser's cross-site request), or this proxy's own host."""
    origin = request.headers.get("Origin")
    if not origin:
        return True
    return urlsplit(origin).netloc.lower() == (request.host or "").lower()


def _wants_html(request: web.Request) -> bool:
    return not _is_upgrade(request) and "text/html" in request.headers.get("Accept", "")


def _title(verdict: Verdict) -> str:
    if verdict.status == 403:
        return "Not yours to open"
    if verdict.status == 410:
        return "Gone"
    return "Not available"


def _json(status: int, body: Mapping[str, Any],
          headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers={"Cache-Control": "no-store", **(headers or {})})


def _page(status: int, headers: Mapping[str, str] | None = None, **values: Any) -> web.Response:
    return web.Response(status=status, text=pages.render(status=status, **values),
                        content_type="text/html",
                        headers={"Cache-Control": "no-store", **(headers or {})})
