"""The IDE access proxy's rules and pieces, pure or on fakes: who may open a workspace's
IDE, where it is, what passes between the browser and the IDE and what is masked, and the
watch that closes WebSockets whose access ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from events.payloads import ide_path, ide_server_path
from functions.domain.catalog import Role
from functions.domain.ide import (
    check_session,
    ide_url,
    resume_requestid,
    sign_in_hint,
    split_path,
)
from functions.domain.links import Outcome, Reason, Target
from functions.handlers.lifecycle import _through_proxy
from functions.ideproxy.access import (
    POLICY_CLOSE,
    Connection,
    Gate,
    IapVisitors,
    Refusing,
    SessionCookies,
    Visitor,
    Watch,
)
from functions.ideproxy.upstream import (
    VSCODE,
    Masker,
    Upstream,
    request_headers,
    response_headers,
    upstream_of,
)
from functions.ideproxy.wiring import identify_from_env
from functions.portal import session
from functions.ports import RuntimeStatus
from functions.proxy.ports import Caller, Unauthenticated

WS = "ml-a--nb"
TOKEN = "0123456789abcdef" * 4
SECRET = b"unit-secret"


def _target(**changes: Any) -> Target:
    return replace(Target(WS, "ml-a", "bob", "RUNNING", 7), **changes)


# --- the rule -------------------------------------------------------------------------------

CASES: dict[str, tuple[str, Role | None, Target | None, tuple[Outcome, Reason, int]]] = {
    "the owner, a member": ("bob", Role.MEMBER, _target(), (Outcome.ALLOW, Reason.OK, 200)),
    "a team admin": ("alice", Role.ADMIN, _target(), (Outcome.ALLOW, Reason.OK, 200)),
    "another member": ("carl", Role.MEMBER, _target(),
                       (Outcome.DENY, Reason.NO_RIGHTS, 403)),
    "the owner, demoted to viewer": ("bob", Role.VIEWER, _target(),
                                     (Outcome.DENY, Reason.NO_RIGHTS, 403)),
    "the owner, removed from the team": ("bob", None, _target(),
                                         (Outcome.DENY, Reason.NOT_MEMBER, 403)),
    "another team's admin": ("carol", None, _target(), (Outcome.DENY, Reason.NOT_MEMBER, 403)),
    "no such workspace": ("bob", Role.MEMBER, None, (Outcome.DENY, Reason.WORKSPACE_GONE, 410)),
    "deleted": ("bob", Role.MEMBER, _target(state="DELETED"),
                (Outcome.DENY, Reason.WORKSPACE_GONE, 410)),
    "deleting": ("bob", Role.MEMBER, _target(state="DELETING"),
                 (Outcome.DENY, Reason.WORKSPACE_GONE, 410)),
    "paused: the user may resume it": ("bob", Role.MEMBER, _target(state="PAUSED"),
                                       (Outcome.RESUME, Reason.RESUMING, 202)),
    "resuming": ("alice", Role.ADMIN, _target(state="RESUMING"),
                 (Outcome.WAIT, Reason.WAITING, 202)),
    "pausing": ("bob", Role.MEMBER, _target(state="PAUSING"),
                (Outcome.WAIT, Reason.WAITING, 202)),
    "queued for capacity": ("bob", Role.MEMBER, _target(state="QUEUED"),
                            (Outcome.DENY, Reason.WORKSPACE_QUEUED, 503)),
    "failed": ("bob", Role.MEMBER, _target(state="FAILED"),
               (Outcome.DENY, Reason.WORKSPACE_FAILED, 409)),
}


@pytest.mark.parametrize("case", CASES)
def test_who_may_open_a_workspaces_ide(case: str) -> None:
    user, role, target, expected = CASES[case]
    verdict = check_session(user, role=role, workspace=target, workspace_id=WS)
    assert (verdict.outcome, verdict.reason, verdict.status) == expected
    assert verdict.allowed == (expected[0] == Outcome.ALLOW)
    if not verdict.allowed:
        assert verdict.message  # every refusal says why


def test_the_refusal_names_who_may_open_it() -> None:
    verdict = check_session("carl", role=Role.MEMBER, workspace=_target(), workspace_id=WS)
    assert verdict.message == ("ml-a--nb belongs to bob: only they and the admins of team "
                               "ml-a open its IDE")


def test_paths_and_urls() -> None:
    assert ide_path(WS) == "/w/ml-a--nb/"
    assert ide_server_path("jupyterlab", WS) == "/w/ml-a--nb/"  # served under it
    assert ide_server_path("vscode", WS) == "/"  # at its root, behind the proxy's prefix
    assert ide_url("https://ide.example.com/", WS) == "https://ide.example.com/w/ml-a--nb/"
    assert split_path("/w/ml-a--nb/lab/tree/x.ipynb") == (WS, "/lab/tree/x.ipynb")
    assert split_path("/w/ml-a--nb/") == (WS, "/")
    assert split_path("/w/ml-a--nb") == (WS, "")
    for other in ("/", "/w/", "/w/nobody/", "/x/ml-a--nb/", "/w/ML-A--nb/", "/w/../etc"):
        assert split_path(other) is None, other
    # One request id per paused period: a double click asks the lifecycle once.
    assert resume_requestid(_target(version=7)) == resume_requestid(_target(version=7))
    assert resume_requestid(_target(version=7)) != resume_requestid(_target(version=9))
    assert "https://p/portal/" in sign_in_hint("https://p/portal/")
    assert "stasis portal" in sign_in_hint(None)


def test_a_running_workspaces_url_is_its_ide_through_the_proxy() -> None:
    from functions.domain.lifecycle import Decision, State, Workspace
    from functions.domain.lifecycle import Reason as LifecycleReason

    ws = Workspace(id=WS, team="ml-a", owner="bob", name="nb", ide="jupyterlab",
                   environment="py", profile="cpu", state=State.RUNNING,
                   url="http://127.0.0.1:4321/w/ml-a--nb/lab")
    decision = Decision(True, LifecycleReason.READY, ws)
    assert _through_proxy(decision, "http://127.0.0.1:8718").workspace.url == \
        "http://127.0.0.1:8718/w/ml-a--nb/"  # type: ignore[union-attr]
    assert _through_proxy(decision, None) is decision  # no proxy: the runtime's URL
    paused = Decision(True, LifecycleReason.PAUSED, replace(ws, state=State.PAUSED, url=None))
    assert _through_proxy(paused, "http://127.0.0.1:8718") is paused


# --- identity -------------------------------------------------------------------------------


def test_the_portals_session_cookie_is_the_local_identity() -> None:
    now = time.time()
    identify = SessionCookies(SECRET, clock=lambda: now)
    _, cookie = session.issue("bob", SECRET, now)
    visitor = identify({}, {session.COOKIE: cookie})
    assert (visitor.user, visitor.via) == ("bob", "session")
    assert visitor.expires_at == now // 1 + session.MAX_AGE_SECONDS
    _, forged = session.issue("bob", b"another secret", now)
    for cookies, why in (({}, "not signed in"),
                         ({session.COOKIE: forged}, "expired or not valid")):
        with pytest.raises(Unauthenticated, match=why):
            identify({}, cookies)
    later = SessionCookies(SECRET, clock=lambda: now + session.MAX_AGE_SECONDS + 1)
    with pytest.raises(Unauthenticated):
        later({}, {session.COOKIE: cookie})


def test_iap_identity_maps_the_email_as_the_dashboard_does() -> None:
    class Verified:
        def caller(self, headers: Mapping[str, str]) -> Caller:
            if "X-Goog-IAP-JWT-Assertion" not in headers:
                raise Unauthenticated("no IAP assertion")
            return Caller("Bob@Example.com", "iap")

    identify = IapVisitors(Verified(), "example.com")
    assert identify({"X-Goog-IAP-JWT-Assertion": "jwt"}, {}).user == "bob"
    assert IapVisitors(Verified(), None)({"X-Goog-IAP-JWT-Assertion": "j"}, {}).user == \
        "bob@example.com"
    with pytest.raises(Unauthenticated):
        identify({}, {session.COOKIE: "a cookie is no IAP identity"})


def test_the_identity_source_fails_closed() -> None:
    assert isinstance(identify_from_env({}), Refusing)
    with pytest.raises(Unauthenticated, match="STASIS_SESSION_SECRET"):
        identify_from_env({})({}, {})
    assert isinstance(identify_from_env({"STASIS_SESSION_SECRET": "s"}), SessionCookies)
    behind_iap = identify_from_env({"STASIS_IAP_AUDIENCE": "/projects/1/global/backendServices/2",
                                    "STASIS_SESSION_SECRET": "s"})
    assert isinstance(behind_iap, IapVisitors)  # a deployment never trusts a cookie alone


# --- where the IDE is, what passes ----------------------------------------------------------


def test_the_runtimes_status_says_where_the_ide_is() -> None:
    lab = RuntimeStatus(WS, True, url="http://127.0.0.1:4321/w/ml-a--nb/lab", token=TOKEN,
                        detail={"ide": "jupyterlab"})
    found = upstream_of(WS, 7, lab)
    assert found == Upstream(WS, 7, "http://127.0.0.1:4321/w/ml-a--nb", TOKEN, "jupyterlab")
    assert found.url("/api/kernels", "a=1&token=leak") == \
        "http://127.0.0.1:4321/w/ml-a--nb/api/kernels?a=1"
    assert found.origin == "http://127.0.0.1:4321"
    code = upstream_of(WS, 7, RuntimeStatus(WS, True, url="http://127.0.0.1:99/", token=TOKEN,
                                            detail={"ide": "vscode"}))
    assert code is not None and (code.kind, code.base_url) == (VSCODE, "http://127.0.0.1:99")
    assert code.url("/", "folder=/home") == "http://127.0.0.1:99/?folder=%2Fhome"
    assert upstream_of(WS, 7, None) is None
    assert upstream_of(WS, 7, replace(lab, running=False)) is None
    assert upstream_of(WS, 7, replace(lab, token=None)) is None


def test_the_browsers_credentials_stay_with_the_proxy_and_the_ides_are_injected() -> None:
    headers = {"Host": "127.0.0.1:8718", "Accept": "text/html", "Cookie": "ignored",
               "Authorization": "token from-the-page", "Origin": "http://127.0.0.1:8718",
               "X-Goog-IAP-JWT-Assertion": "jwt", "Connection": "keep-alive",
               "Accept-Encoding": "gzip", "X-XSRFToken": "x"}
    cookies = {session.COOKIE: "signed", "GCP_IAP_UID": "u", "_xsrf": "x",
               "code-server-session": "a browser's own"}
    out = request_headers(headers, cookies, {"Authorization": f"token {TOKEN}"})
    assert dict(out) == {"Accept": "text/html", "X-XSRFToken": "x", "Cookie": "_xsrf=x",
                         "Authorization": f"token {TOKEN}", "Accept-Encoding": "identity"}
    vscode = request_headers({}, {"_xsrf": "x"}, {"Cookie": "code-server-session=c"})
    assert vscode["Cookie"] == "_xsrf=x; code-server-session=c"


def test_what_comes_back_carries_no_credential() -> None:
    upstream = Upstream(WS, 7, "http://127.0.0.1:4321/w/ml-a--nb", TOKEN, "jupyterlab")
    answer = [("Content-Type", "text/html"), ("Content-Length", "10"),
              ("Set-Cookie", "username-127-0-0-1-4321=\"2|1:0|...\"; HttpOnly; Path=/w/ml-a--nb/"),
              ("Set-Cookie", "_xsrf=2|abc; Path=/w/ml-a--nb/"),
              ("Set-Cookie", "code-server-session=%24argon2; Path=/"),
              ("Location", f"http://127.0.0.1:4321/w/ml-a--nb/lab?token={TOKEN}"),
              ("X-Debug", f"token is {TOKEN}"), ("Transfer-Encoding", "chunked")]
    out = response_headers(answer, Masker([TOKEN]), upstream=upstream, public_base="/w/ml-a--nb")
    assert out.getall("Set-Cookie") == ["_xsrf=2|abc; Path=/w/ml-a--nb/"]
    assert out["Location"] == "/w/ml-a--nb/lab?token=" + "*" * 64
    assert out["X-Debug"] == "token is " + "*" * 64
    assert out["Content-Length"] == "10" and "Transfer-Encoding" not in out
    assert TOKEN not in str(list(out.items()))


def test_the_mask_catches_a_secret_split_across_chunks_and_keeps_the_length() -> None:
    page = f'<script>{{"token": "{TOKEN}", "baseUrl": "/w/ml-a--nb/"}}</script>'.encode() * 3
    for size in (1, 7, 63, 64, 65, 1000):
        mask = Masker([TOKEN])
        chunks = [page[i:i + size] for i in range(0, len(page), size)]
        out = b"".join(mask.feed(c) for c in chunks) + mask.flush()
        assert TOKEN.encode() not in out and len(out) == len(page), size
        assert out == page.replace(TOKEN.encode(), b"*" * 64)
    quoted = Masker(["$argon2id$v=19$m=65536"])
    assert quoted.text("code-server-session=%24argon2id%24v%3D19%24m%3D65536") == \
        "code-server-session=" + "*" * len("%24argon2id%24v%3D19%24m%3D65536")
    assert Masker([]).feed(b"nothing to hide") == b"nothing to hide"


# --- the gate and the watch -----------------------------------------------------------------


class _Store:
    """The reads the gate makes (functions.proxy.ports.LinkStore), counting them."""

    def __init__(self) -> None:
        self.workspaces: dict[str, Target | None] = {WS: _target()}
        self.teams: dict[str, list[Mapping[str, Any]] | None] = {
            "ml-a": [{"user": "bob", "role": "member"}, {"user": "alice", "role": "admin"}]}
        self.reads = 0

    def get_link(self, token_hash: str) -> None:
        return None

    def target(self, workspace_id: str) -> Target | None:
        self.reads += 1
        return self.workspaces.get(workspace_id)

    def team_members(self, team: str) -> list[Mapping[str, Any]] | None:
        self.reads += 1
        return self.teams.get(team)

    def read_many(self, token_hashes: Sequence[str], teams: Sequence[str],
                  workspaces: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any],
                                                      dict[str, Any]]:
        self.reads += len(teams) + len(workspaces)
        return ({}, {t: self.teams.get(t) for t in teams},
                {w: self.workspaces.get(w) for w in workspaces})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_decides_from_the_cache_and_reads_only_what_it_lacks() -> None:
    store, clock = _Store(), _Clock()
    gate = Gate(store, cache_seconds=1.0, monotonic=clock)  # type: ignore[arg-type]
    assert gate.peek("bob", WS) is None  # nothing known yet: the loop must not block
    assert gate.decide("bob", WS).verdict.allowed and store.reads == 2
    clock.now += 0.5
    assert gate.peek("bob", WS).verdict.allowed  # type: ignore[union-attr]
    assert not gate.peek("carol", WS).verdict.allowed  # type: ignore[union-attr]
    assert store.reads == 2
    clock.now += 0.6  # older than cache_seconds: read again
    assert gate.peek("bob", WS) is None
    store.teams["ml-a"] = [{"user": "alice", "role": "admin"}]
    assert gate.decide("bob", WS).verdict.reason == Reason.NOT_MEMBER and store.reads == 4
    decided = asyncio.run(gate.check("alice", WS))
    assert decided.verdict.allowed and decided.target == _target()


def _watched(store: _Store, clock: _Clock, visitor: Visitor) -> tuple[Watch, list[Any]]:
    gate = Gate(store, monotonic=clock)  # type: ignore[arg-type]
    gate.decide(visitor.user, WS)
    watch = Watch(gate, clock=lambda: 1_000.0)
    closed: list[Any] = []

    async def close(code: int, message: str) -> None:
        closed.append((code, message))

    watch.add(Connection(visitor, WS, close))
    return watch, closed


@pytest.mark.parametrize("change, why", [
    (lambda s: s.teams.__setitem__("ml-a", [{"user": "alice", "role": "admin"}]),
     "bob is not a member of team ml-a"),
    (lambda s: s.teams.__setitem__("ml-a", [{"user": "bob", "role": "viewer"}]),
     "ml-a--nb belongs to bob: only they and the admins of team ml-a open its IDE"),
    (lambda s: s.workspaces.__setitem__(WS, _target(state="PAUSING")),
     "workspace ml-a--nb is pausing: waiting for it"),
    (lambda s: s.workspaces.__setitem__(WS, None), "workspace ml-a--nb does not exist"),
])
def test_the_watch_closes_a_websocket_whose_access_ended(change: Any, why: str) -> None:
    store, clock = _Store(), _Clock()
    watch, closed = _watched(store, clock, Visitor("bob", "session"))
    assert asyncio.run(watch.sweep()) == 0 and closed == []
    change(store)
    clock.now += 1.0  # the sweep's batch re-reads what is half-way to expiry (0.75 s)
    assert asyncio.run(watch.sweep()) == 1
    assert closed == [(POLICY_CLOSE, why)] and not watch.connections


def test_the_watch_reads_nothing_while_no_websocket_is_open_and_ends_expired_sessions() -> None:
    store, clock = _Store(), _Clock()
    gate = Gate(store, monotonic=clock)  # type: ignore[arg-type]
    assert asyncio.run(Watch(gate).sweep()) == 0 and store.reads == 0
    watch, closed = _watched(store, clock, Visitor("bob", "session", expires_at=999.0))
    assert asyncio.run(watch.sweep()) == 1
    assert closed == [(POLICY_CLOSE, "the session expired: sign in again")]


def test_the_watch_rereads_an_open_connections_documents_about_once_a_second() -> None:
    """The cost of an open WebSocket: its workspace and team documents re-read once they are
    half-way to expiry (0.75 s), so every other sweep, in one batch."""
    store, clock = _Store(), _Clock()
    watch, closed = _watched(store, clock, Visitor("bob", "session"))
    before = store.reads
    for _ in range(20):  # 10 s of sweeps, every 0.5 s
        clock.now += 0.5
        asyncio.run(watch.sweep())
    assert closed == [] and store.reads - before == 20  # 2 documents, once a second each
