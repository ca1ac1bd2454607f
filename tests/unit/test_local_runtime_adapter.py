"""LocalRuntime (the control plane's client of the node agent): requests and error mapping.

Requests go through a ``requests`` transport that answers in-process, either with canned
responses or by handing the request to the agent's own Flask app (a contract test of the
two sides without sockets).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
import requests
from flask import Flask
from requests.adapters import BaseAdapter

from functions.adapters.local_runtime import LocalRuntime, spec_to_json
from functions.ports import RuntimeRefused, RuntimeUnavailable, WorkspaceSpec

BASE = "http://agent.test"

SPEC = WorkspaceSpec(
    workspace_id="team--ws",
    team="team",
    owner="ana",
    name="ws",
    ide="jupyterlab",
    environment=MappingProxyType({"id": "python-3-11", "python": "default"}),
    profile={"id": "cpu-small", "cpu": 1, "memory": "2Gi", "accelerator": None},
    snapshot_bucket="bucket",
    snapshot_prefix="snapshots/team/team--ws",
    requestid="req-1",
)


class Transport(BaseAdapter):
    """Answers every request with ``respond(request) -> (status, body)``."""

    def __init__(self, respond: Callable[[requests.PreparedRequest], tuple[int, Any]]) -> None:
        super().__init__()
        self.respond = respond
        self.sent: list[requests.PreparedRequest] = []
        self.timeouts: list[Any] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        self.timeouts.append(kwargs.get("timeout"))
        status, body = self.respond(request)
        response = requests.Response()
        response.status_code = status
        response._content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response.headers["Content-Type"] = "application/json"
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        pass


def runtime_with(transport: BaseAdapter, token: str | None = None) -> LocalRuntime:
    session = requests.Session()
    session.mount("http://", transport)
    return LocalRuntime(BASE, session=session, token=token)


def canned(status: int, body: Any) -> tuple[LocalRuntime, Transport]:
    transport = Transport(lambda request: (status, body))
    return runtime_with(transport), transport


def test_spec_travels_as_plain_json() -> None:
    data = spec_to_json(SPEC)
    assert data["environment"] == {"id": "python-3-11", "python": "default"}
    assert json.loads(json.dumps(data)) == data
    assert data["requestid"] == "req-1"


def test_provision_puts_the_spec() -> None:
    runtime, transport = canned(202, {"accepted": True})
    runtime.provision(SPEC)
    request = transport.sent[0]
    assert (request.method, request.url) == ("PUT", f"{BASE}/workspaces/team--ws")
    assert json.loads(request.body or b"") == spec_to_json(SPEC)


def test_snapshot_and_restore_bodies() -> None:
    runtime, transport = canned(202, {"accepted": True})
    runtime.snapshot(SPEC, "snap-1")
    runtime.restore(SPEC, "snap-1")
    snap, restore = (json.loads(r.body or b"") for r in transport.sent)
    assert transport.sent[0].url == f"{BASE}/workspaces/team--ws/snapshot"
    assert snap == {
        "snapshot_id": "snap-1",
        "bucket": "bucket",
        "prefix": "snapshots/team/team--ws/snap-1",
        "requestid": "req-1",
    }
    assert transport.sent[1].url == f"{BASE}/workspaces/team--ws/restore"
    assert restore["spec"] == spec_to_json(SPEC)
    assert restore["prefix"] == "snapshots/team/team--ws/snap-1"


def test_release_and_destroy() -> None:
    runtime, transport = canned(200, {"released": True})
    runtime.release("team--ws")
    runtime.destroy("team--ws", keep_home=True)
    runtime.destroy("team--ws", keep_home=False)
    assert [(r.method, r.url) for r in transport.sent] == [
        ("POST", f"{BASE}/workspaces/team--ws/release"),
        ("DELETE", f"{BASE}/workspaces/team--ws?keep_home=true"),
        ("DELETE", f"{BASE}/workspaces/team--ws?keep_home=false"),
    ]
    # Stopping a server takes a grace period: these calls get the longer timeout.
    assert transport.timeouts[0] == runtime.stop_timeout


def test_refusal_carries_the_agent_message() -> None:
    message = "profile gpu-small needs 1 x nvidia-l4; this host has no GPU"
    runtime, _ = canned(409, {"error": message})
    with pytest.raises(RuntimeRefused) as raised:
        runtime.provision(SPEC)
    assert str(raised.value) == message


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_side_trouble_is_temporary(status: int) -> None:
    runtime, _ = canned(status, {"error": "busy: snapshot s1 in progress"})
    with pytest.raises(RuntimeUnavailable, match="busy: snapshot s1"):
        runtime.snapshot(SPEC, "s2")


def test_unreachable_agent_is_temporary() -> None:
    def refuse(request: requests.PreparedRequest) -> tuple[int, Any]:
        raise requests.ConnectionError("connection refused")

    runtime = runtime_with(Transport(refuse))
    with pytest.raises(RuntimeUnavailable, match="unreachable"):
        runtime.capabilities()


def test_status_of_an_unknown_workspace_is_none() -> None:
    runtime, _ = canned(404, {"error": "workspace team--ws is not known on this node"})
    assert runtime.status("team--ws") is None


def test_status_and_list() -> None:
    item = {
        "workspace_id": "team--ws",
        "running": True,
        "url": "http://127.0.0.1:1/lab",
        "token": "t",
        "operation": None,
        "pid": 42,
        "port": 1,
    }
    runtime, _ = canned(200, item)
    status = runtime.status("team--ws")
    assert status is not None and status.running and status.token == "t"
    assert status.detail["pid"] == 42
    runtime, _ = canned(200, {"workspaces": [item]})
    assert [s.workspace_id for s in runtime.list()] == ["team--ws"]


def test_progress_reads_the_agent_report() -> None:
    report = {"workspace_id": "team--ws", "phase": "restore", "started_at": 1.0,
              "first_byte_at": 2.0, "done_bytes": 5, "total_bytes": 9, "observed_at": 3.0}
    runtime, transport = canned(200, report)
    assert runtime.progress("team--ws") == report
    assert transport.sent[0].url == f"{BASE}/workspaces/team--ws/progress"
    idle, _ = canned(200, {"workspace_id": "team--ws", "phase": None})
    assert idle.progress("team--ws") is None
    unknown, _ = canned(404, {"error": "not known"})
    assert unknown.progress("team--ws") is None


def test_contract_with_the_agent_app(tmp_path: Any) -> None:
    """The adapter's requests are what the agent's app accepts (and its refusals come back
    as RuntimeRefused), without starting any server."""
    from runtime.local.agent import create_app
    from runtime.local.node import NodeAgent
    from runtime.local.publisher import RecordingPublisher
    from runtime.local.settings import AgentSettings

    settings = AgentSettings(data_dir=tmp_path)
    caps = {
        "runtime": "local",
        "cpus": 1,
        "memory_bytes": 2**30,
        "accelerators": {},
        "ides": ["jupyterlab"],
    }
    agent = NodeAgent(settings, RecordingPublisher(), capabilities=caps)
    agent.start()
    app: Flask = create_app(settings, agent=agent)
    client = app.test_client()

    def through_app(request: requests.PreparedRequest) -> tuple[int, Any]:
        path = request.path_url or "/"
        response = client.open(
            path, method=request.method or "GET", data=request.body, headers=dict(request.headers)
        )
        return response.status_code, response.data

    try:
        runtime = runtime_with(Transport(through_app), token=settings.control_token())
        seen = runtime.capabilities()
        assert seen.pop("tenancy")["mode"] in ("per-workspace-users", "single-tenant")
        assert seen == {"node": socket.gethostname(), **caps}
        gpu = WorkspaceSpec(
            **{
                **SPEC.__dict__,
                "profile": {"id": "gpu-small", "accelerator": {"type": "nvidia-l4", "count": 1}},
            }
        )
        with pytest.raises(RuntimeRefused, match="needs 1 x nvidia-l4; this host has no GPU"):
            runtime.provision(gpu)
        with pytest.raises(RuntimeRefused, match="not running"):
            runtime.snapshot(SPEC, "snap-1")
        assert runtime.status("team--ws") is None
        runtime.release("team--ws")
        runtime.destroy("team--ws", keep_home=False)
        assert runtime.list() == []
    finally:
        agent.close()
