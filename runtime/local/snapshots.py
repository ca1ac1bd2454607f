"""Snapshot and restore of a whole workspace: every live kernel, its notebook sessions.

The per-kernel work (capturing a kernel's user namespace to Cloud Storage, loading it into
another kernel) belongs to the kernel-state agent in ``runtime.snapshot``; this module
orchestrates it across a workspace's server:

- ``take_snapshot`` lists the server's kernels and sessions, snapshots each kernel under
  ``<prefix>/<kernel_id>``, and writes the workspace manifest **last** (kernels with their
  kernelspec name and entry, sessions, totals, skipped variables). Without a manifest a
  prefix is not a snapshot, so a crash at any point leaves nothing that looks complete. A
  workspace without kernels is a valid, empty snapshot. On failure the partial objects are
  deleted (after the kernels stopped writing) and ``SnapshotFailed`` says why; the server
  is never touched.
- ``restore_snapshot`` starts one kernel per manifest kernel with the same kernelspec,
  restores each entry into it, and re-creates the sessions so that a notebook reopened in
  the browser attaches to its restored kernel.

The storage and kernel calls go through an ``Engine`` (``default_engine`` binds
``runtime.snapshot``), so the orchestration is tested without kernels or storage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, cast

from runtime.local.jupyter import (
    JupyterClient,
    JupyterError,
    connection_file,
    wait_kernel_ready,
)

log = logging.getLogger(__name__)

_IDLE_POLL = 0.25
_IDLE_SETTLE = 1.0
_CONNECTION_FILE_WAIT = 30.0


class SnapshotFailed(RuntimeError):
    """A workspace snapshot or restore failed; the message is the reason to record."""


#: ``progress(done_bytes, total_bytes)`` of the kernel being transferred.
Progress = Callable[[int, int], None]


class Engine(Protocol):
    """The kernel-state agent's API, as this module uses it."""

    def snapshot_kernel(
        self, connection_file: str, *, bucket: str, prefix: str, kernel_id: str, timeout: float,
        progress: Progress | None = None,
    ) -> dict[str, Any]: ...

    def restore_kernel(
        self, connection_file: str, entry: dict[str, Any], *, bucket: str, timeout: float,
        progress: Progress | None = None,
    ) -> dict[str, Any]: ...

    def write_manifest(self, bucket: str, prefix: str, manifest: dict[str, Any]) -> Any: ...

    def read_manifest(self, bucket: str, prefix: str) -> dict[str, Any]: ...

    def delete_prefix(self, bucket: str, prefix: str) -> Any: ...


def default_engine() -> Engine:
    """``runtime.snapshot`` bound as an Engine (imported on first use: the agent starts,
    and answers status calls, without loading the storage client)."""
    from runtime.snapshot import kernels, manifest

    engine = SimpleNamespace(
        snapshot_kernel=kernels.snapshot_kernel,
        restore_kernel=kernels.restore_kernel,
        write_manifest=manifest.write_manifest,
        read_manifest=manifest.read_manifest,
        delete_prefix=manifest.delete_prefix,
    )
    return cast(Engine, engine)


def is_snapshot_error(exc: BaseException) -> bool:
    try:
        from runtime.snapshot.errors import SnapshotError
    except ImportError:  # pragma: no cover - the package ships with the agent
        return False
    return isinstance(exc, SnapshotError)


@dataclass
class SnapshotOutcome:
    uri: str
    bytes: int
    duration_ms: int
    captured: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    kernels: int = 0
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass
class RestoreOutcome:
    kernels_restored: int
    sessions_restored: int
    kernel_ids: dict[str, str] = field(default_factory=dict)


def snapshot_uri(bucket: str, prefix: str) -> str:
    return f"gs://{bucket}/{prefix.strip('/')}"


def take_snapshot(
    client: JupyterClient,
    runtime_dir: Path,
    *,
    engine: Engine,
    workspace_id: str,
    snapshot_id: str,
    bucket: str,
    prefix: str,
    timeout: float,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    progress: Progress | None = None,
) -> SnapshotOutcome:
    """Snapshot every kernel of the server behind ``client``; raises SnapshotFailed after
    deleting whatever was written under ``prefix``."""
    began = time.monotonic()
    prefix = prefix.strip("/")
    kernel_ids: list[str] = []
    try:
        kernels = client.kernels()
        sessions = client.sessions()
        kernel_ids = [str(k["id"]) for k in kernels]
        paths = _paths_by_kernel(sessions)
        entries: list[dict[str, Any]] = []
        captured: list[str] = []
        skipped: list[dict[str, Any]] = []
        total = 0
        for kernel in kernels:
            kernel_id = str(kernel["id"])
            where = _describe_kernel(kernel_id, paths)
            conn = connection_file(runtime_dir, kernel_id)
            if not conn.is_file():
                raise SnapshotFailed(f"{where}: no connection file at {conn}")
            try:
                # The kernel's objects go under <prefix>/<kernel_id>/ (the engine adds it).
                entry = engine.snapshot_kernel(
                    str(conn), bucket=bucket, prefix=prefix, kernel_id=kernel_id,
                    timeout=timeout, progress=progress,
                )
            except Exception as exc:
                raise SnapshotFailed(f"{where}: {reason_of(exc)}") from exc
            entries.append(
                {"kernel_id": kernel_id, "kernelspec": str(kernel.get("name")), "entry": entry}
            )
            total += _entry_bytes(entry)
            qualifier = "" if len(kernels) == 1 else f"{paths.get(kernel_id, kernel_id)}:"
            captured += [qualifier + name for name in _captured_names(entry)]
            skipped += [_skip_item(item, kernel_id, paths) for item in entry.get("skipped") or []]
        # The engine's write_manifest fills in format, totals and the skipped list.
        manifest = {
            "method": "kernel",
            "workspace_id": workspace_id,
            "snapshot_id": snapshot_id,
            "created_at": now().isoformat(),
            "kernels": entries,
            "sessions": [
                {
                    "path": s.get("path"),
                    "name": s.get("name"),
                    "type": s.get("type") or "notebook",
                    "kernel_id": (s.get("kernel") or {}).get("id"),
                }
                for s in sessions
                if (s.get("kernel") or {}).get("id") in kernel_ids
            ],
            "captured": captured,
            "duration_ms": int((time.monotonic() - began) * 1000),
        }
        try:
            engine.write_manifest(bucket, prefix, manifest)
        except Exception as exc:
            raise SnapshotFailed(f"writing the manifest failed: {reason_of(exc)}") from exc
    except (SnapshotFailed, JupyterError) as exc:
        _discard(client, engine, bucket, prefix, kernel_ids, timeout)
        raise SnapshotFailed(str(exc)) from exc
    except BaseException:
        _discard(client, engine, bucket, prefix, kernel_ids, timeout)
        raise
    return SnapshotOutcome(
        uri=snapshot_uri(bucket, prefix),
        bytes=total,
        duration_ms=int((time.monotonic() - began) * 1000),
        captured=captured,
        skipped=skipped,
        kernels=len(entries),
        manifest=manifest,
    )


def restore_snapshot(
    client: JupyterClient,
    runtime_dir: Path,
    manifest: dict[str, Any],
    *,
    engine: Engine,
    bucket: str,
    timeout: float,
    progress: Progress | None = None,
) -> RestoreOutcome:
    """Start a kernel per manifest kernel, restore it, re-create the sessions. Raises
    SnapshotFailed; the caller stops the server (a half-restored workspace is no use)."""
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list):
        raise SnapshotFailed("the manifest lists no kernels (not a workspace snapshot?)")
    new_ids: dict[str, str] = {}
    for kernel in kernels:
        old_id = str(kernel.get("kernel_id"))
        kernelspec = str(kernel.get("kernelspec") or "python3")
        try:
            started = client.start_kernel(kernelspec)
        except JupyterError as exc:
            raise SnapshotFailed(f"starting a {kernelspec} kernel failed: {exc}") from exc
        new_id = str(started["id"])
        conn = connection_file(runtime_dir, new_id)
        _wait_for_file(conn, _CONNECTION_FILE_WAIT)
        try:
            wait_kernel_ready(conn, timeout)
            engine.restore_kernel(
                str(conn), kernel.get("entry") or {}, bucket=bucket, timeout=timeout,
                progress=progress,
            )
        except Exception as exc:
            raise SnapshotFailed(
                f"restoring kernel {old_id} ({kernelspec}) failed: {reason_of(exc)}"
            ) from exc
        new_ids[old_id] = new_id
    sessions = 0
    for session in manifest.get("sessions") or []:
        attach_to = new_ids.get(str(session.get("kernel_id")))
        if attach_to is None or not session.get("path"):
            continue
        try:
            client.create_session(
                path=str(session["path"]),
                name=str(session.get("name") or session["path"]),
                type=str(session.get("type") or "notebook"),
                kernel_id=attach_to,
            )
        except JupyterError as exc:
            raise SnapshotFailed(
                f"re-creating the session of {session['path']} failed: {exc}"
            ) from exc
        sessions += 1
    return RestoreOutcome(
        kernels_restored=len(new_ids), sessions_restored=sessions, kernel_ids=new_ids
    )


def wait_kernels_idle(
    client: JupyterClient,
    kernel_ids: list[str] | None,
    timeout: float,
    *,
    settle: float = _IDLE_SETTLE,
) -> bool:
    """Wait until none of these kernels (all, with None) has been busy for ``settle``
    seconds; False on timeout or when the server does not answer.

    Why: a capture runs inside the kernel and keeps writing objects after its driver gave
    up or died (until the deadline it was given), so a partial snapshot is deleted only
    once the kernels are quiet. ``settle`` bridges the instant between a user's cell and
    a capture queued behind it, when the kernel reads idle.
    """
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while True:
        try:
            busy = [
                k
                for k in client.kernels()
                if k.get("execution_state") == "busy"
                and (kernel_ids is None or k.get("id") in kernel_ids)
            ]
        except JupyterError:
            return False
        now = time.monotonic()
        if busy:
            quiet_since = None
        else:
            quiet_since = quiet_since if quiet_since is not None else now
            if now - quiet_since >= settle:
                return True
        if now >= deadline:
            return False
        time.sleep(_IDLE_POLL)


def discard_partial(engine: Engine, bucket: str, prefix: str) -> None:
    """Delete a partial snapshot's objects; a failure is logged (the reconciler deletes
    orphans), never raised over the reason the snapshot failed."""
    try:
        engine.delete_prefix(bucket, prefix.strip("/"))
    except Exception:
        log.exception("deleting the partial snapshot gs://%s/%s failed", bucket, prefix)


def _discard(
    client: JupyterClient,
    engine: Engine,
    bucket: str,
    prefix: str,
    kernel_ids: list[str],
    timeout: float,
) -> None:
    if kernel_ids:
        wait_kernels_idle(client, kernel_ids, timeout)
    discard_partial(engine, bucket, prefix)


def _paths_by_kernel(sessions: list[dict[str, Any]]) -> dict[str, str]:
    paths: dict[str, str] = {}
    for s in sessions:
        kernel_id = (s.get("kernel") or {}).get("id")
        if kernel_id and s.get("path"):
            paths.setdefault(str(kernel_id), str(s["path"]))
    return paths


def _describe_kernel(kernel_id: str, paths: dict[str, str]) -> str:
    path = paths.get(kernel_id)
    return f"kernel {kernel_id}" + (f" ({path})" if path else "")


def _entry_bytes(entry: dict[str, Any]) -> int:
    for key in ("bytes", "total_bytes", "size"):
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _captured_names(entry: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for item in entry.get("captured") or entry.get("variables") or []:
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, dict) and item.get("name"):
            names.append(str(item["name"]))
    return names


def _skip_item(item: Any, kernel_id: str, paths: dict[str, str]) -> dict[str, Any]:
    if isinstance(item, dict):
        result = {
            "name": str(item.get("name", "?")),
            "type": str(item.get("type", "?")),
            "reason": str(item.get("reason", "")),
        }
    else:
        result = {"name": str(item), "type": "?", "reason": ""}
    result["kernel"] = kernel_id
    if kernel_id in paths:
        result["path"] = paths[kernel_id]
    return result


def reason_of(exc: BaseException) -> str:
    """The failure reason to record for an exception: its message, with the class name
    when the class is not one of ours."""
    text = str(exc).strip()
    if is_snapshot_error(exc) or isinstance(exc, SnapshotFailed | JupyterError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() >= deadline:
            raise SnapshotFailed(f"the new kernel wrote no connection file at {path}")
        time.sleep(0.05)
