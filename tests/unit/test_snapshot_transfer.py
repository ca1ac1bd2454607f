"""Parallel part transfer (runtime.snapshot.transfer) against an in-memory fake store:
parts and hashes, retries of transient failures, integrity errors, deadlines."""

from __future__ import annotations

import hashlib
import mmap
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from runtime.snapshot import transfer
from runtime.snapshot.errors import (
    ObjectNotFound,
    SnapshotIntegrityError,
    SnapshotTimeout,
    TransientStorageError,
)


class FakeStore:
    """Objects in a dict; `flaky[name]` transient failures before a request succeeds."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.flaky: dict[str, int] = {}
        self.requests: list[str] = []

    def _maybe_fail(self, name: str) -> None:
        self.requests.append(name)
        if self.flaky.get(name, 0) > 0:
            self.flaky[name] -= 1
            raise TransientStorageError(f"{name}: connection reset")

    def upload_chunks(
        self,
        bucket: str,
        name: str,
        chunks: Sequence[memoryview],
        *,
        on_piece: Callable[[memoryview], None] | None = None,
    ) -> int:
        self._maybe_fail(name)
        for chunk in chunks:
            if on_piece is not None:
                on_piece(chunk)
        self.objects[name] = b"".join(bytes(c) for c in chunks)
        return len(self.objects[name])

    def download_into(
        self,
        bucket: str,
        name: str,
        targets: Sequence[memoryview],
        *,
        on_data: Callable[[memoryview], None],
    ) -> int:
        self._maybe_fail(name)
        if name not in self.objects:
            raise ObjectNotFound(f"gs://{bucket}/{name} does not exist")
        data, position = self.objects[name], 0
        for target in targets:
            n = min(len(target), len(data) - position)
            target[:n] = data[position : position + n]
            on_data(target[:n])
            position += n
        return len(data)


SEGMENTS = [b"p" * 10, b"a" * 25, b"", b"b" * 7]


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "_BACKOFF_S", 0.001)


def upload(store: FakeStore, **kwargs: Any) -> list[dict[str, Any]]:
    views = [memoryview(s) for s in SEGMENTS]
    return transfer.upload_segments(store, "bkt", "snap/k", views, **kwargs)  # type: ignore[arg-type]


def download(store: FakeStore, objects: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    sizes = [len(s) for s in SEGMENTS]
    return transfer.download_segments(store, "bkt", objects, sizes, **kwargs)  # type: ignore[arg-type]


def test_segments_are_cut_into_hashed_parts_and_come_back() -> None:
    store = FakeStore()
    seen: list[tuple[int, int]] = []
    objects = upload(store, part_bytes=16, streams=3, progress=lambda d, t: seen.append((d, t)))

    stream = b"".join(SEGMENTS)
    assert [(o["name"], o["offset"], o["bytes"]) for o in objects] == [
        ("snap/k/part-00000", 0, 16),
        ("snap/k/part-00001", 16, 16),
        ("snap/k/part-00002", 32, 10),
    ]
    for obj in objects:
        chunk = stream[obj["offset"] : obj["offset"] + obj["bytes"]]
        assert obj["sha256"] == hashlib.sha256(chunk).hexdigest()
        assert store.objects[obj["name"]] == chunk
    assert seen[-1] == (42, 42)

    buffers = download(store, objects, streams=2)
    assert [bytes(b) for b in buffers] == SEGMENTS


def test_transient_failures_are_retried() -> None:
    store = FakeStore()
    store.flaky["snap/k/part-00001"] = 2
    objects = upload(store, part_bytes=16)
    assert store.requests.count("snap/k/part-00001") == 3
    store.flaky["snap/k/part-00000"] = 1
    assert [bytes(b) for b in download(store, objects)] == SEGMENTS


def test_a_failure_that_persists_is_raised() -> None:
    store = FakeStore()
    store.flaky["snap/k/part-00000"] = 10
    with pytest.raises(TransientStorageError, match="part-00000"):
        upload(store, part_bytes=16)


def test_a_changed_part_is_an_integrity_error_naming_it() -> None:
    store = FakeStore()
    objects = upload(store, part_bytes=16)
    store.objects["snap/k/part-00001"] = b"x" * 16
    with pytest.raises(SnapshotIntegrityError, match=r"part-00001 has sha256"):
        download(store, objects)
    store.objects["snap/k/part-00001"] = b"x" * 15
    with pytest.raises(SnapshotIntegrityError, match=r"part-00001 has 15 bytes"):
        download(store, objects)


def test_a_missing_part_is_reported() -> None:
    store = FakeStore()
    objects = upload(store, part_bytes=16)
    del store.objects["snap/k/part-00002"]
    with pytest.raises(ObjectNotFound, match="part-00002"):
        download(store, objects)


def test_a_passed_deadline_stops_the_transfer() -> None:
    with pytest.raises(SnapshotTimeout, match="deadline"):
        transfer.check_deadline(time.time() - 1, "capture")
    transfer.check_deadline(None, "capture")
    transfer.check_deadline(time.time() + 60, "capture")


def test_restore_buffers_are_untouched_mappings_when_large() -> None:
    assert isinstance(transfer.allocate(10), bytearray)
    big = transfer.allocate(4 * 1024 * 1024)
    assert isinstance(big, mmap.mmap) and len(big) == 4 * 1024 * 1024


def test_default_streams_stay_in_bounds() -> None:
    assert 2 <= transfer.default_streams("download") <= transfer.MAX_STREAMS
    assert 4 <= transfer.default_streams("upload") <= transfer.MAX_STREAMS
