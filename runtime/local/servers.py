"""Process supervision of workspace servers: start one, know when it answers, stop all of it.

Promises:

- A server runs in its own session and process group (``start_new_session``), started
  through the ``launch`` trampoline so its limits bind everything it starts. Servers
  therefore outlive an agent crash, and a restarted agent adopts them (``is_alive`` checks
  the pid *and* its creation time, so a recycled pid is never mistaken for a server).
- Readiness is polled (JupyterLab: ``GET /api/status`` with the token; code-server:
  ``GET /healthz``), never slept for; a server that exits or misses the deadline is stopped
  and the error carries its log tail.
- JupyterLab takes its token from ``JUPYTER_TOKEN``, code-server its password from
  ``PASSWORD``: never on the command line, which every local user can read.
- ``stop`` leaves no process behind. Jupyter starts every kernel in a session of its own
  (jupyter_client's launcher), so signalling the server's group is not enough: the stop
  collects the server's group, its descendants, and every process whose environment
  carries this start's ``STASIS_SERVER_INSTANCE`` marker (which catches kernels, their
  children, and a daemon that called setsid), sends SIGTERM to all of them and their
  groups, waits the grace period, then SIGKILLs what is left and checks again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from runtime.local.host import Limits

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MARKER_VAR = "STASIS_SERVER_INSTANCE"
WORKSPACE_VAR = "STASIS_WORKSPACE_ID"
_POLL = 0.1
_KILL_WAIT = 10.0
_TAIL_LINES = 30
_TAIL_BYTES = 64 * 1024
_CREATE_TIME_SLACK = 0.5
_BIND_RACE = ("already in use", "address in use")
# Variables of the agent's own environment that must not leak into a workspace's server.
_DROPPED_PREFIXES = ("JPY_", "JUPYTER_", "STASIS_SERVER_", "VIRTUAL_ENV_PROMPT")


class ServerError(RuntimeError):
    """A server could not be started or stopped."""


class ServerStartError(ServerError):
    """The server exited before answering, or did not answer in time. The message ends
    with the last lines of its log."""


class ServerStopError(ServerError):
    """Processes of the server survived SIGKILL (reported, never hidden)."""


@dataclass
class ServerProcess:
    """One started server, as recorded in the agent's state file."""

    workspace_id: str
    pid: int
    port: int
    token: str
    marker: str
    create_time: float
    started_at: float
    log_path: str
    log_offset: int = 0
    python: str = ""
    ide: str = "jupyterlab"
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def pgid(self) -> int:
        # start_new_session makes the server the leader of its own group.
        return self.pid

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/lab" if self.ide == "jupyterlab" else f"{self.base_url}/"

    @property
    def ready_path(self) -> str:
        return "/api/status" if self.ide == "jupyterlab" else "/healthz"

    @property
    def handle(self) -> str:
        return f"local:{self.pid}"

    def is_alive(self) -> bool:
        """Whether the server process we started still runs (not a zombie, not a pid
        recycled by another process)."""
        if self.popen is not None and self.popen.poll() is not None:
            return False
        try:
            proc = psutil.Process(self.pid)
            return bool(
                abs(proc.create_time() - self.create_time) <= _CREATE_TIME_SLACK
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        return read_tail(Path(self.log_path), self.log_offset, lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "port": self.port,
            "token": self.token,
            "marker": self.marker,
            "create_time": self.create_time,
            "started_at": self.started_at,
            "log_path": self.log_path,
            "log_offset": self.log_offset,
            "python": self.python,
            "ide": self.ide,
        }

    @classmethod
    def from_json(cls, workspace_id: str, data: Mapping[str, Any]) -> ServerProcess:
        return cls(
            workspace_id=workspace_id,
            pid=int(data["pid"]),
            port=int(data["port"]),
            token=str(data["token"]),
            marker=str(data["marker"]),
            create_time=float(data["create_time"]),
            started_at=float(data["started_at"]),
            log_path=str(data["log_path"]),
            log_offset=int(data.get("log_offset", 0)),
            python=str(data.get("python", "")),
            ide=str(data.get("ide", "jupyterlab")),
        )


@dataclass(frozen=True)
class ServerLaunch:
    """What to start: a workspace's server, its files and its limits."""

    workspace_id: str
    home: Path
    runtime_dir: Path
    log_path: Path
    repo_root: Path
    python: str = sys.executable
    limits: Limits = field(default_factory=Limits)
    ide: str = "jupyterlab"
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def resolve_python(environment: Mapping[str, Any]) -> str:
    """The interpreter of an environment: ``python`` absent or "default" means the agent's
    own; otherwise a path or a command on PATH. Raises ServerError naming the
    environment when there is no such interpreter."""
    wanted = environment.get("python") or "default"
    if wanted == "default":
        return sys.executable
    name = environment.get("id") or environment.get("name") or "?"
    found = shutil.which(str(wanted))
    if not found:
        raise ServerError(f"environment {name}: interpreter {wanted!r} not found on this host")
    return found


def server_argv(launch: ServerLaunch, port: int) -> list[str]:
    """The trampoline, then the IDE's server on loopback."""
    argv = [sys.executable, "-m", "runtime.local.launch"]
    if launch.limits.memory_bytes:
        argv += ["--memory-bytes", str(launch.limits.memory_bytes)]
    if launch.limits.cpus:
        argv += ["--cpus", ",".join(str(c) for c in launch.limits.cpus)]
    if launch.ide == "vscode":
        data = launch.home / ".local" / "share" / "code-server"
        return [
            *argv,
            "--",
            shutil.which("code-server") or "code-server",
            "--bind-addr", f"{HOST}:{port}",
            "--auth", "password",
            "--disable-telemetry",
            "--disable-update-check",
            "--user-data-dir", str(data),
            "--extensions-dir", str(data / "extensions"),
            str(launch.home),
        ]  # fmt: skip
    argv += [
        "--",
        launch.python, "-m", "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={launch.home}",
        "--ServerApp.allow_remote_access=False",
        # No network calls from a workspace server on its own.
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
    ]  # fmt: skip
    if os.geteuid() == 0:
        argv.append("--allow-root")
    return argv


def server_env(launch: ServerLaunch, *, token: str, marker: str) -> dict[str, str]:
    """The server's environment: the agent's (emulator hosts, credentials), minus Jupyter
    variables of its own, plus the workspace's home, runtime dir and markers."""
    env = {k: v for k, v in launch.base_env.items() if not k.startswith(_DROPPED_PREFIXES)}
    home = str(launch.home)
    python_path = [str(launch.repo_root)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env.update(
        {
            "HOME": home,
            "PYTHONUSERBASE": str(launch.home / ".local"),
            "PIP_CACHE_DIR": str(launch.home / ".cache" / "pip"),
            "JUPYTER_RUNTIME_DIR": str(launch.runtime_dir),
            "PYTHONPATH": os.pathsep.join(python_path),
            WORKSPACE_VAR: launch.workspace_id,
            MARKER_VAR: marker,
        }
    )
    env["PASSWORD" if launch.ide == "vscode" else "JUPYTER_TOKEN"] = token
    return env


def start(launch: ServerLaunch, *, timeout: float, attempts: int = 3) -> ServerProcess:
    """Start the server and wait until it answers with its token. Retries on a port taken
    between choosing and binding; raises ServerStartError (nothing left running) else."""
    for attempt in range(1, attempts + 1):
        server = spawn(launch)
        try:
            wait_ready(server, timeout=timeout)
            return server
        except ServerStartError as exc:
            race = any(w in str(exc).lower() for w in _BIND_RACE)
            if attempt == attempts or not race:
                raise
            log.info("%s: port %d was taken, retrying", launch.workspace_id, server.port)
    raise AssertionError("unreachable")


def spawn(launch: ServerLaunch) -> ServerProcess:
    """Start the server process (not waiting for it)."""
    launch.home.mkdir(parents=True, exist_ok=True)
    launch.runtime_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(launch.runtime_dir, 0o700)
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    token = os.urandom(32).hex()
    marker = uuid.uuid4().hex
    port = free_port()
    argv = server_argv(launch, port)
    with open(launch.log_path, "ab") as log_file:
        offset = log_file.tell()
        log_file.write(
            f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} start on port {port}: "
            f"{' '.join(argv)}\n".encode()
        )
        log_file.flush()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=launch.home,
                env=server_env(launch, token=token, marker=marker),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ServerStartError(f"cannot execute {argv[0]!r}: {exc}") from exc
    try:
        create_time = psutil.Process(popen.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = time.time()
    return ServerProcess(
        workspace_id=launch.workspace_id,
        pid=popen.pid,
        port=port,
        token=token,
        marker=marker,
        create_time=create_time,
        started_at=time.time(),
        log_path=str(launch.log_path),
        log_offset=offset,
        python=launch.python,
        ide=launch.ide,
        popen=popen,
    )


def wait_ready(server: ServerProcess, *, timeout: float) -> float:
    """Poll the server's readiness path until it answers 200 (with the token); the
    seconds it took.
    On exit or timeout the server is stopped and ServerStartError raised with its log."""
    began = time.monotonic()
    deadline = began + timeout
    session = requests.Session()
    session.trust_env = False  # loopback probes never go through a proxy
    headers = {"Authorization": f"token {server.token}"}
    try:
        while True:
            if not server.is_alive():
                code = server.popen.poll() if server.popen is not None else None
                why = f"exited with code {code}" if code is not None else "exited"
                raise ServerStartError(_with_tail(f"the server {why} before it answered", server))
            with contextlib.suppress(requests.RequestException):
                response = session.get(
                    f"{server.base_url}{server.ready_path}", headers=headers, timeout=2
                )
                if response.status_code == 200:
                    return time.monotonic() - began
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    _with_tail(
                        f"the server did not answer on port {server.port} within {timeout:g}s",
                        server,
                    )
                )
            time.sleep(_POLL)
    except ServerStartError:
        with contextlib.suppress(ServerError):
            stop(server, grace=2)
        raise
    finally:
        session.close()


def stop(server: ServerProcess, *, grace: float) -> None:
    """Stop the server and everything it started; returns when none of it is left.
    Idempotent. Raises ServerStopError if something survives SIGKILL."""
    targets = _tree(server)
    if targets:
        _signal_all(targets, signal.SIGTERM, server)
        _, alive = psutil.wait_procs(targets, timeout=grace)
        # A kernel may have been (re)started during the grace period.
        alive = _merge(alive, _tree(server))
        if alive:
            log.info(
                "%s: %d processes still alive after %.1fs, killing",
                server.workspace_id,
                len(alive),
                grace,
            )
            _signal_all(alive, signal.SIGKILL, server)
            psutil.wait_procs(alive, timeout=_KILL_WAIT)
    if server.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.popen.wait(timeout=_KILL_WAIT)
    left = _tree(server)
    if left:
        raise ServerStopError(
            f"{server.workspace_id}: processes survived SIGKILL: {sorted(p.pid for p in left)}"
        )


def _tree(server: ServerProcess) -> list[psutil.Process]:
    """Live processes that belong to this start of the server."""
    found: dict[int, psutil.Process] = {}
    leader: psutil.Process | None = None
    if server.is_alive():
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(server.pid)
            found[leader.pid] = leader
            for child in leader.children(recursive=True):
                found[child.pid] = child
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == me:
            continue
        try:
            in_group = leader is not None and os.getpgid(proc.pid) == server.pgid
            if in_group or proc.environ().get(MARKER_VAR) == server.marker:
                found[proc.pid] = proc
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return [p for p in found.values() if _is_live(p)]


def _signal_all(
    procs: Iterable[psutil.Process], sig: signal.Signals, server: ServerProcess
) -> None:
    own_group = os.getpgrp()
    groups: set[int] = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            groups.add(os.getpgid(proc.pid))
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    for pgid in groups:
        # Never our own group, nor init's: a process may have joined neither, but be safe.
        if pgid in (own_group, 0, 1):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    log.debug(
        "%s: sent %s to %d processes in %d groups",
        server.workspace_id,
        sig.name,
        len(groups),
        len(groups),
    )


def _merge(a: list[psutil.Process], b: list[psutil.Process]) -> list[psutil.Process]:
    merged = {p.pid: p for p in a if _is_live(p)}
    for p in b:
        merged.setdefault(p.pid, p)
    return list(merged.values())


def _is_live(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def read_tail(path: Path, offset: int = 0, lines: int = _TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - _TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(the log is empty)"


def _with_tail(message: str, server: ServerProcess) -> str:
    return f"{message}; last lines of {server.log_path}:\n{server.log_tail()}"
