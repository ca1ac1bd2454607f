"""The node agent's HTTP API and operations, with stand-in server processes.

A "server" here is a sleeping Python process started the way the agent starts Jupyter
(own session, the start's marker in its environment), so the real stop logic runs; the
readiness wait and the snapshot orchestration are replaced. The real Jupyter servers are
exercised in tests/integration/test_node_agent.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from flask.testing import FlaskClient

from runtime.local import node as node_module
from runtime.local import servers, snapshots
from runtime.local.agent import create_app
from runtime.local.node import RESTARTED_DURING_SNAPSHOT, NodeAgent
from runtime.local.publisher import RecordingPublisher
from runtime.local.servers import ServerLaunch, ServerProcess, ServerStartError
from runtime.local.settings import AgentSettings, control_token
from runtime.local.state import AgentLockError, Operation, StateFile

WS = "team--ws"
CAPS = {
    "runtime": "local",
    "cpus": 2,
    "memory_bytes": 8 * 2**30,
    "accelerators": {},
    "ides": ["jupyterlab"],
}


def spec(**overrides: Any) -> dict[str, Any]:
    return {
        "workspace_id": WS,
        "team": "team",
        "owner": "ana",
        "name": "ws",
        "ide": "jupyterlab",
        "environment": {"id": "python-3-11", "python": "default"},
        "profile": {"id": "cpu-small", "cpu": 1, "memory": "2Gi"},
        "snapshot_bucket": "bucket",
        "snapshot_prefix": f"snapshots/team/{WS}",
        "requestid": "req-1",
        **overrides,
    }


class FakeServers:
    """spawn: a sleeping process in its own session; wait_ready: gated by ``ready``."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.ready.set()
        self.fail_with: str | None = None
        self.spawned: list[ServerProcess] = []
        self.code = "import time; time.sleep(600)"

    def spawn(self, launch: ServerLaunch) -> ServerProcess:
        launch.home.mkdir(parents=True, exist_ok=True)
        marker = uuid.uuid4().hex
        popen = subprocess.Popen(
            [sys.executable, "-c", self.code],
            start_new_session=True,
            env={**os.environ, servers.MARKER_VAR: marker},
        )
        server = ServerProcess(
            workspace_id=launch.workspace_id,
            pid=popen.pid,
            port=9,
            token="t" * 64,
            marker=marker,
            create_time=psutil.Process(popen.pid).create_time(),
            started_at=time.time(),
            log_path=str(launch.log_path),
            popen=popen,
        )
        self.spawned.append(server)
        return server

    def wait_ready(self, server: ServerProcess, *, timeout: float) -> float:
        self.ready.wait(30)
        if not server.is_alive():
            raise ServerStartError("the server exited before it answered")
        if self.fail_with:
            servers.stop(server, grace=1)
            raise ServerStartError(self.fail_with)
        return 0.01

    def alive(self) -> list[ServerProcess]:
        return [s for s in self.spawned if s.is_alive()]


class FakeEngine:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []

    def delete_prefix(self, bucket: str, prefix: str) -> int:
        self.deleted.append((bucket, prefix))
        return 0

    def read_manifest(self, bucket: str, prefix: str) -> dict[str, Any]:
        raise RuntimeError("no manifest here")


@pytest.fixture
def fake_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServers]:
    fake = FakeServers()
    monkeypatch.setattr(servers, "spawn", fake.spawn)
    monkeypatch.setattr(servers, "wait_ready", fake.wait_ready)
    yield fake
    fake.ready.set()
    for server in fake.spawned:
        servers.stop(server, grace=1)


@pytest.fixture
def settings(tmp_path: Path) -> AgentSettings:
    return AgentSettings(data_dir=tmp_path / "data", stop_grace=2)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def agent(
    settings: AgentSettings,
    publisher: RecordingPublisher,
    engine: FakeEngine,
    fake_servers: FakeServers,
) -> Iterator[NodeAgent]:
    agent = NodeAgent(settings, publisher, engine=engine, capabilities=CAPS)  # type: ignore[arg-type]
    agent.start()
    yield agent
    agent.close()


@pytest.fixture
def client(settings: AgentSettings, agent: NodeAgent) -> FlaskClient:
    """The control plane's client: it carries the agent's credential."""
    client = create_app(settings, agent=agent).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {settings.control_token()}"
    return client


def provisioned(client: FlaskClient, publisher: RecordingPublisher) -> dict[str, Any]:
    response = client.put(f"/workspaces/{WS}", json=spec())
    assert response.status_code == 202, response.json
    publisher.wait_for("workspace.ready", timeout=30)
    return client.get(f"/workspaces/{WS}").json  # type: ignore[no-any-return]


def test_health_and_capabilities(client: FlaskClient) -> None:
    assert client.get("/healthz").json == {"ok": True}
    caps = client.get("/capabilities").json
    assert caps["tenancy"]["mode"] in ("per-workspace-users", "single-tenant")
    assert {k: v for k, v in caps.items() if k != "tenancy"} == {
        "node": socket.gethostname(), **CAPS}


def test_provision_reports_ready_with_the_request_id(
    client: FlaskClient, publisher: RecordingPublisher
) -> None:
    status = provisioned(client, publisher)
    event = publisher.wait_for("workspace.ready")
    assert event.requestid == "req-1"
    assert event.source == "//stasis/runtime/local"
    assert event.payload.runtime_handle == f"local:{status['pid']}"
    assert event.payload.url == status["url"] == f"http://127.0.0.1:{status['port']}/lab"
    assert status["running"] is True and status["token"] and status["operation"] is None
    assert client.get("/workspaces").json["workspaces"][0]["workspace_id"] == WS


def test_provision_again_republishes_ready(
    client: FlaskClient, agent: NodeAgent, publisher: RecordingPublisher, fake_servers: FakeServers
) -> None:
    provisioned(client, publisher)
    again = client.put(f"/workspaces/{WS}", json=spec(requestid="req-2"))
    assert again.status_code == 202 and again.json["detail"] == "already running"
    publisher.wait_for("workspace.ready", timeout=10)
    agent.wait_idle()
    ready = [e for e in publisher.events if e.name == "workspace.ready"]
    assert [e.requestid for e in ready] == ["req-1", "req-2"]
    assert len(fake_servers.spawned) == 1


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/workspaces/Not_An_Id", spec(), "not a workspace id"),
        (f"/workspaces/{WS}", {k: v for k, v in spec().items() if k != "owner"}, "lacks owner"),
        (f"/workspaces/{WS}", spec(workspace_id="team--other"), "is for workspace team--other"),
        (f"/workspaces/{WS}", spec(profile="cpu-small"), "profile must be an object"),
    ],
)
def test_malformed_provisions_are_400(
    client: FlaskClient, path: str, body: dict[str, Any], message: str
) -> None:
    response = client.put(path, json=body)
    assert response.status_code == 400
    assert message in response.json["error"]


def test_body_must_be_json(client: FlaskClient) -> None:
    response = client.put(f"/workspaces/{WS}", data="nope")
    assert response.status_code == 400 and "JSON object" in response.json["error"]


def test_gpu_profile_refused_with_409(client: FlaskClient, fake_servers: FakeServers) -> None:
    gpu = {
        "id": "gpu-small",
        "cpu": 4,
        "memory": "16Gi",
        "accelerator": {"type": "nvidia-l4", "count": 1},
    }
    response = client.put(f"/workspaces/{WS}", json=spec(profile=gpu))
    assert response.status_code == 409
    assert response.json["error"] == "profile gpu-small needs 1 x nvidia-l4; this host has no GPU"
    assert fake_servers.spawned == []


def test_vscode_without_code_server_refused(client: FlaskClient) -> None:
    response = client.put(f"/workspaces/{WS}", json=spec(ide="vscode"))
    assert response.status_code == 409
    assert response.json["error"] == (
        "vscode is not available on this runtime (code-server not installed)"
    )


def test_unknown_interpreter_refused(client: FlaskClient) -> None:
    env = {"id": "python-3-99", "python": "python3.99-does-not-exist"}
    response = client.put(f"/workspaces/{WS}", json=spec(environment=env))
    assert response.status_code == 409
    assert "python-3-99" in response.json["error"]


def test_start_failure_reports_runtime_failed(
    client: FlaskClient, publisher: RecordingPublisher, fake_servers: FakeServers
) -> None:
    fake_servers.fail_with = "the server exited with code 1; last lines: Traceback boom"
    assert client.put(f"/workspaces/{WS}", json=spec()).status_code == 202
    failed = publisher.wait_for("workspace.runtime_failed", timeout=30)
    assert failed.payload.operation == "provision"
    assert "Traceback boom" in failed.payload.reason
    assert failed.requestid == "req-1"
    assert client.get(f"/workspaces/{WS}").json["running"] is False
    assert fake_servers.alive() == []


def test_release_stops_everything_and_keeps_home(
    client: FlaskClient,
    publisher: RecordingPublisher,
    fake_servers: FakeServers,
    settings: AgentSettings,
) -> None:
    provisioned(client, publisher)
    (settings.home(WS) / "notes.txt").write_text("keep me")
    response = client.post(f"/workspaces/{WS}/release")
    assert response.status_code == 200 and response.json["released"] is True
    assert fake_servers.alive() == []
    assert client.get(f"/workspaces/{WS}").json["running"] is False
    assert (settings.home(WS) / "notes.txt").read_text() == "keep me"
    # Idempotent, also for a workspace never seen.
    assert client.post(f"/workspaces/{WS}/release").status_code == 200
    assert client.post("/workspaces/team--never/release").json["known"] is False


@pytest.mark.parametrize(("ide", "waits"), [("jupyterlab", False), ("vscode", True)])
def test_a_release_does_not_wait_for_jupyter_server_s_orderly_exit(
    tmp_path: Path, publisher: RecordingPublisher, fake_servers: FakeServers, ide: str,
    waits: bool,
) -> None:
    """A pause ends with the release (PAUSED promises the hardware is free): a JupyterLab
    server is given ``release_grace`` after SIGTERM, not ``stop_grace`` (its own orderly
    exit took about 2 s and kept nothing of the user's); code-server keeps its grace (it
    writes its editors' backups on the way out)."""
    armed = tmp_path / "armed"  # the stand-in ignores SIGTERM from then on
    fake_servers.code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                         f" open({str(armed)!r}, 'w').close(); time.sleep(600)")
    settings = AgentSettings(data_dir=tmp_path / "data", stop_grace=4, release_grace=0.2)
    agent = NodeAgent(settings, publisher, engine=FakeEngine(),  # type: ignore[arg-type]
                      capabilities={**CAPS, "ides": ["jupyterlab", "vscode"]})
    agent.start()
    try:
        agent.provision(WS, spec(ide=ide))
        publisher.wait_for("workspace.ready", timeout=30)
        deadline = time.monotonic() + 30
        while not armed.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        began = time.monotonic()
        agent.release(WS)
        took = time.monotonic() - began
    finally:
        agent.close()
    assert fake_servers.alive() == []
    assert (took >= 4) is waits  # SIGTERM ignored: killed after the grace it was given


def test_destroy_with_and_without_keep_home(
    client: FlaskClient,
    publisher: RecordingPublisher,
    fake_servers: FakeServers,
    settings: AgentSettings,
) -> None:
    provisioned(client, publisher)
    response = client.delete(f"/workspaces/{WS}?keep_home=true")
    assert response.status_code == 200 and response.json["home_kept"] is True
    assert fake_servers.alive() == []
    assert settings.home(WS).is_dir()
    assert client.get(f"/workspaces/{WS}").status_code == 404
    response = client.delete(f"/workspaces/{WS}?keep_home=false")
    assert response.status_code == 200 and response.json["known"] is False
    assert not settings.home(WS).exists()
    assert client.delete(f"/workspaces/{WS}?keep_home=maybe").status_code == 400


def test_destroy_while_starting_withdraws_the_provision(
    client: FlaskClient, agent: NodeAgent, publisher: RecordingPublisher, fake_servers: FakeServers
) -> None:
    fake_servers.ready.clear()
    assert client.put(f"/workspaces/{WS}", json=spec()).status_code == 202
    deadline = time.monotonic() + 10
    while not fake_servers.spawned and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.delete(f"/workspaces/{WS}").status_code == 200
    fake_servers.ready.set()
    assert agent.wait_idle(30)
    assert publisher.names() == []
    assert fake_servers.alive() == []


def test_snapshot_of_a_workspace_that_is_not_running_is_409(client: FlaskClient) -> None:
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1", "requestid": "r"}
    response = client.post(f"/workspaces/{WS}/snapshot", json=body)
    assert response.status_code == 409 and "not running" in response.json["error"]


def test_snapshot_request_is_checked(client: FlaskClient) -> None:
    response = client.post(
        f"/workspaces/{WS}/snapshot",
        json={"snapshot_id": "S 1", "bucket": "b", "prefix": "p", "requestid": "r"},
    )
    assert response.status_code == 400 and "not a snapshot id" in response.json["error"]
    response = client.post(f"/workspaces/{WS}/snapshot", json={"snapshot_id": "s1"})
    assert response.status_code == 400 and "bucket is required" in response.json["error"]


def test_snapshot_reports_finished(
    client: FlaskClient, publisher: RecordingPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    provisioned(client, publisher)

    def take(client: Any, runtime_dir: Path, **kw: Any) -> snapshots.SnapshotOutcome:
        assert kw["prefix"] == "snapshots/team/team--ws/s1"
        return snapshots.SnapshotOutcome(
            uri="gs://b/snapshots/team/team--ws/s1",
            bytes=123,
            duration_ms=45,
            captured=["x"],
            skipped=[{"name": "lock", "type": "t", "reason": "r"}],
        )

    monkeypatch.setattr(snapshots, "take_snapshot", take)
    body = {
        "snapshot_id": "s1",
        "bucket": "b",
        "prefix": "snapshots/team/team--ws/s1/",
        "requestid": "req-9",
    }
    assert client.post(f"/workspaces/{WS}/snapshot", json=body).status_code == 202
    finished = publisher.wait_for("snapshot.finished", timeout=30)
    assert finished.requestid == "req-9"
    assert finished.payload.succeeded is True
    assert (finished.payload.bytes, finished.payload.captured) == (123, ["x"])
    assert finished.payload.uri == "gs://b/snapshots/team/team--ws/s1"
    assert client.get(f"/workspaces/{WS}").json["operation"] is None


def test_failed_snapshot_leaves_the_server_running(
    client: FlaskClient,
    publisher: RecordingPublisher,
    fake_servers: FakeServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provisioned(client, publisher)

    def take(*args: Any, **kw: Any) -> snapshots.SnapshotOutcome:
        raise snapshots.SnapshotFailed("kernel k (nb.ipynb): capture failed in the kernel")

    monkeypatch.setattr(snapshots, "take_snapshot", take)
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1", "requestid": "r"}
    client.post(f"/workspaces/{WS}/snapshot", json=body)
    finished = publisher.wait_for("snapshot.finished", timeout=30)
    assert finished.payload.succeeded is False
    assert finished.payload.error == "kernel k (nb.ipynb): capture failed in the kernel"
    assert len(fake_servers.alive()) == 1
    assert client.get(f"/workspaces/{WS}").json["running"] is True


def test_one_operation_at_a_time(
    client: FlaskClient, publisher: RecordingPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    provisioned(client, publisher)
    gate = threading.Event()

    def take(*args: Any, **kw: Any) -> snapshots.SnapshotOutcome:
        gate.wait(30)
        return snapshots.SnapshotOutcome(uri="gs://b/p", bytes=0, duration_ms=1)

    monkeypatch.setattr(snapshots, "take_snapshot", take)
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1", "requestid": "r"}
    assert client.post(f"/workspaces/{WS}/snapshot", json=body).status_code == 202
    # The same request again (a redelivery) is accepted; another one is busy.
    assert client.post(f"/workspaces/{WS}/snapshot", json=body).status_code == 202
    other = client.post(f"/workspaces/{WS}/snapshot", json={**body, "snapshot_id": "s2"})
    assert other.status_code == 503 and "snapshot s1 in progress" in other.json["error"]
    assert client.get(f"/workspaces/{WS}").json["operation"] == "snapshot"
    gate.set()
    publisher.wait_for("snapshot.finished", timeout=30)


def test_progress_reports_the_operation_in_flight(
    client: FlaskClient, publisher: RecordingPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    provisioned(client, publisher)
    assert client.get(f"/workspaces/{WS}/progress").json["phase"] is None
    gate, moved = threading.Event(), threading.Event()

    def take(*args: Any, progress: Any = None, **kw: Any) -> snapshots.SnapshotOutcome:
        progress(3 * 2**20, 8 * 2**20)
        moved.set()
        gate.wait(30)
        return snapshots.SnapshotOutcome(uri="gs://b/p", bytes=8 * 2**20, duration_ms=1)

    monkeypatch.setattr(snapshots, "take_snapshot", take)
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1", "requestid": "r"}
    client.post(f"/workspaces/{WS}/snapshot", json=body)
    assert moved.wait(30)
    report = client.get(f"/workspaces/{WS}/progress").json
    assert report["phase"] == "snapshot"
    assert (report["done_bytes"], report["total_bytes"]) == (3 * 2**20, 8 * 2**20)
    assert report["started_at"] <= report["first_byte_at"] <= report["observed_at"]
    gate.set()
    publisher.wait_for("snapshot.finished", timeout=30)
    assert client.get(f"/workspaces/{WS}/progress").json["phase"] is None
    assert client.get("/workspaces/ml-a--nope/progress").status_code == 404


def test_restore_of_a_missing_snapshot_fails_without_a_server(
    client: FlaskClient, publisher: RecordingPublisher, fake_servers: FakeServers
) -> None:
    body = {
        "snapshot_id": "s1",
        "bucket": "bucket",
        "prefix": f"snapshots/team/{WS}/s1",
        "requestid": "req-r",
        "spec": spec(),
    }
    assert client.post(f"/workspaces/{WS}/restore", json=body).status_code == 202
    failed = publisher.wait_for("workspace.runtime_failed", timeout=30)
    assert failed.payload.operation == "resume"
    assert f"cannot read snapshot s1 (gs://bucket/snapshots/team/{WS}/s1)" in failed.payload.reason
    assert failed.requestid == "req-r"
    assert fake_servers.spawned == []


def test_restore_over_a_running_workspace_is_refused(
    client: FlaskClient, publisher: RecordingPublisher
) -> None:
    provisioned(client, publisher)
    body = {"snapshot_id": "s1", "bucket": "bucket", "prefix": f"snapshots/team/{WS}/s1",
            "requestid": "r", "spec": spec()}
    response = client.post(f"/workspaces/{WS}/restore", json=body)
    assert response.status_code == 409 and "release it before" in response.json["error"]


@pytest.mark.parametrize("bucket, prefix", [
    ("bucket", "snapshots/team/team--other/s1"),   # a teammate's snapshot
    ("bucket", "snapshots/other/team--ws/s1"),     # another team's path for this id
    ("elsewhere", f"snapshots/team/{WS}/s1"),      # its path in a bucket it does not use
])
def test_restore_of_anything_but_the_workspaces_own_snapshot_is_refused(
    client: FlaskClient, publisher: RecordingPublisher, fake_servers: FakeServers,
    bucket: str, prefix: str,
) -> None:
    body = {"snapshot_id": "s1", "bucket": bucket, "prefix": prefix, "requestid": "r",
            "spec": spec()}
    response = client.post(f"/workspaces/{WS}/restore", json=body)
    assert response.status_code == 409
    assert "restores only its own snapshots" in response.json["error"]
    assert fake_servers.spawned == []
    assert client.get(f"/workspaces/{WS}").status_code == 404  # nothing recorded


def test_the_agent_answers_only_the_control_plane(
    settings: AgentSettings, agent: NodeAgent, client: FlaskClient, publisher: RecordingPublisher
) -> None:
    """Without the credential (a kernel's call, a wrong token) nothing is told or done: no
    Jupyter token, no restore, no deleted home."""
    provisioned(client, publisher)
    assert client.get(f"/workspaces/{WS}").json["token"]
    home = settings.home(WS)
    assert home.exists()
    restore = {"snapshot_id": "s1", "bucket": "bucket", "prefix": f"snapshots/team/{WS}/s1",
               "requestid": "r", "spec": spec()}
    for header in (None, "Bearer wrong", f"token {settings.control_token()}"):
        stranger = create_app(settings, agent=agent).test_client()
        if header:
            stranger.environ_base["HTTP_AUTHORIZATION"] = header
        for method, path, body in (
            ("GET", "/workspaces", None), ("GET", f"/workspaces/{WS}", None),
            ("GET", "/capabilities", None), ("POST", f"/workspaces/{WS}/restore", restore),
            ("POST", f"/workspaces/{WS}/release", None), ("DELETE", f"/workspaces/{WS}", None),
            ("GET", "/sandboxes", None),
        ):
            response = stranger.open(path, method=method, json=body)
            assert response.status_code == 401, (header, method, path)
            assert "token" not in (response.json or {})
            assert "only the control plane" in response.json["error"]
        assert stranger.get("/healthz").status_code == 200
    assert home.exists() and client.get(f"/workspaces/{WS}").json["running"]
    assert settings.control_token() == control_token(settings.data_dir)
    assert (settings.agent_dir / "token").stat().st_mode & 0o077 == 0


def test_second_agent_on_the_same_data_dir_is_refused(
    agent: NodeAgent, settings: AgentSettings
) -> None:
    with pytest.raises(AgentLockError, match="already serves"):
        NodeAgent(settings, RecordingPublisher(), capabilities=CAPS).start()


def test_restart_adopts_live_servers_and_fails_an_interrupted_snapshot(
    settings: AgentSettings, fake_servers: FakeServers, engine: FakeEngine
) -> None:
    first = NodeAgent(
        settings,
        RecordingPublisher(),
        engine=engine,  # type: ignore[arg-type]
        capabilities=CAPS,
    )
    first.start()
    first.provision(WS, spec())
    first.wait_idle()
    first.provision("team--dead", spec(workspace_id="team--dead", name="dead"))
    first.wait_idle()
    first.close()
    # Simulate a crash mid-snapshot of one workspace, and the other server dying meanwhile.
    state = StateFile(settings.state_path)
    records = state.load()
    records[WS].operation = Operation(
        "snapshot", "req-s", time.time(), snapshot_id="s7", bucket="b", prefix="p/s7"
    )
    state.save(records)
    dead = records["team--dead"].server
    assert dead is not None
    servers.stop(dead, grace=1)

    publisher = RecordingPublisher()
    second = NodeAgent(
        settings,
        publisher,
        engine=engine,  # type: ignore[arg-type]
        capabilities=CAPS,
    )
    second.start()
    try:
        finished = publisher.wait_for("snapshot.finished", timeout=30)
        assert finished.payload.succeeded is False
        assert finished.payload.error == RESTARTED_DURING_SNAPSHOT
        assert finished.requestid == "req-s"
        assert engine.deleted == [("b", "p/s7")]
        assert second.status(WS)["running"] is True
        assert second.status(WS)["operation"] is None
        assert second.status("team--dead")["running"] is False
    finally:
        second.destroy(WS, keep_home=False)
        second.destroy("team--dead", keep_home=False)
        second.close()


def test_ids_are_checked_everywhere(agent: NodeAgent) -> None:
    for call in (agent.status, agent.release, agent.activity):
        with pytest.raises(node_module.BadRequest):
            call("../etc")
    with pytest.raises(node_module.NotFound):
        agent.status("team--nope")
