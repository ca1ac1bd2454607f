"""A kernel's restore downloaded ahead, outside the kernel, into files the kernel maps.

A resume used to wait for the new kernel to start (its interpreter and ipykernel, most of
a second here) and only then download the snapshot from inside it. Both can happen at
once: while the server and the kernel start, the driver (the node agent) downloads each
segment of a kernel entry into a file of its own in a private directory on shared memory
(``/dev/shm``: memory, not a disk that the kernel's writes to its arrays would be flushed
to; the agent's ``restore_staging``), verifying every part's digest as it lands
(``transfer.download_segments``, the same code the kernel would run). The kernel then
maps those files (``MAP_SHARED``: the restored arrays live in the very pages that were
downloaded, nothing is copied) and unlinks them, so the memory is the kernel's alone and
goes when its objects do.

Still safe: the bytes are the ones whose BLAKE3 digests the manifest lists, and the
manifest is the one whose sha256 the control plane recorded (``open_snapshot`` refused any
other before this runs); a part that differs raises :class:`SnapshotIntegrityError` here
and nothing reaches a kernel. The directory is the workspace's (mode 0700, created new for
each restore) and nothing of the workspace runs before its kernel maps the files.

Not staged (the kernel downloads as before): an entry with device arrays (they go
straight to the device through bounded staging buffers, ``transfer.DeviceSink``) and an
entry larger than what shared memory has free.

- :func:`stage` (driver side): download an entry into a directory; the file paths, or
  None when the entry is not staged.
- :func:`load` (kernel side): map the files back as the restore buffers; they are
  unlinked at once.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import transfer
from .errors import ManifestError
from .storage import ObjectStore

#: Room left in shared memory for everything else on the host.
_HEADROOM = 256 * 1024 * 1024


def stageable(entry: Mapping[str, Any], directory: Path) -> bool:
    """Whether ``entry`` can be staged under ``directory``: only host buffers, and room."""
    if any(entry.get("placements") or []):
        return False
    need = sum(int(size) for size in entry.get("segments") or [])
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return False
    return need + _HEADROOM <= free


def stage(
    store: ObjectStore,
    bucket: str,
    entry: Mapping[str, Any],
    directory: Path,
    *,
    streams: int | None = None,
    deadline: float | None = None,
    progress: transfer.Progress | None = None,
    uid: int | None = None,
) -> list[str] | None:
    """Download ``entry``'s segments into new files under ``directory`` (which must exist
    and be private), every part verified; the paths in segment order, or None when the
    entry is not staged (``stageable``). ``uid``: the files are that user's (the
    workspace's kernel runs as it). Raises what ``download_segments`` raises, after
    removing the files it made."""
    if not stageable(entry, directory):
        return None
    sizes = [int(size) for size in entry["segments"]]
    paths = [directory / f"segment-{index}" for index in range(len(sizes))]
    buffers: list[Any] = []
    try:
        for path, size in zip(paths, sizes, strict=True):
            buffers.append(_create(path, size, uid))
        transfer.download_segments(store, bucket, entry["objects"], sizes, buffers=buffers,
                                   streams=streams, deadline=deadline, progress=progress)
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    finally:
        for buffer in buffers:
            if isinstance(buffer, mmap.mmap):
                # After a failure a worker's slice may outlive the call: the map then
                # goes with it (its file is already unlinked).
                with contextlib.suppress(BufferError):
                    buffer.close()
    return [str(path) for path in paths]


def load(paths: Sequence[str], sizes: Sequence[int]) -> list[bytearray | mmap.mmap]:
    """The staged segments as writable buffers, in order; each file is unlinked once
    mapped. Raises :class:`ManifestError` when a file is missing or has another size."""
    if len(paths) != len(sizes):
        raise ManifestError(f"{len(paths)} staged files for {len(sizes)} segments")
    buffers: list[bytearray | mmap.mmap] = []
    try:
        for path, size in zip(paths, sizes, strict=True):
            buffers.append(_open(path, size))
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return buffers


def _create(path: Path, size: int, uid: int | None) -> bytearray | mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if uid is not None:
            os.fchown(fd, uid, uid)
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size) if size else bytearray()
    finally:
        os.close(fd)


def _open(path: str, size: int) -> bytearray | mmap.mmap:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as error:
        raise ManifestError(f"staged segment {path} cannot be opened: {error}") from error
    try:
        found = os.fstat(fd).st_size
        if found != size:
            raise ManifestError(f"staged segment {path} has {found} bytes, expected {size}")
        return mmap.mmap(fd, size) if size else bytearray()
    finally:
        os.close(fd)

