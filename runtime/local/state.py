"""The node agent's state file: which servers it supervises and what is in flight.

``<data_dir>/agent/state.json`` holds one record per workspace the agent knows: its home,
the spec it was started with, its server (pid, pgid, port, token, the marker of that
start, when it started) and the operation in progress, if any. The file is rewritten
atomically (temporary file, fsync, rename) after every change, so a crash leaves either
the old or the new version and a restarted agent can adopt the servers that survived and
finish off what the crash interrupted (see ``NodeAgent.recover``).

``AgentLock`` makes sure one agent at a time serves a data dir: two agents adopting the
same servers would stop each other's work.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runtime.local.servers import ServerProcess
from runtime.supervisor import write_json

log = logging.getLogger(__name__)

VERSION = 1


@dataclass
class Operation:
    """An asynchronous operation in progress: provision, snapshot or restore."""

    kind: str
    requestid: str
    started_at: float
    snapshot_id: str | None = None
    bucket: str | None = None
    prefix: str | None = None
    #: The ``STASIS_SERVER_INSTANCE`` of the server a provision or restore starts, saved
    #: before the process exists: a restarted agent finds by it a server it spawned but
    #: was killed before recording (``servers.stop_marked``).
    marker: str | None = None
    #: Bytes transferred so far and in all, and when the first one moved (Unix seconds),
    #: for the portal and `stasis ws pause|resume --wait` (not persisted).
    done_bytes: int = 0
    total_bytes: int = 0
    first_byte_at: float | None = None

    def report_progress(self, done: int, total: int) -> None:
        if self.first_byte_at is None:
            self.first_byte_at = time.time()
        self.done_bytes, self.total_bytes = done, total

    def progress(self) -> dict[str, Any]:
        """The raw report ``functions.domain.progress.describe`` reads."""
        return {"phase": self.kind, "started_at": self.started_at,
                "first_byte_at": self.first_byte_at, "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes, "observed_at": time.time()}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "requestid": self.requestid,
            "started_at": self.started_at,
            "snapshot_id": self.snapshot_id,
            "bucket": self.bucket,
            "prefix": self.prefix,
            "marker": self.marker,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Operation:
        return cls(
            kind=str(data["kind"]),
            requestid=str(data["requestid"]),
            started_at=float(data["started_at"]),
            snapshot_id=data.get("snapshot_id"),
            bucket=data.get("bucket"),
            prefix=data.get("prefix"),
            marker=data.get("marker"),
        )


@dataclass
class WorkspaceRecord:
    """What the agent knows about one workspace."""

    workspace_id: str
    home: str
    spec: dict[str, Any] = field(default_factory=dict)
    server: ServerProcess | None = None
    operation: Operation | None = None
    # The snapshot the running server was restored from, so a retried restore re-reports.
    restored_from: str | None = None
    kernels_restored: int = 0
    restore_ms: int | None = None
    #: The accelerator indices its server was given, by type (``CUDA_VISIBLE_DEVICES``).
    devices: dict[str, list[int]] = field(default_factory=dict)
    #: The workspace's own OS user (``runtime.local.tenancy``), kept for every later start;
    #: None: it runs as the agent's user.
    uid: int | None = None
    #: Reports of ended operations not yet published, as Pub/Sub messages (``data`` as
    #: text, ``attributes``): saved with the operation's end, so a crash before the
    #: publish is repaired by the next start sending them.
    unsent: list[dict[str, Any]] = field(default_factory=list)
    #: Where the last operation of each kind spent its time, in ms (``restore``:
    #: ``manifest``, ``server``, then ``restore_snapshot``'s phases; ``snapshot``:
    #: ``take_snapshot``'s and ``accepted_at_ms``, when the agent took the request, epoch
    #: ms). Shown by GET /workspaces/<id> for benchmarks and operators; not saved (a
    #: restart forgets it).
    phases_ms: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "home": self.home,
            "spec": self.spec,
            "server": self.server.to_json() if self.server else None,
            "operation": self.operation.to_json() if self.operation else None,
            "restored_from": self.restored_from,
            "kernels_restored": self.kernels_restored,
            "restore_ms": self.restore_ms,
            "devices": self.devices,
            "uid": self.uid,
            "unsent": self.unsent,
        }

    @classmethod
    def from_json(cls, workspace_id: str, data: dict[str, Any]) -> WorkspaceRecord:
        server = data.get("server")
        operation = data.get("operation")
        return cls(
            workspace_id=workspace_id,
            home=str(data["home"]),
            spec=dict(data.get("spec") or {}),
            server=ServerProcess.from_json(workspace_id, server) if server else None,
            operation=Operation.from_json(operation) if operation else None,
            restored_from=data.get("restored_from"),
            kernels_restored=int(data.get("kernels_restored") or 0),
            restore_ms=data.get("restore_ms"),
            devices={str(k): [int(i) for i in v] for k, v in (data.get("devices") or {}).items()},
            uid=int(data["uid"]) if data.get("uid") is not None else None,
            unsent=[dict(m) for m in data.get("unsent") or []],
        )


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, WorkspaceRecord]:
        """Every record; an unreadable file is kept aside (``state.json.corrupt``) and
        reads as empty, since refusing to start would strand every workspace."""
        try:
            data = json.loads(self.path.read_text())
            return {
                wsid: WorkspaceRecord.from_json(wsid, record)
                for wsid, record in dict(data.get("workspaces", {})).items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error("unreadable state file %s (%s); moved to %s", self.path, exc, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return {}

    def save(self, records: dict[str, WorkspaceRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "version": VERSION,
            "agent_pid": os.getpid(),
            "workspaces": {wsid: r.to_json() for wsid, r in sorted(records.items())},
        }
        # The file holds every server's token: readable by the agent's user only.
        write_json(self.path, body, mode=0o600)


class AgentLockError(RuntimeError):
    """Another node agent already serves this data dir."""


class AgentLock:
    """An exclusive ``flock`` on ``agent/agent.lock``, released when the process dies (so a
    ``kill -9`` never leaves a stale lock behind)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held for the agent's lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise AgentLockError(
                f"another node agent (pid {holder}) already serves {self.path.parent.parent}"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
