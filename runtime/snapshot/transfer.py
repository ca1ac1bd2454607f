"""Moving a segment stream to and from its parts, in parallel, with a digest on every part.

Digests are BLAKE3 (``blake3``, the Rust implementation; SHA-256 where the module is
missing). Both are cryptographic hashes with 256-bit digests: a part verifies only if it
holds exactly the bytes that were captured, and since the manifest that lists the digests
is itself anchored by its SHA-256 in the control plane, planting other bytes would need a
BLAKE3 second preimage. BLAKE3 is used because it is about 2.7x faster than SHA-256 on one
core here (3 GB/s against 1.1 GB/s, SHA-NI included): a restore verifies every byte it
receives, and on two cores that hashing competed with the download itself.

Upload (:func:`upload_segments`): the supervising thread hashes the parts in order, on
one core (the digest is the part's name, see ``layout``); a part whose digest the caller
already has in the workspace's part pool (``reuse``) is not sent again, the others go to
worker threads, which send them from the memory views of the live buffers without copying
them, while the supervisor hashes the next parts. Download (:func:`download_segments`): each worker
receives its part straight into the restore buffers and hashes each slice as it lands; a
size or digest mismatch raises :class:`SnapshotIntegrityError` naming the object.

Device memory (a GPU tensor) is not addressable by the host: such a segment is a
:class:`DeviceSource` on capture and a :class:`DeviceSink` on restore, and moves through
host *staging* buffers one part at a time, at most ``streams + 1`` of them at once, so
capturing or restoring a 40 GB model needs ``(streams + 1) x part_bytes`` of host memory,
not 40 GB.

Deadlines are wall-clock epoch seconds because they cross processes (the driver sets
them, the kernel enforces them).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from threading import Event
from typing import Any, Protocol, TypeVar, runtime_checkable

from . import layout
from .errors import ManifestError, SnapshotIntegrityError, SnapshotTimeout, TransientStorageError
from .storage import ObjectStore

MAX_STREAMS = 8
Progress = Callable[[int, int], None]
#: Digest algorithms a part may carry, in the order an object's keys are looked up.
HASHES = ("blake3", "sha256")

_ATTEMPTS = 4
_BACKOFF_S = 0.5
_TICK_S = 0.2
_MMAP_FROM = 1024 * 1024

T = TypeVar("T")


@runtime_checkable
class DeviceSource(Protocol):
    """A capture segment in memory the host cannot address directly (a GPU storage)."""

    nbytes: int

    def read_into(self, offset: int, view: memoryview) -> None:
        """Copy bytes ``[offset, offset + len(view))`` of the segment into ``view``."""

    def staging(self, size: int) -> memoryview:
        """A writable host buffer of ``size`` bytes to stage parts through (pinned memory
        where the device has it)."""


@runtime_checkable
class DeviceSink(Protocol):
    """A restore segment that lives in device memory; what the unpickler gets is ``value``."""

    nbytes: int
    value: Any

    def write_from(self, offset: int, view: memoryview) -> None:
        """Copy ``view`` (verified bytes) into the segment at ``offset``."""

    def staging(self, size: int) -> memoryview: ...


Segment = memoryview | DeviceSource
Restored = bytearray | mmap.mmap | DeviceSink


def capture_hash() -> str:
    """The digest new parts get: ``blake3`` when the module is there, else ``sha256``."""
    try:
        import blake3  # noqa: F401
    except ImportError:
        return "sha256"
    return "blake3"


def new_hasher(algorithm: str) -> Any:
    """A hashlib-style object for ``algorithm``, on one thread: a capture hashes ahead of
    its uploads at about 3 GB/s, over ten times what the storage takes, and BLAKE3 on every
    core took the cores the server and the sends need (capture of 1 GiB, best of 3: 2.37 s
    on every core, 2.22 s on one, bench/pause_resume.py)."""
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError:
            raise ManifestError(
                "this snapshot's parts carry BLAKE3 digests and this kernel lacks the "
                "'blake3' package: install it to restore"
            ) from None
        return blake3.blake3(max_threads=1)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ManifestError(f"unknown part digest {algorithm!r}")


def digest_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(algorithm, hex digest)`` recorded for one stored object."""
    for algorithm in HASHES:
        value = obj.get(algorithm)
        if isinstance(value, str):
            return algorithm, value
    raise ManifestError(f"object {obj.get('name')!r} carries no digest")


def default_streams(direction: str = "download") -> int:
    """Parallel transfers when the caller does not say: between 2 and 8, by cores.

    Downloads hash in the worker threads, so streams beyond the cores only contend.
    Uploads wait on the server while the supervisor hashes, so they keep at least 4
    streams in flight (4 streams were 5-10% faster than 2 on this 2-core host).
    """
    cores = os.cpu_count() or 2
    floor = 4 if direction == "upload" else 2
    return max(floor, min(MAX_STREAMS, cores))


class _Stopped(Exception):
    """A worker noticed that the transfer was abandoned."""


def check_deadline(deadline: float | None, what: str) -> None:
    """Raise :class:`SnapshotTimeout` if ``deadline`` (epoch seconds) has passed."""
    if deadline is not None and time.time() > deadline:
        raise SnapshotTimeout(f"{what}: deadline passed")


def _retrying(call: Callable[[], T], *, stop: Event, deadline: float | None) -> T:
    for attempt in range(_ATTEMPTS):
        try:
            return call()
        except TransientStorageError:
            out_of_time = deadline is not None and time.time() + _BACKOFF_S > deadline
            if attempt == _ATTEMPTS - 1 or stop.is_set() or out_of_time:
                raise
            stop.wait(_BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")


class _Meter:
    """Per-part byte counters summed by the supervising thread (no lock needed)."""

    def __init__(self, parts: int, total: int, progress: Progress | None) -> None:
        self.counts = [0] * parts
        self.total = total
        self._progress = progress
        self._last = -1

    def tick(self) -> None:
        if self._progress is None:
            return
        done = sum(self.counts)
        if done != self._last:
            self._last = done
            self._progress(done, self.total)

    def finish(self) -> None:
        if self._progress is not None and self._last != self.total:
            self._last = self.total
            self._progress(self.total, self.total)


class _Staging:
    """At most ``slots`` host buffers for parts that pass through host memory."""

    def __init__(self, slots: int, make: Callable[[], memoryview]) -> None:
        self._free: queue.Queue[memoryview] = queue.Queue()
        self._make = make
        self._made = 0
        self._slots = slots

    def take(self, stop: Event, deadline: float | None, what: str) -> memoryview:
        while True:
            try:
                return self._free.get_nowait()
            except queue.Empty:
                if self._made < self._slots:
                    self._made += 1
                    return self._make()
            try:
                return self._free.get(timeout=_TICK_S)
            except queue.Empty:
                if stop.is_set():
                    raise _Stopped from None
                check_deadline(deadline, what)

    def give(self, buffer: memoryview) -> None:
        self._free.put(buffer)


def _raise_first_error(futures: set[Future[Any]]) -> set[Future[Any]]:
    """The futures still running; the first error of a finished one is raised."""
    running = set()
    for future in futures:
        if not future.done():
            running.add(future)
        elif future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return running


@contextlib.contextmanager
def _workers(streams: int, stop: Event) -> Iterator[ThreadPoolExecutor]:
    """A pool whose workers are told to stop, and drained, before an error propagates,
    so no thread still reads or writes buffers the caller is about to drop."""
    pool = ThreadPoolExecutor(max(1, streams), "stasis-transfer")
    try:
        yield pool
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _wait_all(pending: set[Future[Any]], meter: _Meter, deadline: float | None,
              what: str) -> None:
    while pending:
        done, pending = wait(pending, timeout=_TICK_S, return_when=FIRST_EXCEPTION)
        meter.tick()
        _raise_first_error(done)
        if pending:
            check_deadline(deadline, what)


@dataclass
class Uploaded:
    """What :func:`upload_segments` stored: the objects for the kernel entry, and how
    much of it was sent (the rest was already in the pool)."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    sent_bytes: int = 0
    sent_parts: int = 0
    reused_bytes: int = 0


def upload_segments(
    store: ObjectStore,
    bucket: str,
    pool: str,
    segments: Sequence[Segment],
    *,
    reuse: Mapping[str, int] | None = None,
    part_bytes: int = layout.DEFAULT_PART_BYTES,
    streams: int | None = None,
    deadline: float | None = None,
    progress: Progress | None = None,
    algorithm: str | None = None,
) -> Uploaded:
    """Store ``segments`` as content-addressed parts under ``pool``.

    ``reuse`` maps digests of parts known to be in the pool (those of the snapshot this
    one follows) to their sizes: such parts are not sent again. Returns the objects for
    the kernel entry in stream order.
    """
    algorithm = algorithm or capture_hash()
    reuse = reuse or {}
    sizes = [s.nbytes for s in segments]
    offsets = layout.segment_offsets(sizes)
    device = {i for i, s in enumerate(segments) if not isinstance(s, memoryview)}
    parts = layout.plan_parts(sizes, part_bytes, alone=device)
    meter = _Meter(len(parts), sum(sizes), progress)
    streams = streams or default_streams("upload")
    stop = Event()
    what = f"upload to gs://{bucket}/{pool}"
    result = Uploaded()
    staging: _Staging | None = None
    if device:
        first = segments[min(device)]
        assert isinstance(first, DeviceSource)
        staging = _Staging(streams + 1, lambda: first.staging(part_bytes))

    def materialize(part: layout.Part) -> tuple[list[memoryview], memoryview | None]:
        spans = layout.pieces(sizes, offsets, part.offset, part.size)
        segment, lo, hi = spans[0]
        source = segments[segment]
        if isinstance(source, memoryview):
            return [segments[i][a:b] for i, a, b in spans], None  # type: ignore[index]
        assert staging is not None and len(spans) == 1
        slot = staging.take(stop, deadline, what)
        view = slot[: hi - lo]
        source.read_into(lo, view)
        return [view], slot

    def send(part: layout.Part, name: str, chunks: list[memoryview],
             slot: memoryview | None) -> None:
        try:
            if stop.is_set():
                raise _Stopped

            def attempt() -> None:
                meter.counts[part.index] = 0

                def sent(piece: memoryview) -> None:
                    meter.counts[part.index] += piece.nbytes

                if store.upload_chunks(bucket, name, chunks, on_piece=sent) != part.size:
                    raise TransientStorageError(f"upload gs://{bucket}/{name}: body cut short")

            _retrying(attempt, stop=stop, deadline=deadline)
            meter.counts[part.index] = part.size
        finally:
            if slot is not None and staging is not None:
                staging.give(slot)

    with _workers(streams, stop) as workers:
        pending: set[Future[None]] = set()
        for part in parts:
            pending = _raise_first_error(pending)
            meter.tick()
            check_deadline(deadline, what)
            chunks, slot = materialize(part)
            digest = new_hasher(algorithm)
            for chunk in chunks:
                digest.update(chunk)
            hexdigest = digest.hexdigest()
            name = layout.part_name(pool, hexdigest)
            result.objects.append({"name": name, "offset": part.offset, "bytes": part.size,
                                   algorithm: hexdigest})
            if reuse.get(hexdigest) == part.size:
                meter.counts[part.index] = part.size
                result.reused_bytes += part.size
                if slot is not None and staging is not None:
                    staging.give(slot)
                continue
            result.sent_bytes += part.size
            result.sent_parts += 1
            pending.add(workers.submit(send, part, name, chunks, slot))
            if len(pending) >= 2 * streams:  # hash ahead of the uploads, not of memory
                wait(pending, timeout=_TICK_S, return_when=FIRST_COMPLETED)
                pending = _raise_first_error(pending)
        _wait_all(pending, meter, deadline, what)
    meter.finish()
    return result


def allocate(size: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``size`` bytes for a restored segment.

    Large ones are anonymous mappings: their pages are zero and untouched until the
    download writes them, where ``bytearray(n)`` would first write every byte (about
    0.7 s per GiB here) and then the download would write it again.
    """
    if size < _MMAP_FROM:
        return bytearray(size)
    buffer = mmap.mmap(-1, size)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # THP disabled: plain pages work too
            buffer.madvise(advice)
    return buffer


def download_segments(
    store: ObjectStore,
    bucket: str,
    objects: Sequence[Mapping[str, Any]],
    sizes: Sequence[int],
    *,
    sinks: Mapping[int, DeviceSink] | None = None,
    buffers: Sequence[Restored] | None = None,
    streams: int | None = None,
    deadline: float | None = None,
    progress: Progress | None = None,
) -> list[Restored]:
    """Fetch ``objects`` into new buffers shaped by ``sizes``; verify every part's digest.

    Segments named in ``sinks`` are filled through staging buffers instead (device
    memory); the returned list holds the sink there. ``buffers`` (one writable buffer of
    the right size per segment, e.g. mapped files, ``staging``) replace the new ones. Raises
    :class:`SnapshotIntegrityError` (naming the object) on the first part whose size or
    digest differs from ``objects``; nothing is returned then.
    """
    sinks = sinks or {}
    total = sum(sizes)
    layout.check_objects(objects, total)  # type: ignore[arg-type]
    digests = [digest_of(obj) for obj in objects]
    for index, sink in sinks.items():
        if sink.nbytes != sizes[index]:
            raise ManifestError(f"segment {index} has {sizes[index]} bytes, its sink {sink.nbytes}")
    if buffers is not None and [memoryview(b).nbytes for b in buffers] != list(sizes):
        raise ManifestError("the buffers given do not match the segments' sizes")
    restored: list[Restored] = (list(buffers) if buffers is not None else
                                [sinks.get(i) or allocate(size) for i, size in enumerate(sizes)])
    views = [memoryview(b) if not isinstance(b, DeviceSink) else memoryview(b"")
             for b in restored]
    offsets = layout.segment_offsets(sizes)
    meter = _Meter(len(objects), total, progress)
    streams = streams or default_streams("download")
    stop = Event()
    what = f"download from gs://{bucket}"
    staging: _Staging | None = None
    if sinks:
        first = next(iter(sinks.values()))
        part = max((int(o["bytes"]) for o in objects), default=0)
        staging = _Staging(streams, lambda: first.staging(part))

    def fetch(index: int, obj: Mapping[str, Any]) -> None:
        if stop.is_set():
            raise _Stopped
        name, size = str(obj["name"]), int(obj["bytes"])
        algorithm, expected = digests[index]
        spans = layout.pieces(sizes, offsets, int(obj["offset"]), size)
        sink = sinks.get(spans[0][0])
        slot = staging.take(stop, deadline, what) if sink is not None and staging else None
        try:
            targets = ([slot[:size]] if slot is not None
                       else [views[i][lo:hi] for i, lo, hi in spans])

            def attempt() -> tuple[int, str]:
                digest = new_hasher(algorithm)
                meter.counts[index] = 0

                def landed(view: memoryview) -> None:
                    if stop.is_set():
                        raise _Stopped
                    digest.update(view)
                    meter.counts[index] += view.nbytes

                received = store.download_into(bucket, name, targets, on_data=landed)
                return received, digest.hexdigest()

            received, actual = _retrying(attempt, stop=stop, deadline=deadline)
            if received != size:
                raise SnapshotIntegrityError(
                    f"object gs://{bucket}/{name} has {received} bytes, the snapshot recorded "
                    f"{size}: the snapshot is damaged"
                )
            if actual != expected:
                raise SnapshotIntegrityError(
                    f"object gs://{bucket}/{name} has {algorithm} {actual[:16]}..., the "
                    f"snapshot recorded {expected[:16]}...: the snapshot is damaged"
                )
            if sink is not None and slot is not None:
                _segment, lo, _hi = spans[0]
                sink.write_from(lo, slot[:size])  # verified bytes only reach the device
        finally:
            if slot is not None and staging is not None:
                staging.give(slot)

    try:
        with _workers(streams, stop) as workers:
            futures = {workers.submit(fetch, i, o) for i, o in enumerate(objects)}
            _wait_all(futures, meter, deadline, what)
    finally:
        for view in views:
            view.release()
    meter.finish()
    return restored
