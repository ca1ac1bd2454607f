"""The kernel-state snapshot agent against real ipykernel kernels and a real fake-gcs-server.

Kernels are started with jupyter_client's KernelManager; fake-gcs-server is the session's
`gcs_emulator` (tests/conftest.py). Every kernel started here is shut down at teardown.
Nothing is mocked: capture runs in the kernel, parts travel through the emulator, restore
runs in a second kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

from runtime.snapshot import (
    FORMAT,
    KernelUnavailable,
    ManifestError,
    ObjectNotFound,
    RestoreFailed,
    RestoreRefused,
    SnapshotIntegrityError,
    SnapshotTimeout,
    delete_prefix,
    manifest_sha256,
    read_manifest,
    restore_kernel,
    reusable_parts,
    snapshot_kernel,
    write_manifest,
)
from runtime.snapshot.kernels import stage_kernel
from runtime.snapshot.layout import pool_prefix
from runtime.snapshot.storage import ObjectStore
from runtime.snapshot.transfer import default_streams

MiB = 1024 * 1024


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(gcs_emulator: Any) -> ObjectStore:
    return ObjectStore(emulator_host=gcs_emulator.url)


@pytest.fixture(scope="module")
def bucket(store: ObjectStore) -> str:
    name = f"snapshots-{uuid.uuid4().hex[:10]}"
    store.client.create_bucket(name)
    return name


@pytest.fixture
def emulator(gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The driver hands the kernel the emulator from STORAGE_EMULATOR_HOST."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    return str(gcs_emulator.url)


class Kernel:
    """A real kernel and a client for the test's own cells."""

    def __init__(self, manager: KernelManager, client: BlockingKernelClient) -> None:
        self.manager = manager
        self.client = client

    @property
    def connection_file(self) -> str:
        return str(self.manager.connection_file)

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.process.pid)  # type: ignore[union-attr]

    def wait_dead(self) -> None:
        self.manager.provisioner.process.wait(10)  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 120) -> str:
        """Run a cell (without touching history) and return its stdout; fail on error."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = self.client.execute_interactive(
            code, store_history=False, timeout=timeout, output_hook=hook
        )
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def value(self, expression: str) -> Any:
        """JSON value of an expression evaluated in the kernel."""
        return json.loads(self.run(f"print(__import__('json').dumps({expression}))"))

    def names(self) -> list[str]:
        return self.value("sorted(globals())")


@pytest.fixture
def start_kernel(tmp_path: Path) -> Iterator[Callable[[], Kernel]]:
    started: list[Kernel] = []

    def start() -> Kernel:
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
        kernel = Kernel(manager, client)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.client.stop_channels()
        if kernel.manager.has_kernel:
            kernel.manager.shutdown_kernel(now=True)


def _prefix() -> str:
    return f"ws-{uuid.uuid4().hex[:8]}/snap-1"


# -- round trip ---------------------------------------------------------------------------

STATE = """
import numpy as np
import hashlib
import json as js

big = np.arange(8 * 1024 * 1024, dtype=np.float64)   # 64 MiB
big *= 1.5
config = {"lr": 3e-4, "layers": [64, 64], "weights": big, "name": "run-7"}
counter = 0

def bump(step=1):
    global counter
    counter += step
    return counter

def scaled(x):
    return float(big[1] * x)

class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm1(self):
        return abs(self.x) + abs(self.y)

origin = Point(-3, 4)
_cache = {"hits": 2}
"""

CHECKS = (
    "{'sha': hashlib.sha256(big.tobytes()).hexdigest(), 'shape': list(big.shape),"
    " 'shared': config['weights'] is big, 'scaled': scaled(2), 'norm': origin.norm1(),"
    " 'cls': type(origin).__name__, 'same_cls': type(origin) is Point,"
    " 'np': np.__name__, 'js': js.__name__, 'cache': _cache, 'lr': config['lr']}"
)


def test_round_trip_into_a_fresh_kernel(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    source = start_kernel()
    source.run(STATE)
    expected = source.value(CHECKS)
    names_before = source.names()
    seen: list[tuple[int, int]] = []
    prefix = _prefix()

    entry = snapshot_kernel(
        source.connection_file,
        bucket=bucket,
        prefix=prefix,
        kernel_id="k-1",
        timeout=120,
        progress=lambda done, total: seen.append((done, total)),
    )

    # The capture leaves the user's namespace as it was (no helper names, no `_`).
    assert source.names() == names_before
    assert entry["format"] == FORMAT
    assert entry["skipped"] == []
    captured = {v["name"]: v for v in entry["variables"]}
    assert set(captured) == {
        "np", "hashlib", "js", "big", "config", "counter", "bump", "scaled", "Point",
        "origin", "_cache",
    }  # fmt: skip
    assert captured["np"]["type"] == "module"
    assert captured["big"]["type"] == "numpy.ndarray"
    assert captured["big"]["bytes"] >= 64 * MiB
    assert captured["config"]["bytes"] < 4096  # the array inside is shared, not stored twice
    assert (
        entry["total_bytes"] == sum(entry["segments"]) == sum(o["bytes"] for o in entry["objects"])
    )
    assert all(len(o["blake3"]) == 64 for o in entry["objects"])
    stored = store.list_objects(bucket, pool_prefix(prefix) + "/")
    assert set(stored) == {o["name"] for o in entry["objects"]}
    assert entry["uploaded_bytes"] == entry["total_bytes"]  # a first snapshot sends it all
    assert seen and seen[-1] == (entry["total_bytes"], entry["total_bytes"])

    target = start_kernel()
    restored_seen: list[tuple[int, int]] = []
    result = restore_kernel(
        target.connection_file,
        entry,
        bucket=bucket,
        timeout=120,
        progress=lambda done, total: restored_seen.append((done, total)),
    )

    assert set(result["variables"]) == set(captured)
    assert target.value(CHECKS) == expected
    assert restored_seen[-1] == (entry["total_bytes"], entry["total_bytes"])
    # Notebook functions see the live namespace: a global update is visible to the notebook.
    assert target.value("[bump(5), counter, bump.__globals__ is globals()]") == [5, 5, True]
    assert target.value("big.flags.writeable") is True


def test_unpicklable_variables_are_skipped_with_their_reason(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    source = start_kernel()
    source.run(
        "import threading\n"
        "lock = threading.Lock()\n"
        "pending = (i * i for i in range(10)); next(pending)\n"
        "rows = [1, 2, 3]\n"
        "def locked_sum():\n"
        "    with lock:\n"
        "        return sum(rows)\n"
    )
    entry = snapshot_kernel(
        source.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60
    )

    skipped = {s["name"]: s for s in entry["skipped"]}
    assert set(skipped) == {"lock", "pending"}
    assert skipped["lock"]["type"] == "_thread.lock"
    assert skipped["lock"]["reason"] == "TypeError: cannot pickle '_thread.lock' object"
    assert skipped["pending"]["type"] == "generator"
    assert "cannot pickle 'generator' object" in skipped["pending"]["reason"]
    assert {v["name"] for v in entry["variables"]} == {"threading", "rows", "locked_sum"}

    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=60)
    assert target.value("rows") == [1, 2, 3]
    assert target.value("'lock' in globals() or 'pending' in globals()") is False
    # The function came back; the lock it uses is the one thing missing, and says so.
    out = target.run("try:\n    locked_sum()\nexcept NameError as error:\n    print(error)")
    assert out.strip() == "name 'lock' is not defined"


def test_a_staged_restore_maps_what_the_driver_downloaded_and_verified(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, tmp_path: Path
) -> None:
    """A resume downloads while its kernel starts: the driver stages the entry into files,
    the kernel maps them (writable, no copy) and unlinks them; the state is the same."""
    source = start_kernel()
    source.run(STATE)
    expected = source.value(CHECKS)
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k-1", timeout=120)
    staged_dir = tmp_path / "staged"
    staged_dir.mkdir(mode=0o700)
    seen: list[tuple[int, int]] = []

    paths = stage_kernel(entry, bucket=bucket, directory=str(staged_dir), timeout=60,
                         progress=lambda done, total: seen.append((done, total)))

    assert paths is not None and len(paths) == len(entry["segments"])
    assert [os.path.getsize(p) for p in paths] == entry["segments"]
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in paths)
    assert seen[-1] == (entry["total_bytes"], entry["total_bytes"])
    target = start_kernel()
    result = restore_kernel(target.connection_file, entry, bucket=bucket, timeout=120,
                            staged=paths)
    assert target.value(CHECKS) == expected
    assert result["timings"]["download_s"] < 1.0  # nothing was downloaded in the kernel
    assert list(staged_dir.iterdir()) == []  # the kernel's now, and only its
    assert target.value("[big.flags.writeable, bump(2)]") == [True, 2]
    target.run("big += 1")
    assert target.value("float(big[0])") == 1.0


def test_a_damaged_part_is_refused_while_staging_and_nothing_is_left(
    emulator: str, bucket: str, store: ObjectStore, start_kernel: Callable[[], Kernel],
    tmp_path: Path,
) -> None:
    source = start_kernel()
    source.run("import numpy as np\nweights = np.ones(3 * 1024 * 1024)\n")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k-1", timeout=60, part_bytes=4 * MiB)
    victim = entry["objects"][2]
    store.upload_chunks(bucket, victim["name"], [memoryview(bytes([7]) * victim["bytes"])])

    with pytest.raises(SnapshotIntegrityError) as caught:
        stage_kernel(entry, bucket=bucket, directory=str(tmp_path), timeout=60)

    assert victim["name"] in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_device_arrays_are_never_staged(tmp_path: Path, bucket: str, emulator: str) -> None:
    entry = {"format": FORMAT, "segments": [10, 20], "placements": [None, {"kind": "torch"}],
             "objects": [{"name": "p/a", "bytes": 30, "offset": 0, "blake3": "0" * 64}]}
    assert stage_kernel(entry, bucket=bucket, directory=str(tmp_path), timeout=5) is None


# -- integrity ----------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flipped bytes", "truncated"])
def test_a_damaged_part_fails_restore_and_leaves_the_namespace_alone(
    start_kernel: Callable[[], Kernel],
    emulator: str,
    bucket: str,
    store: ObjectStore,
    damage: str,
) -> None:
    source = start_kernel()
    source.run("import numpy as np\nweights = np.ones(3 * 1024 * 1024)\nnote = 'hello'\n")
    entry = snapshot_kernel(
        source.connection_file,
        bucket=bucket,
        prefix=_prefix(),
        kernel_id="k-1",
        timeout=60,
        part_bytes=4 * MiB,
    )
    assert len(entry["objects"]) == 7  # 24 MiB of array + the pickle, in 4 MiB parts
    victim = entry["objects"][3]
    size = victim["bytes"] if damage == "flipped bytes" else victim["bytes"] - 1
    store.upload_chunks(bucket, victim["name"], [memoryview(bytes([7]) * size)])

    target = start_kernel()
    target.run("marker = 41")
    names_before = target.names()
    with pytest.raises(SnapshotIntegrityError) as caught:
        restore_kernel(target.connection_file, entry, bucket=bucket, timeout=60)

    assert victim["name"] in str(caught.value)
    assert ("blake3" if damage == "flipped bytes" else "bytes") in str(caught.value)
    assert target.names() == names_before
    assert target.value("marker") == 41


def test_a_missing_part_is_reported_by_name(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    source = start_kernel()
    source.run("data = bytes(range(256)) * 4096")
    entry = snapshot_kernel(
        source.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60
    )
    store.delete_objects(bucket, [entry["objects"][0]["name"]])
    target = start_kernel()
    with pytest.raises(ObjectNotFound, match=entry["objects"][0]["name"]):
        restore_kernel(target.connection_file, entry, bucket=bucket, timeout=60)
    assert "data" not in target.names()


def test_a_package_missing_in_the_new_kernel_fails_with_the_remote_error(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, tmp_path: Path
) -> None:
    package = tmp_path / "only_here"
    package.mkdir()
    (package / "stasis_private_mod.py").write_text("class Thing:\n    size = 3\n")
    source = start_kernel()
    source.run(f"import sys; sys.path.insert(0, {str(package)!r})\n")
    source.run("import stasis_private_mod\nthing = stasis_private_mod.Thing()\nkeep = 5\n")
    entry = snapshot_kernel(
        source.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60
    )
    shutil.rmtree(package)

    target = start_kernel()
    with pytest.raises(RestoreFailed, match="No module named 'stasis_private_mod'"):
        restore_kernel(target.connection_file, entry, bucket=bucket, timeout=60)
    assert "keep" not in target.names()


# -- manifest and deletion ----------------------------------------------------------------


def test_the_manifest_is_written_last_and_delete_prefix_removes_everything(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    kernel = start_kernel()
    kernel.run(
        "import numpy as np\nimport threading\n"
        "x = np.zeros(2 * 1024 * 1024)\ny = {'a': 1}\nz = threading.Lock()"
    )
    prefix = _prefix()
    entries = [
        snapshot_kernel(
            kernel.connection_file, bucket=bucket, prefix=prefix, kernel_id=kid, timeout=60
        )
        for kid in ("k-a", "k-b")
    ]
    # A sibling snapshot whose name extends ours must survive delete_prefix(prefix).
    sibling = prefix + "0"
    sibling_entry = snapshot_kernel(
        kernel.connection_file, bucket=bucket, prefix=sibling, kernel_id="k-a", timeout=60
    )
    write_manifest(bucket, sibling, {"kernels": [
        {"kernel_id": "k-a", "kernelspec": "python3", "entry": sibling_entry}]}, store=store)

    # Capture alone writes no manifest: the snapshot is not committed yet.
    assert not any(n.endswith("manifest.json") for n in store.list_objects(bucket, prefix + "/"))
    with pytest.raises(ObjectNotFound, match="partial"):
        read_manifest(bucket, prefix, store=store)

    manifest = {
        "workspace": "ws-1",
        "kernels": [
            {"kernel_id": e["kernel_id"], "kernelspec": "python3", "entry": e} for e in entries
        ],
        "sessions": [{"path": "train.ipynb", "kernel_id": "k-a", "type": "notebook"}],
    }
    written = write_manifest(bucket, prefix, manifest, store=store)
    assert written["format"] == FORMAT
    assert written["totals"]["kernels"] == 2
    assert written["totals"]["bytes"] == sum(e["total_bytes"] for e in entries)
    assert [(s["kernel_id"], s["name"]) for s in written["skipped"]] == [("k-a", "z"), ("k-b", "z")]
    assert read_manifest(bucket, prefix, store=store) == written
    anchor = manifest_sha256(written)  # what the control plane keeps in Firestore
    assert read_manifest(bucket, prefix, expected_sha256=anchor, store=store) == written
    tampered = {**written, "sessions": []}
    store.put_bytes(bucket, f"{prefix}/manifest.json", json.dumps(tampered).encode(), "x/y")
    with pytest.raises(SnapshotIntegrityError, match="changed after it was written"):
        read_manifest(bucket, prefix, expected_sha256=anchor, store=store)

    # Parts are the pool's: the same namespace captured three times is stored once.
    pool = store.list_objects(bucket, pool_prefix(prefix) + "/")
    assert set(pool) == {o["name"] for o in entries[0]["objects"]}
    assert [o["name"] for o in entries[1]["objects"]] == [o["name"] for o in entries[0]["objects"]]
    deleted = delete_prefix(bucket, prefix, store=store)
    assert deleted == 1  # the manifest; the parts stay for retention to decide
    assert store.list_objects(bucket, prefix + "/") == {}
    assert store.list_objects(bucket, sibling + "/") != {}
    assert store.list_objects(bucket, pool_prefix(prefix) + "/") == pool
    delete_prefix(bucket, sibling, store=store)


def test_write_manifest_refuses_a_snapshot_with_a_missing_part(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    kernel = start_kernel()
    kernel.run("v = list(range(1000))")
    prefix = _prefix()
    entry = snapshot_kernel(
        kernel.connection_file, bucket=bucket, prefix=prefix, kernel_id="k-1", timeout=60
    )
    store.delete_objects(bucket, [entry["objects"][-1]["name"]])
    manifest = {"kernels": [{"kernel_id": "k-1", "kernelspec": "python3", "entry": entry}]}
    with pytest.raises(ManifestError, match="missing"):
        write_manifest(bucket, prefix, manifest, store=store)
    assert store.list_objects(bucket, prefix + "/manifest.json") == {}


# -- busy, dead and failing kernels -------------------------------------------------------


def test_a_busy_kernel_is_waited_for_within_the_timeout(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    kernel = start_kernel()
    kernel.run("value = 1")
    kernel.client.execute("import time; time.sleep(2); value = 2")
    entry = snapshot_kernel(
        kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60
    )
    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=60)
    assert target.value("value") == 2  # captured after the running cell finished


def test_a_request_that_times_out_behind_a_busy_cell_never_runs_later(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    kernel = start_kernel()
    kernel.client.execute("import time; time.sleep(4)")
    prefix = _prefix()
    with pytest.raises(SnapshotTimeout, match="busy"):
        snapshot_kernel(
            kernel.connection_file, bucket=bucket, prefix=prefix, kernel_id="k-1", timeout=1.5
        )
    kernel.run("pass", timeout=30)  # the sleep and our queued request are done
    assert store.list_objects(bucket, prefix + "/") == {}
    assert store.list_objects(bucket, pool_prefix(prefix) + "/") == {}


def test_a_request_aborted_by_a_failing_cell_is_sent_again(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    kernel = start_kernel()
    kernel.run("value = 3")
    # The failing cell makes the kernel abort every request queued behind it, ours too.
    kernel.client.execute("import time; time.sleep(1.5); raise ValueError('boom')")
    entry = snapshot_kernel(
        kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60
    )
    assert {v["name"] for v in entry["variables"]} == {"value", "time"}


def test_a_kernel_restarted_under_a_queued_request_is_reported(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    kernel = start_kernel()
    kernel.client.execute("import time\nfor i in range(100):\n    print(i)\n    time.sleep(0.1)")
    restarter = threading.Timer(1.5, lambda: kernel.manager.restart_kernel(now=True))
    restarter.start()
    started = time.monotonic()
    try:
        with pytest.raises(KernelUnavailable, match="restarted"):
            snapshot_kernel(
                kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k", timeout=60
            )
    finally:
        restarter.join()
    assert time.monotonic() - started < 30


def test_a_dead_kernel_is_reported(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, tmp_path: Path
) -> None:
    kernel = start_kernel()
    stale = tmp_path / "stale-connection.json"
    shutil.copy(kernel.connection_file, stale)
    os.kill(kernel.pid, signal.SIGKILL)
    kernel.wait_dead()

    started = time.monotonic()
    with pytest.raises(KernelUnavailable, match="heartbeat"):
        snapshot_kernel(str(stale), bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=60)
    assert time.monotonic() - started < 20
    with pytest.raises(KernelUnavailable, match="does not exist"):
        snapshot_kernel(
            str(tmp_path / "nope.json"), bucket=bucket, prefix=_prefix(), kernel_id="k", timeout=5
        )


def test_a_capture_error_carries_the_remote_reason(
    start_kernel: Callable[[], Kernel], emulator: str
) -> None:
    kernel = start_kernel()
    kernel.run("x = 1")
    with pytest.raises(ObjectNotFound, match="no-such-bucket"):
        snapshot_kernel(
            kernel.connection_file,
            bucket="no-such-bucket-stasis",
            prefix=_prefix(),
            kernel_id="k-1",
            timeout=60,
        )
    assert kernel.value("x") == 1


# -- memory -------------------------------------------------------------------------------


def _sample_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        stop.wait(0.005)


def test_capture_does_not_copy_a_large_array(
    start_kernel: Callable[[], Kernel],
    emulator: str,
    bucket: str,
    record_property: Callable[[str, object], None],
) -> None:
    kernel = start_kernel()
    # Built in place, so building it does not raise the kernel's peak above 1x.
    kernel.run("import numpy as np\nstate = np.empty(32 * 1024 * 1024)\nstate.fill(0.5)")
    # A small capture first, so the one measured does not include importing the agent.
    snapshot_kernel(
        kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="warm", timeout=60
    )
    kernel.run("import gc; gc.collect()")
    baseline = psutil.Process(kernel.pid).memory_info().rss

    stop, peak = threading.Event(), [baseline]
    sampler = threading.Thread(target=_sample_rss, args=(kernel.pid, stop, peak))
    sampler.start()
    try:
        entry = snapshot_kernel(
            kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k-1", timeout=120
        )
    finally:
        stop.set()
        sampler.join()

    array = 256 * MiB
    extra = peak[0] - baseline
    record_property("rss_baseline_mib", round(baseline / MiB, 1))
    record_property("rss_peak_mib", round(peak[0] / MiB, 1))
    print(
        f"capture of 256 MiB: kernel RSS {baseline / MiB:.0f} MiB before, "
        f"{peak[0] / MiB:.0f} MiB peak (+{extra / MiB:.0f} MiB, "
        f"{peak[0] / baseline:.2f}x), {entry['seconds']} s"
    )
    assert entry["total_bytes"] >= array
    assert extra < array // 4, f"capture grew the kernel by {extra / MiB:.0f} MiB"


# -- incremental snapshots ----------------------------------------------------------------


def test_a_second_snapshot_sends_only_the_parts_that_changed(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str, store: ObjectStore
) -> None:
    kernel = start_kernel()
    kernel.run(
        "import numpy as np\n"
        "weights = np.arange(6 * 1024 * 1024, dtype=np.float64)\n"  # 48 MiB, unchanged
        "results = np.zeros(1024 * 1024)\n"  # 8 MiB, changes
        "step = 1\n"
    )
    first_prefix = _prefix()
    first = snapshot_kernel(kernel.connection_file, bucket=bucket, prefix=first_prefix,
                            kernel_id="k", timeout=60, part_bytes=4 * MiB)
    written = write_manifest(bucket, first_prefix, {"kernels": [
        {"kernel_id": "k", "kernelspec": "python3", "entry": first}]}, store=store)
    kernel.run("results[:10] = 7.0\nstep = 2\nextra = list(range(100))\n")

    second_prefix = first_prefix.replace("snap-1", "snap-2")
    store_requests_before = set(store.list_objects(bucket, pool_prefix(first_prefix) + "/"))
    second = snapshot_kernel(kernel.connection_file, bucket=bucket, prefix=second_prefix,
                             kernel_id="k", timeout=60, part_bytes=4 * MiB,
                             reuse=reusable_parts(written))

    # The pickle stream and the one 4 MiB part of `results` that changed; not the weights.
    assert second["uploaded_bytes"] <= 4 * MiB + 64 * 1024, second["uploaded_bytes"]
    assert second["total_bytes"] > 56 * MiB
    new = set(store.list_objects(bucket, pool_prefix(first_prefix) + "/")) - store_requests_before
    assert len(new) == 2
    target = start_kernel()
    restore_kernel(target.connection_file, second, bucket=bucket, timeout=60)
    assert target.value("[float(results[0]), float(results[10]), step, len(extra),"
                        " float(weights[-1])]") == [7.0, 0.0, 2, 100, 6 * 1024 * 1024 - 1.0]


# -- device arrays (CPU; the GPU side is at the end of this file) ----------------------

TORCH_STATE = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 8))
embeddings = torch.randn(16 * 1024 * 1024 // 4).reshape(4096, -1)
rows = embeddings[:100]
out = model(torch.ones(2, 1024)).detach()
"""
TORCH_CHECKS = (
    "[float(model(torch.ones(2, 1024)).detach().sub(out).abs().max()),"
    " bool(rows.untyped_storage().data_ptr() == embeddings.untyped_storage().data_ptr()),"
    " type(model[0].weight).__name__, str(embeddings.device), float(embeddings.sum())]"
)


def test_torch_modules_and_tensors_come_back_into_a_fresh_kernel(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    pytest.importorskip("torch")
    source = start_kernel()
    source.run(TORCH_STATE)
    expected = source.value(TORCH_CHECKS)
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=120)

    assert {"kind": "torch", "device": "cpu"} in entry["placements"]
    assert entry["accelerators"]["count"] == 0 and entry["libraries"]["torch"]
    variables = {v["name"]: v for v in entry["variables"]}
    assert variables["embeddings"]["bytes"] >= 16 * MiB
    assert variables["rows"]["bytes"] < 4096  # a view of embeddings: its storage is shared
    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=120)
    assert target.value(TORCH_CHECKS) == expected


def test_device_arrays_are_refused_without_their_accelerator_unless_asked_to_cpu(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    """A snapshot whose tensors were on a GPU, restored in a CPU-only kernel. The
    entry is the CPU capture with its placements set to cuda:0: the bytes of a storage
    do not depend on its device, so this is the restore a GPU snapshot gets here."""
    pytest.importorskip("torch")
    source = start_kernel()
    source.run("import torch\nweights = torch.arange(1024 * 1024, dtype=torch.float32)\nn = 3")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=60)
    on_gpu = {**entry,
              "placements": [dict(p, device="cuda:0") if p else p for p in entry["placements"]],
              "accelerators": {"type": "NVIDIA H200", "count": 1, "driver": "570.86.15",
                               "cuda": "12.8", "framework": "torch"}}

    target = start_kernel()
    with pytest.raises(RestoreRefused, match="NVIDIA H200 and this kernel has no accelerator"):
        restore_kernel(target.connection_file, on_gpu, bucket=bucket, timeout=60)
    assert "weights" not in target.names()

    restore_kernel(target.connection_file, on_gpu, bucket=bucket, timeout=60,
                   device_arrays_to_cpu=True)
    assert target.value("[str(weights.device), float(weights[-1]), n]") == [
        "cpu", 1024 * 1024 - 1.0, 3]


def test_jax_arrays_come_back_into_a_fresh_kernel(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    pytest.importorskip("jax")
    source = start_kernel()
    source.run("import jax, jax.numpy as jnp\nx = jnp.arange(4 * 1024 * 1024, dtype=jnp.float32)"
               "\ny = (x * 2).reshape(1024, -1)\n")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=120)
    assert {"kind": "jax", "device": "cpu:0"} in entry["placements"]
    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=120)
    assert target.value("[float(y[1023, -1]), str(type(x).__module__), str(list(x.devices())[0])]"
                        ) == [2 * (4 * 1024 * 1024 - 1.0), "jaxlib._jax", "cpu:0"]


def test_capturing_torch_tensors_does_not_copy_them(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str,
    record_property: Callable[[str, object], None],
) -> None:
    """The memory bound of a device-array capture, measured with CPU tensors: their
    storages are sent from the tensors' own memory (a GPU's is staged through
    (streams + 1) parts of host memory: tests/unit/test_snapshot_transfer.py, and the GPU
    test below)."""
    pytest.importorskip("torch")
    kernel = start_kernel()
    kernel.run("import torch\nstate = torch.empty(64 * 1024 * 1024)\nstate.fill_(0.5)")
    snapshot_kernel(kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="warm",
                    timeout=120)
    kernel.run("import gc; gc.collect()")
    baseline = psutil.Process(kernel.pid).memory_info().rss
    stop, peak = threading.Event(), [baseline]
    sampler = threading.Thread(target=_sample_rss, args=(kernel.pid, stop, peak))
    sampler.start()
    try:
        snapshot_kernel(kernel.connection_file, bucket=bucket, prefix=_prefix(), kernel_id="k",
                        timeout=120)
    finally:
        stop.set()
        sampler.join()
    extra = peak[0] - baseline
    record_property("torch_capture_extra_mib", round(extra / MiB, 1))
    assert extra < 64 * MiB, f"capturing 256 MiB of tensors took {extra / MiB:.0f} MiB more"


# -- device arrays on a GPU --------------------------------------------------------------
# Skipped with the reason "no CUDA device" without one (this project's machines have
# none). The same code's CPU side is tested above and in tests/unit/test_snapshot_transfer.py
# (the staging bound, with a stand-in device); bench/gpu_pause_resume.py --device cuda
# measures this path.


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False  # no driver: do not pay for importing torch to find out
    import torch

    return bool(torch.cuda.is_available())


needs_cuda = pytest.mark.skipif(not _has_cuda(), reason="no CUDA device")


GPU_MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to("cuda:0")
extra = torch.randn(64 * 1024 * 1024 // 4, device="cuda:0")   # 64 MiB
view = extra[:1000]
probe = torch.ones(3, 4096, device="cuda:0")
expected = model(probe).sum().item()
"""
GPU_CHECKS = ("[str(model[0].weight.device), abs(model(probe).sum().item() - expected) < 1e-3,"
          " bool(view.untyped_storage().data_ptr() == extra.untyped_storage().data_ptr()),"
          " type(model[3].weight).__name__]")


@needs_cuda
def test_a_model_on_the_gpu_comes_back_onto_the_same_device(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str,
    record_property: Callable[[str, Any], None],
) -> None:
    source = start_kernel()
    source.run(GPU_MODEL)
    baseline = psutil.Process(source.pid).memory_info().rss
    stop, peak = threading.Event(), [baseline]
    sampler = threading.Thread(target=_sample_rss, args=(source.pid, stop, peak))
    sampler.start()
    try:
        entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                                kernel_id="k", timeout=600)
    finally:
        stop.set()
        sampler.join()

    import torch

    assert {"kind": "torch", "device": "cuda:0"} in entry["placements"]
    accelerators = entry["accelerators"]
    assert accelerators["count"] >= 1
    assert accelerators["type"] == torch.cuda.get_device_name(0)
    assert (accelerators["cuda"], accelerators["framework"]) == (torch.version.cuda, "torch")
    # Host memory for the capture: the staging buffers, not the model (about 600 MiB).
    bound = (default_streams("upload") + 1) * entry["part_bytes"]
    record_property("capture_extra_host_mib", round((peak[0] - baseline) / MiB))
    assert peak[0] - baseline <= bound + 64 * MiB, (peak[0] - baseline, bound)

    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=600)
    assert target.value(GPU_CHECKS) == ["cuda:0", True, True, "Parameter"]


@needs_cuda
def test_a_gpu_snapshot_restores_onto_cpu_when_asked(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    source = start_kernel()
    source.run("import torch\nw = torch.arange(1024, dtype=torch.float32, device='cuda:0')")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=120)
    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=120,
                   device_arrays_to_cpu=True)
    assert target.value("[str(w.device), float(w[-1])]") == ["cpu", 1023.0]


@needs_cuda
def test_another_accelerator_type_is_refused_with_the_reason(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    source = start_kernel()
    source.run("import torch\nw = torch.ones(1024, device='cuda:0')")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=120)
    elsewhere = {**entry, "accelerators": {**entry["accelerators"], "type": "NVIDIA L4"}}
    target = start_kernel()
    with pytest.raises(RestoreRefused, match=r"NVIDIA L4 and this kernel has .*another "
                                             r"accelerator type"):
        restore_kernel(target.connection_file, elsewhere, bucket=bucket, timeout=120)
    assert "w" not in target.names()


@needs_cuda
def test_jax_arrays_on_the_gpu_come_back_onto_it(
    start_kernel: Callable[[], Kernel], emulator: str, bucket: str
) -> None:
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("no CUDA device for JAX (jax[cuda] is not installed)")
    source = start_kernel()
    source.run("import jax, jax.numpy as jnp\n"
               "x = jax.device_put(jnp.arange(1 << 20, dtype=jnp.float32), jax.devices('gpu')[0])")
    entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=_prefix(),
                            kernel_id="k", timeout=120)
    assert {"kind": "jax", "device": "gpu:0"} in entry["placements"]
    target = start_kernel()
    restore_kernel(target.connection_file, entry, bucket=bucket, timeout=120)
    assert target.value("[list(x.devices())[0].platform, float(x[-1])]") == [
        "gpu", float((1 << 20) - 1)]
