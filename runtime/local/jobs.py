"""Scale-out jobs on the local runtime: ``hosts`` processes that form ONE distributed system.

The notebook-side API (``stasis.jobs``) runs a job here, as children of the kernel that
submitted it: the kernel already has the workspace's home directory, its Python and its
environment, so shipping a function needs no server, and a job's processes die with the
workspace like the kernel's own children. (The node agent is not involved: it would have
to receive the pickled function over HTTP and stream the logs back, for no gain on one
machine; on GKE the same call becomes a JobSet, ``functions.kubernetes.objects.jobset``.)

Each host is ``python -m runtime.local.jobs --payload P --out DIR`` with the environment
both frameworks read, the names the GKE JobSet uses (``functions.kubernetes.objects.jobset``):
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and a free
``MASTER_PORT`` for ``torch.distributed``; ``JAX_COORDINATOR_ADDRESS=127.0.0.1:<another
free port>``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` for ``jax.distributed``. It
unpickles ``(fn, args, kwargs)`` (cloudpickle), joins the distributed system of the job's
``framework`` (``STASIS_JOB_FRAMEWORK``), calls ``fn(*args, **kwargs)`` and, on host 0,
pickles the return value:

- ``torch`` (the default): a ``torch.distributed`` process group, gloo backend, TCP
  rendezvous on loopback, when torch is installed (JAX is not imported);
- ``jax``: :func:`jax_initialize` (gloo CPU collectives, the coordinator on host 0, bound to
  loopback), so ``jax.devices()`` are every host's devices (torch is not imported);
- ``none``: nothing; the function may still call :func:`jax_initialize` itself, first thing.

Every line a host prints (stdout and stderr) is kept prefixed ``[host N] `` in order of
arrival and in ``DIR/log.txt``. The first host to exit non-zero fails the job: the others
are killed (they would wait forever in a collective) and the error names the host and ends
with its log.

A job lives as long as the kernel that started it. Each host watches its parent and kills
its own process group once the kernel is gone (a restart, a crash), within a second; and
pausing or deleting the workspace stops every process of its server, job hosts included
(``runtime.local.servers.stop``: descendants and the ``STASIS_SERVER_INSTANCE`` marker they
inherit). A job is never paused with its workspace: it ends, and since the kernel that
would report ``job.finished`` is gone, the reconciler reports it (``runtime_lost``, see
``functions.domain.reconcile.lost_jobs``) and the team's accelerators go back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import cloudpickle

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULT = "result.pkl"
LOG_TAIL_LINES = 40
FRAMEWORKS = ("torch", "jax", "none")
#: How often a host checks that the kernel that started it is still there.
PARENT_POLL_S = 0.5


class JobFailed(RuntimeError):
    """The job did not succeed; ``failed_host`` is the host that failed first (or None)."""

    def __init__(self, message: str, *, failed_host: int | None = None,
                 exit_status: int | None = None, state: str = "FAILED") -> None:
        super().__init__(message)
        self.failed_host = failed_host
        self.exit_status = exit_status
        self.state = state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}"


class LocalJob:
    """One job's processes on this machine: start, follow, wait, cancel."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, *, hosts: int = 1,
                 job_id: str | None = None, workdir: str | Path | None = None,
                 cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                 python: str = sys.executable, framework: str = "torch",
                 on_finish: Callable[[LocalJob], None] | None = None) -> None:
        if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
            raise ValueError(f"hosts must be a whole number >= 1, got {hosts!r}")
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, "
                             f"got {framework!r}")
        self.framework = framework
        self.id = job_id or new_job_id()
        self.hosts = hosts
        self.dir = Path(workdir or tempfile.mkdtemp(prefix=f"stasis-{self.id}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cwd = Path(cwd) if cwd else Path.cwd()
        self._fn, self._args, self._kwargs = fn, tuple(args), dict(kwargs or {})
        self._env = dict(env or {})
        self._python = python
        self._on_finish = on_finish
        self.state = "SUBMITTED"
        self.failed_host: int | None = None
        self.exit_status: int | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lines: list[str] = []
        self._host_lines: dict[int, list[str]] = {i: [] for i in range(hosts)}
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._readers: list[threading.Thread] = []

    @property
    def log_path(self) -> Path:
        return self.dir / "log.txt"

    @property
    def pids(self) -> list[int]:
        """The hosts' process ids, host 0 first (empty before ``start``)."""
        return [proc.pid for proc in self._procs]

    # -- running ---------------------------------------------------------------------

    def start(self) -> LocalJob:
        payload = self.dir / "payload.pkl"
        payload.write_bytes(cloudpickle.dumps((self._fn, self._args, self._kwargs)))
        port, jax_port = free_port(), free_port()
        pythonpath = os.pathsep.join(p for p in (str(self.cwd), str(REPO_ROOT),
                                                 os.environ.get("PYTHONPATH", "")) if p)
        self.started_at = time.time()
        self.state = "RUNNING"
        for rank in range(self.hosts):
            env = {**os.environ, **self._env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(self.hosts), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "STASIS_JOB_ID": self.id,
                   "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{jax_port}",
                   # JAX binds its coordinator to every interface unless told otherwise
                   "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{jax_port}",
                   "JAX_NUM_PROCESSES": str(self.hosts), "JAX_PROCESS_ID": str(rank),
                   "STASIS_JOB_FRAMEWORK": self.framework,
                   "STASIS_JOB_PARENT_PID": str(os.getpid()),
                   "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1",
                   # one CPU thread per host: hosts share the machine's cores
                   "OMP_NUM_THREADS": self._env.get("OMP_NUM_THREADS", "1")}
            proc = subprocess.Popen(
                [self._python, "-u", "-m", "runtime.local.jobs", "--payload", str(payload),
                 "--out", str(self.dir)],
                cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
            self._procs.append(proc)
            reader = threading.Thread(target=self._read, args=(rank, proc), daemon=True,
                                      name=f"{self.id}-host-{rank}")
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._watch, daemon=True, name=f"{self.id}-watch").start()
        return self

    def _read(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as log:
            for raw in proc.stdout:
                line = f"[host {rank}] {raw.decode('utf-8', 'replace').rstrip()}"
                with self._cond:
                    self._lines.append(line)
                    self._host_lines[rank].append(line)
                    log.write(line + "\n")
                    log.flush()
                    self._cond.notify_all()

    def _watch(self) -> None:
        exits: list[tuple[float, int, int]] = []  # (when, host, status), in order of exit
        guard = threading.Lock()

        def wait(rank: int, proc: subprocess.Popen[bytes]) -> None:
            code = proc.wait()
            with guard:
                exits.append((time.monotonic(), rank, code))

        waiters = [threading.Thread(target=wait, args=(rank, proc), daemon=True)
                   for rank, proc in enumerate(self._procs)]
        for waiter in waiters:
            waiter.start()
        while True:
            with guard:
                failed = [(when, rank, code) for when, rank, code in exits if code != 0]
                finished = len(exits) == len(self._procs)
            if failed and self.state == "RUNNING":
                # the others would wait forever in a collective; a peer that lost its
                # connection to the failed host may exit too, a moment later: the first
                # to exit is the one that failed
                self._kill(self._procs)
            if finished:
                break
            time.sleep(0.02)
        if failed and self.state == "RUNNING":
            _, self.failed_host, self.exit_status = min(self._first_failures(failed))
        for reader in self._readers:
            reader.join(timeout=5)
        with self._cond:
            if self.state == "RUNNING":
                if self.failed_host is None:
                    self.state, self.exit_status = "SUCCEEDED", 0
                else:
                    tail = "\n".join(self._host_lines[self.failed_host][-LOG_TAIL_LINES:])
                    self.state = "FAILED"
                    self.error = (f"host {self.failed_host} of {self.hosts} exited with status "
                                  f"{self.exit_status}; its log:\n{tail}")
            self.finished_at = time.time()
        if self._on_finish is not None:  # reported before result() returns
            try:
                self._on_finish(self)
            except Exception as exc:  # the job's outcome stands; say why it was not reported
                with self._cond:
                    self._lines.append(f"[stasis] could not report the job's end: {exc!r}")
        with self._cond:
            self._done.set()
            self._cond.notify_all()

    def _first_failures(self, failed: list[tuple[float, int, int]]
                        ) -> list[tuple[float, int, int]]:
        """When each failed host failed: the moment it noted itself (``failed-N``, written
        before it exits, so before any peer can notice its absence), else the moment its
        exit was seen here (a host killed outright). Seeing exits here is not enough: on a
        busy machine a peer's exit may be seen first. Both clocks are CLOCK_MONOTONIC."""
        out = []
        for seen, rank, code in failed:
            with contextlib.suppress(OSError, ValueError):
                seen = min(seen, float((self.dir / f"failed-{rank}").read_text()))
            out.append((seen, rank, code))
        return out

    @staticmethod
    def _kill(procs: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    # -- the notebook's view ---------------------------------------------------------

    def status(self) -> str:
        return self.state

    def done(self) -> bool:
        return self._done.is_set()

    def logs(self, *, follow: bool = True) -> Iterator[str]:
        """Every host's lines, ``[host N] ...``, from the start; with ``follow`` (the
        default) it waits for new lines until the job has ended."""
        index = 0
        while True:
            with self._cond:
                while index >= len(self._lines) and follow and not self._done.is_set():
                    self._cond.wait(timeout=0.5)
                batch = self._lines[index:]
                index += len(batch)
                finished = self._done.is_set() or not follow
            yield from batch
            if finished and not batch:
                return

    def wait(self, timeout: float | None = None) -> str:
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
        return self.state

    def result(self, timeout: float | None = None) -> Any:
        """Host 0's return value; raises :class:`JobFailed` if the job did not succeed."""
        self.wait(timeout)
        if self.state != "SUCCEEDED":
            raise JobFailed(self.error or f"job {self.id} {self.state.lower()}",
                            failed_host=self.failed_host, exit_status=self.exit_status,
                            state=self.state)
        return cloudpickle.loads((self.dir / RESULT).read_bytes())

    def cancel(self) -> str:
        with self._cond:
            if self._done.is_set() or self.finished_at is not None:
                return self.state
            self.state = "CANCELLED"
            self.error = f"job {self.id} was cancelled"
        self._kill(self._procs)
        self._done.wait(timeout=10)
        return self.state

    def __repr__(self) -> str:
        return f"<LocalJob {self.id} {self.hosts} hosts {self.state}>"


# -- one host ------------------------------------------------------------------------


def jax_initialize() -> None:
    """Join this job's JAX distributed system (no-op when already joined).

    Reads ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (set
    for every host, here and in the GKE JobSet). On CPU, cross-process collectives go over
    gloo. Call it before anything else touches JAX (its backend is chosen on first use).
    """
    import jax

    if jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]))


def _jax_shutdown() -> None:
    """Leave JAX's distributed system together, if the job (or the function) joined it:
    host 0 runs the coordinator, so nobody may exit while another still needs it."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("stasis-job-end")
    jax.distributed.shutdown()


def _watch_parent() -> None:
    """End this host (its whole process group) once the kernel that started it is gone:
    its output has nowhere to go and nobody would report or cancel it."""
    parent = os.environ.get("STASIS_JOB_PARENT_PID")
    if not parent or os.getppid() != int(parent):
        return  # not started by a LocalJob (e.g. a GKE pod), or already orphaned

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(PARENT_POLL_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="stasis-parent-watch").start()


def _host_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one host of a Stasis job")
    parser.add_argument("--payload", required=True)
    parser.add_argument("--out", required=True)
    ns = parser.parse_args(argv)
    _watch_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    framework = os.environ.get("STASIS_JOB_FRAMEWORK", "torch")
    dist: Any = None
    if framework == "torch":
        try:
            import torch.distributed as dist
        except ImportError:  # a job without torch still runs; it just has no process group
            dist = None
    try:
        if framework == "jax":
            jax_initialize()
        if dist is not None:
            dist.init_process_group(
                "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                    f"{os.environ['MASTER_PORT']}",
                rank=rank, world_size=world, timeout=timedelta(seconds=120))
        fn, args, kwargs = cloudpickle.loads(Path(ns.payload).read_bytes())
        value = fn(*args, **kwargs)
        if rank == 0:
            target = Path(ns.out) / RESULT
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(cloudpickle.dumps(value))
            tmp.replace(target)
        if dist is not None:
            dist.barrier()  # nobody leaves while another host may still talk to it
            dist.destroy_process_group()
        _jax_shutdown()
    except BaseException:
        with contextlib.suppress(OSError):  # the job's verdict: who failed first
            (Path(ns.out) / f"failed-{rank}").write_text(repr(time.monotonic()))
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no atexit / gloo teardown that could hang on a dead peer
    return 0


if __name__ == "__main__":
    sys.exit(_host_main())
