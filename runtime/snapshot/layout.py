"""How one kernel's snapshot is laid out in Cloud Storage. Pure: no I/O.

A capture produces a list of *segments*: segment 0 is the main pickle stream, the others
are the large buffers (numpy arrays, torch storages, JAX arrays) the stream refers to.
The segments are treated as one logical byte stream that is cut into *parts*; each part
is a window ``[offset, offset + size)`` of that stream, stored as one object.

Parts are **content-addressed** and shared: a part is stored as
``<workspace>/_parts/<digest>`` (its BLAKE3 digest), so the next snapshot of the same
workspace stores only the parts whose bytes changed; the snapshot's manifest lists the
parts it uses. For that to work the cut must not move when something else changes, so it
follows the segments (:func:`plan_parts`): the pickle stream (which changes whenever any
variable does) is cut alone, a buffer of at least a quarter part is cut alone at multiples
of ``part_bytes`` from its own start, and only smaller buffers are packed together, so that
a thousand 1 MiB arrays still cost few, big requests. An array that did not change keeps
its parts and their digests, whatever happened to its neighbours; an array that did costs
its own parts, not a pack of others (measured, ``bench/incremental_snapshots.py``: with
64 arrays of 4 MiB, 1% changed re-sent 6.25% of the state when they were packed by four,
1.6% alone).

A part that spans two segments is sent from (and received into) both memory views
directly, so the cut costs no copy.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

FORMAT = "stasis.kernel/2"
#: Formats :func:`runtime.snapshot.manifest.read_manifest` still restores: ``/1`` stored
#: parts per snapshot (``<prefix>/<kernel>/part-N``) with a sha256 each.
READABLE_FORMATS = frozenset({FORMAT, "stasis.kernel/1"})
DEFAULT_PART_BYTES = 16 * 1024 * 1024
MIN_PART_BYTES = 256 * 1024
#: Above this many parts a kernel's parts grow (powers of two), so that a snapshot record
#: listing them stays far below Firestore's 1 MiB per document (4096 parts: about 64 GiB
#: at 16 MiB; a 140 GB model gets 64 MiB parts).
MAX_PARTS = 4096
#: The folder of a workspace's shared parts, beside its snapshot folders (an underscore
#: never begins a snapshot id).
POOL = "_parts"

_KERNEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Part:
    """One stored object: a window ``[offset, offset + size)`` of the segment stream."""

    index: int
    offset: int
    size: int


def normalize_prefix(prefix: str) -> str:
    """Return ``prefix`` without surrounding slashes; refuse an empty one.

    An empty prefix would make :func:`delete_prefix` empty the whole bucket.
    """
    cleaned = prefix.strip("/")
    if not cleaned or "//" in cleaned:
        raise ValueError(f"invalid snapshot prefix {prefix!r}: need a non-empty path")
    return cleaned


def check_kernel_id(kernel_id: str) -> str:
    if not _KERNEL_ID.match(kernel_id):
        raise ValueError(f"invalid kernel id {kernel_id!r}: letters, digits, '.', '_', '-' only")
    return kernel_id


def pool_prefix(prefix: str) -> str:
    """The folder (no trailing slash) of the shared parts of the snapshot at ``prefix``:
    ``snapshots/t/ws/snap-1`` -> ``snapshots/t/ws/_parts``."""
    head, _, _ = normalize_prefix(prefix).rpartition("/")
    return f"{head}/{POOL}" if head else POOL


def part_name(pool: str, digest: str) -> str:
    """Object name of the part whose content has ``digest``."""
    return f"{pool}/{digest}"


def part_bytes_for(total: int, part_bytes: int) -> int:
    """``part_bytes``, or the smallest power-of-two multiple of it that cuts ``total``
    bytes into at most :data:`MAX_PARTS` parts."""
    size = max(int(part_bytes), MIN_PART_BYTES)
    while total > size * MAX_PARTS:
        size *= 2
    return size


def plan_parts(
    sizes: Sequence[int], part_bytes: int, *, alone: Collection[int] = (),
    pack_below: int | None = None,
) -> list[Part]:
    """Cut the stream of segments of ``sizes`` into parts of at most ``part_bytes``.

    Segment 0 (the pickle stream), every segment of at least ``pack_below`` bytes (a
    quarter part by default), and the segments in ``alone`` (device memory, staged through
    host buffers part by part) start parts of their own, cut at multiples of
    ``part_bytes`` from their start. Smaller segments are packed together, in order, while
    a pack stays within ``part_bytes``. Empty segments get no part.
    """
    if part_bytes < 1:
        raise ValueError("part_bytes must be positive")
    pack_below = max(1, part_bytes // 4) if pack_below is None else pack_below
    parts: list[Part] = []
    pack_start, pack_size = 0, 0

    def close_pack() -> None:
        nonlocal pack_size
        if pack_size:
            parts.append(Part(len(parts), pack_start, pack_size))
        pack_size = 0

    for index, (start, size) in enumerate(zip(segment_offsets(sizes), sizes, strict=True)):
        if size == 0:
            continue
        if index == 0 or size >= pack_below or index in alone:
            close_pack()
            for offset in range(start, start + size, part_bytes):
                parts.append(Part(len(parts), offset, min(part_bytes, start + size - offset)))
            continue
        if pack_size and pack_size + size > part_bytes:
            close_pack()
        if not pack_size:
            pack_start = start
        pack_size += size
    close_pack()
    return parts


def segment_offsets(sizes: Sequence[int]) -> list[int]:
    """Start offset of each segment in the logical stream."""
    return [0, *itertools.accumulate(sizes)][:-1] if sizes else []


def pieces(
    sizes: Sequence[int], offsets: Sequence[int], start: int, size: int
) -> list[tuple[int, int, int]]:
    """The ``(segment, lo, hi)`` windows of segments that together cover
    ``[start, start + size)`` of the stream; empty segments are skipped."""
    out: list[tuple[int, int, int]] = []
    end = start + size
    i = max(bisect.bisect_right(offsets, start) - 1, 0)
    while start < end and i < len(sizes):
        lo = start - offsets[i]
        hi = min(sizes[i], end - offsets[i])
        if hi > lo:
            out.append((i, lo, hi))
            start += hi - lo
        i += 1
    if start != end:
        raise ValueError(f"window [{start}, {end}) runs past the end of the stream")
    return out


def window(
    views: Sequence[memoryview], offsets: Sequence[int], start: int, size: int
) -> list[memoryview]:
    """Memory views (slices, no copies) that together cover ``[start, start + size)``.

    ``views`` are byte-format (``"B"``), one per segment; ``offsets`` from
    :func:`segment_offsets`.
    """
    sizes = [len(v) for v in views]
    return [views[i][lo:hi] for i, lo, hi in pieces(sizes, offsets, start, size)]


def check_objects(objects: Sequence[dict[str, object]], total: int) -> None:
    """Raise ``ValueError`` unless ``objects`` tile ``[0, total)`` in order, gap-free."""
    position = 0
    for obj in objects:
        offset, size = obj.get("offset"), obj.get("bytes")
        if not isinstance(offset, int) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"object {obj.get('name')!r} has no valid offset/bytes")
        if offset != position:
            raise ValueError(f"object {obj.get('name')!r} starts at {offset}, expected {position}")
        position += size
    if position != total:
        raise ValueError(f"objects cover {position} bytes, the segments need {total}")
