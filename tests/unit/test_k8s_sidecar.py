"""The snapshot agent sidecar (``runtime/kubernetes/sidecar.py``) and the monitor's rules that
need no API server (``runtime/kubernetes/monitor.py``), with fakes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from functions.domain import manifests as m
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


def test_activity_and_health() -> None:
    client = create_app(agent()).test_client()
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
                               skipped=[], kernels=1)

    client = create_app(agent(take=take)).test_client()
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p"}
    assert client.post("/snapshots", json=body).status_code == 202
    assert client.post("/snapshots", json=body).get_json()["state"] == "running"
    assert client.get("/snapshots/s1").get_json()["state"] == "running"
    release.set()
    done = wait_state(client, "/snapshots/s1")
    assert done == {"snapshot_id": "s1", "state": "succeeded", "error": None, "uri": "gs://b/p",
                    "bytes": 42, "duration_ms": 7, "captured": ["x"], "skipped": [],
                    "kernels": 1}
    assert len(calls) == 1
    assert calls[0] == {"workspace_id": "ml-a--nb", "snapshot_id": "s1", "bucket": "b",
                        "prefix": "p", "timeout": 900.0}
    assert client.get("/snapshots/nope").status_code == 404
    assert client.post("/snapshots", json={"snapshot_id": "s2"}).status_code == 400


def test_a_failed_snapshot_says_why_and_may_be_retried() -> None:
    attempts = []

    def take(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        attempts.append(1)
        raise RuntimeError("kernel k1: capture timed out")

    client = create_app(agent(take=take)).test_client()
    body = {"snapshot_id": "s1", "bucket": "b", "prefix": "p"}
    client.post("/snapshots", json=body)
    failed = wait_state(client, "/snapshots/s1")
    assert failed["state"] == "failed" and "timed out" in failed["error"]
    client.post("/snapshots", json=body)
    wait_state(client, "/snapshots/s1")
    assert len(attempts) == 2


def test_restore() -> None:
    def restore(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        assert kwargs == {"bucket": "b", "prefix": "p/s1", "timeout": 900.0}
        return SimpleNamespace(kernels_restored=2, sessions_restored=1)

    client = create_app(agent(restore=restore)).test_client()
    assert client.get("/restore").get_json() == {"state": "none"}
    client.post("/restore", json={"snapshot_id": "s1", "bucket": "b", "prefix": "p/s1"})
    done = wait_state(client, "/restore")
    assert done["state"] == "succeeded" and done["kernels_restored"] == 2


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
                         "labels": {m.MANAGED_BY: m.STASIS},
                         "annotations": {m.ANN_WORKSPACE_ID: "ml-a--xy", m.ANN_REQUESTID: "r1",
                                         **annotations}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_restored_pod_without_podrestored_gets_a_grace_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bus = RecordingPublisher()
    restored = pod(**{m.PS_NAME_ANNOTATION: "ps-1", m.ANN_OPERATION: "restore"})
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
                            "labels": {m.MANAGED_BY: m.STASIS},
                            "annotations": {m.ANN_WORKSPACE_ID: "ml-a--xy",
                                            m.ANN_SNAPSHOT_ID: "s", m.ANN_REQUESTED_AT: "1000"}},
               "status": {"conditions": [{"type": "Triggered", "status": "False",
                                          "reason": "Failed", "message": "x"}]}}
    bus = RecordingPublisher()
    Monitor(Cluster([], [trigger]), bus, Sidecars(None)).sync()
    assert bus.names() == []  # requested in 1970: a restarted monitor stays quiet
