"""How a kernel snapshot's byte stream is cut into stored parts (runtime.snapshot.layout)."""

from __future__ import annotations

import pytest

from runtime.snapshot import layout


def _cut(sizes: list[int], part_bytes: int, **kwargs: object) -> list[tuple[int, int]]:
    return [(p.offset, p.size) for p in layout.plan_parts(sizes, part_bytes, **kwargs)]  # type: ignore[arg-type]


def test_parts_cover_the_stream_with_a_short_last_part() -> None:
    parts = layout.plan_parts([10], 4)
    assert [(p.index, p.offset, p.size) for p in parts] == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]
    assert layout.plan_parts([8], 4)[-1].size == 4
    assert layout.plan_parts([0], 4) == [] == layout.plan_parts([], 4)


def test_large_segments_are_cut_from_their_own_start() -> None:
    # The pickle stream (3 bytes) alone; a 9-byte buffer cut at 0, 4, 8 of its own.
    assert _cut([3, 9], 4) == [(0, 3), (3, 4), (7, 4), (11, 1)]


def test_small_segments_are_packed_until_a_part_is_full() -> None:
    # stream | 1+2 packed | 3 (adding it would pass 4) | 5 cut alone | 2+1 packed
    assert _cut([2, 1, 2, 3, 5, 2, 1], 4, pack_below=4) == [
        (0, 2), (2, 3), (5, 3), (8, 4), (12, 1), (13, 3)]
    # A segment named alone (device memory) is never packed with its neighbours.
    assert _cut([2, 1, 1, 1], 4, alone={2}, pack_below=4) == [(0, 2), (2, 1), (3, 1), (4, 1)]
    # By default a quarter part is enough to stand alone.
    assert _cut([1, 1, 1, 3, 40, 4], 16) == [(0, 1), (1, 5), (6, 16), (22, 16), (38, 8), (46, 4)]


def test_a_change_elsewhere_does_not_move_an_array_s_parts() -> None:
    """Why the cut follows the segments: a bigger pickle stream (a new variable) or a
    neighbour that grew keeps the parts, hence the digests, of an unchanged array."""
    before = layout.plan_parts([100, 8, 40], 16)
    after = layout.plan_parts([130, 9, 40], 16)

    def array_parts(parts: list[layout.Part], start: int) -> list[tuple[int, int]]:
        return [(p.offset - start, p.size) for p in parts if p.offset >= start]

    assert array_parts(before, 108) == array_parts(after, 139) == [(0, 16), (16, 16), (32, 8)]


def test_part_bytes_grow_to_keep_few_parts() -> None:
    mib = 1024 * 1024
    assert layout.part_bytes_for(10 * mib, 16 * mib) == 16 * mib
    assert layout.part_bytes_for(100 * 1024 * mib, 16 * mib) == 32 * mib
    assert layout.part_bytes_for(140 * 1000 * mib, 16 * mib) == 64 * mib
    assert layout.part_bytes_for(1, 1) == layout.MIN_PART_BYTES


def test_segment_offsets() -> None:
    assert layout.segment_offsets([3, 0, 5]) == [0, 3, 3]
    assert layout.segment_offsets([]) == []


@pytest.mark.parametrize(
    ("start", "size", "expected"),
    [
        (0, 3, [b"abc"]),
        (2, 4, [b"c", b"def"]),  # spans the first two segments
        (5, 4, [b"f", b"ghi"]),  # skips the empty segment
        (0, 9, [b"abc", b"def", b"ghi"]),
        (8, 1, [b"i"]),
    ],
)
def test_window_slices_across_segments_without_copying(
    start: int, size: int, expected: list[bytes]
) -> None:
    backing = [bytearray(b"abc"), bytearray(b"def"), bytearray(), bytearray(b"ghi")]
    views = [memoryview(b) for b in backing]
    offsets = layout.segment_offsets([len(b) for b in backing])
    got = layout.window(views, offsets, start, size)
    assert [bytes(v) for v in got] == expected
    got[0][0:1] = b"X"  # a view, not a copy
    assert b"X" in b"".join(bytes(b) for b in backing)


def test_window_past_the_end_is_refused() -> None:
    views = [memoryview(b"abc")]
    with pytest.raises(ValueError, match="past the end"):
        layout.window(views, [0], 2, 5)


def test_names_and_prefixes() -> None:
    assert layout.pool_prefix("/snapshots/t/t--ws/snap-1/") == "snapshots/t/t--ws/_parts"
    assert layout.pool_prefix("snap-1") == "_parts"
    assert layout.part_name("snapshots/t/t--ws/_parts", "ab12") == "snapshots/t/t--ws/_parts/ab12"
    for bad in ("", "/", "a//b"):
        with pytest.raises(ValueError, match="prefix"):
            layout.normalize_prefix(bad)
    assert layout.check_kernel_id("k-1.x") == "k-1.x"
    for bad in ("", "a/b", "../x", "x" * 200):
        with pytest.raises(ValueError, match="kernel id"):
            layout.check_kernel_id(bad)


def test_objects_must_tile_the_stream() -> None:
    good = [{"name": "a", "offset": 0, "bytes": 4}, {"name": "b", "offset": 4, "bytes": 2}]
    layout.check_objects(good, 6)
    with pytest.raises(ValueError, match="starts at 5"):
        layout.check_objects([good[0], {"name": "b", "offset": 5, "bytes": 1}], 6)
    with pytest.raises(ValueError, match="cover 6 bytes"):
        layout.check_objects(good, 7)
    with pytest.raises(ValueError, match="no valid offset"):
        layout.check_objects([{"name": "a", "offset": 0, "bytes": 0}], 0)
