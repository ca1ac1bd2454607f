"""How a kernel snapshot's byte stream is cut into stored parts (runtime.snapshot.layout)."""

from __future__ import annotations

import pytest

from runtime.snapshot import layout


def test_parts_cover_the_stream_with_a_short_last_part() -> None:
    parts = layout.plan_parts(10, 4)
    assert [(p.index, p.offset, p.size) for p in parts] == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]
    assert layout.plan_parts(8, 4)[-1].size == 4
    assert layout.plan_parts(0, 4) == []


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
    assert layout.kernel_prefix("/team/ws/snap-1/", "k-1") == "team/ws/snap-1/k-1"
    assert layout.part_name("p/k", 7) == "p/k/part-00007"
    for bad in ("", "/", "a//b"):
        with pytest.raises(ValueError, match="prefix"):
            layout.normalize_prefix(bad)
    for bad in ("", "a/b", "../x", "x" * 200):
        with pytest.raises(ValueError, match="kernel id"):
            layout.kernel_prefix("p", bad)


def test_objects_must_tile_the_stream() -> None:
    good = [{"name": "a", "offset": 0, "bytes": 4}, {"name": "b", "offset": 4, "bytes": 2}]
    layout.check_objects(good, 6)
    with pytest.raises(ValueError, match="starts at 5"):
        layout.check_objects([good[0], {"name": "b", "offset": 5, "bytes": 1}], 6)
    with pytest.raises(ValueError, match="cover 6 bytes"):
        layout.check_objects(good, 7)
    with pytest.raises(ValueError, match="no valid offset"):
        layout.check_objects([{"name": "a", "offset": 0, "bytes": 0}], 0)
