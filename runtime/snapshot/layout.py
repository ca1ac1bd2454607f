"""How one kernel's snapshot is laid out in Cloud Storage. Pure: no I/O.

A capture produces a list of *segments*: segment 0 is the main pickle stream, the others
are the out-of-band buffers (large numpy arrays) in the order the pickle consumes them.
The segments are treated as one logical byte stream that is cut into fixed-size *parts*;
part ``i`` covers bytes ``[i * part_bytes, (i + 1) * part_bytes)`` of that stream and is
stored as the object ``<prefix>/<kernel-id>/part-<i>``.

Why one stream cut into equal parts rather than objects per buffer: every object costs a
request, so a namespace of a thousand 2 MiB arrays would cost a thousand requests, while
equal parts keep requests few and big and the parallel upload evenly loaded. A part that
spans two segments is sent from (and received into) both memory views directly, so the
cut costs no copy.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

FORMAT = "stasis.kernel/1"
DEFAULT_PART_BYTES = 32 * 1024 * 1024
MIN_PART_BYTES = 256 * 1024

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


def kernel_prefix(prefix: str, kernel_id: str) -> str:
    """Folder (without trailing slash) that holds one kernel's parts."""
    if not _KERNEL_ID.match(kernel_id):
        raise ValueError(f"invalid kernel id {kernel_id!r}: letters, digits, '.', '_', '-' only")
    return f"{normalize_prefix(prefix)}/{kernel_id}"


def part_name(folder: str, index: int) -> str:
    """Object name of part ``index`` under a kernel folder."""
    return f"{folder}/part-{index:05d}"


def plan_parts(total: int, part_bytes: int) -> list[Part]:
    """Cut a stream of ``total`` bytes into parts of ``part_bytes`` (the last may be short).

    An empty stream still gets no parts; a capture always has a non-empty pickle, so in
    practice there is at least one.
    """
    if part_bytes < 1:
        raise ValueError("part_bytes must be positive")
    return [
        Part(index=i, offset=offset, size=min(part_bytes, total - offset))
        for i, offset in enumerate(range(0, total, part_bytes))
    ]


def segment_offsets(sizes: Sequence[int]) -> list[int]:
    """Start offset of each segment in the logical stream."""
    return [0, *itertools.accumulate(sizes)][:-1] if sizes else []


def window(
    views: Sequence[memoryview], offsets: Sequence[int], start: int, size: int
) -> list[memoryview]:
    """Memory views (slices, no copies) that together cover ``[start, start + size)``.

    ``views`` are byte-format (``"B"``), one per segment; ``offsets`` from
    :func:`segment_offsets`. Empty segments are skipped.
    """
    out: list[memoryview] = []
    end = start + size
    i = max(bisect.bisect_right(offsets, start) - 1, 0)
    while start < end and i < len(views):
        seg_start = offsets[i]
        view = views[i]
        lo = start - seg_start
        hi = min(len(view), end - seg_start)
        if hi > lo:
            out.append(view[lo:hi])
            start += hi - lo
        i += 1
    if start != end:
        raise ValueError(f"window [{start}, {end}) runs past the end of the stream")
    return out


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
