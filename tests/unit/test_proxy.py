"""The access proxy and the link issuer against small fakes (no I/O): what each request is
answered, the execute stream, auto-resume, revocation of open streams, rate limits, the
IAP check. Time is a fake monotonic clock that ``sleep`` and the scripted cells advance."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from link_fakes import (
    Clock,
    FakeExecution,
    FakeGateway,
    MemoryLinkStore,
    MemorySandboxResults,
    RecordingBus,
)
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client
from werkzeug.wrappers import Response

from functions.adapters.iap import DevIdentity, IapIdentity, certs_json
from functions.domain.links import DEFAULT_POLICY, TOKEN_PREFIX, LinkPolicy, Target, token_hash
from functions.proxy.access import AccessProxy, wsgi
from functions.proxy.issuer import LinkIssuer
from functions.proxy.ports import Unauthenticated

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
WS = "ml-a--nb"


class Mono:
    """A monotonic clock that only moves when told (or slept on)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Harness:
    def __init__(self, policy: LinkPolicy = DEFAULT_POLICY, cell: Any = None) -> None:
        self.mono = Mono()
        self.clock = Clock(NOW)
        self.store = MemoryLinkStore()
        self.store.teams = {"ml-a": [{"user": "alice", "role": "admin"},
                                     {"user": "bob", "role": "member"},
                                     {"user": "vera", "role": "viewer"}],
                            "ml-b": [{"user": "carol", "role": "admin"}]}
        self.store.workspaces = {
            WS: Target(WS, "ml-a", "bob", "RUNNING", 2),
            "ml-b--other": Target("ml-b--other", "ml-b", "carol", "RUNNING", 2)}
        self.bus = RecordingBus()
        self.gateway = FakeGateway(cell)
        self.exposed: list[str] = []
        self.sandboxes = MemorySandboxResults()
        self.proxy = AccessProxy(self.store, self.gateway, self.bus, DevIdentity(),
                                 clock=self.clock, policy=policy, monotonic=self.mono,
                                 sleep=self.mono.sleep, on_exposed=self.exposed.append,
                                 refresh_ahead=False, sandboxes=self.sandboxes)
        self.issuer = LinkIssuer(self.store, self.bus, DevIdentity(), clock=self.clock,
                                 policy=policy,
                                 proxy_url=lambda request: "http://127.0.0.1:8713/proxy")
        self.issuer.revoked_listeners.append(self.proxy.auth.forget)
        self.client = Client(DispatcherMiddleware(Response("no", 404), {
            "/proxy": wsgi(self.proxy), "/links": wsgi(self.issuer)}))

    def create(self, user: str = "bob", ws: str = WS, **body: Any) -> Any:
        return self.client.post("/links/", json={"workspace_id": ws, **body},
                                headers={"X-Stasis-User": user})

    def token(self, **kwargs: Any) -> str:
        response = self.create(**kwargs)
        assert response.status_code == 201, response.get_data(as_text=True)
        return str(response.json["token"])

    def get(self, token: str, path: str = "/", ws: str = WS, **kwargs: Any) -> Any:
        return self.client.get(f"/proxy/{ws}{path}", headers={"Authorization": f"Bearer {token}"},
                               **kwargs)

    def execute(self, token: str, code: str = "print(1)", ws: str = WS,
                **kwargs: Any) -> tuple[Any, list[dict[str, Any]]]:
        response = self.client.post(f"/proxy/{ws}/execute", json={"code": code},
                                    headers={"Authorization": f"Bearer {token}"}, **kwargs)
        lines = [json.loads(line) for line in response.get_data(as_text=True).splitlines()
                 if line.strip()] if response.mimetype == "application/x-ndjson" else []
        return response, lines


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- issuing --------------------------------------------------------------------------------------
def test_create_answers_the_token_once_and_stores_only_its_hash(h: Harness) -> None:
    response = h.create(ttl="30m")
    body = response.json
    assert response.status_code == 201
    token = body["token"]
    assert body["url"] == f"http://127.0.0.1:8713/proxy/{WS}#{token}"
    assert token.startswith(TOKEN_PREFIX) and list(h.store.links) == [token_hash(token)]
    link = h.store.links[token_hash(token)]
    assert (link.creator, link.scope, link.expires_at) == ("bob", "exec",
                                                           NOW + timedelta(minutes=30))
    [event] = h.bus.events
    assert event.name == "link.created" and event.payload.link_id == body["link_id"]
    assert token not in json.dumps(event.payload.__dict__) + str(h.store.audits)
    assert h.store.audits[0]["action"] == "link.created"
    assert response.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("user, ws, body, status, error", [
    ("carl", WS, {}, 403, "creator_not_member"),  # not in ml-a
    ("bob", "ml-b--other", {}, 403, "creator_not_member"),  # a workspace of another team
    ("vera", WS, {}, 403, "creator_no_rights"),  # a viewer, not the owner
    ("bob", "ml-a--missing", {}, 410, "workspace_gone"),
    ("bob", WS, {"scope": "root"}, 400, "bad_scope"),
    ("bob", WS, {"ttl": "soon"}, 400, "bad_ttl"),
])
def test_create_refusals(h: Harness, user: str, ws: str, body: dict[str, Any], status: int,
                         error: str) -> None:
    response = h.create(user=user, ws=ws, **body)
    assert (response.status_code, response.json["error"]) == (status, error)
    assert h.store.links == {} and h.bus.events == []


def test_a_ttl_over_the_cap_is_cut_with_a_notice(h: Harness) -> None:
    body = h.create(ttl="3d").json
    assert body["ttl_seconds"] == 12 * 3600 and "capped to 12h" in body["notices"][0]


def test_a_link_that_cannot_be_announced_does_not_stay_usable(h: Harness) -> None:
    h.bus.fail = True
    response = h.create()
    assert response.status_code == 503 and "token" not in response.json
    [link] = h.store.links.values()
    assert link.revoked_at is not None


def test_list_shows_own_links_and_admins_see_the_team(h: Harness) -> None:
    h.token(user="bob")
    h.token(user="alice")
    mine = h.client.get("/links/", headers={"X-Stasis-User": "bob"}).json["links"]
    assert [r["creator"] for r in mine] == ["bob"]
    team = h.client.get("/links/?team=ml-a", headers={"X-Stasis-User": "alice"}).json["links"]
    assert sorted(r["creator"] for r in team) == ["alice", "bob"]
    assert all("token" not in r for r in team)


def test_revoke_by_creator_or_admin_only(h: Harness) -> None:
    h.token(user="bob")
    link_id = next(iter(h.store.links.values())).link_id
    refused = h.client.delete(f"/links/{link_id}", headers={"X-Stasis-User": "vera"})
    assert refused.status_code == 403
    ok = h.client.delete(f"/links/{link_id}", headers={"X-Stasis-User": "alice"})
    assert ok.status_code == 200 and ok.json["revoked_by"] == "alice"
    again = h.client.post(f"/links/{link_id}/revoke", headers={"X-Stasis-User": "bob"})
    assert again.status_code == 200 and again.json["error"] == "already_revoked"
    assert [e.name for e in h.bus.events] == ["link.created", "link.revoked"]
    assert h.client.delete("/links/lnk-0000000000000000").status_code == 404


# --- the check ------------------------------------------------------------------------------------
def test_info_needs_nothing_but_the_token(h: Harness) -> None:
    token = h.token()
    response = h.get(token)
    assert response.status_code == 200
    assert response.json["workspace"] == WS and response.json["state"] == "RUNNING"
    assert response.headers["Server-Timing"].startswith("auth;dur=")


def test_refusals_carry_their_status_and_www_authenticate(h: Harness) -> None:
    token = h.token()
    missing = h.client.get(f"/proxy/{WS}/")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == \
        'Bearer realm="stasis"'
    unknown = h.get(TOKEN_PREFIX + "B" * 43)
    assert unknown.status_code == 401 and unknown.json["error"] == "unknown_link"
    assert 'error="invalid_token"' in unknown.headers["WWW-Authenticate"]
    other = h.get(token, ws="ml-b--other")
    assert (other.status_code, other.json["error"]) == (403, "wrong_workspace")
    assert h.get(token, "/lab").status_code == 404


def test_read_scope_reads_the_api_and_nothing_else(h: Harness) -> None:
    token = h.token(scope="read")
    response = h.get(token, "/api/contents/work.ipynb", query_string={"content": "0"})
    assert response.status_code == 200 and response.json == {"forwarded": True}
    assert h.gateway.forwarded == [("GET", "api/contents/work.ipynb", "content=0", b"")]
    write = h.client.put(f"/proxy/{WS}/api/contents/x.py", data=b"x",
                         headers={"Authorization": f"Bearer {token}"})
    assert write.status_code == 403 and 'insufficient_scope' in write.headers["WWW-Authenticate"]
    response, _ = h.execute(token)
    assert (response.status_code, response.json["error"]) == (403, "insufficient_scope")
    assert h.gateway.executions == []


def test_a_token_in_the_url_is_refused_and_its_link_revoked(h: Harness) -> None:
    token = h.token()
    response = h.client.get(f"/proxy/{WS}/?token={token}",
                            headers={"Authorization": f"Bearer {token}"})
    assert (response.status_code, response.json["error"]) == (400, "token_in_url")
    assert h.exposed == [token_hash(token)]


@pytest.mark.parametrize("path", [
    "/api/%252e%252e/%252e%252e/files/x",  # double-encoded: %2e%2e once decoded
    "/api/contents/%252fetc",
    "/api/%2e%2e/files/x",  # encoded once: .. once decoded
    "/api/contents/../../files/x",
    "/api/contents/a\\..\\b",
])
def test_a_path_that_would_decode_again_or_climb_is_refused_before_it_is_forwarded(
        h: Harness, path: str) -> None:
    token = h.token(scope="read")
    response = h.get(token, path)
    assert (response.status_code, response.json["error"]) == (400, "bad_path")
    assert h.gateway.forwarded == []


def test_the_path_is_forwarded_as_it_was_decided_on(h: Harness) -> None:
    token = h.token(scope="read")
    assert h.get(token, "/api//contents///work.ipynb").status_code == 200
    assert h.gateway.forwarded == [("GET", "api/contents/work.ipynb", "", b"")]
    assert h.get(token, "/api/contents/100%25 done.txt").status_code == 200  # a literal %
    assert h.gateway.forwarded[-1][1] == "api/contents/100% done.txt"


def test_a_link_is_refused_by_a_later_workspace_of_the_same_id(h: Harness) -> None:
    h.store.workspaces[WS] = dataclasses.replace(h.store.workspaces[WS], incarnation="inc-1")
    token = h.token()
    assert h.get(token).status_code == 200
    # Deleted, then created again under the same id (here by alice): another workspace.
    h.store.workspaces[WS] = Target(WS, "ml-a", "alice", "RUNNING", 9, incarnation="inc-2")
    h.mono.sleep(5)  # past the proxy's cache
    response = h.get(token)
    assert (response.status_code, response.json["error"]) == (410, "workspace_gone")
    assert "earlier workspace" in response.json["message"]


def test_creator_removed_from_the_team_takes_the_link_down(h: Harness) -> None:
    token = h.token(user="bob")
    assert h.get(token).status_code == 200
    h.store.teams["ml-a"] = [m for m in h.store.teams["ml-a"] if m["user"] != "bob"]
    h.mono.sleep(DEFAULT_POLICY.cache_seconds)  # what the proxy cached has expired
    response = h.get(token)
    assert (response.status_code, response.json["error"]) == (403, "creator_not_member")


def test_expired(h: Harness) -> None:
    token = h.token(ttl="1h")
    h.clock.advance(3600)
    response = h.get(token)
    assert (response.status_code, response.json["error"]) == (401, "expired")


def test_cached_reads_are_reused_within_the_ttl(h: Harness) -> None:
    token = h.token()
    for _ in range(5):
        h.get(token)
    assert h.store.reads == 1
    h.mono.sleep(DEFAULT_POLICY.cache_seconds)
    h.get(token)
    assert h.store.reads == 2


# --- rate limits ----------------------------------------------------------------------------------
def test_each_link_is_rate_limited(h: Harness) -> None:
    token = h.token()
    statuses = [h.get(token).status_code for _ in range(DEFAULT_POLICY.link_rate.burst + 5)]
    assert statuses.count(200) == DEFAULT_POLICY.link_rate.burst
    limited = h.get(token)
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    h.mono.sleep(1.0)
    assert h.get(token).status_code == 200  # refilled at the link's rate


def test_failed_attempts_are_limited_per_client(h: Harness) -> None:
    burst = DEFAULT_POLICY.failure_rate.burst
    guesses = [TOKEN_PREFIX + f"{i:043d}" for i in range(burst + 5)]
    attacker = {"REMOTE_ADDR": "10.0.0.66"}
    statuses = [h.get(g, environ_base=attacker).status_code for g in guesses]
    assert statuses == [401] * burst + [429] * 5
    reads = h.store.reads
    h.get(guesses[0], environ_base=attacker)
    assert h.store.reads == reads  # a limited client costs no lookup
    assert h.get(guesses[0], environ_base={"REMOTE_ADDR": "10.0.0.7"}).status_code == 401


# --- execute --------------------------------------------------------------------------------------
def test_execute_streams_the_cell_and_ends_with_its_status(h: Harness) -> None:
    h.gateway.cell = lambda code: FakeExecution([
        {"type": "stream", "name": "stdout", "text": "hello\n"},
        {"type": "stream", "name": "stderr", "text": "warn\n"},
        {"type": "result", "text": "42", "mimetypes": ["text/plain"]}])
    token = h.token()
    response, lines = h.execute(token, "secret = 1\nprint('hello')")
    assert response.status_code == 200 and response.mimetype == "application/x-ndjson"
    assert [m["type"] for m in lines] == ["kernel", "stream", "stream", "result", "end"]
    assert lines[-1]["status"] == "ok"
    audit = [a for a in h.store.audits if a["action"] == "link.exec"]
    assert audit and audit[0]["code_bytes"] == len("secret = 1\nprint('hello')")
    assert "secret" not in json.dumps(audit, default=str)  # the code itself is not kept


def test_a_failing_cell_ends_with_error(h: Harness) -> None:
    h.gateway.cell = lambda code: FakeExecution(
        [{"type": "error", "ename": "ZeroDivisionError", "evalue": "x", "traceback": []}],
        status="error")
    _, lines = h.execute(h.token(), "1/0")
    assert lines[-1]["status"] == "error" and lines[-2]["ename"] == "ZeroDivisionError"


def test_bad_execute_bodies(h: Harness) -> None:
    token = h.token()
    bad = h.client.post(f"/proxy/{WS}/execute", json={"cmd": 1},
                        headers={"Authorization": f"Bearer {token}"})
    assert bad.status_code == 400
    big = h.client.post(f"/proxy/{WS}/execute", json={"code": "x" * (2 << 20)},
                        headers={"Authorization": f"Bearer {token}"})
    assert big.status_code == 413


def _endless(h: Harness, on_step: Any = None) -> Any:
    """A cell that never ends; each step advances the fake clock by 0.1 s."""
    def step(execution: FakeExecution) -> dict[str, Any] | None:
        h.mono.sleep(0.1)
        if on_step:
            on_step(execution)
        return {"type": "stream", "name": "stdout", "text": "."}
    return lambda code: FakeExecution(step)


def test_revoking_closes_an_open_stream_and_interrupts_the_cell(h: Harness) -> None:
    token = h.token()
    link_id = next(iter(h.store.links.values())).link_id
    revoked_at: list[float] = []

    def revoke_once(execution: FakeExecution) -> None:
        if execution.position == 5 and not revoked_at:
            # Another instance revoked it: only the cache TTL makes this one notice.
            link = h.store.links[token_hash(token)]
            h.store.links[token_hash(token)] = dataclasses.replace(link, revoked_at=NOW)
            revoked_at.append(h.mono.t)
        execution.position += 1

    h.gateway.cell = _endless(h, revoke_once)
    _, lines = h.execute(token, "while True: pass")
    end = lines[-1]
    assert (end["type"], end["status"], end["reason"]) == ("end", "revoked", "revoked")
    assert h.mono.t - revoked_at[0] < 1.0  # noticed within a second of fake time
    assert h.gateway.executions[0].interrupted.is_set()
    assert h.gateway.executions[0].closed.is_set()
    assert link_id in end["message"]


def test_a_client_that_goes_away_interrupts_its_cell(h: Harness) -> None:
    h.gateway.cell = _endless(h)
    token = h.token()
    response = h.client.post(f"/proxy/{WS}/execute", json={"code": "while True: pass"},
                             headers={"Authorization": f"Bearer {token}"}, buffered=False)
    chunks = iter(response.response)
    next(chunks), next(chunks)
    response.close()  # the connection dropped (Ctrl-C)
    assert h.gateway.executions[0].interrupted.is_set()


def test_a_cell_past_its_timeout_is_interrupted(h: Harness) -> None:
    h.gateway.cell = _endless(h)
    token = h.token()
    response = h.client.post(f"/proxy/{WS}/execute", json={"code": "x", "timeout": 2},
                             headers={"Authorization": f"Bearer {token}"})
    end = json.loads(response.get_data(as_text=True).splitlines()[-1])
    assert end["status"] == "timeout" and h.gateway.executions[0].interrupted.is_set()


# --- auto-resume ----------------------------------------------------------------------------------
def _paused(h: Harness, version: int = 4) -> None:
    h.store.workspaces[WS] = Target(WS, "ml-a", "bob", "PAUSED", version)


def test_a_paused_workspace_is_resumed_once_and_the_cell_runs_after(h: Harness) -> None:
    token = h.token()
    _paused(h)
    polls = {"n": 0}

    def lifecycle(seconds: float) -> None:  # the resume, as the lifecycle would do it
        h.mono.t += seconds
        polls["n"] += 1
        state, version = ("RESUMING", 5) if polls["n"] < 4 else ("RUNNING", 6)
        h.store.workspaces[WS] = Target(WS, "ml-a", "bob", state, version)

    h.proxy.sleep = lifecycle
    _, lines = h.execute(token)
    states = [m["state"] for m in lines if m["type"] == "status"]
    assert states == ["PAUSED", "RESUME_REQUESTED", "RESUMING", "RUNNING"]
    assert lines[-1]["status"] == "ok"
    [resume] = [e for e in h.bus.events if e.name == "workspace.resume_requested"]
    assert resume.requestid == f"link-resume-{WS}-v4"
    assert resume.payload.actor.startswith("bob (link lnk-")


def test_a_refused_resume_ends_the_stream_with_the_reason(h: Harness) -> None:
    token = h.token()
    _paused(h)
    h.store.outcomes[f"link-resume-{WS}-v4"] = {"accepted": False, "reason":
                                                "admission_refused", "message": "team ml-a "
                                                "uses 4/4 GPUs"}
    _, lines = h.execute(token)
    assert lines[-1]["status"] == "unavailable" and "4/4 GPUs" in lines[-1]["message"]
    assert h.gateway.executions == []


def test_the_wait_for_a_resume_is_bounded(h: Harness) -> None:
    h = Harness(policy=LinkPolicy(resume_wait_seconds=5))
    token = h.token()
    _paused(h)
    _, lines = h.execute(token)
    assert lines[-1]["status"] == "timeout" and "still PAUSED" in lines[-1]["message"]
    assert len([e for e in h.bus.events if e.name == "workspace.resume_requested"]) == 1


def test_a_read_link_does_not_resume(h: Harness) -> None:
    token = h.token(scope="read")
    _paused(h)
    response = h.get(token, "/api/contents")
    assert (response.status_code, response.json["error"]) == (409, "workspace_paused")
    assert [e.name for e in h.bus.events] == ["link.created"]


def test_a_queued_workspace_is_refused_at_once_with_a_retry_after(h: Harness) -> None:
    """Queued for capacity may last hours: neither the cell nor a REST call is held."""
    token = h.token()
    h.store.workspaces[WS] = Target(WS, "ml-a", "bob", "QUEUED", 4)
    response, _ = h.execute(token)
    assert (response.status_code, response.json["error"]) == (503, "workspace_queued")
    assert response.headers["Retry-After"] == "60" and "queued" in response.json["message"]
    assert h.get(token, "/api/contents").status_code == 503
    assert [e.name for e in h.bus.events] == ["link.created"]  # no resume asked
    assert h.gateway.executions == []


def test_a_rest_request_on_an_exec_link_waits_for_the_resume(h: Harness) -> None:
    token = h.token()
    _paused(h)

    def lifecycle(seconds: float) -> None:
        h.mono.t += seconds
        h.store.workspaces[WS] = Target(WS, "ml-a", "bob", "RUNNING", 6)

    h.proxy.sleep = lifecycle
    response = h.get(token, "/api/sessions")
    assert response.status_code == 200 and h.gateway.forwarded


# --- identity -------------------------------------------------------------------------------------
def _iap_token(audience: str, *, issuer: str = "https://cloud.google.com/iap") -> tuple[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from google.auth import crypt, jwt

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    signer = crypt.ES256Signer.from_string(pem, key_id="k1")
    now = int(datetime.now(UTC).timestamp())
    token = jwt.encode(signer, {"iss": issuer, "aud": audience, "email": "bob@example.com",
                                "sub": "accounts.google.com:1", "iat": now, "exp": now + 600})

    class Transport:
        calls = 0

        def __call__(self, url: str, method: str = "GET", **kwargs: Any) -> Any:
            Transport.calls += 1
            return type("R", (), {"status": 200, "data": certs_json({"k1": public.decode()})})()

    return token.decode(), Transport()


def test_iap_assertions_are_verified_with_the_audience_and_issuer() -> None:
    audience = "/projects/123/global/backendServices/456"
    token, transport = _iap_token(audience)
    identity = IapIdentity(audience, request=transport)
    caller = identity.caller({"X-Goog-IAP-JWT-Assertion": token})
    assert (caller.user, caller.via) == ("bob@example.com", "iap")
    identity.caller({"x-goog-iap-jwt-assertion": token})
    assert transport.calls == 1  # the keys are cached
    with pytest.raises(Unauthenticated, match="no IAP assertion"):
        identity.caller({})
    with pytest.raises(Unauthenticated, match="invalid"):
        IapIdentity("/projects/999/global/backendServices/1", request=transport).caller(
            {"X-Goog-IAP-JWT-Assertion": token})
    forged, _ = _iap_token(audience)
    with pytest.raises(Unauthenticated, match="invalid"):
        identity.caller({"X-Goog-IAP-JWT-Assertion": forged})  # signed by another key
    wrong_issuer, keys = _iap_token(audience, issuer="https://accounts.google.com")
    with pytest.raises(Unauthenticated, match="issuer"):
        IapIdentity(audience, request=keys).caller({"X-Goog-IAP-JWT-Assertion": wrong_issuer})


def test_without_a_verified_identity_the_proxy_refuses(h: Harness) -> None:
    token = h.token()
    audience = "/projects/1/apps/p"
    h.proxy.identity = IapIdentity(audience, request=_iap_token(audience)[1])
    response = h.get(token)
    assert (response.status_code, response.json["error"]) == (401, "unauthenticated")


def test_identity_from_env_never_trusts_a_header_in_a_deployment() -> None:
    from functions.proxy.wiring import identity_from_env

    assert isinstance(identity_from_env({"FIRESTORE_EMULATOR_HOST": "x"}), DevIdentity)
    for environ in ({}, {"STASIS_IDENTITY": "iap"}, {"STASIS_IDENTITY": "sso"}):
        with pytest.raises(Unauthenticated, match="STASIS_IAP_AUDIENCE"):
            identity_from_env(environ).caller({"X-Stasis-User": "admin"})
    for environ in ({"STASIS_IAP_AUDIENCE": "/projects/1/apps/p"},
                    {"STASIS_IAP_AUDIENCE": "/projects/1/apps/p", "FIRESTORE_EMULATOR_HOST": "x"}):
        assert isinstance(identity_from_env(environ), IapIdentity)


# --- the read-ahead cache -------------------------------------------------------------------------
def test_read_ahead_keeps_a_link_in_use_from_ever_missing(h: Harness) -> None:
    token = h.token()
    cache = h.proxy.auth.cache
    h.get(token)
    reads = h.store.reads
    for _ in range(10):  # 10 x 0.25 s: every entry would have expired twice over
        h.mono.sleep(cache.seconds / 2)
        cache.refresh()
        assert h.get(token).status_code == 200
    assert h.store.reads == reads + 10  # only the batch reads, one per refresh
    h.store.links[token_hash(token)] = dataclasses.replace(
        h.store.links[token_hash(token)], revoked_at=NOW)  # revoked by another instance
    h.mono.sleep(cache.seconds / 2)
    cache.refresh()
    assert h.get(token).status_code == 401


def test_an_entry_is_never_older_than_the_ttl_without_a_refresh(h: Harness) -> None:
    token = h.token()
    h.get(token)
    h.store.links[token_hash(token)] = dataclasses.replace(
        h.store.links[token_hash(token)], revoked_at=NOW)
    h.mono.sleep(DEFAULT_POLICY.cache_seconds * 0.9)
    assert h.get(token).status_code == 200  # still within the TTL
    h.mono.sleep(DEFAULT_POLICY.cache_seconds * 0.1)
    assert h.get(token).status_code == 401


def test_a_refresh_under_way_does_not_undo_a_forget(h: Harness) -> None:
    token = h.token()
    digest = token_hash(token)
    h.get(token)
    cache = h.proxy.auth.cache
    stale = h.store.links[digest]
    real_read = h.store.read_many

    def slow_read(*args: Any) -> Any:  # the revocation lands while the batch is in flight
        result = real_read(*args)
        h.store.links[digest] = dataclasses.replace(stale, revoked_at=NOW)
        h.mono.sleep(0.01)
        cache.forget("link", digest)
        return result

    h.store.read_many = slow_read  # type: ignore[method-assign]
    h.mono.sleep(cache.seconds / 2)  # half-way to expiry: due for the read-ahead
    assert cache.refresh() > 0
    assert h.get(token).status_code == 401


def test_cold_entries_are_dropped_by_the_refresh(h: Harness) -> None:
    h.get(h.token())
    cache = h.proxy.auth.cache
    h.mono.sleep(cache.hot_seconds + 1)
    assert cache.refresh() == 0 and not any(cache.data.values())


# --- agent sandboxes through the link ---------------------------------------------------------
TASK = {"repository": "/srv/repo", "command": "python fix.py", "base_ref": "main",
        "limits": {"cpu_seconds": 60, "memory": "1Gi"}, "allowed_network": ["pypi.org"]}


def _admit_as(h: Harness, **outcome: Any) -> None:
    """Stand in for the sandbox handler: each sandbox.requested gets this verdict."""
    def admit(event: Any) -> None:
        if event.name == "sandbox.requested":
            h.sandboxes.outcomes[event.requestid] = {
                "accepted": True, "reason": "admitted", "state": "RUNNING",
                "queue_position": None, "message": "running: 1/2 slots", **outcome}
    h.bus.on_publish = admit


def _post(h: Harness, token: str, body: Any, ws: str = WS) -> Any:
    return h.client.post(f"/proxy/{ws}/stasis/sandboxes", json=body,
                         headers={"Authorization": f"Bearer {token}"})


def _requested(h: Harness) -> list[Any]:
    return [e for e in h.bus.events if e.name == "sandbox.requested"]


def test_an_exec_link_requests_a_sandbox_as_its_creator_in_its_team(h: Harness) -> None:
    _admit_as(h)
    token = h.token()
    response = _post(h, token, {**TASK, "sandbox_id": "sbx-fix-1"})
    assert response.status_code == 201, response.json
    body = response.json
    assert (body["sandbox_id"], body["state"], body["message"]) == (
        "sbx-fix-1", "RUNNING", "running: 1/2 slots")
    assert response.headers["Location"] == body["url"] == f"/proxy/{WS}/stasis/sandboxes/sbx-fix-1"
    [event] = _requested(h)
    p = event.payload
    assert (p.team, p.requester, p.repository, p.command, p.base_ref) == (
        "ml-a", "bob", "/srv/repo", "python fix.py", "main")
    assert (p.limits, p.allowed_network, p.reply_to) == (
        {"cpu_seconds": 60, "memory": "1Gi"}, ["pypi.org"], None)
    link = next(iter(h.store.links.values()))
    assert event.requestid == event.id == f"link-{link.link_id}-sbx-fix-1"
    assert any(a.get("action") == "link.sandbox" and a["outcome"] == "answered 201"
               for a in h.store.audits)


def test_a_retried_post_has_the_same_request_id_and_a_generated_id_has_the_cli_shape(
        h: Harness) -> None:
    _admit_as(h)
    token = h.token()
    first, again = (_post(h, token, {**TASK, "sandbox_id": "sbx-same"}) for _ in range(2))
    assert first.json == again.json
    assert len({e.requestid for e in _requested(h)}) == 1  # the handler's ledger: one effect
    generated = _post(h, token, TASK).json["sandbox_id"]
    assert re.fullmatch(r"sbx-20250610-120000-[0-9a-f]{6}", generated), generated


def test_a_queued_request_answers_its_position(h: Harness) -> None:
    _admit_as(h, reason="queued", state="QUEUED", queue_position=2,
              message="queued: team ml-a runs 2/2 sandboxes; position 2 of 2")
    body = _post(h, h.token(), TASK).json
    assert (body["state"], body["queue_position"]) == ("QUEUED", 2)
    assert "position 2 of 2" in body["message"]


@pytest.mark.parametrize(("reason", "status"), [
    ("limit_above_maximum", 400), ("network_not_permitted", 403), ("read_only_member", 403),
    ("sandbox_id_in_use", 409), ("queue_full", 429), ("invalid_policy", 503)])
def test_the_handlers_refusal_is_answered_with_its_status_and_message(
        h: Harness, reason: str, status: int) -> None:
    _admit_as(h, accepted=False, reason=reason, state="FAILED",
              message=f"refused: because {reason}")
    response = _post(h, h.token(), TASK)
    assert response.status_code == status
    assert (response.json["error"], response.json["message"]) == (
        reason, f"refused: because {reason}")


def test_no_verdict_in_time_answers_202_with_where_to_poll(h: Harness) -> None:
    token = h.token()
    started = h.mono.t
    response = _post(h, token, TASK)
    assert response.status_code == 202 and response.json["state"] == "REQUESTED"
    assert response.headers["Location"].startswith(f"/proxy/{WS}/stasis/sandboxes/sbx-")
    assert h.mono.t - started >= 10.0 and h.sandboxes.asked_outcome > 10  # waited, bounded


@pytest.mark.parametrize(("body", "says"), [
    ("not json", "not a JSON object"),
    ({"command": "make"}, "repository is missing"),
    ({"repository": "/r", "command": "  "}, "command is missing"),
    ({**TASK, "priority": 1}, "unknown fields priority"),
    ({**TASK, "limits": {"gpus": 1}}, "gpus"),
    ({**TASK, "limits": {"cpu_seconds": 0}}, "cpu_seconds"),
    ({**TASK, "allowed_network": "pypi.org"}, "allowed_network is a list"),
    ({**TASK, "sandbox_id": "Bad_Id"}, "sandbox_id takes"),
])
def test_bad_bodies_are_refused_with_what_to_send_and_nothing_is_requested(
        h: Harness, body: Any, says: str) -> None:
    token = h.token()
    response = (h.client.post(f"/proxy/{WS}/stasis/sandboxes", data=body,
                              headers={"Authorization": f"Bearer {token}"})
                if isinstance(body, str) else _post(h, token, body))
    assert response.status_code == 400 and says in response.json["message"], response.json
    assert _requested(h) == []


def test_scopes_a_sandbox_link_only_requests_sandboxes_a_read_link_none(h: Harness) -> None:
    _admit_as(h)
    sandbox = h.token(scope="sandbox")
    assert _post(h, sandbox, TASK).status_code == 201
    assert h.get(sandbox).status_code == 403  # not even the link's info
    assert h.get(sandbox, "/api/contents").status_code == 403
    response, _ = h.execute(sandbox)
    assert response.status_code == 403 and response.json["error"] == "insufficient_scope"
    read = h.token(scope="read")
    assert _post(h, read, TASK).status_code == 403
    assert len(_requested(h)) == 1


def test_a_paused_workspace_is_not_resumed_for_a_sandbox(h: Harness) -> None:
    _admit_as(h)
    token = h.token()
    h.store.workspaces[WS] = Target(WS, "ml-a", "bob", "PAUSED", 4)
    h.clock.advance(1)  # past the cache
    h.mono.sleep(1)
    assert _post(h, token, TASK).status_code == 201
    assert [e.name for e in h.bus.events if e.name != "link.created"] == ["sandbox.requested"]


def test_revoked_or_expired_links_request_and_read_nothing(h: Harness) -> None:
    _admit_as(h)
    token = h.token()
    _post(h, token, {**TASK, "sandbox_id": "sbx-mine"})
    h.sandboxes.docs["sbx-mine"] = {"id": "sbx-mine", "team": "ml-a", "requester": "bob",
                                    "state": "RUNNING"}
    link_id = next(iter(h.store.links.values())).link_id
    assert h.client.delete(f"/links/{link_id}", headers={"X-Stasis-User": "bob"}).status_code \
        == 200
    assert _post(h, token, TASK).status_code == 401
    assert h.get(token, "/stasis/sandboxes/sbx-mine").status_code == 401
    other = h.token()
    h.clock.advance(3601)
    assert h.get(other, "/stasis/sandboxes/sbx-mine").json["error"] == "expired"
    assert len(_requested(h)) == 1


def _ended(h: Harness, **doc: Any) -> None:
    h.sandboxes.docs["sbx-done"] = {
        "id": "sbx-done", "team": "ml-a", "requester": "bob", "state": "SUCCEEDED",
        "reason": "succeeded", "message": "the task succeeded; a patch of 1 file",
        "exit_status": 0, "files_changed": ["calc.py"], "patch_bytes": 30,
        "requested_at": NOW, "finished_at": NOW + timedelta(seconds=3),
        "patch_uri": "gs://b/sandboxes/ml-a/sbx-done/patch.diff",
        "log_uri": "gs://b/sandboxes/ml-a/sbx-done/log.txt", **doc}
    h.sandboxes.objects["gs://b/sandboxes/ml-a/sbx-done/patch.diff"] = b"diff --git a/calc.py\n"
    h.sandboxes.objects["gs://b/sandboxes/ml-a/sbx-done/log.txt"] = b"x" * 20000 + b"END\n"


def test_a_finished_sandbox_answers_its_patch_log_tail_and_how_to_review(h: Harness) -> None:
    _ended(h)
    token = h.token()
    body = h.get(token, "/stasis/sandboxes/sbx-done").json
    assert (body["state"], body["exit_status"], body["files_changed"]) == (
        "SUCCEEDED", 0, ["calc.py"])
    assert (body["patch"], body["patch_truncated"]) == ("diff --git a/calc.py\n", False)
    assert body["log_tail"].endswith("END\n") and body["log_tail_truncated"] is True
    assert len(body["log_tail"]) == 16 << 10
    assert "stasis sandbox apply sbx-done --to CHECKOUT" in body["review"]
    assert body["finished_at"] == (NOW + timedelta(seconds=3)).isoformat()
    raw = h.get(token, "/stasis/sandboxes/sbx-done/patch")
    assert raw.status_code == 200 and raw.mimetype == "text/x-diff"
    assert raw.get_data() == b"diff --git a/calc.py\n"
    listed = h.get(token, "/stasis/sandboxes").json
    assert [r["id"] for r in listed["sandboxes"]] == ["sbx-done"]


def test_a_running_sandbox_has_no_patch_yet_and_a_lost_object_is_named(h: Harness) -> None:
    _ended(h, state="RUNNING")
    token = h.token()
    body = h.get(token, "/stasis/sandboxes/sbx-done").json
    assert body["state"] == "RUNNING" and "patch" not in body and "review" not in body
    assert h.get(token, "/stasis/sandboxes/sbx-done/patch").status_code == 409
    _ended(h, patch_uri="gs://b/gone.diff")
    body = h.get(token, "/stasis/sandboxes/sbx-done").json
    assert "cannot read gs://b/gone.diff" in body["patch_error"] and "log_tail" in body


@pytest.mark.parametrize("doc", [{"requester": "alice"}, {"team": "ml-b"}])
def test_another_creators_or_teams_sandbox_does_not_exist_for_the_link(
        h: Harness, doc: dict[str, Any]) -> None:
    _ended(h, **doc)
    token = h.token()
    for path in ("/stasis/sandboxes/sbx-done", "/stasis/sandboxes/sbx-done/patch"):
        response = h.get(token, path)
        assert response.status_code == 404 and response.json["error"] == "unknown_sandbox"
    assert h.get(token, "/stasis/sandboxes").json["sandboxes"] == []


def test_without_sandboxes_the_proxy_says_so(h: Harness) -> None:
    h.proxy.sandbox_desk = None
    response = _post(h, h.token(), TASK)
    assert response.status_code == 503 and "not available" in response.json["message"]


def _held(h: Harness, **doc: Any) -> None:
    h.sandboxes.docs["sbx-held"] = {"id": "sbx-held", "team": "ml-a", "requester": "bob",
                                    "state": "SUSPENDED", "version": 4, **doc}


def test_an_agent_resumes_its_suspended_sandbox_once_per_suspension(h: Harness) -> None:
    def resume(event: Any) -> None:
        if event.name == "sandbox.resume_requested":
            h.sandboxes.outcomes[event.requestid] = {
                "accepted": True, "reason": "resumed", "state": "RUNNING",
                "queue_position": None, "message": "resumed after 30 s suspended"}
    h.bus.on_publish = resume
    _held(h)
    token = h.token(scope="sandbox")
    path = f"/proxy/{WS}/stasis/sandboxes/sbx-held/resume"
    headers = {"Authorization": f"Bearer {token}"}
    first = h.client.post(path, headers=headers)
    again = h.client.post(path, headers=headers)
    assert first.status_code == again.status_code == 200, first.json
    assert (first.json["state"], first.json["message"]) == ("RUNNING",
                                                             "resumed after 30 s suspended")
    events = [e for e in h.bus.events if e.name == "sandbox.resume_requested"]
    link = next(iter(h.store.links.values()))
    assert {e.requestid for e in events} == {f"link-{link.link_id}-resume-sbx-held-v4"}
    assert events[0].payload.requester == "bob"


def test_a_resume_that_cannot_be_is_answered_409_and_another_creators_is_404(
        h: Harness) -> None:
    token = h.token()
    headers = {"Authorization": f"Bearer {token}"}
    _held(h, state="RUNNING")
    running = h.client.post(f"/proxy/{WS}/stasis/sandboxes/sbx-held/resume", headers=headers)
    assert running.status_code == 409 and "not suspended" in running.json["message"]
    _held(h)
    h.bus.on_publish = lambda event: h.sandboxes.outcomes.__setitem__(event.requestid, {
        "accepted": False, "reason": "resume_already_queued", "state": None,
        "message": "sandbox sbx-held's resume already waits"})
    queued = h.client.post(f"/proxy/{WS}/stasis/sandboxes/sbx-held/resume", headers=headers)
    assert queued.status_code == 409 and queued.json["error"] == "resume_already_queued"
    _held(h, requester="alice")
    theirs = h.client.post(f"/proxy/{WS}/stasis/sandboxes/sbx-held/resume", headers=headers)
    assert theirs.status_code == 404
    assert len([e for e in h.bus.events if e.name == "sandbox.resume_requested"]) == 1
