"""``workspace_api`` on GKE: the caller is the workspace whose own KSA's projected token it
sends (issue 17 §3). The cluster is stood in for by an RSA key made here and its JWKS served
on 127.0.0.1; tokens are minted with PyJWT carrying the claims a kubelet's projected token
has. Team and owner still come from the workspace's document."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from json_server import serving_json
from store_fakes import handler_deps, published
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from events import new_event
from events.payloads import JobSubmitted
from functions.adapters.kubernetes_tokens import KubernetesTokens
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from functions.handlers import workspace_api
from functions.kubernetes.objects.workspace import service_account_name

ROOT = Path(__file__).resolve().parents[2]
ISSUER = "https://container.googleapis.com/v1/projects/p/locations/europe-west4/clusters/c"
AUDIENCE = "stasis-workspace"
WS = Workspace(id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile="cpu-small",
               state=State.RUNNING, version=3, incarnation="inc-1")
MATE = Workspace(id="ml-a--mate", team="ml-a", owner="bob", name="mate", profile="cpu-small",
                 state=State.RUNNING, version=1, incarnation="inc-9")
JOB = {"job_id": "job-1", "profile": "cpu-small", "hosts": 1, "function": "f"}
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()
    with serving_json(body) as url:
        yield f"{url}/jwks"


@pytest.fixture
def deps(jwks_url: str) -> Any:
    deps = handler_deps(Catalog.from_config(yaml.safe_load(
        (ROOT / "examples" / "stasis.yaml").read_text())))
    deps.store.put_workspace(WS)
    deps.store.put_workspace(MATE)
    return dataclasses.replace(deps, workspace_tokens=KubernetesTokens(
        ISSUER, AUDIENCE, jwks_url=jwks_url))


def token(ws: Workspace = WS, *, namespace: str = "stasis-ml-a", audience: str = AUDIENCE,
          issuer: str = ISSUER, expires_in: int = 3600, key: Any = KEY,
          kid: str = "k1") -> str:
    """What the kubelet projects into ``ws``'s IDE container."""
    now = int(time.time())
    claims = {"iss": issuer, "aud": [audience], "iat": now - 10, "nbf": now - 10,
              "exp": now + expires_in,
              "sub": f"system:serviceaccount:{namespace}:"
                     f"{service_account_name(ws.id, ws.incarnation)}",
              "kubernetes.io": {"namespace": namespace,
                                "pod": {"name": "ws-x", "uid": "u1"},
                                "serviceaccount": {
                                    "name": service_account_name(ws.id, ws.incarnation),
                                    "uid": "u2"}}}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def submit(deps: Any, bearer: str, workspace: str = WS.id,
           payload: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    request = Request(EnvironBuilder(
        method="POST", path="/events",
        json={"type": "job.submitted", "payload": payload or {**JOB, "owner": "mallory"}},
        headers={"Authorization": f"Bearer {bearer}",
                 workspace_api.WORKSPACE_HEADER: workspace}).get_environ())
    response = workspace_api.serve(request, deps)
    return response.status_code, response.get_json()


def test_the_workspaces_own_token_publishes_as_its_document_says(deps: Any) -> None:
    status, body = submit(deps, token())
    assert status == 202, body
    (submitted,) = published(deps, "job.submitted")
    assert (submitted.team, submitted.owner, submitted.workspace_id) == (
        "ml-a", "alice", WS.id)


def test_another_team_in_the_payload_is_still_refused(deps: Any) -> None:
    status, body = submit(deps, token(), payload={**JOB, "team": "ml-b"})
    assert status == 403 and "own team (ml-a) only" in body["refusal"]
    assert published(deps, "job.submitted") == []


@pytest.mark.parametrize(("bearer", "named", "reason"), [
    (lambda: token(audience="https://kubernetes.default.svc"), WS.id, "Audience"),
    (lambda: token(expires_in=-60), WS.id, "expired"),
    (lambda: token(issuer="https://evil.example"), WS.id, "issuer"),
    (lambda: token(key=STRANGER), WS.id, "Signature verification failed"),
    (lambda: token(kid="k2"), WS.id, "Unable to find a signing key"),
    # a teammate's own valid token, naming this workspace
    (lambda: token(MATE), WS.id, "another workspace's service account"),
    # this workspace's KSA name, in another team's namespace
    (lambda: token(namespace="stasis-ml-b"), WS.id, "another namespace"),
    # an earlier incarnation of the same id
    (lambda: token(dataclasses.replace(WS, incarnation="inc-0")), WS.id,
     "another workspace's service account"),
    (lambda: token(), "ml-a--nobody", "no such workspace"),
], ids=["audience", "expired", "issuer", "forged", "unknown key", "teammate",
        "namespace", "old incarnation", "unknown workspace"])
def test_a_token_that_is_not_the_workspaces_own_is_refused_with_why(
        deps: Any, bearer: Any, named: str, reason: str) -> None:
    status, body = submit(deps, bearer(), named)
    assert status == 401, body
    assert reason in body["refusal"], body
    assert published(deps, "job.submitted") == []


def test_a_deleted_workspaces_token_is_refused(deps: Any) -> None:
    deps.store.put_workspace(dataclasses.replace(WS, state=State.DELETED))
    status, body = submit(deps, token())
    assert status == 401 and "deleted" in body["refusal"]


def test_the_kernel_sends_its_projected_token_as_it_is_now(deps: Any, tmp_path: Path) -> None:
    """``stasis.control_plane`` over real HTTP: the token file is read on every call (the
    kubelet rotates it), and the workspace is named beside it."""
    from werkzeug.serving import make_server

    from stasis.control_plane import from_identity, has_identity

    def app(environ: Any, start_response: Any) -> Any:
        return workspace_api.serve(Request(environ), deps)(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        projected = tmp_path / "token"
        projected.write_text(token() + "\n")
        env = {"STASIS_WORKSPACE_TOKEN_FILE": str(projected), "STASIS_WORKSPACE_ID": WS.id,
               "STASIS_WORKSPACE_URL": f"http://127.0.0.1:{server.server_port}"}
        assert has_identity(env)
        plane = from_identity(env)
        event = new_event(JobSubmitted(job_id="job-1", team="ml-b", owner="mallory",
                                       profile="cpu-small", hosts=1, function="f"),
                          source="//test")
        with pytest.raises(PermissionError, match="own team"):
            plane.publish(event)
        plane.publish(new_event(dataclasses.replace(event.payload, team="ml-a"),
                                source="//test"))
        (submitted,) = published(deps, "job.submitted")
        assert (submitted.team, submitted.owner) == ("ml-a", "alice")
        assert plane.read_job("job-1") is None  # GET: not of its team yet, but allowed
        projected.write_text(token(expires_in=-60))  # what it holds now is what is sent
        with pytest.raises(PermissionError, match="expired"):
            plane.read_job("job-1")
    finally:
        server.shutdown()
