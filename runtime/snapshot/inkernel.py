"""The half of the snapshot agent that runs inside the Jupyter kernel.

:func:`capture` pickles the kernel's user namespace (see ``pickling``) and streams it to
Cloud Storage (see ``transfer``); :func:`restore` fetches and verifies every part before it
unpickles anything, then applies the variables with one ``globals().update``. Both work on
any namespace dict, so they can be called directly in a notebook or a test.

The driver (``kernels.py``) reaches them through :func:`serve`: it executes a one-line
cell that runs a tiny bootstrap in a private namespace (the user's globals gain no name),
and reads the JSON result back through ``user_expressions`` with :func:`take_result`.
Progress, when asked for, is written to stdout as ``stasis-progress <done> <total>``
lines; only the driver's own request sees them.

Keep the imports here light and free of jupyter_client: this module is imported in every
kernel that gets snapshotted.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import cloudpickle

from . import layout, pickling, transfer
from .errors import ManifestError, RestoreFailed, SnapshotError
from .storage import ObjectStore, get_store

PROGRESS_TAG = "stasis-progress"
_PROGRESS_EVERY_S = 0.25
_RESULTS: dict[str, str] = {}


def _ipython_hidden(namespace: Mapping[str, Any]) -> Mapping[str, Any]:
    """IPython's ``user_ns_hidden`` if ``namespace`` is the running shell's namespace."""
    shell_module = sys.modules.get("IPython")
    if shell_module is None:
        return {}
    shell = shell_module.get_ipython()
    if shell is None or shell.user_ns is not namespace:
        return {}
    hidden: Mapping[str, Any] = shell.user_ns_hidden
    return hidden


def _versions() -> dict[str, str]:
    versions = {"cloudpickle": cloudpickle.__version__}
    for module in ("numpy", "pandas", "torch"):
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
            versions[module] = loaded.__version__
    return versions


def _python() -> str:
    return ".".join(str(v) for v in sys.version_info[:3])


def capture(
    namespace: dict[str, Any],
    *,
    bucket: str,
    prefix: str,
    kernel_id: str,
    emulator_host: str | None = None,
    part_bytes: int = layout.DEFAULT_PART_BYTES,
    streams: int | None = None,
    deadline: float | None = None,
    progress: transfer.Progress | None = None,
    store: ObjectStore | None = None,
) -> dict[str, Any]:
    """Store the user variables of ``namespace`` under ``gs://bucket/prefix/kernel_id/``.

    Returns the kernel entry for the workspace manifest (JSON-able). Writes no manifest:
    the caller commits the snapshot by writing the manifest last. On failure, the parts
    already stored are deleted (best effort) before the error propagates. ``deadline`` is
    epoch seconds; ``progress(done_bytes, total_bytes)`` is called from this thread.
    """
    started = time.time()
    transfer.check_deadline(deadline, "capture did not start before its deadline")
    part_bytes = max(int(part_bytes), layout.MIN_PART_BYTES)
    folder = layout.kernel_prefix(prefix, kernel_id)
    store = store or get_store(emulator_host)

    names = pickling.user_variables(namespace, _ipython_hidden(namespace))
    dump = pickling.dump_namespace(namespace, names)
    pickled = time.time()
    sizes = [s.nbytes for s in dump.segments]
    try:
        objects = transfer.upload_segments(
            store,
            bucket,
            folder,
            dump.segments,
            part_bytes=part_bytes,
            streams=streams,
            deadline=deadline,
            progress=progress,
        )
    except BaseException:
        _delete_quietly(store, bucket, folder)
        raise
    finally:
        dump.release()
    finished = time.time()
    total = sum(sizes)
    return {
        "format": layout.FORMAT,
        "kernel_id": kernel_id,
        "prefix": folder,
        "created_at": datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z"),
        "python": _python(),
        "libraries": _versions(),
        "pickle_protocol": pickling.PROTOCOL,
        "part_bytes": part_bytes,
        "segments": sizes,
        "objects": objects,
        "variables": [{"name": v.name, "type": v.type, "bytes": v.bytes} for v in dump.captured],
        "skipped": [{"name": s.name, "type": s.type, "reason": s.reason} for s in dump.skipped],
        "total_bytes": total,
        "seconds": round(finished - started, 3),
        "timings": {
            "pickle_s": round(pickled - started, 3),
            "upload_s": round(finished - pickled, 3),
        },
    }


def _delete_quietly(store: ObjectStore, bucket: str, folder: str) -> None:
    # Best effort: the node agent deletes the whole prefix after a failure anyway.
    with contextlib.suppress(Exception):
        store.delete_objects(bucket, store.list_objects(bucket, folder + "/"))


def check_entry(entry: Mapping[str, Any]) -> None:
    """Raise :class:`ManifestError` unless ``entry`` is a well-formed kernel entry."""
    if entry.get("format") != layout.FORMAT:
        raise ManifestError(
            f"kernel entry has format {entry.get('format')!r}, expected {layout.FORMAT!r}"
        )
    segments = entry.get("segments")
    if not isinstance(segments, list) or not all(isinstance(s, int) and s >= 0 for s in segments):
        raise ManifestError("kernel entry has no valid 'segments' list")
    objects = entry.get("objects")
    if not isinstance(objects, list):
        raise ManifestError("kernel entry has no 'objects' list")
    for obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("sha256"), str):
            raise ManifestError(f"kernel entry object {obj!r} lacks a sha256")
    try:
        layout.check_objects(objects, sum(segments))
    except ValueError as error:
        raise ManifestError(f"kernel entry is inconsistent: {error}") from error


def restore(
    namespace: dict[str, Any],
    entry: Mapping[str, Any],
    *,
    bucket: str,
    emulator_host: str | None = None,
    streams: int | None = None,
    deadline: float | None = None,
    progress: transfer.Progress | None = None,
    store: ObjectStore | None = None,
) -> dict[str, Any]:
    """Bring the variables of ``entry`` back into ``namespace``.

    Every part is downloaded and its sha256 verified before anything is unpickled; a
    mismatch raises :class:`SnapshotIntegrityError` and leaves ``namespace`` untouched. If
    unpickling fails (a package missing in this kernel), ``namespace`` is untouched too.
    """
    started = time.time()
    check_entry(entry)
    transfer.check_deadline(deadline, "restore did not start before its deadline")
    python = _python()
    if entry.get("python", python).split(".")[:2] != python.split(".")[:2]:
        raise RestoreFailed(
            f"the snapshot was taken with Python {entry['python']} and this kernel runs "
            f"{python}: pickled functions and classes do not cross Python versions"
        )
    store = store or get_store(emulator_host)
    buffers = transfer.download_segments(
        store,
        bucket,
        entry["objects"],
        entry["segments"],
        streams=streams,
        deadline=deadline,
        progress=progress,
    )
    downloaded = time.time()
    main, *out_of_band = buffers
    try:
        values = pickling.load_namespace(main, out_of_band, namespace)
    except SnapshotError:
        raise
    except Exception as error:
        raise RestoreFailed(
            f"unpickling the snapshot failed: {type(error).__name__}: {error}"
        ) from error
    del main, buffers
    namespace.update(values)
    finished = time.time()
    return {
        "kernel_id": entry.get("kernel_id"),
        "variables": list(values),
        "skipped": list(entry.get("skipped", [])),
        "bytes": sum(entry["segments"]),
        "seconds": round(finished - started, 3),
        "timings": {
            "download_s": round(downloaded - started, 3),
            "unpickle_s": round(finished - downloaded, 3),
        },
    }


# -- the driver's entry point --------------------------------------------------------------


class _StdoutProgress:
    """Writes throttled progress lines that the driver turns back into callbacks."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < _PROGRESS_EVERY_S:
            return
        self._last = now
        print(f"{PROGRESS_TAG} {done} {total}", flush=True)


def serve(namespace: dict[str, Any], request: str) -> None:
    """Run one driver request (JSON) against ``namespace``; keep the result for the driver.

    Returns ``None`` on purpose: the cell's value is not displayed, so IPython's output
    cache (``_``, ``Out``) does not change.
    """
    args = json.loads(request)
    token = args.pop("token")
    op = args.pop("op")
    if args.pop("progress", False):
        args["progress"] = _StdoutProgress()
    if op == "capture":
        result = capture(namespace, **args)
    elif op == "restore":
        result = restore(namespace, **args)
    else:
        raise SnapshotError(f"unknown snapshot operation {op!r}")
    _RESULTS[token] = json.dumps(result)


def take_result(token: str) -> str:
    """Hand over (and forget) the JSON result of :func:`serve` for ``token``."""
    return _RESULTS.pop(token)
