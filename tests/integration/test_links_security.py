"""Agent links against the real Firestore and Pub/Sub emulators: the security cases.

The ``links`` and ``proxy`` functions are served in-process on a loopback HTTP server (the
same request handlers the function host mounts), with the real Firestore link store and
Pub/Sub bus; only the kernel is a scripted fake (tests/e2e runs real kernels). Each test
has its own project, so caches, buckets and documents never leak between tests.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from google.cloud import firestore, pubsub_v1
from link_fakes import Clock, FakeExecution, FakeGateway, ticking
from pubsub_support import pull, subscribe
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Response

from events import spec_for
from functions.adapters.iap import DevIdentity
from functions.adapters.link_store import FirestoreLinkStore
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.links import DEFAULT_POLICY, TOKEN_PREFIX, token_hash
from functions.proxy.access import AccessProxy, wsgi
from functions.proxy.issuer import LinkIssuer
from stasis_cli import link_client

WS, OTHER = "ml-a--nb", "ml-b--other"


class _Quiet(WSGIRequestHandler):
    """No access log: the function host runs gunicorn without one either."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Served:
    url: str
    db: firestore.Client
    project: str
    clock: Clock
    gateway: FakeGateway
    proxy: AccessProxy
    issuer: LinkIssuer
    other_instance: LinkIssuer  # an issuer in "another instance": no shared cache
    tokens: list[str]

    def create(self, user: str = "bob", ws: str = WS, **body: Any) -> requests.Response:
        response = requests.post(f"{self.url}/links/", json={"workspace_id": ws, **body},
                                 headers={"X-Stasis-User": user}, timeout=30)
        if response.status_code == 201:
            self.tokens.append(response.json()["token"])
        return response

    def link(self, **kwargs: Any) -> dict[str, Any]:
        response = self.create(**kwargs)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def call(self, token: str, method: str = "GET", path: str = "/", ws: str = WS,
             client: requests.Session | None = None, **kwargs: Any) -> requests.Response:
        return (client or requests).request(method, f"{self.url}/proxy/{ws}{path}", headers={
            "Authorization": f"Bearer {token}"}, timeout=30, **kwargs)


def _seed(db: firestore.Client) -> None:
    db.collection("teams").document("ml-a").set({"id": "ml-a", "members": [
        {"user": "alice", "role": "admin"}, {"user": "bob", "role": "member"}],
        "member_ids": ["alice", "bob"]})
    db.collection("teams").document("ml-b").set({"id": "ml-b", "members": [
        {"user": "carol", "role": "admin"}], "member_ids": ["carol"]})
    for ws, team, owner in ((WS, "ml-a", "bob"), (OTHER, "ml-b", "carol")):
        db.collection("workspaces").document(ws).set({
            "id": ws, "team": team, "owner": owner, "name": ws.split("--")[1],
            "state": "RUNNING", "version": 2, "profile": "cpu-small"})


@pytest.fixture
def served(emulator_env: dict[str, str]) -> Iterator[Served]:
    project = emulator_env["STASIS_PROJECT"]
    publisher = pubsub_v1.PublisherClient()
    for name in ("link.created", "link.revoked", "workspace.resume_requested"):
        publisher.create_topic(name=publisher.topic_path(project, spec_for(name).topic))
    db = firestore.Client(project=project)
    _seed(db)
    store = FirestoreLinkStore(db)
    bus = PubSubBus(project, origin="links")
    clock = Clock()
    gateway = FakeGateway()
    holder: dict[str, str] = {}
    issuer = LinkIssuer(store, bus, DevIdentity(), clock=clock,
                        proxy_url=lambda request: holder["url"] + "/proxy")
    proxy = AccessProxy(store, gateway, bus, DevIdentity(), clock=clock,
                        on_exposed=issuer.revoke_exposed)
    issuer.revoked_listeners.append(proxy.auth.forget)
    other = LinkIssuer(store, bus, DevIdentity(), clock=clock,
                       proxy_url=lambda request: holder["url"] + "/proxy")
    app = DispatcherMiddleware(Response("not found", 404), {
        "/proxy": wsgi(proxy), "/links": wsgi(issuer), "/other-links": wsgi(other)})
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    holder["url"] = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(holder["url"], db, project, clock, gateway, proxy, issuer, other, [])
    finally:
        server.shutdown()
        thread.join(timeout=10)
        proxy.close()


def _raw_get(base: str, path: str) -> int:
    """A GET with http.client, which logs nothing: a misbehaving client's own debug log is
    not what the scan is about (the proxy's is)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def _all_documents(db: firestore.Client) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every document of every collection (and subcollection) of the project."""
    def walk(collections: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        for collection in collections:
            for snap in collection.stream():
                yield snap.reference.path, snap.to_dict() or {}
                yield from walk(snap.reference.collections())
    yield from walk(db.collections())


# --- creation -------------------------------------------------------------------------------------
def test_a_link_is_shown_once_stored_as_its_hash_published_and_audited(served: Served) -> None:
    created = subscribe(served.project, "stasis-link-created")
    body = served.link(ttl="2h")
    token = body["token"]
    assert body["url"] == f"{served.url}/proxy/{WS}#{token}"
    snap = served.db.collection("links").document(token_hash(token)).get()
    doc = snap.to_dict()
    assert snap.exists and doc["link_id"] == body["link_id"] and doc["creator"] == "bob"
    assert doc["revoked_at"] is None and doc["scope"] == "exec"
    assert abs((doc["expires_at"] - served.clock()).total_seconds() - 7200) < 60
    [message] = pull(created, 1)
    assert json.loads(message.data)["link_id"] == body["link_id"]
    assert token not in message.data.decode() and token_hash(token) not in message.data.decode()
    audit = [d for _, d in _all_documents(served.db) if d.get("action") == "link.created"]
    assert audit and audit[0]["actor"] == "bob" and audit[0]["link_id"] == body["link_id"]
    for _ in range(3):
        assert served.call(token).status_code == 200
    served.proxy.flush()  # use counts are written at most once a second, off the request
    used = served.db.collection("links").document(token_hash(token)).get().to_dict()
    assert used["uses"] == 3 and used["last_used_at"] is not None


def test_a_link_to_a_workspace_of_another_team_cannot_be_created(served: Served) -> None:
    response = served.create(user="bob", ws=OTHER)
    assert (response.status_code, response.json()["error"]) == (403, "creator_not_member")


# --- each rejection, with its status --------------------------------------------------------------
def test_unknown_token(served: Served) -> None:
    response = served.call(TOKEN_PREFIX + secrets.token_urlsafe(32))
    assert (response.status_code, response.json()["error"]) == (401, "unknown_link")
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]


def test_expired(served: Served) -> None:
    token = served.link(ttl="1h")["token"]
    assert served.call(token).status_code == 200
    served.clock.advance(3600)
    response = served.call(token)
    assert (response.status_code, response.json()["error"]) == (401, "expired")


def test_revoked(served: Served) -> None:
    body = served.link()
    revoked = requests.delete(f"{served.url}/links/{body['link_id']}",
                              headers={"X-Stasis-User": "bob"}, timeout=30)
    assert revoked.status_code == 200
    response = served.call(body["token"])
    assert (response.status_code, response.json()["error"]) == (401, "revoked")


def test_wrong_scope(served: Served) -> None:
    token = served.link(scope="read")["token"]
    assert served.call(token, path="/api/sessions").status_code == 200  # read is fine
    response = served.call(token, "POST", "/execute", json={"code": "print(1)"})
    assert (response.status_code, response.json()["error"]) == (403, "insufficient_scope")
    assert served.gateway.executions == []


def test_creator_removed_from_the_team(served: Served) -> None:
    token = served.link(user="bob")["token"]
    assert served.call(token).status_code == 200
    served.db.collection("teams").document("ml-a").update({
        "members": [{"user": "alice", "role": "admin"}], "member_ids": ["alice"]})
    time.sleep(DEFAULT_POLICY.cache_seconds + 0.1)
    response = served.call(token)
    assert (response.status_code, response.json()["error"]) == (403, "creator_not_member")


def test_a_workspace_of_another_team(served: Served) -> None:
    token = served.link(user="bob")["token"]
    response = served.call(token, ws=OTHER)
    assert (response.status_code, response.json()["error"]) == (403, "wrong_workspace")
    # A link record whose workspace now belongs to another team (re-created under it).
    served.db.collection("workspaces").document(WS).update({"team": "ml-b"})
    time.sleep(DEFAULT_POLICY.cache_seconds + 0.1)
    response = served.call(token)
    assert (response.status_code, response.json()["error"]) == (403, "other_team")


def test_a_token_in_the_url_query_is_refused_and_its_link_revoked(served: Served) -> None:
    body = served.link()
    token = body["token"]
    response = requests.get(f"{served.url}/proxy/{WS}/api/contents", params={"token": token},
                            timeout=30)
    assert (response.status_code, response.json()["error"]) == (400, "token_in_url")
    doc = served.db.collection("links").document(token_hash(token)).get().to_dict()
    assert doc["revoked_by"] == "stasis-proxy" and "URL" in doc["revoke_reason"]
    assert served.call(token).status_code == 401  # the leaked token is dead
    # The client never builds such a URL: a query string in a link is refused up front.
    err = io.StringIO()
    assert link_client.run(f"{served.url}/proxy/{WS}?x=1#{token}", "1", err=err) == 2
    assert "no query string" in err.getvalue()


def test_brute_force_is_rate_limited(served: Served) -> None:
    burst = DEFAULT_POLICY.failure_rate.burst
    session = requests.Session()
    statuses = [served.call(TOKEN_PREFIX + secrets.token_urlsafe(32), client=session)
                for _ in range(burst + 10)]
    assert [r.status_code for r in statuses] == [401] * burst + [429] * 10
    assert int(statuses[-1].headers["Retry-After"]) >= 1
    assert statuses[-1].json()["error"] == "too_many_failures"
    # The client, throttled with a good link, says so and exits 4 (worth a retry), not 3
    # (the link refused): a chaos run's agent holding a revoked and a live link met this.
    err = io.StringIO()
    assert link_client.run(served.link()["url"], "print(1)", err=err) == \
        link_client.EXIT_UNAVAILABLE
    assert "too_many_failures" in err.getvalue() and "retry after" in err.getvalue()


def test_each_link_is_rate_limited(served: Served) -> None:
    token = served.link()["token"]
    session = requests.Session()
    codes = [served.call(token, client=session).status_code for _ in range(30)]
    assert codes.count(429) >= 30 - DEFAULT_POLICY.link_rate.burst - 5
    assert codes[: DEFAULT_POLICY.link_rate.burst] == [200] * DEFAULT_POLICY.link_rate.burst


# --- revocation while in use ----------------------------------------------------------------------
def test_revocation_takes_effect_within_a_second_while_another_client_streams(
        served: Served) -> None:
    served.gateway.cell = lambda code: FakeExecution(ticking(0.05), real_time=True)
    body = served.link()
    token = body["token"]
    lines: list[tuple[float, dict[str, Any]]] = []
    ticks = threading.Event()

    def agent() -> None:  # the agent: one long-running cell, streaming
        with requests.post(f"{served.url}/proxy/{WS}/execute", json={"code": "loop()"},
                           headers={"Authorization": f"Bearer {token}"}, stream=True,
                           timeout=(5, 30)) as response:
            for raw in response.iter_lines(chunk_size=None):
                if raw:
                    lines.append((time.monotonic(), json.loads(raw)))
                    if len(lines) >= 4:
                        ticks.set()

    streaming = threading.Thread(target=agent)
    streaming.start()
    assert ticks.wait(20), "the stream did not start"
    # Revoked through another instance of the links function: this proxy's cache is not
    # told, so the cache TTL and the stream's re-check are what end the stream.
    revoked = requests.delete(f"{served.url}/other-links/{body['link_id']}",
                              headers={"X-Stasis-User": "alice"}, timeout=30)
    revoked_at = time.monotonic()
    assert revoked.status_code == 200
    refused_after = None
    while time.monotonic() - revoked_at < 3:
        if served.call(token).status_code == 401:
            refused_after = time.monotonic() - revoked_at
            break
        time.sleep(0.02)
    streaming.join(timeout=10)
    end_at, end = lines[-1]
    assert end["type"] == "end" and end["status"] == "revoked"
    assert end_at - revoked_at < 1.0, f"stream closed {end_at - revoked_at:.2f}s after revoke"
    assert refused_after is not None and refused_after < 1.0
    assert served.gateway.executions[0].interrupted.is_set()


# --- the client, and secrecy ----------------------------------------------------------------------
def test_the_client_needs_nothing_but_the_link(served: Served) -> None:
    body = served.link()
    out, err = io.StringIO(), io.StringIO()
    assert link_client.run(body["url"], "print(1)", out=out, err=err) == 0
    assert out.getvalue() == "ran 8 bytes\n"
    served.gateway.cell = lambda code: FakeExecution(
        [{"type": "error", "ename": "NameError", "evalue": "x",
          "traceback": ["\x1b[31mNameError\x1b[0m: x"]}], status="error")
    err = io.StringIO()
    assert link_client.run(body["url"], "x", out=out, err=err) == 1
    assert err.getvalue() == "NameError: x\n"  # colours stripped off a non-terminal
    requests.delete(f"{served.url}/links/{body['link_id']}", headers={"X-Stasis-User": "bob"},
                    timeout=30)
    err = io.StringIO()
    assert link_client.run(body["url"], "print(1)", out=out, err=err) == 3
    assert "refused (401) revoked" in err.getvalue()


def test_the_token_never_appears_in_logs_or_in_firestore(
        served: Served, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    events = subscribe(served.project, "stasis-link-revoked")
    # Every path a token takes: create, use, exec, REST, a denial, a leak, revocation.
    body = served.link()
    read = served.link(scope="read")
    token = body["token"]
    served.call(token)
    assert served.call(token, "POST", "/execute", json={"code": "print(1)"}).ok
    served.call(token, path="/api/contents")
    served.call(read["token"], "POST", "/execute", json={"code": "1"})
    _raw_get(served.url, f"/proxy/{WS}/?t={read['token']}")  # a client that leaks it
    served.call(TOKEN_PREFIX + secrets.token_urlsafe(32))
    requests.delete(f"{served.url}/links/{body['link_id']}", headers={"X-Stasis-User": "bob"},
                    timeout=30)
    served.call(token)
    served.proxy.flush()
    messages = pull(events, 2)
    assert len(served.tokens) == 2
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    out, errors = capfd.readouterr()
    documents = list(_all_documents(served.db))
    assert any(path.startswith("links/") for path, _ in documents)
    assert any(d.get("action") == "link.exec" for _, d in documents)
    stored = json.dumps([d for _, d in documents], default=str)
    published = " ".join(m.data.decode() + json.dumps(dict(m.attributes)) for m in messages)
    for secret in served.tokens:
        assert secret not in logged, "a token was logged"
        assert secret not in out + errors, "a token was printed"
        assert secret not in stored, "a token was stored"
        assert secret not in published, "a token was published"
    assert caplog.records, "nothing was logged: the scan would prove nothing"
