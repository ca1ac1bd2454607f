"""The half of the snapshot agent that runs inside the Jupyter kernel.

:func:`capture` pickles the kernel's user namespace (see ``pickling``) and streams it to
the workspace's part pool in Cloud Storage (see ``transfer``), skipping the parts the
previous snapshot already stored; :func:`restore` checks that this kernel can take the
snapshot's device arrays (see ``devices``), fetches and verifies every part before it
unpickles anything, then applies the variables with one ``globals().update``. While the
parts download, a thread imports the libraries the snapshot was taken with (numpy, torch,
JAX: tens of milliseconds to seconds that unpickling would otherwise wait for). Both work
on any namespace dict, so they can be called directly in a notebook or a test.

The driver (``kernels.py``) reaches them through :func:`serve`: it executes a one-line
cell that runs a tiny bootstrap in a private namespace (the user's globals gain no name),
and reads the JSON result back through ``user_expressions`` with :func:`take_result`.
Progress, when asked for, is written to stdout as ``stasis-progress <done> <total>``
lines; only the driver's own request sees them.

Keep the imports here light and free of jupyter_client: this module is imported in every
kernel that gets snapshotted.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import cloudpickle

from . import devices, layout, pickling, staging, transfer
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


#: Libraries whose versions an entry records, and which a restore imports ahead.
_LIBRARIES = ("numpy", "pandas", "torch", "jax")


def _versions() -> dict[str, str]:
    versions = {"cloudpickle": cloudpickle.__version__}
    for module in _LIBRARIES:
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
    reuse: Mapping[str, int] | None = None,
    streams: int | None = None,
    deadline: float | None = None,
    progress: transfer.Progress | None = None,
    store: ObjectStore | None = None,
    access_token: str | None = None,
) -> dict[str, Any]:
    """Store the user variables of ``namespace`` as parts of the workspace's pool (beside
    ``gs://bucket/prefix``) and return the kernel entry for the workspace manifest.

    ``reuse`` (digest -> bytes) names parts already in the pool, from the snapshot this one
    follows: they are not sent again. Writes no manifest: the caller commits the snapshot
    by writing the manifest last. Parts are content-addressed and may be shared, so a
    failed capture deletes none; parts no snapshot uses are the janitor's. ``deadline`` is
    epoch seconds; ``progress(done_bytes, total_bytes)`` is called from this thread.
    ``access_token``: the only credential to use (the driver's downscoped token on GKE).
    """
    started = time.time()
    transfer.check_deadline(deadline, "capture did not start before its deadline")
    layout.check_kernel_id(kernel_id)
    pool = layout.pool_prefix(prefix)
    store = store or get_store(emulator_host, access_token=access_token)

    names = pickling.user_variables(namespace, _ipython_hidden(namespace))
    dump = pickling.dump_namespace(namespace, names)
    pickled = time.time()
    sizes = [s.nbytes for s in dump.segments]
    part_bytes = layout.part_bytes_for(sum(sizes), part_bytes)
    try:
        uploaded = transfer.upload_segments(
            store,
            bucket,
            pool,
            dump.segments,
            reuse=reuse,
            part_bytes=part_bytes,
            streams=streams,
            deadline=deadline,
            progress=progress,
        )
    finally:
        dump.release()
    finished = time.time()
    total = sum(sizes)
    return {
        "format": layout.FORMAT,
        "kernel_id": kernel_id,
        "created_at": datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z"),
        "python": _python(),
        "libraries": _versions(),
        "pickle_protocol": pickling.PROTOCOL,
        "part_bytes": part_bytes,
        "segments": sizes,
        "placements": dump.placements,
        "accelerators": devices.seen(dump.placements),
        "objects": uploaded.objects,
        "variables": [{"name": v.name, "type": v.type, "bytes": v.bytes} for v in dump.captured],
        "skipped": [{"name": s.name, "type": s.type, "reason": s.reason} for s in dump.skipped],
        "total_bytes": total,
        "uploaded_bytes": uploaded.sent_bytes,
        "seconds": round(finished - started, 3),
        "timings": {
            "pickle_s": round(pickled - started, 3),
            "upload_s": round(finished - pickled, 3),
        },
    }


def check_entry(entry: Mapping[str, Any]) -> None:
    """Raise :class:`ManifestError` unless ``entry`` is a well-formed kernel entry."""
    if entry.get("format") not in layout.READABLE_FORMATS:
        raise ManifestError(
            f"kernel entry has format {entry.get('format')!r}, expected {layout.FORMAT!r}"
        )
    segments = entry.get("segments")
    if not isinstance(segments, list) or not all(isinstance(s, int) and s >= 0 for s in segments):
        raise ManifestError("kernel entry has no valid 'segments' list")
    placements = entry.get("placements", [None] * len(segments))
    if not isinstance(placements, list) or len(placements) != len(segments) or not all(
        p is None or isinstance(p, dict) for p in placements
    ):
        raise ManifestError("kernel entry's 'placements' do not match its segments")
    objects = entry.get("objects")
    if not isinstance(objects, list):
        raise ManifestError("kernel entry has no 'objects' list")
    for obj in objects:
        if not isinstance(obj, dict):
            raise ManifestError(f"kernel entry object {obj!r} is not an object")
        transfer.digest_of(obj)
    try:
        layout.check_objects(objects, sum(segments))
    except ValueError as error:
        raise ManifestError(f"kernel entry is inconsistent: {error}") from error


def _import_ahead(libraries: Mapping[str, Any]) -> threading.Thread:
    """Import the snapshot's libraries on a thread while the parts download: unpickling
    would otherwise wait for them (numpy 60-80 ms here, torch seconds). A library that
    fails to import is left for the unpickler to report."""

    def run() -> None:
        for name in _LIBRARIES:
            if name in libraries and name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception:  # reported by the unpickler, with its context
                    continue

    thread = threading.Thread(target=run, name="stasis-import-ahead", daemon=True)
    thread.start()
    return thread


def restore(
    namespace: dict[str, Any],
    entry: Mapping[str, Any],
    *,
    bucket: str,
    emulator_host: str | None = None,
    device_arrays_to_cpu: bool = False,
    streams: int | None = None,
    deadline: float | None = None,
    progress: transfer.Progress | None = None,
    store: ObjectStore | None = None,
    staged: Sequence[str] | None = None,
    access_token: str | None = None,
) -> dict[str, Any]:
    """Bring the variables of ``entry`` back into ``namespace``.

    ``staged``: the entry's segments already downloaded and verified by the driver
    (``staging.stage``), one file each; they are mapped instead of downloaded.

    Device arrays go back to the device they came from, or to CPU with
    ``device_arrays_to_cpu``; a kernel that cannot take them is refused
    (:class:`RestoreRefused`) before anything is read. Every part is downloaded and its
    digest verified before anything is unpickled; a mismatch raises
    :class:`SnapshotIntegrityError` and leaves ``namespace`` untouched. If unpickling
    fails (a package missing in this kernel), ``namespace`` is untouched too.
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
    sizes = list(entry["segments"])
    placements = list(entry.get("placements") or [None] * len(sizes))
    devices.check_restore(entry, to_cpu=device_arrays_to_cpu)
    importing = _import_ahead(entry.get("libraries") or {})
    restored: list[Any]
    if staged is not None:
        if any(placements):
            raise ManifestError("device arrays are never staged: they go to the device")
        restored = list(staging.load(staged, sizes))
    else:
        restored = transfer.download_segments(
            store or get_store(emulator_host, access_token=access_token),
            bucket,
            entry["objects"],
            sizes,
            sinks=devices.sinks_for(placements, sizes, to_cpu=device_arrays_to_cpu),
            streams=streams,
            deadline=deadline,
            progress=progress,
        )
    downloaded = time.time()
    importing.join()
    try:
        values = pickling.load_namespace(
            restored, namespace, placements=placements, to_cpu=device_arrays_to_cpu
        )
    except SnapshotError:
        raise
    except Exception as error:
        raise RestoreFailed(
            f"unpickling the snapshot failed: {type(error).__name__}: {error}"
        ) from error
    del restored
    namespace.update(values)
    finished = time.time()
    return {
        "kernel_id": entry.get("kernel_id"),
        "variables": list(values),
        "skipped": list(entry.get("skipped", [])),
        "bytes": sum(sizes),
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
