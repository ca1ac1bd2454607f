"""The access proxy: agent links in, the workspace's kernel and Jupyter REST API out.

Paths (after the function's own mount, ``/proxy`` on the local host):

========================== ========= =====================================================
``GET  /<workspace>/``     read      the link: scope, expiry, the workspace's state
``POST /<workspace>/execute`` execute run ``{"code": ...}`` in a kernel; NDJSON stream
``*    /<workspace>/api/...`` read    the workspace's Jupyter REST API (GET/HEAD: read,
                                      other methods: write, which only exec links have)
``*    /<workspace>/stasis/sandboxes/...`` sandbox: agent sandboxes for the link's team, as
                                      its creator (:mod:`functions.proxy.sandboxes`)
========================== ========= =====================================================

Every request carries ``Authorization: Bearer <token>`` and is checked, every time, by
:func:`functions.domain.links.check_request` on what this instance knows about the link, the
creator's team and the workspace. That knowledge is cached for ``policy.cache_seconds``
(0.5 s): Cloud Functions run many instances and an event reaches only one of them, so a
short TTL, not invalidation, is what bounds how long a revoked link keeps working (the
``links`` function also drops the link from its own process's cache at once). An open
stream re-checks its link every ``policy.recheck_seconds`` (0.2 s) and, when the link is
revoked or expires, ends with ``{"type": "end", "status": "revoked"}`` and interrupts the
cell it started: revocation takes effect in under a second, streams included.

The execute stream, one JSON object per line:

- ``{"type": "status", "state": "PAUSED", "message": ...}`` while a paused workspace is
  resumed (the proxy publishes workspace.resume_requested once per paused period: the
  request id is derived from the workspace's version) or a starting one comes up;
- ``{"type": "kernel", "kernel_id": ..., "notebook": ...}`` the kernel it runs in;
- ``{"type": "stream", "name": "stdout"|"stderr", "text": ...}``,
  ``{"type": "result", "text": ...}``, ``{"type": "error", "ename", "evalue", "traceback"}``;
- last, ``{"type": "end", "status": "ok"|"error"|"revoked"|"expired"|"denied"|"timeout"|
  "unavailable", "reason": ..., "message": ..., "seconds": ...}``.

Rate limits (per instance): each link has a token bucket (``policy.link_rate``); each
client (the IAP principal, else the remote address) has a budget of failed attempts
(``policy.failure_rate``), spent by every 401, after which it gets 429 with Retry-After
without a lookup. A token found in the request URL is refused (400) and, if it names a
link, that link is revoked: a URL is logged on its way, so the token must be considered
leaked.

The token is never logged: denials name the link id, or the first 8 hex digits of the
token's hash when there is no link.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from typing import Any

from werkzeug.wrappers import Request, Response

from events import WorkspaceResumeRequested, new_event
from functions.domain.links import (
    BAD_PATH,
    DEFAULT_POLICY,
    Bucket,
    Link,
    LinkPolicy,
    Operation,
    Outcome,
    Reason,
    Target,
    Verdict,
    available,
    check_request,
    check_token,
    deny,
    normal_path,
    operation_for,
    role_in,
    take,
    token_hash,
    tokens_in,
)
from functions.ports import Bus
from functions.proxy.ports import (
    Caller,
    GatewayError,
    Identity,
    KernelGateway,
    LinkStore,
    SandboxResults,
    Unauthenticated,
)
from functions.proxy.sandboxes import SandboxDesk

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/proxy"
NDJSON = "application/x-ndjson"
_MAX_CACHED = 10_000
#: A REST request waits at most this long for a resume (an HTTP client would time out).
REST_WAIT_SECONDS = 60.0


class ReadCache:
    """What this instance knows about links, teams and workspaces, never older than
    ``seconds``: an entry's age counts from *before* the read that produced it began.

    A miss reads on the request path. Entries used in the last ``hot_seconds`` are
    re-read ahead of expiry: every ``seconds / 5`` the proxy's refresher thread calls
    :meth:`refresh`, which re-reads, in one batch, those half-way to expiry; so a link in
    steady use is never a miss, and the batches stay small (GIL pauses short). If
    the refresher does not run (no CPU between requests), entries simply expire and the
    next request reads. :meth:`forget` drops an entry at once and keeps a refresh that was
    already under way from writing back what it read before.
    """

    KINDS = ("link", "team", "workspace")

    def __init__(self, store: LinkStore, seconds: float, *,
                 monotonic: Callable[[], float] = time.monotonic, hot_seconds: float = 10.0,
                 maxsize: int = _MAX_CACHED) -> None:
        self.store = store
        self.seconds = seconds
        self.monotonic = monotonic
        self.hot_seconds = hot_seconds
        self.maxsize = maxsize
        self.lock = threading.Lock()
        # kind -> key -> (value, read_at, used_at)
        self.data: dict[str, OrderedDict[str, tuple[Any, float, float]]] = {
            kind: OrderedDict() for kind in self.KINDS}
        self.forgotten: dict[tuple[str, str], float] = {}
        self.loaders: dict[str, Callable[[str], Any]] = {
            "link": store.get_link, "team": store.team_members, "workspace": store.target}

    def get(self, kind: str, key: str) -> Any:
        fresh, value = self.peek(kind, key)
        if fresh:
            return value
        started = self.monotonic()
        value = self.loaders[kind](key)
        self._put(kind, key, value, started, used=started)
        return value

    def peek(self, kind: str, key: str) -> tuple[bool, Any]:
        """(True, value) when the cache holds a fresh entry (now marked used), else
        (False, None): never reads (the IDE proxy's event loop must not block)."""
        now = self.monotonic()
        with self.lock:
            hit = self.data[kind].get(key)
            if hit is None or now - hit[1] >= self.seconds:
                return False, None
            self.data[kind][key] = (hit[0], hit[1], now)
            return True, hit[0]

    def forget(self, kind: str, key: str) -> None:
        with self.lock:
            self.data[kind].pop(key, None)
            self.forgotten[(kind, key)] = self.monotonic()

    def refresh(self) -> int:
        """Re-read every hot entry in one batch; returns how many were read."""
        now = self.monotonic()
        with self.lock:
            hot: dict[str, list[str]] = {}
            for kind, entries in self.data.items():
                for key in [k for k, v in entries.items() if now - v[2] > self.hot_seconds]:
                    del entries[key]  # cold: the next use reads again
                # Only what is half-way to expiry: small batches, spread over time.
                hot[kind] = [k for k, v in entries.items() if now - v[1] >= self.seconds / 2]
            self.forgotten = {k: t for k, t in self.forgotten.items()
                              if now - t < 2 * self.seconds}
        if not any(hot.values()):
            return 0
        started = self.monotonic()
        links, teams, workspaces = self.store.read_many(hot["link"], hot["team"],
                                                        hot["workspace"])
        for kind, values in (("link", links), ("team", teams), ("workspace", workspaces)):
            for key, value in values.items():
                self._put(kind, key, value, started, used=None)
        return sum(len(v) for v in hot.values())

    def _put(self, kind: str, key: str, value: Any, read_at: float,
             used: float | None) -> None:
        with self.lock:
            if self.forgotten.get((kind, key), float("-inf")) >= read_at:
                return  # forgotten after this read began: what it read may be stale
            entries = self.data[kind]
            old = entries.get(key)
            if old is not None and old[1] > read_at:
                return  # a newer read got there first
            if used is None and old is None:
                return  # dropped (cold or forgotten) while the refresh ran
            used_at = used if used is not None else (old[2] if old is not None else read_at)
            entries[key] = (value, read_at, used_at)
            entries.move_to_end(key)
            while len(entries) > self.maxsize:
                entries.popitem(last=False)


@dataclass(frozen=True)
class Access:
    """A verdict with what it was decided on."""

    verdict: Verdict
    link: Link | None = None
    token_hash: str = ""
    target: Target | None = None


class Authorizer:
    """The per-request check: cached reads, the domain's decision, the rate limits."""

    def __init__(self, store: LinkStore, *, clock: Callable[[], datetime],
                 policy: LinkPolicy = DEFAULT_POLICY,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.policy = policy
        self.monotonic = monotonic
        self.cache = ReadCache(store, policy.cache_seconds, monotonic=monotonic)
        self.lock = threading.Lock()
        self.link_buckets: dict[str, Bucket] = {}
        self.client_buckets: dict[str, Bucket] = {}

    def authorize(self, token: str, *, client: str, workspace_id: str, operation: Operation,
                  count: bool = True) -> Access:
        """Check one request. ``count=False`` (an open stream re-checking) spends nothing
        from the rate limits."""
        now = self.monotonic()
        if count:
            with self.lock:
                left = available(self.client_buckets.get(client), now,
                                 self.policy.failure_rate)
            if left < 1:
                wait = (1 - left) / self.policy.failure_rate.per_second
                return Access(deny(Reason.TOO_MANY_FAILURES, "too many failed attempts from "
                                   "this client: wait and check the link", wait))
        digest = token_hash(token)
        link: Link | None = self.cache.get("link", digest)
        role, target = None, None
        if link is not None:
            role = role_in(self.cache.get("team", link.team) or [], link.creator)
            target = self.cache.get("workspace", link.workspace)
        verdict = check_request(link, now=self.clock(), workspace_id=workspace_id,
                                operation=operation, creator_role=role, workspace=target,
                                policy=self.policy)
        if count:
            verdict = self._spend(verdict, client, digest, now)
        return Access(verdict, link, digest, target)

    def _spend(self, verdict: Verdict, client: str, digest: str, now: float) -> Verdict:
        with self.lock:
            if not verdict.authenticated:
                _, self.client_buckets[client], _ = take(self.client_buckets.get(client), now,
                                                         self.policy.failure_rate)
                _prune(self.client_buckets, now, self.policy.failure_rate.burst)
                return verdict
            allowed, self.link_buckets[digest], wait = take(self.link_buckets.get(digest), now,
                                                            self.policy.link_rate)
            _prune(self.link_buckets, now, self.policy.link_rate.burst)
        if not allowed:
            return deny(Reason.RATE_LIMITED, f"more than {self.policy.link_rate.per_second:g} "
                        "requests per second on this link: slow down", wait)
        return verdict

    def forget(self, digest: str) -> None:
        """Drop a link from the cache (it was revoked in this process)."""
        self.cache.forget("link", digest)


def _prune(buckets: dict[str, Bucket], now: float, burst: int) -> None:
    # Bounded memory under a flood of clients: forget buckets idle long enough to be full.
    if len(buckets) > _MAX_CACHED:
        for key in [k for k, b in buckets.items() if now - b.at > burst * 60]:
            del buckets[key]


@dataclass(frozen=True)
class _Call:
    """One proxied request, as the streaming code needs it after the view returned."""

    token: str
    client: str
    caller: Caller
    workspace_id: str
    operation: Operation


class AccessProxy:
    """The ``proxy`` HTTP function: ``proxy(request) -> response``."""

    def __init__(self, store: LinkStore, gateway: KernelGateway, bus: Bus, identity: Identity,
                 *, clock: Callable[[], datetime], policy: LinkPolicy = DEFAULT_POLICY,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll_seconds: float = 0.5,
                 on_exposed: Callable[[str], Any] | None = None,
                 refresh_ahead: bool = True,
                 sandboxes: SandboxResults | None = None) -> None:
        self.store = store
        self.gateway = gateway
        self.bus = bus
        self.identity = identity
        self.clock = clock
        self.policy = policy
        self.monotonic = monotonic
        self.sleep = sleep
        self.poll_seconds = poll_seconds
        self.on_exposed = on_exposed
        self.auth = Authorizer(store, clock=clock, policy=policy, monotonic=monotonic)
        self.sandbox_desk = None if sandboxes is None else SandboxDesk(
            sandboxes, bus, clock=clock, monotonic=monotonic, sleep=sleep)
        self._uses: Counter[str] = Counter()
        self._flushed = monotonic()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._refresher: threading.Thread | None = None if refresh_ahead else _NO_THREAD
        self._closed = threading.Event()

    # --- the view ---------------------------------------------------------------------------
    def __call__(self, request: Request) -> Response:
        started, started_cpu = time.perf_counter(), time.thread_time()
        if self._refresher is None:
            self._start_refresher()
        path = request.path
        query = request.query_string.decode("latin-1")
        checked = check_token(path, query, request.headers.get("Authorization"))
        if isinstance(checked, Verdict):
            if checked.reason == Reason.TOKEN_IN_URL:
                self._exposed(path + "?" + query)
            return _refusal(checked)
        token = checked
        try:
            caller = self.identity.caller(request.headers)
        except Unauthenticated as exc:
            return _refusal(deny(Reason.UNAUTHENTICATED, str(exc)))
        client = caller.user if caller.via == "iap" else (request.remote_addr or "unknown")
        workspace_id, _, raw_subpath = path.strip("/").partition("/")
        subpath = normal_path(raw_subpath)
        if subpath is None:
            return _refusal(BAD_PATH)
        operation = operation_for(request.method, subpath)
        access = self.auth.authorize(token, client=client, workspace_id=workspace_id,
                                     operation=operation or Operation.READ)
        # The check's wall time (queueing for the CPU included) and its own CPU time.
        timing = {"Server-Timing": f"auth;dur={(time.perf_counter() - started) * 1000:.3f}, "
                                   f"authcpu;dur={(time.thread_time() - started_cpu) * 1000:.3f}"}
        if access.verdict.outcome == Outcome.DENY:
            self._denied(access, client, caller)
            return _refusal(access.verdict, timing)
        if operation is None:
            return _json({"error": str(Reason.UNKNOWN_OPERATION), "message":
                          f"the proxy serves GET /, POST /execute and /api/...; not "
                          f"{request.method} /{subpath}"}, 404, timing)
        self._count_use(access.token_hash)
        call = _Call(token, client, caller, workspace_id, operation)
        if operation == Operation.EXECUTE:
            return self._execute(request, call, access, timing)
        if operation == Operation.SANDBOX:
            return self._sandboxes(request, call, access, subpath, timing)
        if not subpath.strip("/"):
            return self._info(access, timing)
        return self._forward(request, call, access, subpath, query, timing)

    def _start_refresher(self) -> None:
        with self._lock:
            if self._refresher is not None:
                return
            self._refresher = threading.Thread(target=self._refresh_forever, daemon=True,
                                               name="proxy-read-ahead")
        self._refresher.start()

    def _refresh_forever(self) -> None:
        cache = self.auth.cache
        while not self._closed.wait(cache.seconds / 5):
            try:
                cache.refresh()
            except Exception as exc:  # entries then expire and requests read themselves
                log.warning("read-ahead of links failed: %s", exc)

    # --- link info and REST -------------------------------------------------------------------
    def _info(self, access: Access, headers: dict[str, str]) -> Response:
        link, target = access.link, access.target
        assert link is not None and target is not None
        return _json({"link_id": link.link_id, "workspace": link.workspace, "team": link.team,
                      "creator": link.creator, "scope": str(link.scope),
                      "expires_at": link.expires_at.isoformat(), "state": target.state,
                      "verdict": str(access.verdict.reason)}, 200, headers)

    def _forward(self, request: Request, call: _Call, access: Access, subpath: str, query: str,
                 headers: dict[str, str]) -> Response:
        if access.verdict.outcome != Outcome.ALLOW:
            waiting = self._wait_running(call, access, min(self.policy.resume_wait_seconds,
                                                           REST_WAIT_SECONDS))
            try:
                while True:
                    next(waiting)
            except StopIteration as stop:
                final, end = stop.value
            if final is None:
                status = {"revoked": 401, "expired": 401, "denied": 403}.get(
                    str((end or {}).get("status")), 503)
                return _json({"error": end.get("reason") if end else "unavailable",
                              "message": end.get("message") if end else ""}, status,
                             {**headers, "Retry-After": "5"})
            access = final
        assert access.target is not None
        try:
            server = self.gateway.server(call.workspace_id, access.target.version)
            if server is None:
                return _json({"error": str(Reason.UNAVAILABLE), "message":
                              "the workspace has no running server"}, 503,
                             {**headers, "Retry-After": "5"})
            forwarded = self.gateway.forward(server, request.method, subpath, query,
                                             request.get_data(), request.content_type)
        except GatewayError as exc:
            return _json({"error": str(Reason.UNAVAILABLE), "message": str(exc)}, 502, headers)
        return Response(forwarded.body, status=forwarded.status,
                        content_type=forwarded.content_type,
                        headers={**headers, "Cache-Control": "no-store"})

    # --- agent sandboxes ----------------------------------------------------------------------
    def _sandboxes(self, request: Request, call: _Call, access: Access, subpath: str,
                   headers: dict[str, str]) -> Response:
        if self.sandbox_desk is None:
            return _json({"error": str(Reason.UNAVAILABLE), "message": "agent sandboxes are "
                          "not available on this deployment"}, 503, headers)
        assert access.link is not None
        rest = [s for s in subpath.split("/") if s][2:]  # after stasis/sandboxes
        response = self.sandbox_desk(request, access.link, rest, headers)
        if request.method == "POST":
            self._audit(access, call, "link.sandbox", f"answered {response.status_code}")
        return response

    # --- execute --------------------------------------------------------------------------------
    def _execute(self, request: Request, call: _Call, access: Access,
                 headers: dict[str, str]) -> Response:
        limit = self.policy.max_code_bytes
        if (request.content_length or 0) > limit + 4096:
            return _json({"error": "too_large", "message": f"code over {limit} bytes"}, 413)
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return _json({"error": "bad_request", "message":
                          'send JSON {"code": "...", "notebook"?: PATH, "kernel_id"?: ID, '
                          '"timeout"?: SECONDS}'}, 400, headers)
        code = body["code"]
        if len(code.encode()) > limit:
            return _json({"error": "too_large", "message": f"code over {limit} bytes"}, 413)
        options = {k: body.get(k) for k in ("notebook", "kernel_id")}
        if any(v is not None and not isinstance(v, str) for v in options.values()):
            return _json({"error": "bad_request", "message": "notebook and kernel_id are "
                          "strings"}, 400, headers)
        try:
            timeout = min(float(body.get("timeout") or self.policy.max_exec_seconds),
                          self.policy.max_exec_seconds)
        except (TypeError, ValueError):
            return _json({"error": "bad_request", "message": "timeout is seconds"}, 400)
        self._audit(access, call, "link.exec", "accepted", code=code)
        stream = self._exec_stream(call, access, code, options, timeout)
        return Response(stream, status=200, mimetype=NDJSON, headers={
            **headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def _exec_stream(self, call: _Call, access: Access, code: str,
                     options: Mapping[str, str | None], timeout: float) -> Iterator[bytes]:
        started = self.monotonic()

        def end(status: str, reason: str, message: str = "", **extra: Any) -> bytes:
            return _line({"type": "end", "status": status, "reason": reason,
                          "message": message, "seconds": round(self.monotonic() - started, 3),
                          **extra})

        if access.verdict.outcome != Outcome.ALLOW:
            final, _ = yield from self._wait_running(call, access,
                                                     self.policy.resume_wait_seconds)
            if final is None:
                return
            access = final
        assert access.target is not None
        try:
            server = self.gateway.server(call.workspace_id, access.target.version)
            if server is None:
                yield end("unavailable", str(Reason.UNAVAILABLE),
                          "the workspace has no running server")
                return
            choice = self.gateway.choose_kernel(server, notebook=options.get("notebook"),
                                                kernel_id=options.get("kernel_id"))
            yield _line({"type": "kernel", "kernel_id": choice.kernel_id,
                         "notebook": choice.notebook, "created": choice.created})
            execution = self.gateway.execute(server, choice.kernel_id, code)
        except GatewayError as exc:
            yield end("unavailable", str(Reason.UNAVAILABLE), str(exc))
            return
        finished = False
        try:
            last_check = self.monotonic()
            while True:
                try:
                    message = execution.next(self.policy.recheck_seconds)
                except GatewayError as exc:
                    yield end("unavailable", str(Reason.UNAVAILABLE), str(exc))
                    return
                if message is not None and message.get("type") == "done":
                    finished = True
                    status = "ok" if message.get("status") == "ok" else "error"
                    yield end(status, str(Reason.OK), "",
                              execution_count=message.get("execution_count"))
                    return
                now = self.monotonic()
                if now - last_check >= self.policy.recheck_seconds:
                    last_check = now
                    check = self.auth.authorize(call.token, client=call.client,
                                                workspace_id=call.workspace_id,
                                                operation=call.operation, count=False)
                    if not check.verdict.allowed:
                        # Revoked, expired, creator removed, workspace pausing: stop here.
                        log.info("closing the stream of link %s: %s", _link_name(check),
                                 check.verdict.reason)
                        yield end(_end_status(check.verdict), str(check.verdict.reason),
                                  check.verdict.message)
                        return
                if now - started > timeout:
                    yield end("timeout", "timeout", f"the cell ran over {timeout:g} s: "
                              "interrupted")
                    return
                if message is not None:
                    yield _line(message)
        finally:
            # Revoked, timed out, or the client went away (GeneratorExit): stop the cell.
            if not finished:
                execution.interrupt()
            execution.close()

    # --- auto-resume -------------------------------------------------------------------------
    def _wait_running(self, call: _Call, access: Access, limit: float
                      ) -> Generator[bytes, None, tuple[Access | None, dict[str, Any] | None]]:
        """Wait (bounded) until the link's workspace is RUNNING, resuming it if it is
        paused; yields status lines. Returns (the allowing access, None) or (None, the end
        message it yielded)."""
        started = self.monotonic()
        resume: Any = None
        resumed_version: int | None = None
        last_state: str | None = None
        while True:
            verdict, target = access.verdict, access.target
            if verdict.allowed:
                yield _line({"type": "status", "state": "RUNNING",
                             "message": f"{call.workspace_id} is running",
                             "waited": round(self.monotonic() - started, 3)})
                return access, None
            if verdict.outcome == Outcome.DENY:
                end = {"type": "end", "status": _end_status(verdict),
                       "reason": str(verdict.reason), "message": verdict.message}
                yield _line(end)
                return None, end
            assert target is not None and access.link is not None
            if target.state != last_state:
                last_state = target.state
                yield _line({"type": "status", "state": target.state,
                             "message": verdict.message})
            if verdict.outcome == Outcome.RESUME:
                if resumed_version != target.version:
                    resume = self._request_resume(access.link, target)
                    resumed_version = target.version
                    yield _line({"type": "status", "state": "RESUME_REQUESTED",
                                 "message": f"resuming {target.id}: requested"})
                outcome = self.store.resume_outcome(resume)
                if outcome is not None and not outcome.get("accepted"):
                    end = {"type": "end", "status": "unavailable", "reason": "resume_refused",
                           "message": f"the resume was refused: "
                                      f"{outcome.get('message') or outcome.get('reason')}"}
                    yield _line(end)
                    return None, end
            if self.monotonic() - started >= limit:
                end = {"type": "end", "status": "timeout", "reason": "resume_timeout",
                       "message": f"{call.workspace_id} is still {target.state} after "
                                  f"{limit:g} s: try again shortly"}
                yield _line(end)
                return None, end
            self.sleep(self.poll_seconds)
            access = self.auth.authorize(call.token, client=call.client,
                                         workspace_id=call.workspace_id,
                                         operation=call.operation, count=False)

    def _request_resume(self, link: Link, target: Target) -> Any:
        # One request id per paused period (the version changes with every transition):
        # concurrent requests, from any link, ask the lifecycle once.
        event = new_event(
            WorkspaceResumeRequested(workspace_id=target.id,
                                     actor=f"{link.creator} (link {link.link_id})"),
            source=SOURCE, requestid=f"link-resume-{target.id}-v{target.version}")
        self.bus.publish(event)
        log.info("link %s: %s is paused, resume requested", link.link_id, target.id)
        return event

    # --- bookkeeping ---------------------------------------------------------------------------
    def _exposed(self, url: str) -> None:
        """A token travelled in a URL: revoke its link (URLs end up in logs)."""
        for leaked in tokens_in(url):
            digest = token_hash(leaked)
            log.warning("a link token (hash %s...) was sent in a URL: refused and revoked",
                        digest[:8])
            if self.on_exposed is not None:
                try:
                    self.on_exposed(digest)
                except Exception:
                    log.exception("revoking the exposed link failed")
            self.auth.forget(digest)

    def _denied(self, access: Access, client: str, caller: Caller) -> None:
        log.info("link %s denied for %s: %s", _link_name(access), client, access.verdict.reason)
        if access.link is not None and access.verdict.reason not in (
                Reason.RATE_LIMITED, Reason.TOO_MANY_FAILURES):
            call = _Call("", client, caller, access.link.workspace, Operation.READ)
            self._background(lambda: self._audit(access, call, "link.denied",
                                                 f"refused: {access.verdict.reason}"))

    def _audit(self, access: Access, call: _Call, action: str, outcome: str,
               code: str | None = None) -> None:
        link = access.link
        if link is None:
            return
        entry: dict[str, Any] = {
            "actor": link.creator, "action": action, "target": link.workspace,
            "outcome": outcome, "link_id": link.link_id, "team": link.team,
            "caller": call.caller.user, "via": call.caller.via, "client": call.client,
            "time": self.clock()}
        if code is not None:
            entry.update(code_sha256=sha256(code.encode()).hexdigest(),
                         code_bytes=len(code.encode()))
        self.store.audit(entry)

    def _count_use(self, digest: str) -> None:
        now = self.monotonic()
        with self._lock:
            self._uses[digest] += 1
            if now - self._flushed < 1.0:
                return
            uses, self._uses, self._flushed = self._uses, Counter(), now
        self._background(lambda: self.store.record_uses(uses, self.clock()))

    def close(self) -> None:
        """Stop the read-ahead thread (tests and benchmarks; a function instance just ends)."""
        self._closed.set()
        refresher = self._refresher
        if refresher is not None and refresher is not _NO_THREAD and refresher.is_alive():
            refresher.join(timeout=5)

    def flush(self) -> None:
        """Write the pending use counts now (tests; the proxy does it at most once a second)."""
        with self._lock:
            uses, self._uses = self._uses, Counter()
        if uses:
            self.store.record_uses(uses, self.clock())
        if self._executor is not None:
            self._executor.submit(lambda: None).result(timeout=30)

    def _background(self, work: Callable[[], Any]) -> None:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="proxy-bookkeeping")
        self._executor.submit(_logged, work)


_NO_THREAD = threading.Thread()


def _logged(work: Callable[[], Any]) -> None:
    try:
        work()
    except Exception:
        log.exception("proxy bookkeeping failed")


def _link_name(access: Access) -> str:
    if access.link is not None:
        return access.link.link_id
    return f"(unknown, hash {access.token_hash[:8]}...)" if access.token_hash else "(none)"


def _end_status(verdict: Verdict) -> str:
    if verdict.reason in (Reason.REVOKED, Reason.EXPIRED):
        return str(verdict.reason)
    if verdict.outcome in (Outcome.WAIT, Outcome.RESUME) or verdict.reason in (
            Reason.WORKSPACE_GONE, Reason.WORKSPACE_FAILED, Reason.WORKSPACE_PAUSED,
            Reason.WORKSPACE_QUEUED):
        return "unavailable"
    return "denied"


def _line(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, default=str) + "\n").encode()


def _json(body: Mapping[str, Any], status: int,
          headers: Mapping[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str), status=status,
                    mimetype="application/json",
                    headers={"Cache-Control": "no-store", **(headers or {})})


def _refusal(verdict: Verdict, headers: Mapping[str, str] | None = None) -> Response:
    extra = dict(headers or {})
    if verdict.status == 401:
        error = "" if verdict.reason == Reason.MISSING_TOKEN else ', error="invalid_token"'
        extra["WWW-Authenticate"] = f'Bearer realm="stasis"{error}'
    elif verdict.reason == Reason.SCOPE:
        extra["WWW-Authenticate"] = 'Bearer realm="stasis", error="insufficient_scope"'
    if verdict.retry_after is not None:
        extra["Retry-After"] = str(max(1, math.ceil(verdict.retry_after)))
    return _json({"error": str(verdict.reason), "message": verdict.message}, verdict.status,
                 extra)


def wsgi(handler: Callable[[Request], Response]) -> Callable[..., Any]:
    """A plain WSGI app around a ``request -> response`` function (tests, benchmarks)."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        return handler(Request(environ))(environ, start_response)

    return app
