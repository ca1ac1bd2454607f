"""The snapshot agent sidecar (``runtime/kubernetes/sidecar.py``) and the monitor's rules that
need no API server (``runtime/kubernetes/monitor.py``), with fakes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from functions.kubernetes.objects.meta import (
    ANN_OPERATION,
    ANN_REQUESTED_AT,
    ANN_REQUESTID,
    ANN_RESTORE_REQUEST,
    ANN_SNAPSHOT_ID,
    ANN_WORKSPACE_ID,
    MANAGED_BY,
    STASIS,
)
from functions.kubernetes.objects.podsnapshot import PS_NAME_ANNOTATION
from functions.kubernetes.objects.workspace import sidecar_token
from runtime.kubernetes import monitor as monitor_module
from runtime.kubernetes.monitor import Monitor
from runtime.kubernetes.sidecar import Agent, create_app, install
from runtime.local.publisher import RecordingPublisher


class FakeJupyter:
    def __init__(self) -> None:
        self.closed = False

    def __enter__(self) -> FakeJupyter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def status(self) -> dict[str, Any]:
        return {"last_activity": "2026-01-01T00:00:00+00:00", "started": "x", "connections": 2}

    def kernels(self) -> list[dict[str, Any]]:
        return [{"id": "k1", "execution_state": "busy"}, {"id": "k2", "execution_state": "idle"}]


def wait_state(client: Any, url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(url).get_json()
        if body.get("state") != "running" or time.monotonic() > deadline:
            return body
        time.sleep(0.01)


def agent(take: Any = None, restore: Any = None) -> Agent:
    return Agent(workspace_id="ml-a--nb", client=FakeJupyter, runtime_dir=Path("/run/jupyter"),
                 take=take, restore=restore)


TOKEN = sidecar_token("deployment-key", "ml-a--nb")


def monitor_client(sidecar: Agent) -> Any:
    """The monitor's client: it carries the workspace's sidecar token."""
    client = create_app(sidecar, TOKEN).test_client()
    client.environ_base["HTTP_X_STASIS_SIDECAR_TOKEN"] = TOKEN
    return client


def test_the_sidecar_answers_only_the_monitor() -> None:
    """A kernel in the same pod reaches the sidecar's port but not its token: every call
    but the readiness probe is refused, and a sidecar without a token refuses them all."""
    restored: list[Any] = []
    for configured, header in ((TOKEN, None), (TOKEN, "wrong"),
                               (TOKEN, sidecar_token("deployment-key", "ml-a--other")),
                               ("", "")):
        client = create_app(agent(restore=lambda *a, **k: restored.append(k)),
                            configured).test_client()
        if header is not None:
            client.environ_base["HTTP_X_STASIS_SIDECAR_TOKEN"] = header
        assert client.get("/healthz").status_code == 200
        for method, path in (("GET", "/activity"), ("POST", "/snapshots"),
                             ("GET", "/snapshots/s1"), ("POST", "/restore"),
                             ("GET", "/restore")):
            answer = client.open(path, method=method, json={
                "snapshot_id": "s1", "bucket": "b", "prefix": "snapshots/ml-a/ml-a--x/s1"})
            assert answer.status_code == 401, (configured, header, method, path)
    assert restored == []


def test_activity_and_health() -> None:
    client = monitor_client(agent())
    assert client.get("/healthz").get_json() == {"ok": True}
    assert client.get("/activity").get_json() == {
        "workspace_id": "ml-a--nb", "last_activity": "2026-01-01T00:00:00+00:00",
        "started": "x", "busy_kernels": 1, "kernels": 2, "connections": 2}


def test_a_snapshot_runs_once_per_id_and_reports_its_outcome() -> None:
    calls: list[dict[str, Any]] = []
    release = threading.Event()

    def take(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        calls.append(kwargs)
        release.wait(5)
        return SimpleNamespace(uri="gs://b/p", bytes=42, duration_ms=7, captured=["x"],
                               skipped=[], kernels=1, manifest_sha256="ab" * 32,
                               parts={"t/w/_parts/cd": 42}, uploaded_bytes=40)

    client = monitor_client(agent(take=take))
    base = {"snapshot_id": "s0", "prefix": "p0", "manifest_sha256": "ef" * 32}
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p", "base": base}
    assert client.post("/snapshots", json=body).status_code == 202
    assert client.post("/snapshots", json=body).get_json()["state"] == "running"
    assert client.get("/snapshots/s1").get_json()["state"] == "running"
    release.set()
    done = wait_state(client, "/snapshots/s1")
    assert done == {"snapshot_id": "s1", "state": "succeeded", "error": None, "cause": None,
                    "uri": "gs://b/p", "bytes": 42, "duration_ms": 7, "captured": ["x"],
                    "skipped": [], "kernels": 1, "manifest_sha256": "ab" * 32,
                    "parts": {"t/w/_parts/cd": 42}, "uploaded_bytes": 40}
    assert len(calls) == 1
    assert calls[0] == {"workspace_id": "ml-a--nb", "snapshot_id": "s1", "bucket": "b",
                        "prefix": "p", "timeout": 900.0, "base": base,
                        "access_token": None}
    assert client.get("/snapshots/nope").status_code == 404
    assert client.post("/snapshots", json={"snapshot_id": "s2"}).status_code == 400


def test_a_failed_snapshot_says_why_and_may_be_retried() -> None:
    attempts = []

    def take(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        attempts.append(1)
        raise RuntimeError("kernel k1: capture timed out")

    client = monitor_client(agent(take=take))
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p"}
    client.post("/snapshots", json=body)
    failed = wait_state(client, "/snapshots/s1")
    assert failed["state"] == "failed" and "timed out" in failed["error"]
    client.post("/snapshots", json=body)
    wait_state(client, "/snapshots/s1")
    assert len(attempts) == 2


def test_restore() -> None:
    def restore(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        assert kwargs == {"bucket": "b", "prefix": "p/s1", "timeout": 900.0,
                          "snapshot_id": "s1", "manifest_sha256": "ab" * 32,
                          "device_arrays_to_cpu": True, "access_token": None}
        return SimpleNamespace(kernels_restored=2, sessions_restored=1)

    client = monitor_client(agent(restore=restore))
    assert client.get("/restore").get_json() == {"state": "none"}
    client.post("/restore", json={"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1",
                                  "manifest_sha256": "ab" * 32, "device_arrays_to_cpu": True})
    done = wait_state(client, "/restore")
    assert done["state"] == "succeeded" and done["kernels_restored"] == 2


def test_a_restore_refused_for_its_integrity_says_so() -> None:
    from runtime.local.snapshots import SnapshotFailed

    def restore(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        raise SnapshotFailed("manifest.json has sha256 9f...", cause="snapshot_integrity")

    client = monitor_client(agent(restore=restore))
    client.post("/restore", json={"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1",
                                  "manifest_sha256": "ab" * 32})
    failed = wait_state(client, "/restore")
    assert (failed["state"], failed["cause"]) == ("failed", "snapshot_integrity")


def test_install_copies_the_in_kernel_agent(tmp_path: Path) -> None:
    install(tmp_path)
    assert (tmp_path / "runtime" / "__init__.py").is_file()
    assert (tmp_path / "runtime" / "snapshot" / "inkernel.py").is_file()
    assert not list(tmp_path.rglob("__pycache__"))


# -- monitor rules ---------------------------------------------------------------------------


class Cluster:
    def __init__(self, pods: list[dict[str, Any]], triggers: list[dict[str, Any]] = ()) -> None:
        self._pods, self._triggers = pods, list(triggers)

    def pods(self) -> list[dict[str, Any]]:
        return self._pods

    def triggers(self) -> list[dict[str, Any]]:
        return self._triggers

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class Sidecars:
    def __init__(self, activity: dict[str, Any] | None) -> None:
        self.activity = activity

    def get(self, pod: Any, path: str) -> dict[str, Any] | None:
        return self.activity

    def post(self, pod: Any, path: str, body: Any) -> dict[str, Any] | None:
        return None


def pod(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "ws-x", "namespace": "stasis-ml-a",
                         "labels": {MANAGED_BY: STASIS},
                         "annotations": {ANN_WORKSPACE_ID: "ml-a--xy", ANN_REQUESTID: "r1",
                                         **annotations}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_restored_pod_without_podrestored_gets_a_grace_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bus = RecordingPublisher()
    restored = pod(**{PS_NAME_ANNOTATION: "ps-1", ANN_OPERATION: "restore"})
    monitor = Monitor(Cluster([restored]), bus, Sidecars({}))
    assert monitor.sync() is True and bus.names() == []
    monkeypatch.setattr(monitor_module, "RESTORE_CONDITION_GRACE_S", 0.0)
    monitor.sync()
    assert bus.names() == ["workspace.runtime_failed"]
    assert "no PodRestored condition" in bus.events[0].payload.reason


def test_idle_reports_need_an_activity_time() -> None:
    bus = RecordingPublisher()
    monitor = Monitor(Cluster([pod()]), bus, Sidecars({"last_activity": None}))
    monitor.sync()
    assert monitor.report_activity() == 0
    monitor.sidecars = Sidecars({"last_activity": "2026-01-01T00:00:00Z", "busy_kernels": 1})
    assert monitor.report_activity() == 1
    assert bus.events[-1].payload.busy_kernels == 1


def test_old_triggers_are_history_not_news() -> None:
    trigger = {"metadata": {"name": "snap-s", "namespace": "ns",
                            "labels": {MANAGED_BY: STASIS},
                            "annotations": {ANN_WORKSPACE_ID: "ml-a--xy",
                                            ANN_SNAPSHOT_ID: "s", ANN_REQUESTED_AT: "1000"}},
               "status": {"conditions": [{"type": "Triggered", "status": "False",
                                          "reason": "Failed", "message": "x"}]}}
    bus = RecordingPublisher()
    Monitor(Cluster([], [trigger]), bus, Sidecars(None)).sync()
    assert bus.names() == []  # requested in 1970: a restarted monitor stays quiet


def test_a_kernel_restore_the_agent_refused_keeps_its_cause() -> None:
    import json

    class Answers(Sidecars):
        def get(self, pod: Any, path: str) -> dict[str, Any] | None:
            return {"state": "failed", "error": "manifest.json has sha256 9f...",
                    "cause": "snapshot_integrity"} if path == "/restore" else {}

        def post(self, pod: Any, path: str, body: Any) -> dict[str, Any] | None:
            self.asked = body
            return {"state": "running"}

    bus = RecordingPublisher()
    request = json.dumps({"snapshot_id": "s", "bucket": "b", "prefix": "p/s",
                          "requestid": "r1", "manifest_sha256": "ab" * 32,
                          "device_arrays_to_cpu": True})
    sidecars = Answers(None)
    restoring = pod(**{ANN_OPERATION: "restore", ANN_RESTORE_REQUEST: request})
    Monitor(Cluster([restoring]), bus, sidecars).sync()
    assert sidecars.asked["manifest_sha256"] == "ab" * 32
    assert sidecars.asked["device_arrays_to_cpu"] is True
    [failed] = bus.events
    assert (failed.name, failed.payload.cause) == ("workspace.runtime_failed",
                                                   "snapshot_integrity")
