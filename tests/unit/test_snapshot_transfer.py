"""Parallel part transfer (runtime.snapshot.transfer) against an in-memory fake store:
content-addressed parts and their digests, reuse, device segments staged through bounded
host buffers, retries of transient failures, integrity errors, deadlines."""

from __future__ import annotations

import hashlib
import mmap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import blake3
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
POOL = "snapshots/t/t--ws/_parts"


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "_BACKOFF_S", 0.001)


def upload(store: FakeStore, segments: Sequence[Any] | None = None,
           **kwargs: Any) -> transfer.Uploaded:
    views = segments if segments is not None else [memoryview(s) for s in SEGMENTS]
    return transfer.upload_segments(store, "bkt", POOL, views, **kwargs)  # type: ignore[arg-type]


def download(store: FakeStore, objects: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    sizes = [len(s) for s in SEGMENTS]
    return transfer.download_segments(store, "bkt", objects, sizes, **kwargs)  # type: ignore[arg-type]


def name_of(chunk: bytes) -> str:
    return f"{POOL}/{blake3.blake3(chunk).hexdigest()}"


def test_segments_are_cut_into_parts_named_by_their_digest_and_come_back() -> None:
    store = FakeStore()
    seen: list[tuple[int, int]] = []
    uploaded = upload(store, part_bytes=16, streams=3, progress=lambda d, t: seen.append((d, t)))

    stream = b"".join(SEGMENTS)
    # The pickle stream alone, the 25-byte buffer from its own start, the last one alone.
    assert [(o["offset"], o["bytes"]) for o in uploaded.objects] == [
        (0, 10), (10, 16), (26, 9), (35, 7)]
    for obj in uploaded.objects:
        chunk = stream[obj["offset"] : obj["offset"] + obj["bytes"]]
        assert obj["blake3"] == blake3.blake3(chunk).hexdigest()
        assert obj["name"] == name_of(chunk)
        assert store.objects[obj["name"]] == chunk
    assert uploaded.sent_bytes == 42 and uploaded.reused_bytes == 0
    assert seen[-1] == (42, 42)

    buffers = download(store, uploaded.objects, streams=2)
    assert [bytes(b) for b in buffers] == SEGMENTS


def test_parts_the_pool_has_are_not_sent_again() -> None:
    store = FakeStore()
    first = upload(store, part_bytes=16)
    reuse = {o["blake3"]: o["bytes"] for o in first.objects}
    store.requests.clear()

    changed = [memoryview(b"q" * 12), *(memoryview(s) for s in SEGMENTS[1:])]
    second = upload(store, changed, part_bytes=16, reuse=reuse)

    assert store.requests == [name_of(b"q" * 12)]  # only the changed pickle stream
    assert second.sent_bytes == 12 and second.reused_bytes == 32
    assert [o["name"] for o in second.objects][1:] == [o["name"] for o in first.objects][1:]
    # A digest known with another size is not trusted: the part is sent.
    wrong = {**reuse, first.objects[1]["blake3"]: 3}
    store.requests.clear()
    upload(store, part_bytes=16, reuse=wrong)
    assert store.requests == [first.objects[1]["name"]]


def test_sha256_parts_of_older_snapshots_still_verify() -> None:
    store = FakeStore()
    store.objects["old/part-00000"] = b"".join(SEGMENTS)
    objects = [{"name": "old/part-00000", "offset": 0, "bytes": 42,
                "sha256": hashlib.sha256(b"".join(SEGMENTS)).hexdigest()}]
    assert [bytes(b) for b in download(store, objects)] == SEGMENTS


class ArraySource:
    """A device segment stand-in: host bytes that can only be read by copying."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.nbytes = len(data)
        self.staged: list[int] = []
        self.lock = threading.Lock()
        self.in_use = 0
        self.peak = 0

    def read_into(self, offset: int, view: memoryview) -> None:
        view[:] = self.data[offset : offset + len(view)]

    def staging(self, size: int) -> memoryview:
        self.staged.append(size)
        return memoryview(bytearray(size))


class ArraySink:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.value = bytearray(nbytes)
        self.staged: list[int] = []

    def write_from(self, offset: int, view: memoryview) -> None:
        self.value[offset : offset + len(view)] = view

    def staging(self, size: int) -> memoryview:
        self.staged.append(size)
        return memoryview(bytearray(size))


def test_device_segments_move_through_a_bounded_number_of_staging_buffers() -> None:
    store = FakeStore()
    device = ArraySource(bytes(range(256)) * 40)  # 10240 bytes, 40 parts of 256
    segments = [memoryview(b"stream"), device]
    uploaded = upload(store, segments, part_bytes=256, streams=3)

    assert len(device.staged) <= 3 + 1, "more staging buffers than streams + 1"
    assert all(size == 256 for size in device.staged)
    assert len(uploaded.objects) == 41
    sink = ArraySink(device.nbytes)
    restored = transfer.download_segments(
        store, "bkt", uploaded.objects, [6, device.nbytes], sinks={1: sink}, streams=2)  # type: ignore[arg-type]
    assert restored[1] is sink and bytes(sink.value) == device.data
    assert bytes(restored[0]) == b"stream"
    assert len(sink.staged) <= 2


def test_a_damaged_device_part_never_reaches_the_device() -> None:
    store = FakeStore()
    device = ArraySource(b"d" * 1024)
    uploaded = upload(store, [memoryview(b"s"), device], part_bytes=256)
    store.objects[uploaded.objects[2]["name"]] = b"x" * 256
    sink = ArraySink(1024)
    with pytest.raises(SnapshotIntegrityError):
        transfer.download_segments(store, "bkt", uploaded.objects, [1, 1024], sinks={1: sink})  # type: ignore[arg-type]
    assert b"x" not in sink.value


def test_transient_failures_are_retried() -> None:
    store = FakeStore()
    store.flaky[name_of(SEGMENTS[1][:16])] = 2
    objects = upload(store, part_bytes=16).objects
    assert store.requests.count(name_of(SEGMENTS[1][:16])) == 3
    store.flaky[objects[0]["name"]] = 1
    assert [bytes(b) for b in download(store, objects)] == SEGMENTS


def test_a_failure_that_persists_is_raised() -> None:
    store = FakeStore()
    store.flaky[name_of(SEGMENTS[0])] = 10
    with pytest.raises(TransientStorageError, match=name_of(SEGMENTS[0])):
        upload(store, part_bytes=16)


def test_a_changed_part_is_an_integrity_error_naming_it() -> None:
    store = FakeStore()
    objects = upload(store, part_bytes=16).objects
    victim = objects[1]["name"]
    store.objects[victim] = b"x" * 16
    with pytest.raises(SnapshotIntegrityError, match=f"{victim} has blake3"):
        download(store, objects)
    store.objects[victim] = b"x" * 15
    with pytest.raises(SnapshotIntegrityError, match=f"{victim} has 15 bytes"):
        download(store, objects)


def test_a_missing_part_is_reported() -> None:
    store = FakeStore()
    objects = upload(store, part_bytes=16).objects
    del store.objects[objects[2]["name"]]
    with pytest.raises(ObjectNotFound, match=objects[2]["name"]):
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


def test_torch_device_storages_stage_through_registered_buffers_and_free_them() -> None:
    """The CUDA source and sink classes, driven with a CPU storage (``copy_`` is the same
    call for any device): what a GPU capture and restore run, short of the GPU."""
    torch = pytest.importorskip("torch")
    from runtime.snapshot import devices

    weights = torch.arange(50_000, dtype=torch.float32)
    source = devices._TorchCuda(weights.untyped_storage())
    store = FakeStore()
    uploaded = transfer.upload_segments(store, "bkt", POOL, [memoryview(b"main"), source],
                                        part_bytes=16 * 1024, streams=2)  # type: ignore[arg-type]
    assert len(uploaded.objects) == 1 + 13  # 200 000 bytes in 16 KiB parts
    sink = devices._TorchCudaSink("cpu", source.nbytes)
    transfer.download_segments(store, "bkt", uploaded.objects, [4, source.nbytes],  # type: ignore[arg-type]
                               sinks={1: sink}, streams=2)
    back = torch.empty(0, dtype=torch.float32).set_(sink.value.untyped_storage(), 0,
                                                   (50_000,), (1,))
    assert torch.equal(back, weights)
    assert len(devices._PINNED._buffers) == 0  # staging buffers die with the transfer
