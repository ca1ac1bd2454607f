"""The workspace snapshot manifest: what a whole ``kernel``-method snapshot consists of.

One snapshot is ``gs://<bucket>/<prefix>/manifest.json``, written **last**, and the parts
it lists, which live in the workspace's shared part pool beside it
(``<workspace prefix>/_parts/<digest>``, see ``layout``) and may be used by other
snapshots of the same workspace. The manifest is the commit point: a snapshot without one
is partial (a failed or running capture) and :func:`delete_prefix` deletes its folder,
never restored. Parts are never deleted with a snapshot: which ones no snapshot uses any
more is for the control plane's retention to decide (``functions.domain.retention``).

Format (``"format": "stasis.kernel/2"``; ``/1`` manifests, whose parts lived in the
snapshot's own folder, are still read)::

    {
      "format": "stasis.kernel/2",
      "method": "kernel",
      "created_at": "2025-01-01T12:00:00Z",
      "kernels": [{"kernel_id": "...", "kernelspec": "python3", "entry": {<kernel entry>}}],
      "sessions": [{"path": "analysis.ipynb", "kernel_id": "...", ...}],
      "totals": {"kernels": 1, "objects": 3, "bytes": 67110000, "variables": 5,
                 "skipped": 1, "uploaded_bytes": 1048576, "seconds": 1.2},
      "skipped": [{"kernel_id": "...", "name": "lock", "type": "_thread.lock",
                   "reason": "TypeError: cannot pickle '_thread.lock' object"}],
      ...any other keys the caller adds (workspace id, team) are kept as they are
    }

``totals`` and ``skipped`` are derived from the kernel entries here, so they always agree
with them. :func:`normalize_manifest`, :func:`manifest_parts` and :func:`manifest_sha256`
are pure; the other functions do I/O through ``storage``.

Trust: every part's digest is in the manifest, and the manifest's own sha256
(:func:`manifest_sha256`) is what the control plane keeps in the snapshot's Firestore
record (``snapshot.finished`` carries it) and hands back to :func:`read_manifest` on every
restore, which refuses a manifest that does not match before anything is read. Without that
anchor, whoever can write the bucket could rewrite parts and manifest together, and a
restore would unpickle (run) what they wrote.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from . import inkernel, layout, transfer
from .errors import ManifestError, ObjectNotFound, SnapshotError, SnapshotIntegrityError
from .storage import ObjectStore, get_store

MANIFEST_NAME = "manifest.json"


def manifest_name(prefix: str) -> str:
    """Object name of the manifest of the snapshot at ``prefix``."""
    return f"{layout.normalize_prefix(prefix)}/{MANIFEST_NAME}"


def _timestamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def normalize_manifest(
    manifest: Mapping[str, Any], *, prefix: str, now: datetime
) -> dict[str, Any]:
    """Validate ``manifest`` and return it with ``format``, ``created_at``, ``totals`` and
    ``skipped`` filled in. Raises :class:`ManifestError` naming the first problem; every
    object must be in the workspace's part pool (or, format ``/1``, the snapshot's folder).
    """
    folders = (layout.normalize_prefix(prefix) + "/", layout.pool_prefix(prefix) + "/")
    kernels = manifest.get("kernels")
    if not isinstance(kernels, Sequence) or isinstance(kernels, str):
        raise ManifestError("manifest needs a 'kernels' list")
    sessions = manifest.get("sessions", [])
    if not isinstance(sessions, Sequence) or not all(isinstance(s, Mapping) for s in sessions):
        raise ManifestError("manifest 'sessions' must be a list of objects")
    fmt = manifest.get("format", layout.FORMAT)
    if fmt not in layout.READABLE_FORMATS:
        raise ManifestError(f"manifest format {fmt!r} is not {layout.FORMAT!r}")

    seen: set[str] = set()
    skipped: list[dict[str, Any]] = []
    totals = {"kernels": 0, "objects": 0, "bytes": 0, "variables": 0, "skipped": 0,
              "uploaded_bytes": 0}
    seconds = 0.0
    for kernel in kernels:
        if not isinstance(kernel, Mapping):
            raise ManifestError(f"manifest kernel {kernel!r} is not an object")
        kernel_id, spec, entry = (
            kernel.get("kernel_id"),
            kernel.get("kernelspec"),
            kernel.get("entry"),
        )
        if not isinstance(kernel_id, str) or not isinstance(spec, str):
            raise ManifestError(f"manifest kernel {kernel_id!r} needs 'kernel_id' and 'kernelspec'")
        if kernel_id in seen:
            raise ManifestError(f"kernel {kernel_id!r} appears twice in the manifest")
        seen.add(kernel_id)
        if not isinstance(entry, Mapping):
            raise ManifestError(f"kernel {kernel_id!r} has no entry")
        inkernel.check_entry(entry)
        if entry.get("kernel_id") != kernel_id:
            raise ManifestError(
                f"kernel {kernel_id!r} carries the entry of kernel {entry.get('kernel_id')!r}"
            )
        for obj in entry["objects"]:
            if not str(obj["name"]).startswith(folders):
                raise ManifestError(
                    f"kernel {kernel_id!r} object {obj['name']!r} is outside {folders[1]!r}"
                )
        totals["kernels"] += 1
        totals["objects"] += len(entry["objects"])
        size = int(entry.get("total_bytes", sum(entry["segments"])))
        totals["bytes"] += size
        totals["variables"] += len(entry.get("variables", []))
        totals["uploaded_bytes"] += int(entry.get("uploaded_bytes", size))
        seconds += float(entry.get("seconds", 0.0))
        for skip in entry.get("skipped", []):
            skipped.append({"kernel_id": kernel_id, **skip})
    totals["skipped"] = len(skipped)

    created_at = manifest.get("created_at") or _timestamp(now)
    return {
        **manifest,
        "format": fmt,
        "method": "kernel",
        "created_at": created_at,
        "kernels": [dict(k) for k in kernels],
        "sessions": [dict(s) for s in sessions],
        "totals": {**totals, "seconds": round(seconds, 3)},
        "skipped": skipped,
    }


def manifest_parts(manifest: Mapping[str, Any]) -> dict[str, int]:
    """``{object name: bytes}`` of every part the snapshot uses (each once, however many
    kernels share it): what the control plane counts against the team."""
    return {
        str(obj["name"]): int(obj["bytes"])
        for kernel in manifest.get("kernels") or []
        for obj in (kernel.get("entry") or {}).get("objects") or []
    }


def reusable_parts(manifest: Mapping[str, Any]) -> dict[str, int]:
    """``{digest: bytes}`` of the pool parts of a snapshot: what the next capture of the
    same workspace need not send again (``/1`` parts are not in the pool)."""
    found: dict[str, int] = {}
    for kernel in manifest.get("kernels") or []:
        entry = kernel.get("entry") or {}
        if entry.get("format") != layout.FORMAT:
            continue
        for obj in entry.get("objects") or []:
            found[transfer.digest_of(obj)[1]] = int(obj["bytes"])
    return found


def _serialize(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def manifest_sha256(manifest: Mapping[str, Any]) -> str:
    """sha256 of ``manifest.json`` as :func:`write_manifest` writes the returned document."""
    return hashlib.sha256(_serialize(manifest)).hexdigest()


def write_manifest(
    bucket: str,
    prefix: str,
    manifest: Mapping[str, Any],
    *,
    store: ObjectStore | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Commit a snapshot: check that every part it names is stored, then write
    ``<prefix>/manifest.json``. Returns the manifest as written.

    Raises :class:`ManifestError` (and writes nothing) if a part is missing or has the
    wrong size, so a manifest never points at an incomplete snapshot.
    """
    doc = normalize_manifest(manifest, prefix=prefix, now=now or datetime.now(UTC))
    store = store or get_store()
    parts = manifest_parts(doc)
    stored: dict[str, int] = {}
    for folder in sorted({name.rpartition("/")[0] for name in parts}):
        stored.update(store.list_objects(bucket, folder + "/"))
    wrong = [name for name, size in parts.items() if stored.get(name) != size]
    if wrong:
        raise ManifestError(
            f"refusing to write the manifest of gs://{bucket}/{prefix}: {len(wrong)} "
            f"part(s) missing or of the wrong size, first {wrong[0]}"
        )
    data = _serialize(doc)
    store.put_bytes(bucket, manifest_name(prefix), data, "application/json")
    return doc


def read_manifest(
    bucket: str,
    prefix: str,
    *,
    expected_sha256: str | None = None,
    store: ObjectStore | None = None,
) -> dict[str, Any]:
    """Read and validate ``<prefix>/manifest.json``.

    Raises :class:`ObjectNotFound` if there is none (no snapshot, or a partial one),
    :class:`SnapshotIntegrityError` if ``expected_sha256`` (from :func:`manifest_sha256` at
    write time) does not match, and :class:`ManifestError` if it is not a
    ``stasis.kernel/1`` manifest.
    """
    store = store or get_store()
    name = manifest_name(prefix)
    try:
        raw = store.get_bytes(bucket, name)
    except ObjectNotFound:
        raise ObjectNotFound(
            f"no manifest at gs://{bucket}/{name}: the snapshot does not exist or is partial"
        ) from None
    if expected_sha256 is not None:
        actual = hashlib.sha256(raw).hexdigest()
        if actual != expected_sha256:
            raise SnapshotIntegrityError(
                f"gs://{bucket}/{name} has sha256 {actual[:16]}..., the snapshot record says "
                f"{expected_sha256[:16]}...: the manifest was changed after it was written"
            )
    try:
        doc = json.loads(raw)
    except ValueError as error:
        raise ManifestError(f"gs://{bucket}/{name} is not JSON: {error}") from error
    if not isinstance(doc, dict):
        raise ManifestError(f"gs://{bucket}/{name} is not a JSON object")
    try:
        normalize_manifest(doc, prefix=prefix, now=datetime.now(UTC))
    except SnapshotError as error:
        raise ManifestError(f"gs://{bucket}/{name}: {error}") from error
    return doc


def delete_prefix(bucket: str, prefix: str, *, store: ObjectStore | None = None) -> int:
    """Delete every object in the folder of the snapshot at ``prefix`` (its manifest, and
    a ``/1`` snapshot's parts); return how many there were. Pool parts stay (retention's).

    The manifest goes first, so a snapshot whose deletion is interrupted is seen as
    partial, never as complete. Only ``<prefix>/...`` is touched: ``snap-1`` does not
    delete ``snap-10``.
    """
    store = store or get_store()
    folder = layout.normalize_prefix(prefix) + "/"
    names = list(store.list_objects(bucket, folder))
    manifest = manifest_name(prefix)
    deleted = 0
    if manifest in names:
        deleted += store.delete_objects(bucket, [manifest])
        names.remove(manifest)
    return deleted + store.delete_objects(bucket, names)
