"""A Cloud Function reaches GKE with its Google identity:
``functions.kubernetes.api.google_api_client``.

A real HTTP server plays both the cluster's API server (recording the Authorization
header of every request) and Google's token endpoint (a real google-auth refresh with a
refresh token), so the test sees what the official clients send.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from functions.kubernetes.api import KubeApi, google_api_client


class _Server(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []
    issued = 0

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        self._json({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "ns"}})

    def do_POST(self) -> None:  # the token endpoint
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        assert form["grant_type"] == ["refresh_token"]
        type(self).issued += 1
        self._json({"access_token": f"fresh-{type(self).issued}", "expires_in": 3600,
                    "token_type": "Bearer"})

    def log_message(self, *args) -> None:
        return


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Server.seen, _Server.issued = [], 0
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _credentials(base: str, token: str, expiry: datetime):
    from google.oauth2.credentials import Credentials

    return Credentials(token=token, refresh_token="r", client_id="c", client_secret="s",
                       token_uri=f"{base}/token",
                       expiry=expiry.astimezone(UTC).replace(tzinfo=None))


def test_every_request_carries_the_token_and_an_expired_one_is_refreshed_once(server):
    valid = _credentials(server, "still-good", datetime.now(UTC) + timedelta(hours=1))
    kube = KubeApi(google_api_client(server, credentials=valid))
    assert kube.read("Pod", "ns", "p")["metadata"]["name"] == "p"
    assert _Server.seen[-1] == ("/api/v1/namespaces/ns/pods/p", "Bearer still-good")
    assert _Server.issued == 0

    expired = _credentials(server, "old", datetime.now(UTC) - timedelta(minutes=1))
    kube = KubeApi(google_api_client(server, credentials=expired))
    kube.read("Pod", "ns", "p")
    kube.read("Pod", "ns", "p")
    assert [auth for _path, auth in _Server.seen[-2:]] == ["Bearer fresh-1"] * 2
    assert _Server.issued == 1  # refreshed once, then reused while valid


def test_the_environment_picks_the_google_client(monkeypatch, server):
    from functions.kubernetes import api as kube_api

    monkeypatch.setenv("STASIS_K8S_HOST", server)
    seen = {}

    def fake(host, *, ca_cert=None):
        seen["host"], seen["ca"] = host, ca_cert
        return "client"

    monkeypatch.setattr(kube_api, "google_api_client", fake)
    assert kube_api.default_api_client() == "client" and seen == {"host": server, "ca": None}
