"""Snapshot and restore orchestration of a workspace's kernels, against recording fakes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runtime.local import snapshots
from runtime.local.jupyter import JupyterError
from runtime.local.snapshots import (
    SnapshotFailed,
    open_snapshot,
    restore_snapshot,
    take_snapshot,
)
from runtime.snapshot.errors import RestoreRefused, SnapshotIntegrityError
from runtime.snapshot.manifest import manifest_sha256

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
        progress: Any = None, reuse: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        self.calls.append(("snapshot_kernel", kernel_id, prefix))
        self.reuse = reuse
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
        progress: Any = None, device_arrays_to_cpu: bool = False,
        staged: list[str] | None = None,
    ) -> dict[str, Any]:
        self.calls.append(("restore_kernel", Path(connection_file).name, entry["kernel_id"]))
        self.staged = staged
        self.to_cpu = device_arrays_to_cpu
        if self.fail_on == entry["kernel_id"]:
            raise self.failure
        return {"variables": ["x"]}

    failure: Exception = RuntimeError("integrity")

    def stage_kernel(self, entry: dict[str, Any], *, bucket: str, directory: str,
                     timeout: float, progress: Any = None,
                     uid: int | None = None) -> list[str] | None:
        self.calls.append(("stage_kernel", entry["kernel_id"]))
        if self.fail_on == f"stage:{entry['kernel_id']}":
            raise self.failure
        path = Path(directory) / f"{entry['kernel_id']}.seg"
        path.write_bytes(b"x")
        return [str(path)]

    def write_manifest(self, bucket: str, prefix: str, manifest: dict[str, Any]) -> None:
        self.calls.append(("write_manifest", prefix))
        self.manifest = manifest

    def read_manifest(self, bucket: str, prefix: str, *,
                      expected_sha256: str | None = None) -> dict[str, Any]:
        self.calls.append(("read_manifest", prefix, expected_sha256))
        assert self.manifest is not None
        actual = manifest_sha256(self.manifest)
        if expected_sha256 is not None and actual != expected_sha256:
            raise SnapshotIntegrityError(f"{prefix}/manifest.json has sha256 {actual[:16]}...")
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


def _take(server: FakeServer, engine: FakeEngine, **kwargs: Any) -> snapshots.SnapshotOutcome:
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
        **kwargs,
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


POOL = "snapshots/t/t--w/_parts"
ENTRY = {"format": "stasis.kernel/2", "kernel_id": "k0", "segments": [8],
         "objects": [{"name": f"{POOL}/{'c' * 64}", "offset": 0, "bytes": 8, "blake3": "c" * 64}]}


def test_the_base_snapshot_s_parts_are_offered_for_reuse_if_it_is_the_one_recorded(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    engine.manifest = {"kernels": [{"kernel_id": "k0", "kernelspec": "python3", "entry": ENTRY}]}
    anchor = manifest_sha256(engine.manifest)
    base = {"snapshot_id": "s0", "prefix": "snapshots/t/t--w/s0", "manifest_sha256": anchor}
    _take(_server(tmp_path, kernels=1), engine, base=base)
    assert ("read_manifest", "snapshots/t/t--w/s0", anchor) in engine.calls
    assert engine.reuse == {"c" * 64: 8}

    # A base rewritten in the bucket decides nothing: every part is sent, the pause works.
    engine.manifest["sessions"] = [{"path": "planted.ipynb"}]
    _take(_server(tmp_path, kernels=1), engine, base=base)
    assert engine.reuse == {}


def test_a_manifest_that_is_not_the_recorded_one_is_refused_as_an_integrity_failure() -> None:
    engine = FakeEngine()
    engine.manifest = {"kernels": []}
    good = manifest_sha256(engine.manifest)
    assert open_snapshot(engine, "b", "p/s1", snapshot_id="s1", manifest_sha256=good) == {  # type: ignore[arg-type]
        "kernels": []}
    with pytest.raises(SnapshotFailed, match="cannot read snapshot s1") as caught:
        open_snapshot(engine, "b", "p/s1", snapshot_id="s1", manifest_sha256="0" * 64)  # type: ignore[arg-type]
    assert caught.value.cause == "snapshot_integrity"


@pytest.mark.parametrize(("failure", "cause"), [
    (SnapshotIntegrityError("object x has blake3 ab..."), "snapshot_integrity"),
    (RestoreRefused("this kernel has no accelerator"), "restore_refused"),
    (RuntimeError("No module named 'torch'"), None),
])
def test_a_restore_failure_says_whether_the_snapshot_is_intact(
    tmp_path: Path, failure: Exception, cause: str | None,
) -> None:
    source, engine = _server(tmp_path, kernels=1), FakeEngine()
    _take(source, engine)
    engine.fail_on, engine.failure = "k0", failure
    with pytest.raises(SnapshotFailed) as caught:
        restore_snapshot(FakeServer([], [], tmp_path), tmp_path, engine.manifest or {},  # type: ignore[arg-type]
                         engine=engine, bucket="b", timeout=5, device_arrays_to_cpu=True)  # type: ignore[arg-type]
    assert caught.value.cause == cause and engine.to_cpu is True


def _staged_restore(tmp_path: Path, engine: FakeEngine, root: Path | None,
                    memory_bytes: int | None = None) -> Any:
    with snapshots.Staging(engine, engine.manifest or {}, bucket="b", root=root,
                           timeout=5, memory_bytes=memory_bytes) as staging:
        directory = staging.directory
        outcome = restore_snapshot(FakeServer([], [], tmp_path), tmp_path,  # type: ignore[arg-type]
                                   engine.manifest or {}, engine=engine, bucket="b",  # type: ignore[arg-type]
                                   timeout=5, staged=staging.futures)
    return outcome, directory


def test_a_resume_downloads_ahead_and_each_kernel_maps_its_own_staged_files(
    tmp_path: Path,
) -> None:
    source, engine = _server(tmp_path), FakeEngine()
    _take(source, engine)
    engine.calls.clear()
    root = tmp_path / "shm"
    root.mkdir()

    outcome, directory = _staged_restore(tmp_path, engine, root)

    assert [c for c in engine.calls if c[0] == "stage_kernel"] == [
        ("stage_kernel", "k0"), ("stage_kernel", "k1")]
    # the last kernel got its own, in a directory of its own (the real files of every
    # entry are named segment-0, segment-1, ...)
    assert engine.staged == [str(directory / "kernel-1" / "k1.seg")]
    assert directory is not None and directory.parent == root and not directory.exists()
    assert {"kernel_ready", "staged_wait", "restore", "sessions"} <= set(outcome.phases_ms)


def test_without_shared_memory_each_kernel_downloads_its_own(tmp_path: Path) -> None:
    source, engine = _server(tmp_path, kernels=1), FakeEngine()
    _take(source, engine)
    engine.calls.clear()
    _outcome, directory = _staged_restore(tmp_path, engine, None)
    assert directory is None and engine.staged is None
    assert [c[0] for c in engine.calls] == ["restore_kernel"]


def test_a_part_damaged_while_staging_fails_the_resume_as_an_integrity_failure(
    tmp_path: Path,
) -> None:
    source, engine = _server(tmp_path, kernels=1), FakeEngine()
    _take(source, engine)
    engine.fail_on, engine.failure = "stage:k0", SnapshotIntegrityError("object x has blake3")
    root = tmp_path / "shm"
    root.mkdir()
    with pytest.raises(SnapshotFailed, match="restoring kernel k0") as caught:
        _staged_restore(tmp_path, engine, root)
    assert caught.value.cause == "snapshot_integrity"
    assert not [c for c in engine.calls if c[0] == "restore_kernel"]
    assert list(root.iterdir()) == []


def test_a_kernel_larger_than_its_memory_limit_downloads_its_own(tmp_path: Path) -> None:
    """Shared mappings escape RLIMIT_DATA: a state over the limit (a resume onto a smaller
    profile) is downloaded by its kernel, which meets its limit as before."""
    source, engine = _server(tmp_path, kernels=1), FakeEngine()  # 100 bytes of state
    _take(source, engine)
    engine.calls.clear()
    root = tmp_path / "shm"
    root.mkdir()
    _staged_restore(tmp_path, engine, root, memory_bytes=99)
    assert [c[0] for c in engine.calls] == ["restore_kernel"] and engine.staged is None
    engine.calls.clear()
    _staged_restore(tmp_path, engine, root, memory_bytes=100)
    assert [c[0] for c in engine.calls] == ["stage_kernel", "restore_kernel"]
