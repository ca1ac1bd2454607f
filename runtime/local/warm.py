"""The warm pools: per environment, a few JupyterLab servers, and a few kernels, imported
ahead and not started.

What the admin file asks (``environments[].warm_pool``, 0 by default; ``stasis admin apply``
and ``stasis up`` send it to the agent's ``PUT /pools``) the node agent keeps:
that many ``runtime.local.prewarm`` processes per environment, each in the environment's
interpreter, each waiting for one workspace. A provision or a resume of a JupyterLab
workspace takes one (``take``) and ``servers.adopt`` hands it the workspace's launch: the
same arguments, environment (token, home, runtime dir, markers), limits and log a cold start
would get. What it saves is the imports, most of a JupyterLab start.

The same pool, with ``module="runtime.local.prekernel"``, keeps warm kernels
(``environments[].warm_kernels``): a JupyterLab start of the environment takes one too,
and ``servers.hand_kernel`` makes it the workspace's, for its server's first kernel (see
``runtime.local.prekernel``). A warm kernel starts with only the allow-list of the agent's
environment (``KERNEL_ENV``): no credential, emulator host or project is ever in its
process, not even in the environment block it was started with.

Promises:

- A warm process has served nobody: it binds no port and holds no token before its launch,
  and it is taken at most once (removed from the pool under the lock before it is handed
  over). The pool counts and hands out only processes that finished their imports (each
  writes a ready file) and are alive.
- The pool refills in the background, one process at a time and only when the agent asks
  (``refill``, a few seconds after an operation ended), so warming never competes with the
  start it replaces nor with the workspace's first seconds (its kernel's start, the
  browser's first load). A pool shrunk by policy stops the surplus at once.
- A warm process dies with the agent: its stdin is the agent's pipe, and end of stdin ends
  it. ``close`` stops every warm process left.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import supervisor
from runtime.local.prewarm import READY_VAR

log = logging.getLogger(__name__)

MARKER_VAR = "STASIS_WARM_INSTANCE"
#: How long one may take over its imports (a loaded 2-core host took 25 s).
_WARM_TIMEOUT = 120.0
#: What a warm kernel takes from the agent's environment (the rest comes at its claim).
KERNEL_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH",
                        "OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE"})


@dataclass
class WarmServer:
    """One waiting interpreter (a server's or a kernel's)."""

    environment: str
    python: str
    popen: subprocess.Popen[bytes]
    create_time: float
    marker: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None and supervisor.same_process(self.pid, self.create_time)

    def stop(self, grace: float = 2.0) -> None:
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()  # end of stdin: it exits by itself
        supervisor.terminate(lambda: supervisor.process_tree(self.pid, self.create_time),
                             grace=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=supervisor.KILL_WAIT)


@dataclass(frozen=True)
class PoolTarget:
    """What the policy asks of one environment: its interpreter and how many wait."""

    python: str
    size: int


@dataclass
class WarmPool:
    """Warm servers (or kernels) by environment id (see the module's promises)."""

    log_dir: Path
    base_env: Mapping[str, str]
    repo_root: Path
    #: What each process runs: the warm server, or ``runtime.local.prekernel``.
    module: str = "runtime.local.prewarm"
    #: The agent's variables it keeps (None: all but Jupyter's own).
    env_allow: frozenset[str] | None = None
    _targets: dict[str, PoolTarget] = field(default_factory=dict)
    _waiting: dict[str, list[WarmServer]] = field(default_factory=dict)
    _adopted: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refilling: threading.Thread | None = None
    _closed: bool = False
    _wake: threading.Event = field(default_factory=threading.Event)

    def configure(self, targets: Mapping[str, PoolTarget]) -> None:
        """Set the wanted size of each named environment (others keep theirs); the
        surplus of a shrunk pool is stopped now, a grown one fills on ``refill``."""
        surplus: list[WarmServer] = []
        with self._lock:
            for env_id, target in targets.items():
                self._targets[env_id] = target
                waiting = self._waiting.setdefault(env_id, [])
                keep = [w for w in waiting if w.python == target.python][: target.size]
                surplus += [w for w in waiting if w not in keep]
                self._waiting[env_id] = keep
        for warm in surplus:
            warm.stop()

    def take(self, environment: str, python: str) -> WarmServer | None:
        """A live warm server of this environment and interpreter, removed from the pool,
        or None (the caller starts cold)."""
        stale: list[WarmServer] = []
        found = None
        with self._lock:
            waiting = self._waiting.get(environment, [])
            while waiting:
                warm = waiting.pop(0)
                if warm.python == python and warm.is_alive():
                    found = warm
                    self._adopted += 1
                    break
                stale.append(warm)
        for warm in stale:
            warm.stop()
        return found

    def refill(self, delay: float = 0.0) -> None:
        """Start, in the background after ``delay`` seconds, what the pools lack (one
        process at a time)."""
        with self._lock:
            if self._closed or (self._refilling is not None and self._refilling.is_alive()):
                return
            self._refilling = threading.Thread(target=self._fill, args=(delay,),
                                               name="warm-pool", daemon=True)
            self._refilling.start()

    def status(self) -> dict[str, Any]:
        """{"environments": {id: {"size", "waiting"}}, "adopted": n}."""
        with self._lock:
            return {
                "environments": {
                    env_id: {"size": target.size,
                             "waiting": sum(w.is_alive() for w in self._waiting.get(env_id, []))}
                    for env_id, target in sorted(self._targets.items())
                },
                "adopted": self._adopted,
            }

    def close(self) -> None:
        self._wake.set()
        with self._lock:
            self._closed = True
            every = [w for waiting in self._waiting.values() for w in waiting]
            self._waiting.clear()
        for warm in every:
            warm.stop()

    def _fill(self, delay: float) -> None:
        if delay > 0:
            self._wake.wait(delay)
        while True:
            with self._lock:
                if self._closed:
                    return
                lacking = next(((env_id, target) for env_id, target in self._targets.items()
                                if len([w for w in self._waiting.get(env_id, [])
                                        if w.is_alive()]) < target.size), None)
                for env_id, waiting in self._waiting.items():
                    self._waiting[env_id] = [w for w in waiting if w.is_alive()]
            if lacking is None:
                return
            env_id, target = lacking
            try:
                warm = self._spawn(env_id, target.python)
            except OSError as exc:
                log.warning("warm pool %s: cannot start %s: %s", env_id, target.python, exc)
                return
            with self._lock:
                if self._closed or self._targets.get(env_id) != target:
                    surplus = True
                else:
                    surplus = False
                    self._waiting.setdefault(env_id, []).append(warm)
            if surplus:
                warm.stop()

    def _spawn(self, environment: str, python: str) -> WarmServer:
        """Start one and wait until its imports are done (it writes its ready file), so the
        pool only ever counts, and hands out, a warm one. Raises OSError when it cannot
        start or does not get warm in time (it is stopped)."""
        marker = uuid.uuid4().hex
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ready = self.log_dir / f"warm-{marker}.ready"
        if self.env_allow is not None:
            env = {k: v for k, v in self.base_env.items()
                   if k in self.env_allow or k.startswith("LC_")}
        else:
            env = {k: v for k, v in self.base_env.items()
                   if not k.startswith(("JPY_", "JUPYTER_"))}
        env["PYTHONPATH"] = ":".join(p for p in (str(self.repo_root), env.get("PYTHONPATH"))
                                     if p)
        env[MARKER_VAR] = marker
        env[READY_VAR] = str(ready)
        what = "kernel" if self.module.endswith("prekernel") else "server"
        child = supervisor.spawn([python, "-m", self.module],
                                 log_path=self.log_dir / f"warm-{what}-{environment}.log"
                                 if what == "kernel" else self.log_dir / f"warm-{environment}.log",
                                 env=env, cwd=self.log_dir,
                                 header=f"warm {what} for {environment}",
                                 stdin=subprocess.PIPE)
        warm = WarmServer(environment, python, child.popen, child.create_time, marker)
        deadline = time.monotonic() + _WARM_TIMEOUT
        while not ready.exists():
            if not warm.is_alive() or time.monotonic() > deadline or self._closed:
                warm.stop()
                raise OSError(f"it exited or missed {_WARM_TIMEOUT:g}s before its imports "
                              f"were done (see {self.log_dir})")
            self._wake.wait(0.05)
        ready.unlink(missing_ok=True)
        return warm


def targets_of(environments: list[Mapping[str, Any]], resolve: Any,
               field_name: str = "warm_pool") -> dict[str, PoolTarget]:
    """The pool targets of catalog environments (``id``, ``python``, and ``field_name``:
    ``warm_pool`` for servers, ``warm_kernels`` for kernels);
    ``resolve`` maps an environment to its interpreter (raising for one this host lacks,
    which then gets no pool)."""
    targets = {}
    for environment in environments:
        env_id = str(environment.get("id") or "")
        if not env_id:
            continue
        try:
            python = resolve(environment)
        except Exception as exc:  # an interpreter this host lacks: no pool, said once
            log.warning("warm pool %s: %s", env_id, exc)
            continue
        targets[env_id] = PoolTarget(python, max(0, int(environment.get(field_name) or 0)))
    return targets
