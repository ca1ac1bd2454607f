"""Where a workspace's IDE server is, how the proxy authenticates to it, and what of its
answers may reach the browser.

- :class:`Upstreams` asks the runtime (``Runtime.status``: the node agent locally, the Pod
  and its token Secret on GKE) where a RUNNING workspace's server is and its token, once per
  workspace version (every transition changes it, so a resumed server is looked up again).
- Credentials are injected on every forwarded request and WebSocket: JupyterLab's token as
  ``Authorization: token …``; for code-server, whose only credential is its login cookie,
  the proxy logs in once with the password (``POST /login``) and sends that cookie.
- Nothing that authenticates to the IDE reaches the browser: request credentials of the
  browser's own (the session cookie, IAP's assertion and cookies, an ``Authorization`` or a
  ``token`` query parameter) are not forwarded; the IDE's login cookies
  (``username-*`` of jupyter-server, ``code-server-session``) are dropped from responses;
  and every response header, body and WebSocket message is scanned for the token, the
  password and the login cookie, each occurrence replaced by as many ``*`` (JupyterLab's
  page embeds its token; a lengths-preserving mask keeps ``Content-Length`` true).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import aiohttp
from multidict import CIMultiDict

from functions.ports import RuntimeStatus

log = logging.getLogger(__name__)

JUPYTERLAB = "jupyterlab"
VSCODE = "vscode"
CODE_SERVER_COOKIE = "code-server-session"
#: Cookies of the browser that are Stasis's or IAP's, never the IDE's business.
BROWSER_ONLY_COOKIES = ("stasis_session", "GCP_IAP_", "__Host-GCP_IAP_")
#: Cookies an IDE sets that would log a browser in directly, bypassing the proxy.
IDE_LOGIN_COOKIES = ("username-", CODE_SERVER_COOKIE)
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade"})
#: Request headers never forwarded (the proxy sets its own, or they are the browser's
#: credentials). Origin is checked by the proxy and then dropped: the IDE would compare it
#: with its own host and refuse.
_REQUEST_DROP = HOP_BY_HOP | {
    "host", "authorization", "cookie", "origin", "accept-encoding", "x-goog-iap-jwt-assertion",
    "x-goog-authenticated-user-email", "x-goog-authenticated-user-id",
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-protocol", "sec-websocket-accept"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-encoding", "sec-websocket-accept",
                               "sec-websocket-protocol", "sec-websocket-extensions"}
_QUERY_DROP = frozenset({"token"})


class UpstreamError(RuntimeError):
    """The IDE's server could not be reached or refused the proxy's credentials."""


@dataclass(frozen=True)
class Upstream:
    """A running workspace's IDE server: ``base_url`` is what ``/w/<id>`` stands for
    (``http://host:port/w/<id>`` for JupyterLab, served under that base path;
    ``http://host:port`` for code-server, served at its root)."""

    workspace_id: str
    version: int
    base_url: str
    token: str
    kind: str

    def url(self, rest: str, query: str) -> str:
        kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                if k not in _QUERY_DROP]
        path = self.base_url + (rest or "/")
        return path + ("?" + urlencode(kept, quote_via=quote) if kept else "")

    @property
    def origin(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"


@dataclass
class _Login:
    cookie: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Upstreams:
    """Where each running workspace's IDE server is (``status`` is the runtime's, a blocking
    call run off the event loop), and the proxy's credentials for it."""

    def __init__(self, status: Callable[[str], RuntimeStatus | None],
                 http: aiohttp.ClientSession) -> None:
        self.status = status
        self.http = http
        self._known: dict[str, Upstream] = {}
        self._logins: dict[tuple[str, int], _Login] = {}

    async def get(self, workspace_id: str, version: int) -> Upstream | None:
        """The server of the workspace at this version, or None if the runtime runs none
        (yet). Raises UpstreamError if the runtime cannot say."""
        known = self._known.get(workspace_id)
        if known is not None and known.version == version:
            return known
        try:
            status = await asyncio.to_thread(self.status, workspace_id)
        except Exception as exc:  # the runtime's own errors: unavailable, refused
            raise UpstreamError(f"the runtime cannot say where {workspace_id} runs: "
                                f"{exc}") from exc
        found = upstream_of(workspace_id, version, status)
        if found is None:
            self.forget(workspace_id)  # not running (yet): ask again next time
            return None
        self._known[workspace_id] = found
        self._logins = {k: v for k, v in self._logins.items() if k[0] != workspace_id}
        return found

    def forget(self, workspace_id: str) -> None:
        """Drop what is known of a workspace's server (it failed to answer)."""
        self._known.pop(workspace_id, None)
        self._logins = {k: v for k, v in self._logins.items() if k[0] != workspace_id}

    async def credentials(self, upstream: Upstream) -> dict[str, str]:
        """The headers that authenticate the proxy to this server."""
        if upstream.kind != VSCODE:
            return {"Authorization": f"token {upstream.token}"}
        return {"Cookie": f"{CODE_SERVER_COOKIE}={await self._login(upstream)}"}

    def secrets(self, upstream: Upstream) -> list[str]:
        """Every value that must never reach the browser for this server."""
        found = [upstream.token]
        login = self._logins.get((upstream.workspace_id, upstream.version))
        if login is not None and login.cookie:
            found.append(login.cookie)
        return found

    def logged_out(self, upstream: Upstream) -> None:
        """code-server sent the proxy to its login page: log in again next time."""
        self._logins.pop((upstream.workspace_id, upstream.version), None)

    async def _login(self, upstream: Upstream) -> str:
        login = self._logins.setdefault((upstream.workspace_id, upstream.version), _Login())
        async with login.lock:
            if login.cookie:
                return login.cookie
            try:
                async with self.http.post(upstream.base_url + "/login",
                                          data={"password": upstream.token},
                                          allow_redirects=False) as answer:
                    morsel = answer.cookies.get(CODE_SERVER_COOKIE)
                    status = answer.status
            except aiohttp.ClientError as exc:
                raise UpstreamError(f"code-server of {upstream.workspace_id} did not "
                                    f"answer its login: {exc}") from exc
            if morsel is None or not morsel.value:
                raise UpstreamError(f"code-server of {upstream.workspace_id} refused the "
                                    f"proxy's login (HTTP {status})")
            login.cookie = morsel.value
            return login.cookie


def upstream_of(workspace_id: str, version: int,
                status: RuntimeStatus | None) -> Upstream | None:
    """The runtime's status as an upstream: JupyterLab's URL ends in ``/lab`` under its base
    path; code-server's is its root."""
    if status is None or not status.running or not status.url or not status.token:
        return None
    kind = str(status.detail.get("ide_kind") or status.detail.get("ide") or JUPYTERLAB)
    kind = VSCODE if kind == VSCODE else JUPYTERLAB
    base = status.url.rstrip("/").removesuffix("/lab")
    return Upstream(workspace_id, version, base, status.token, kind)


# --------------------------------------------------------------------------------------------
# What passes, and what is masked
# --------------------------------------------------------------------------------------------


def request_headers(headers: Mapping[str, str], cookies: Mapping[str, str],
                    credentials: Mapping[str, str]) -> CIMultiDict[str]:
    """The browser's headers as the IDE may see them, with the proxy's credentials."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in _REQUEST_DROP:
            out.add(name, value)
    kept = [f"{k}={v}" for k, v in cookies.items()
            if not k.startswith(BROWSER_ONLY_COOKIES) and k != CODE_SERVER_COOKIE]
    own = credentials.get("Cookie")
    if own:
        kept.append(own)
    if kept:
        out["Cookie"] = "; ".join(kept)
    for name, value in credentials.items():
        if name != "Cookie":
            out[name] = value
    out["Accept-Encoding"] = "identity"  # the proxy reads what it passes on
    return out


def response_headers(headers: Iterable[tuple[str, str]], mask: Masker, *,
                     upstream: Upstream, public_base: str) -> CIMultiDict[str]:
    """The IDE's response headers as the browser may see them."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        lowered = name.lower()
        if lowered in _RESPONSE_DROP:
            continue
        if lowered == "set-cookie" and _is_login_cookie(value):
            continue
        if lowered == "location" and value.startswith(upstream.origin):
            # An absolute redirect to the server itself: the same place through the proxy.
            value = public_base + value[len(upstream.base_url):]
        out.add(name, mask.text(value))
    return out


def _is_login_cookie(set_cookie: str) -> bool:
    try:
        jar: SimpleCookie = SimpleCookie()
        jar.load(set_cookie)
    except CookieError:
        return True  # unreadable: not worth the risk
    return any(name.startswith(IDE_LOGIN_COOKIES) for name in jar)


class Masker:
    """Replaces each secret by as many ``*`` in text and in a stream of chunks (a secret
    split across two chunks is still caught: the last ``longest - 1`` bytes wait for the
    next chunk)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = {s for s in secrets if s}
        # Also as they would appear in a URL or a cookie, and decoded from one.
        values |= {quote(s, safe="") for s in values} | {unquote(s) for s in values}
        self.texts = sorted(values, key=len, reverse=True)
        self.raw = [s.encode() for s in self.texts]
        self.keep = max((len(s) for s in self.raw), default=1) - 1
        self.tail = b""

    def text(self, value: str) -> str:
        for secret in self.texts:
            if secret in value:
                value = value.replace(secret, "*" * len(secret))
        return value

    def data(self, value: bytes) -> bytes:
        for secret in self.raw:
            if secret in value:
                value = value.replace(secret, b"*" * len(secret))
        return value

    def feed(self, chunk: bytes) -> bytes:
        buffer = self.data(self.tail + chunk)
        if self.keep <= 0:
            return buffer
        cut = max(0, len(buffer) - self.keep)
        self.tail = buffer[cut:]
        return buffer[:cut]

    def flush(self) -> bytes:
        rest, self.tail = self.tail, b""
        return rest


def client_timeout() -> aiohttp.ClientTimeout:
    """No total limit (downloads, long polls); a server that does not answer at all is
    given up after a minute."""
    return aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=None)
