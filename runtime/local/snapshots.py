"""Snapshot and restore of a whole workspace: every live kernel, its notebook sessions.

The per-kernel work (capturing a kernel's user namespace to Cloud Storage, loading it into
another kernel) belongs to the kernel-state agent in ``runtime.snapshot``; this module
orchestrates it across a workspace's server:

- ``take_snapshot`` lists the server's kernels and sessions, snapshots each kernel into the
  workspace's part pool, and writes the workspace manifest **last** (kernels with their
  kernelspec name and entry, sessions, totals, skipped variables). Without a manifest a
  prefix is not a snapshot, so a crash at any point leaves nothing that looks complete. A
  workspace without kernels is a valid, empty snapshot. Given the *base* (the snapshot this
  one follows, as the control plane recorded it), the parts its manifest lists are not sent
  again. On failure the snapshot's folder is deleted (after the kernels stopped writing)
  and ``SnapshotFailed`` says why; parts it wrote are left to retention (they may be
  shared); the server is never touched.
- ``open_snapshot`` reads a manifest and refuses it unless it hashes to the sha256 the
  control plane recorded, before anything else is read: the local agent and the
  Kubernetes sidecar both restore only through it.
- ``restore_snapshot`` starts one kernel per manifest kernel with the same kernelspec,
  restores each entry into it, and re-creates the sessions so that a notebook reopened in
  the browser attaches to its restored kernel.
- ``Staging`` downloads the kernels' entries while the server and kernels start
  (``runtime.snapshot.staging``: into private shared-memory files the kernel maps, every
  part verified on the way), so a resume waits for the longer of the two, not their sum.

The storage and kernel calls go through an ``Engine`` (``default_engine`` binds
``runtime.snapshot``), so the orchestration is tested without kernels or storage.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
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
    """A workspace snapshot or restore failed; the message is the reason to record.

    ``cause`` is set when a restore was refused with the snapshot intact (the event's
    ``cause``: ``snapshot_integrity`` or ``restore_refused``), so the workspace stays
    PAUSED.
    """

    def __init__(self, reason: str, *, cause: str | None = None) -> None:
        super().__init__(reason)
        self.cause = cause


INTEGRITY = "snapshot_integrity"
REFUSED = "restore_refused"


#: ``progress(done_bytes, total_bytes)`` of the kernel being transferred.
Progress = Callable[[int, int], None]


class Engine(Protocol):
    """The kernel-state agent's API, as this module uses it."""

    def snapshot_kernel(
        self, connection_file: str, *, bucket: str, prefix: str, kernel_id: str, timeout: float,
        progress: Progress | None = None, reuse: dict[str, int] | None = None,
    ) -> dict[str, Any]: ...

    def restore_kernel(
        self, connection_file: str, entry: dict[str, Any], *, bucket: str, timeout: float,
        progress: Progress | None = None, device_arrays_to_cpu: bool = False,
        staged: list[str] | None = None,
    ) -> dict[str, Any]: ...

    def stage_kernel(
        self, entry: dict[str, Any], *, bucket: str, directory: str, timeout: float,
        progress: Progress | None = None, uid: int | None = None,
    ) -> list[str] | None: ...

    def write_manifest(self, bucket: str, prefix: str, manifest: dict[str, Any]) -> Any: ...

    def read_manifest(
        self, bucket: str, prefix: str, *, expected_sha256: str | None = None
    ) -> dict[str, Any]: ...

    def delete_prefix(self, bucket: str, prefix: str) -> Any: ...


def default_engine(access_token: str | None = None) -> Engine:
    """``runtime.snapshot`` bound as an Engine (imported on first use: the agent starts,
    and answers status calls, without loading the storage client). ``access_token``: every
    call, in this process and in the kernels, uses only that credential (the Kubernetes
    sidecar's downscoped token for one operation)."""
    from runtime.snapshot import kernels, manifest

    if access_token:
        from functools import partial

        from runtime.snapshot.storage import get_store

        store = get_store(access_token=access_token)
        return cast(Engine, SimpleNamespace(
            snapshot_kernel=partial(kernels.snapshot_kernel, access_token=access_token),
            restore_kernel=partial(kernels.restore_kernel, access_token=access_token),
            stage_kernel=partial(kernels.stage_kernel, access_token=access_token),
            write_manifest=partial(manifest.write_manifest, store=store),
            read_manifest=partial(manifest.read_manifest, store=store),
            delete_prefix=partial(manifest.delete_prefix, store=store),
        ))
    engine = SimpleNamespace(
        snapshot_kernel=kernels.snapshot_kernel,
        restore_kernel=kernels.restore_kernel,
        stage_kernel=kernels.stage_kernel,
        write_manifest=manifest.write_manifest,
        read_manifest=manifest.read_manifest,
        delete_prefix=manifest.delete_prefix,
    )
    return cast(Engine, engine)


def _is_error(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is the snapshot agent's error class ``name`` (imported lazily)."""
    from runtime.snapshot import errors

    return isinstance(exc, getattr(errors, name))


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
    #: What snapshot.finished carries: the anchor, the parts used, the bytes sent.
    manifest_sha256: str | None = None
    parts: dict[str, int] = field(default_factory=dict)
    uploaded_bytes: int = 0
    #: ms per phase: ``list`` (kernels and sessions), ``capture`` (the agent's calls, of
    #: which the kernels report ``pickle`` and ``upload``), ``manifest``.
    phases_ms: dict[str, int] = field(default_factory=dict)


@dataclass
class RestoreOutcome:
    kernels_restored: int
    sessions_restored: int
    kernel_ids: dict[str, str] = field(default_factory=dict)
    #: Where the restore's time went, in ms, summed over kernels: ``kernel_start`` (the
    #: server's POST /api/kernels), ``kernel_ready`` (until it answers ``kernel_info``),
    #: ``staged_wait`` (for the download ahead, past the kernel's start), ``restore`` (the
    #: agent's call, of which the kernel reports ``download`` and ``unpickle``),
    #: ``sessions``.
    phases_ms: dict[str, int] = field(default_factory=dict)


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
    base: Mapping[str, Any] | None = None,
) -> SnapshotOutcome:
    """Snapshot every kernel of the server behind ``client``; raises SnapshotFailed after
    deleting whatever was written under ``prefix``. ``base`` (``prefix``,
    ``manifest_sha256``): the snapshot this one follows, whose parts are not sent again."""
    from runtime.snapshot import manifest as manifests

    began = time.monotonic()
    prefix = prefix.strip("/")
    kernel_ids: list[str] = []
    reuse = _reusable(engine, bucket, base)
    phases = _Phases()
    try:
        kernels = client.kernels()
        sessions = client.sessions()
        phases.lap("list")
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
                    timeout=timeout, progress=progress, reuse=reuse,
                )
            except Exception as exc:
                raise SnapshotFailed(f"{where}: {reason_of(exc)}") from exc
            phases.lap("capture")
            phases.add_seconds(entry.get("timings") or {})
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
            written = engine.write_manifest(bucket, prefix, manifest)
        except Exception as exc:
            raise SnapshotFailed(f"writing the manifest failed: {reason_of(exc)}") from exc
        phases.lap("manifest")
    except (SnapshotFailed, JupyterError) as exc:
        _discard(client, engine, bucket, prefix, kernel_ids, timeout)
        raise SnapshotFailed(str(exc)) from exc
    except BaseException:
        _discard(client, engine, bucket, prefix, kernel_ids, timeout)
        raise
    doc = written if isinstance(written, dict) else manifest
    return SnapshotOutcome(
        uri=snapshot_uri(bucket, prefix),
        bytes=total,
        duration_ms=int((time.monotonic() - began) * 1000),
        captured=captured,
        skipped=skipped,
        kernels=len(entries),
        manifest=doc,
        manifest_sha256=manifests.manifest_sha256(doc) if written is not None else None,
        parts=manifests.manifest_parts(doc),
        uploaded_bytes=sum(int(e["entry"].get("uploaded_bytes", _entry_bytes(e["entry"])))
                           for e in entries),
        phases_ms=phases.ms,
    )


def _reusable(engine: Engine, bucket: str, base: Mapping[str, Any] | None) -> dict[str, int]:
    """The parts of ``base`` that a capture need not send again; none if it cannot be
    read as recorded (a base that was tampered with must not decide what is skipped, and
    must not stop the pause either: everything is sent then)."""
    if not base or not base.get("prefix"):
        return {}
    from runtime.snapshot.manifest import reusable_parts

    try:
        doc = engine.read_manifest(bucket, str(base["prefix"]).strip("/"),
                                   expected_sha256=base.get("manifest_sha256"))
    except Exception as exc:
        log.warning("base snapshot %s unusable, sending every part: %s",
                    base.get("snapshot_id"), reason_of(exc))
        return {}
    return reusable_parts(doc)


def open_snapshot(engine: Engine, bucket: str, prefix: str, *, snapshot_id: str,
                  manifest_sha256: str | None) -> dict[str, Any]:
    """The manifest of the snapshot to restore, if it hashes to ``manifest_sha256``.

    The hash comes from the control plane (``snapshot.finished`` carried it, the snapshot
    record keeps it): a manifest rewritten in the bucket, with parts to match, is refused
    here, before any part is read or anything unpickled. None: a snapshot recorded before
    manifests were anchored (read as is, and logged).
    """
    if manifest_sha256 is None:
        log.warning("restoring snapshot %s without a recorded manifest hash", snapshot_id)
    try:
        return engine.read_manifest(bucket, prefix, expected_sha256=manifest_sha256)
    except Exception as exc:
        cause = INTEGRITY if _is_error(exc, "SnapshotIntegrityError") else None
        raise SnapshotFailed(
            f"cannot read snapshot {snapshot_id} ({snapshot_uri(bucket, prefix)}): "
            f"{reason_of(exc)}", cause=cause,
        ) from exc


class Staging:
    """The kernels of a manifest downloading ahead (one after another, each on the
    transfer's parallel streams) into a new private directory under ``root``; ``close``
    waits for them and removes what the kernels did not take. No ``root`` (the host has
    no shared memory): nothing is staged and every kernel downloads its own entry. ``uid``
    (a workspace with an OS user of its own): the directory and files are that user's,
    mode 0700 / 0600, for its kernel to map and unlink.

    A kernel's memory limit (``RLIMIT_DATA``, ``memory_bytes``) does not count shared
    file mappings, so a kernel entry larger than it is not staged: its kernel downloads it
    and meets its limit as before (a resume onto a smaller profile)."""

    def __init__(self, engine: Engine, manifest: Mapping[str, Any], *, bucket: str,
                 root: Path | None, timeout: float, progress: Progress | None = None,
                 memory_bytes: int | None = None, uid: int | None = None) -> None:
        self.futures: dict[str, Future[list[str] | None]] = {}
        self.directory: Path | None = None
        self._pool: ThreadPoolExecutor | None = None
        kernels = manifest.get("kernels")
        if root is None or not root.is_dir() or not isinstance(kernels, list) or not kernels:
            return
        kernels = [k for k in kernels if memory_bytes is None or _entry_bytes(
            k.get("entry") or {}) <= memory_bytes]
        if not kernels:
            return
        self.directory = Path(tempfile.mkdtemp(prefix="stasis-restore-", dir=root))
        if uid is not None:  # the workspace's own kernel maps and unlinks the files
            os.chown(self.directory, uid, uid)
        self._pool = ThreadPoolExecutor(1, "stasis-staging")
        for index, kernel in enumerate(kernels):
            # A directory per kernel: every entry's files are segment-0, segment-1, ...
            own = self.directory / f"kernel-{index}"
            own.mkdir(mode=0o700)
            if uid is not None:
                os.chown(own, uid, uid)
            self.futures[str(kernel.get("kernel_id"))] = self._pool.submit(
                engine.stage_kernel, dict(kernel.get("entry") or {}), bucket=bucket,
                directory=str(own), timeout=timeout, progress=progress, uid=uid)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def restore_snapshot(
    client: JupyterClient,
    runtime_dir: Path,
    manifest: dict[str, Any],
    *,
    engine: Engine,
    bucket: str,
    timeout: float,
    progress: Progress | None = None,
    device_arrays_to_cpu: bool = False,
    staged: Mapping[str, Future[list[str] | None]] | None = None,
) -> RestoreOutcome:
    """Start a kernel per manifest kernel, restore it, re-create the sessions. Raises
    SnapshotFailed (with its ``cause`` when a part failed its digest or the kernel cannot
    take the device arrays); the caller stops the server (a half-restored workspace is no
    use). ``staged`` (``Staging.futures``): entries downloading ahead, by old kernel id;
    a kernel maps its staged files once both are ready, or downloads its entry itself when
    it was not staged."""
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list):
        raise SnapshotFailed("the manifest lists no kernels (not a workspace snapshot?)")
    new_ids: dict[str, str] = {}
    phases = _Phases()
    for kernel in kernels:
        old_id = str(kernel.get("kernel_id"))
        kernelspec = str(kernel.get("kernelspec") or "python3")
        try:
            started = client.start_kernel(kernelspec)
        except JupyterError as exc:
            raise SnapshotFailed(f"starting a {kernelspec} kernel failed: {exc}") from exc
        new_id = str(started["id"])
        conn = connection_file(runtime_dir, new_id)
        phases.lap("kernel_start")
        _wait_for_file(conn, _CONNECTION_FILE_WAIT)
        try:
            wait_kernel_ready(conn, timeout)
            phases.lap("kernel_ready")
            ahead = (staged or {}).get(old_id)
            paths = ahead.result() if ahead is not None else None
            phases.lap("staged_wait")
            result = engine.restore_kernel(
                str(conn), kernel.get("entry") or {}, bucket=bucket, timeout=timeout,
                progress=progress, device_arrays_to_cpu=device_arrays_to_cpu, staged=paths,
            )
            phases.lap("restore")
            phases.add_seconds((result or {}).get("timings") or {})
        except Exception as exc:
            cause = (INTEGRITY if _is_error(exc, "SnapshotIntegrityError")
                     else REFUSED if _is_error(exc, "RestoreRefused") else None)
            raise SnapshotFailed(
                f"restoring kernel {old_id} ({kernelspec}) failed: {reason_of(exc)}",
                cause=cause,
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
    phases.lap("sessions")
    return RestoreOutcome(
        kernels_restored=len(new_ids), sessions_restored=sessions, kernel_ids=new_ids,
        phases_ms=phases.ms,
    )


class _Phases:
    """Milliseconds per named phase, summed: ``lap(name)`` charges the time since the last
    lap to ``name``; ``add_seconds`` adds what a kernel measured itself (``download_s``)."""

    def __init__(self) -> None:
        self.ms: dict[str, int] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.ms[name] = self.ms.get(name, 0) + int((now - self._last) * 1000)
        self._last = now

    def add_seconds(self, timings: Mapping[str, Any]) -> None:
        for key, value in timings.items():
            if key.endswith("_s") and isinstance(value, int | float):
                name = key.removesuffix("_s")
                self.ms[name] = self.ms.get(name, 0) + int(value * 1000)


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
