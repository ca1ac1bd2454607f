"""One host of a scale-out job on Kubernetes: the command of every pod of a job's JobSet.

    python -m runtime.kubernetes.job_host      # env: STASIS_JOB_URI, RANK, WORLD_SIZE,
                                               # MASTER_ADDR, MASTER_PORT, JAX_* (JobSet)

It downloads the pickled ``(fn, args, kwargs)`` from ``$STASIS_JOB_URI/payload.pkl`` (and
the job's settings, ``job.json``: which framework to join) and runs it as the local runtime
runs one host (``python -m runtime.local.jobs``: join the distributed system from the
environment, torch gloo rendezvous at ``MASTER_ADDR`` or JAX's coordinator, call the
function, pickle host 0's return value), as a child process: everything the function and
the native libraries under it print, on either stream, is captured, and a host that hangs
in a collective can be stopped without losing the log. The pod gives the rendezvous the
JobSet's environment unchanged (``functions.kubernetes.objects.jobset``), so the same host
code runs on one machine and on a slice.

What it leaves under the job's prefix (names from ``functions.kubernetes.objects.jobset``):

- ``logs/host-<i>/<seq>.txt``: the host's lines, a chunk every ``STASIS_JOB_LOG_INTERVAL``
  seconds (2 by default) while there is something new, and a last one at the end;
- ``result.pkl`` (host 0, on success): the return value, cloudpickled;
- ``hosts/host-<i>/traceback.txt`` (on failure): the Python traceback the host printed
  (or its last lines, if it printed none);
- ``hosts/host-<i>/exit.json``: exit status and the time it failed or exited (ms, wall
  clock: the moment its function raised, not when its uploads were done), written last,
  which tells the watcher which host failed first.

The exit status is the child's: a failure exits non-zero, so the pod fails and the JobSet
with it. SIGTERM (the JobSet deleted, a peer failed) is passed on to the child; the log
and the exit record are still written.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from functions.kubernetes.objects import jobset as js
from runtime.snapshot.storage import ObjectStore, get_store

TAIL_LINES = 400
TRACEBACK_START = "Traceback (most recent call last):"


def split_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> (``bucket``, ``a/b``)."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, name = uri[len("gs://"):].partition("/")
    return bucket, name.rstrip("/")


def host_index(env: Mapping[str, str]) -> int:
    """This host's index: the JobSet gives the completion index as RANK (and as
    JAX_PROCESS_ID / TPU_WORKER_ID)."""
    for name in ("RANK", "JAX_PROCESS_ID", "TPU_WORKER_ID"):
        if env.get(name, "").strip():
            return int(env[name])
    raise KeyError("RANK: which host is this?")


def traceback_of(lines: list[str]) -> str:
    """The last Python traceback among ``lines`` (to the end), else the last 40 lines."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(TRACEBACK_START):
            return "\n".join(lines[i:])
    return "\n".join(lines[-40:])


class LogShipper:
    """A host's lines to ``logs/host-<i>/<seq>.txt``, one chunk per interval."""

    def __init__(self, store: ObjectStore, bucket: str, prefix: str, host: int,
                 interval: float) -> None:
        self.store, self.bucket, self.prefix, self.host = store, bucket, prefix, host
        self.interval = interval
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._pending: list[str] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="log-shipper")

    def start(self) -> LogShipper:
        self._thread.start()
        return self

    def add(self, line: str) -> None:
        with self._lock:
            self._pending.append(line)
            self.tail.append(line)

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            seq, self._seq = self._seq, self._seq + 1
        name = f"{self.prefix}/{js.log_chunk(self.host, seq)}"
        try:
            self.store.put_bytes(self.bucket, name, ("\n".join(batch) + "\n").encode(),
                                 "text/plain; charset=utf-8")
        except Exception as exc:  # keep the lines for the next chunk; the job goes on
            with self._lock:
                self._pending[:0] = batch
                if self._seq == seq + 1:
                    self._seq = seq
            print(f"[job_host] could not upload a log chunk: {exc}", file=sys.stderr)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.flush()


def run(env: Mapping[str, str] | None = None, *, python: str = sys.executable) -> int:
    """Run this host; returns its exit status (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    bucket, prefix = split_uri(env["STASIS_JOB_URI"])
    host = host_index(env)
    store = get_store(env.get("STORAGE_EMULATOR_HOST") or None)
    shipper = LogShipper(store, bucket, prefix, host,
                         float(env.get("STASIS_JOB_LOG_INTERVAL") or 2.0)).start()
    workdir = Path(tempfile.mkdtemp(prefix="stasis-job-"))
    status = 1
    failed_ms: int | None = None
    try:
        payload = workdir / js.PAYLOAD
        payload.write_bytes(store.get_bytes(bucket, f"{prefix}/{js.PAYLOAD}"))
        settings = _settings(store, bucket, prefix)
        if settings.get("framework"):
            env["STASIS_JOB_FRAMEWORK"] = str(settings["framework"])
        status = _run_child(python, payload, workdir, env, host, shipper)
        failed_ms = _failed_at(workdir, host) if status != 0 else None
        if status == 0 and host == 0:
            result = workdir / js.RESULT
            if not result.exists():
                shipper.add(f"[job_host] host 0 exited 0 but wrote no {js.RESULT}")
                status = 1
            else:
                store.put_bytes(bucket, f"{prefix}/{js.RESULT}", result.read_bytes(),
                                "application/octet-stream")
    except Exception:  # the payload could not be read, or the result not stored
        for line in traceback.format_exc().rstrip().splitlines():
            shipper.add(line)
        status = status or 1
    finally:
        shipper.close()
        if status != 0:
            with contextlib.suppress(Exception):
                store.put_bytes(bucket, f"{prefix}/{js.traceback_object(host)}",
                                traceback_of(list(shipper.tail)).encode(),
                                "text/plain; charset=utf-8")
        # When it failed, not when its uploads were done: a peer that lost it fails a
        # moment later but may finish uploading first (the first failure names the cause).
        record = {"host": host, "exit_status": status,
                  "finished_ms": failed_ms or int(time.time() * 1000)}
        with contextlib.suppress(Exception):
            store.put_bytes(bucket, f"{prefix}/{js.exit_record(host)}",
                            json.dumps(record).encode(), "application/json")
    return status


def _failed_at(workdir: Path, host: int) -> int:
    """Wall-clock ms at which the host's function failed: the ``failed-<rank>`` note the
    runner writes before it exits (its mtime: comparable across hosts, unlike the monotonic
    clock inside), else now (the child was killed outright)."""
    now = int(time.time() * 1000)
    try:
        return min(now, int((workdir / f"failed-{host}").stat().st_mtime * 1000))
    except OSError:
        return now


def _settings(store: ObjectStore, bucket: str, prefix: str) -> dict[str, Any]:
    """The job's settings next to its payload (none: the defaults)."""
    from runtime.snapshot.errors import ObjectNotFound

    try:
        data = json.loads(store.get_bytes(bucket, f"{prefix}/{js.JOB_SETTINGS}"))
    except ObjectNotFound:
        return {}
    return data if isinstance(data, dict) else {}


def _run_child(python: str, payload: Path, workdir: Path, env: Mapping[str, str],
               host: int, shipper: LogShipper) -> int:
    child_env = {**env, "PYTHONUNBUFFERED": "1", "RANK": str(host)}
    proc = subprocess.Popen(
        [python, "-u", "-m", "runtime.local.jobs", "--payload", str(payload),
         "--out", str(workdir)],
        env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)

    def stop(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: nothing to forward
        previous = signal.signal(signal.SIGTERM, stop)
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            shipper.add(raw.decode("utf-8", "replace").rstrip("\n"))
        return proc.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
