"""Snapshot and restore orchestration of a workspace's kernels, against recording fakes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runtime.local import snapshots
from runtime.local.jupyter import JupyterError
from runtime.local.snapshots import SnapshotFailed, restore_snapshot, take_snapshot

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


class FakeServer:
    """The REST calls of a workspace server, recorded."""

    def __init__(
        self, kernels: list[dict[str, Any]], sessions: list[dict[str, Any]], runtime_dir: Path
    ) -> None:
        self._kernels = kernels
        self._sessions = sessions
        self.runtime_dir = runtime_dir
        self.started: list[str] = []
        self.created_sessions: list[dict[str, Any]] = []
        for kernel in kernels:
            (runtime_dir / f"kernel-{kernel['id']}.json").write_text("{}")

    def kernels(self) -> list[dict[str, Any]]:
        return self._kernels

    def sessions(self) -> list[dict[str, Any]]:
        return self._sessions

    def start_kernel(self, kernelspec: str) -> dict[str, Any]:
        new_id = f"new-{len(self.started)}"
        self.started.append(kernelspec)
        (self.runtime_dir / f"kernel-{new_id}.json").write_text("{}")
        return {"id": new_id, "name": kernelspec}

    def create_session(self, **kwargs: Any) -> dict[str, Any]:
        self.created_sessions.append(kwargs)
        return {"id": "s", **kwargs}


class FakeEngine:
    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on = fail_on
        self.manifest: dict[str, Any] | None = None

    def snapshot_kernel(
        self, connection_file: str, *, bucket: str, prefix: str, kernel_id: str, timeout: float,
        progress: Any = None,
    ) -> dict[str, Any]:
        self.calls.append(("snapshot_kernel", kernel_id, prefix))
        if self.fail_on == kernel_id:
            raise RuntimeError("boom in the kernel")
        return {
            "kernel_id": kernel_id,
            "total_bytes": 100,
            "variables": [{"name": "x", "type": "int", "bytes": 10}],
            "skipped": [{"name": "lock", "type": "_thread.lock", "reason": "cannot pickle"}],
        }

    def restore_kernel(
        self, connection_file: str, entry: dict[str, Any], *, bucket: str, timeout: float,
        progress: Any = None,
    ) -> dict[str, Any]:
        self.calls.append(("restore_kernel", Path(connection_file).name, entry["kernel_id"]))
        if self.fail_on == entry["kernel_id"]:
            raise RuntimeError("integrity")
        return {"variables": ["x"]}

    def write_manifest(self, bucket: str, prefix: str, manifest: dict[str, Any]) -> None:
        self.calls.append(("write_manifest", prefix))
        self.manifest = manifest

    def read_manifest(self, bucket: str, prefix: str) -> dict[str, Any]:
        assert self.manifest is not None
        return self.manifest

    def delete_prefix(self, bucket: str, prefix: str) -> int:
        self.calls.append(("delete_prefix", prefix))
        return 0


@pytest.fixture(autouse=True)
def _kernels_are_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "wait_kernel_ready", lambda conn, timeout: None)


def _server(tmp_path: Path, kernels: int = 2) -> FakeServer:
    return FakeServer(
        kernels=[
            {"id": f"k{i}", "name": "python3", "execution_state": "idle"} for i in range(kernels)
        ],
        sessions=[
            {
                "path": f"nb{i}.ipynb",
                "name": f"nb{i}.ipynb",
                "type": "notebook",
                "kernel": {"id": f"k{i}"},
            }
            for i in range(kernels)
        ],
        runtime_dir=tmp_path,
    )


def _take(server: FakeServer, engine: FakeEngine) -> snapshots.SnapshotOutcome:
    return take_snapshot(
        server,
        server.runtime_dir,
        engine=engine,  # type: ignore[arg-type]
        workspace_id="t--w",
        snapshot_id="s1",
        bucket="b",
        prefix="/snapshots/t/t--w/s1/",
        timeout=5,
        now=lambda: NOW,
    )


def test_every_kernel_then_the_manifest_last(tmp_path: Path) -> None:
    server, engine = _server(tmp_path), FakeEngine()
    outcome = _take(server, engine)
    assert engine.calls == [
        ("snapshot_kernel", "k0", "snapshots/t/t--w/s1"),
        ("snapshot_kernel", "k1", "snapshots/t/t--w/s1"),
        ("write_manifest", "snapshots/t/t--w/s1"),
    ]
    assert outcome.uri == "gs://b/snapshots/t/t--w/s1"
    assert outcome.bytes == 200 and outcome.kernels == 2
    # Two kernels: names are qualified by their notebook.
    assert outcome.captured == ["nb0.ipynb:x", "nb1.ipynb:x"]
    assert outcome.skipped[0] == {
        "name": "lock",
        "type": "_thread.lock",
        "reason": "cannot pickle",
        "kernel": "k0",
        "path": "nb0.ipynb",
    }
    manifest = engine.manifest
    assert manifest is not None
    assert [k["kernel_id"] for k in manifest["kernels"]] == ["k0", "k1"]
    assert manifest["kernels"][0]["kernelspec"] == "python3"
    assert manifest["sessions"][1] == {
        "path": "nb1.ipynb",
        "name": "nb1.ipynb",
        "type": "notebook",
        "kernel_id": "k1",
    }
    assert manifest["created_at"] == NOW.isoformat()


def test_single_kernel_names_stay_plain(tmp_path: Path) -> None:
    outcome = _take(_server(tmp_path, kernels=1), FakeEngine())
    assert outcome.captured == ["x"]


def test_no_kernels_is_an_empty_snapshot(tmp_path: Path) -> None:
    engine = FakeEngine()
    outcome = _take(_server(tmp_path, kernels=0), engine)
    assert engine.calls == [("write_manifest", "snapshots/t/t--w/s1")]
    assert outcome.bytes == 0 and outcome.captured == [] and outcome.kernels == 0


def test_failure_deletes_the_partial_objects_and_names_the_kernel(tmp_path: Path) -> None:
    engine = FakeEngine(fail_on="k1")
    with pytest.raises(SnapshotFailed, match=r"kernel k1 \(nb1.ipynb\): RuntimeError: boom"):
        _take(_server(tmp_path), engine)
    assert engine.calls[-1] == ("delete_prefix", "snapshots/t/t--w/s1")
    assert not any(c[0] == "write_manifest" for c in engine.calls)


def test_missing_connection_file_fails_cleanly(tmp_path: Path) -> None:
    server, engine = _server(tmp_path, kernels=1), FakeEngine()
    (tmp_path / "kernel-k0.json").unlink()
    with pytest.raises(SnapshotFailed, match="no connection file"):
        _take(server, engine)
    assert engine.calls == [("delete_prefix", "snapshots/t/t--w/s1")]


def test_server_errors_become_snapshot_failures(tmp_path: Path) -> None:
    class Broken(FakeServer):
        def kernels(self) -> list[dict[str, Any]]:
            raise JupyterError("GET /api/kernels on the workspace's server failed: refused")

    engine = FakeEngine()
    with pytest.raises(SnapshotFailed, match="GET /api/kernels"):
        _take(Broken([], [], tmp_path), engine)
    assert engine.calls == [("delete_prefix", "snapshots/t/t--w/s1")]


def test_restore_starts_same_kernelspecs_and_reattaches_sessions(tmp_path: Path) -> None:
    source, engine = _server(tmp_path), FakeEngine()
    _take(source, engine)
    assert engine.manifest is not None
    target = FakeServer([], [], tmp_path)
    engine.calls.clear()
    outcome = restore_snapshot(
        target,
        tmp_path,
        engine.manifest,  # type: ignore[arg-type]
        engine=engine,
        bucket="b",
        timeout=5,
    )
    assert target.started == ["python3", "python3"]
    assert engine.calls == [
        ("restore_kernel", "kernel-new-0.json", "k0"),
        ("restore_kernel", "kernel-new-1.json", "k1"),
    ]
    assert outcome.kernels_restored == 2 and outcome.sessions_restored == 2
    assert target.created_sessions == [
        {"path": "nb0.ipynb", "name": "nb0.ipynb", "type": "notebook", "kernel_id": "new-0"},
        {"path": "nb1.ipynb", "name": "nb1.ipynb", "type": "notebook", "kernel_id": "new-1"},
    ]


def test_restore_failure_says_which_kernel(tmp_path: Path) -> None:
    source, engine = _server(tmp_path), FakeEngine()
    _take(source, engine)
    assert engine.manifest is not None
    engine.fail_on = "k0"
    with pytest.raises(SnapshotFailed, match=r"restoring kernel k0 \(python3\) failed"):
        restore_snapshot(
            FakeServer([], [], tmp_path),
            tmp_path,  # type: ignore[arg-type]
            engine.manifest,
            engine=engine,
            bucket="b",
            timeout=5,
        )


def test_restore_of_something_that_is_not_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(SnapshotFailed, match="lists no kernels"):
        restore_snapshot(
            FakeServer([], [], tmp_path),
            tmp_path,
            {},  # type: ignore[arg-type]
            engine=FakeEngine(),
            bucket="b",
            timeout=5,
        )
