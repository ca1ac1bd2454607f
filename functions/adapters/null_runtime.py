"""The null runtime: reports every workspace ready at once, runs nothing.

For control-plane tests and benchmarks only (``STASIS_RUNTIME=null``); never the default.
It answers through the bus exactly as a real runtime does, carrying the request's id:
``provision`` and ``restore`` publish workspace.ready (url ``null://<id>``, handle
``null``), ``snapshot`` publishes a successful, empty snapshot.finished; ``release`` and
``destroy`` do nothing but forget the workspace. Its capabilities admit every profile of a
realistic catalog (lots of CPUs and memory, every GKE accelerator type it knows, both
IDEs); pass ``accelerators`` for other types.

It keeps what it was asked (``calls``) and which workspaces it "runs" (``running``), so
tests can assert on both without a fake of their own. Given a ``state_file`` (the local
stack passes one in its data dir), the workspaces it runs are kept there instead, in
SQLite: the function host has more than one worker, and each must see the same node, or the
reconciler of one would take the workspaces another started for lost.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from events import SnapshotFinished, WorkspaceReady, new_event
from functions.ports import Bus, RuntimeStatus, WorkspaceSpec

SOURCE = "//stasis/runtime/null"
_PLENTY = 1024
KNOWN_ACCELERATORS = (
    "nvidia-tesla-t4", "nvidia-tesla-p4", "nvidia-tesla-p100", "nvidia-tesla-v100",
    "nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100", "nvidia-h100-80gb",
    "nvidia-h100-mega-80gb", "nvidia-h200-141gb", "nvidia-b200", "nvidia-gb200",
    "nvidia-rtx-pro-6000",
    "tpu-v4-podslice", "tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x",
)  # fmt: skip


#: How many of its latest calls a null runtime remembers.
CALLS_KEPT = 1000


class NullRuntime:
    name = "null"

    def __init__(self, bus: Bus, *, accelerators: Mapping[str, int] | None = None,
                 state_file: Path | None = None) -> None:
        self.bus = bus
        self._accelerators = {kind: _PLENTY for kind in KNOWN_ACCELERATORS}
        self._accelerators.update(accelerators or {})
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._state_file = state_file
        if state_file is not None:
            with self._db() as db:
                db.execute("CREATE TABLE IF NOT EXISTS running (workspace_id TEXT PRIMARY KEY)")
        #: (operation, workspace id): the latest CALLS_KEPT, for tests (the stack's function
        #: host runs this too, under load: all of them would be memory that only grows).
        self.calls: list[tuple[str, str]] = []

    @property
    def running(self) -> set[str]:
        """The workspaces it runs (in memory: the set itself, which a test may change;
        with a ``state_file``: every instance's, read now)."""
        if self._state_file is None:
            return self._running
        with self._db() as db:
            return {row[0] for row in db.execute("SELECT workspace_id FROM running")}

    def _ids(self) -> set[str]:
        with self._lock:
            return set(self.running)

    def capabilities(self) -> Mapping[str, Any]:
        return {
            "runtime": "null",
            "cpus": _PLENTY,
            "memory_bytes": 2**50,
            "accelerators": dict(self._accelerators),
            "ides": ["jupyterlab", "vscode"],
        }

    def provision(self, spec: WorkspaceSpec) -> None:
        self._record("provision", spec.workspace_id, running=True)
        self._ready(spec)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None,
                device_arrays_to_cpu: bool = False) -> None:
        self._record("restore", spec.workspace_id, running=True)
        self._ready(spec, restore_ms=0)

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        self._record("snapshot", spec.workspace_id)
        payload = SnapshotFinished(
            workspace_id=spec.workspace_id,
            snapshot_id=snapshot_id,
            succeeded=True,
            method="kernel",
            uri=f"gs://{spec.snapshot_bucket}/{spec.snapshot_path(snapshot_id)}",
            bytes=0,
            duration_ms=0,
        )
        self.bus.publish(new_event(payload, source=SOURCE, requestid=spec.requestid))

    def release(self, workspace_id: str) -> None:
        self._record("release", workspace_id, running=False)

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        """Nothing is ever in flight: every operation finishes as it is asked."""
        return None

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        self._record("destroy", workspace_id, running=False)

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        if workspace_id not in self._ids():
            return None
        return RuntimeStatus(workspace_id, running=True, url=f"null://{workspace_id}")

    def list(self) -> list[RuntimeStatus]:
        ids = sorted(self._ids())
        return [RuntimeStatus(ws, running=True, url=f"null://{ws}") for ws in ids]

    def _ready(self, spec: WorkspaceSpec, restore_ms: int | None = None) -> None:
        payload = WorkspaceReady(
            workspace_id=spec.workspace_id,
            url=f"null://{spec.workspace_id}",
            runtime_handle="null",
            restore_ms=restore_ms,
        )
        self.bus.publish(new_event(payload, source=SOURCE, requestid=spec.requestid))

    def _record(self, operation: str, workspace_id: str, *, running: bool | None = None) -> None:
        with self._lock:
            self.calls.append((operation, workspace_id))
            if len(self.calls) > 2 * CALLS_KEPT:
                del self.calls[:-CALLS_KEPT]
            if self._state_file is None:
                if running is True:
                    self._running.add(workspace_id)
                elif running is False:
                    self._running.discard(workspace_id)
                return
        if running is None:
            return
        with self._db() as db:
            if running:
                db.execute("INSERT OR IGNORE INTO running VALUES (?)", (workspace_id,))
            else:
                db.execute("DELETE FROM running WHERE workspace_id = ?", (workspace_id,))

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection per use (instances are threads and processes), committed and
        closed after it. SQLite's own locking orders the writers of every instance."""
        assert self._state_file is not None
        with contextlib.closing(sqlite3.connect(self._state_file, timeout=30)) as db, db:
            yield db
