"""Workspace servers: start one, know when it answers, stop all of it.

The process-group mechanics are ``runtime.supervisor``'s (shared with the local stack);
this module knows what a JupyterLab or code-server start looks like. Promises:

- A server runs in its own session and process group (``start_new_session``), started
  through the ``launch`` trampoline so its limits bind everything it starts. Servers
  therefore outlive an agent crash, and a restarted agent adopts them (``is_alive`` checks
  the pid *and* its creation time, so a recycled pid is never mistaken for a server).
- Readiness is polled (JupyterLab: ``GET /api/status`` with the token; code-server:
  ``GET /healthz``), never slept for; a server that exits or misses the deadline is stopped
  and the error carries its log tail.
- JupyterLab takes its token from ``JUPYTER_TOKEN``, code-server its password from
  ``PASSWORD``: never on the command line, which every local user can read.
- Both are configured for the IDE access proxy's path ``/w/<workspace id>/``
  (``events.payloads.ide_path``): JupyterLab serves under it (``base_url``, so the
  proxy forwards paths unchanged); code-server serves at its root and works relatively
  behind a prefix, told the prefix only for its ``/absproxy`` (``--abs-proxy-base-path``).
- ``stop`` leaves no process behind. Jupyter starts every kernel in a session of its own
  (jupyter_client's launcher), so signalling the server's group is not enough: the stop
  collects the server's group, its descendants, and every process whose environment
  carries this start's ``STASIS_SERVER_INSTANCE`` marker (which catches kernels, their
  children, and a daemon that called setsid), sends SIGTERM to all of them and their
  groups, waits the grace period, then SIGKILLs what is left and checks again. A warm
  kernel handed to the start (``hand_kernel``: the agent's child, started before the
  marker existed) is collected by the pid and creation time recorded with the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import requests

from events.identity import KEY_VAR
from events.payloads import ide_path, ide_server_path
from runtime import supervisor
from runtime.local import tenancy, userenv
from runtime.local.host import Limits, code_server_command
from runtime.local.settings import TOKEN_VAR
from runtime.local.warm import WarmServer

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MARKER_VAR = "STASIS_SERVER_INSTANCE"
WORKSPACE_VAR = "STASIS_WORKSPACE_ID"
_POLL = 0.1
_TAIL_LINES = 30
_BIND_RACE = ("already in use", "address in use")
# Variables of the agent's own environment that must not leak into a workspace's server.
_DROPPED_PREFIXES = ("JPY_", "JUPYTER_", "STASIS_SERVER_", "VIRTUAL_ENV_PROMPT",
                     "STASIS_SLACK_")
# The control plane's credentials: a kernel that had them could drive the node agent, the
# sidecars, or forge the front doors' requests and sessions.
_DROPPED_NAMES = frozenset({TOKEN_VAR, "STASIS_SIDECAR_KEY", "STASIS_SESSION_SECRET",
                            "STASIS_ALERTMANAGER_TOKEN", KEY_VAR})
# What an isolated workspace's server takes from the agent's environment: the locale, the
# terminal, the search paths. What the server sets itself (home, venv, Jupyter's paths,
# the workspace's markers and devices) comes on top.
_ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "SHELL", "PYTHONPATH",
                      "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "NVIDIA_VISIBLE_DEVICES",
                      "NVIDIA_DRIVER_CAPABILITIES", "LD_LIBRARY_PATH", "OMP_NUM_THREADS"})
_ALLOWED_PREFIXES = ("LC_",)


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
    #: The path the server serves under (JupyterLab's base_url; "" for code-server, and
    #: for servers started before base paths).
    base_path: str = ""
    #: Warm kernels handed to this start (``hand_kernel``): [pid, create_time] each. They
    #: are the agent's children, not the server's, so a stop collects them by these.
    kernels: list[list[float]] = field(default_factory=list)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def pgid(self) -> int:
        # start_new_session makes the server the leader of its own group.
        return self.pid

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}{self.base_path.rstrip('/')}"

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
        return supervisor.same_process(self.pid, self.create_time)

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        return supervisor.read_tail(Path(self.log_path), self.log_offset, lines)

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
            "base_path": self.base_path,
            "kernels": self.kernels,
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
            base_path=str(data.get("base_path", "")),
            kernels=[[int(k[0]), float(k[1])] for k in data.get("kernels") or []],
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
    #: Set on top (the workspace's accelerators: ``CUDA_VISIBLE_DEVICES``).
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: The workspace's own OS user (``runtime.local.tenancy``); None: the agent's.
    uid: int | None = None
    #: This start's ``STASIS_SERVER_INSTANCE`` when the agent chose it first (to save it
    #: with the operation before the process exists); "" for a fresh one.
    marker: str = ""


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
    if launch.uid is not None:
        argv += ["--user", str(launch.uid)]
    if launch.ide == "vscode":
        data = launch.home / ".local" / "share" / "code-server"
        return [
            *argv,
            "--",
            *(code_server_command() or ["code-server"]),
            "--bind-addr", f"{HOST}:{port}",
            "--auth", "password",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            "--abs-proxy-base-path", ide_path(launch.workspace_id).rstrip("/"),
            "--user-data-dir", str(data),
            "--extensions-dir", str(data / "extensions"),
            str(launch.home),
        ]  # fmt: skip
    return [*argv, "--", launch.python, "-m", "jupyterlab", *jupyterlab_args(launch, port)]


def jupyterlab_args(launch: ServerLaunch, port: int) -> list[str]:
    """JupyterLab's own arguments, the same for a cold start and an adopted warm server."""
    args = [
        "--no-browser",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={launch.home}",
        f"--ServerApp.base_url={base_path(launch)}",
        "--ServerApp.allow_remote_access=False",
        # No network calls from a workspace server on its own.
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=",
        "--LabApp.extension_manager=readonly",  # lists installed ones, asks no index
        # Trimmed from every start: jupyter_lsp scans PATH for 19 language servers, none
        # installed here, with the CPU the new workspace's kernel needs (JupyterLab's own
        # LSP features are off unless a user turns them on and installs a server).
        "--ServerApp.jpserver_extensions=jupyter_lsp=False",
    ]  # fmt: skip
    if os.geteuid() == 0 and launch.uid is None:
        args.append("--allow-root")
    return args


def base_path(launch: ServerLaunch) -> str:
    """The path the IDE's server serves under (``events.payloads.ide_server_path``)."""
    return ide_server_path(launch.ide, launch.workspace_id)


def server_env(launch: ServerLaunch, *, token: str, marker: str) -> dict[str, str]:
    """The server's environment, plus the workspace's home and venv, runtime dir and
    markers. A workspace with a user of its own gets only the allow-list of the agent's
    (``_ALLOWED``: no emulator host, project, bucket or credential of any kind); one that
    shares the agent's user gets the agent's minus Jupyter variables of its own and the
    control plane's credentials (hiding more would be no boundary: the same user reads
    the agent's ``/proc/<pid>/environ``)."""
    if launch.uid is not None:
        env = {k: v for k, v in launch.base_env.items()
               if k in _ALLOWED or k.startswith(_ALLOWED_PREFIXES)}
        env.update(tenancy.user_env(launch.uid))
    else:
        env = {k: v for k, v in launch.base_env.items()
               if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED_NAMES}
    home = str(launch.home)
    python_path = [str(launch.repo_root)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env.update(
        {
            "HOME": home,
            "PYTHONUSERBASE": str(launch.home / ".local"),
            "PIP_CACHE_DIR": str(launch.home / ".cache" / "pip"),
            # A terminal's python and pip are the home venv's (runtime.local.userenv).
            "VIRTUAL_ENV": str(userenv.venv_dir(launch.home)),
            "PATH": os.pathsep.join(p for p in (str(userenv.venv_dir(launch.home) / "bin"),
                                                env.get("PATH", os.defpath)) if p),
            "JUPYTER_RUNTIME_DIR": str(launch.runtime_dir),
            "PYTHONPATH": os.pathsep.join(python_path),
            WORKSPACE_VAR: launch.workspace_id,
            MARKER_VAR: marker,
        }
    )
    env.update(launch.extra_env)
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
    launch, token, marker, port = _prepare(launch)
    argv = server_argv(launch, port)
    try:
        child = supervisor.spawn(argv, log_path=launch.log_path, cwd=launch.home,
                                 env=server_env(launch, token=token, marker=marker),
                                 header=f"start on port {port}: {' '.join(argv)}")
    except OSError as exc:
        raise ServerStartError(f"cannot execute {argv[0]!r}: {exc}") from exc
    return _record(launch, child.popen, child.create_time, child.log_offset,
                   port=port, token=token, marker=marker)


def adopt(warm: WarmServer, launch: ServerLaunch) -> ServerProcess:
    """Make a warm server (``runtime.local.warm``) this workspace's: hand it the launch a
    cold start would get (arguments, environment with a fresh token and marker, limits,
    home, log), not waiting for it to answer. It keeps its pid, so the record is as true
    as a spawned one's. Raises ServerStartError when it cannot take the launch (it is
    stopped; the caller starts cold)."""
    launch, token, marker, port = _prepare(launch)
    args = jupyterlab_args(launch, port)
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(launch.log_path, "ab") as log_file:
        offset = log_file.tell()
        log_file.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} adopted warm server "
                       f"{warm.pid} on port {port}: {' '.join(args)}\n".encode())
    order = {
        "argv": args,
        "env": server_env(launch, token=token, marker=marker),
        "cwd": str(launch.home),
        "log": str(launch.log_path),
        "memory_bytes": launch.limits.memory_bytes,
        "cpus": list(launch.limits.cpus) if launch.limits.cpus else None,
        "uid": launch.uid,
    }
    failed = _hand(warm, order)
    if failed is not None:
        raise ServerStartError(f"the warm server {warm.pid} could not take the launch: "
                               f"{failed}") from failed
    return _record(launch, warm.popen, warm.create_time, offset,
                   port=port, token=token, marker=marker)


def hand_kernel(warm: WarmServer, launch: ServerLaunch, server: ServerProcess) -> None:
    """Make a warm kernel (``runtime.local.prekernel``) this workspace's, for its server's
    first kernel: hand it, once, the workspace's log, runtime dir, home, limits and user
    (its environment meanwhile: the home and the user's name only; the kernel's own comes
    with its claim). Recorded in ``server.kernels`` so a stop ends it; reaped by a thread
    of the agent (its parent) when it ends. On failure it is stopped and nothing else
    changes: the server's first kernel starts cold."""
    env = {"HOME": str(launch.home), "PATH": os.defpath}
    if launch.uid is not None:
        env.update(tenancy.user_env(launch.uid))
    order = {
        "log": str(launch.log_path),
        "runtime_dir": str(launch.runtime_dir),
        "cwd": str(launch.home),
        "env": env,
        "server_pid": server.pid,
        "memory_bytes": launch.limits.memory_bytes,
        "cpus": list(launch.limits.cpus) if launch.limits.cpus else None,
        "uid": launch.uid,
    }
    failed = _hand(warm, order)
    if failed is not None:
        log.warning("%s: the warm kernel %d could not take the hand-over: %s",
                    launch.workspace_id, warm.pid, failed)
        return
    server.kernels.append([warm.pid, warm.create_time])
    threading.Thread(target=warm.popen.wait, name=f"reap-kernel-{warm.pid}",
                     daemon=True).start()


def _hand(warm: WarmServer, order: dict[str, Any]) -> Exception | None:
    """Send a warm process its one order (its stdin's only line); the error, the process
    stopped, when it could not take it."""
    try:
        assert warm.popen.stdin is not None
        warm.popen.stdin.write(json.dumps(order).encode() + b"\n")
        warm.popen.stdin.close()
    except (OSError, ValueError) as exc:
        warm.stop()
        return exc
    return None


def _prepare(launch: ServerLaunch) -> tuple[ServerLaunch, str, str, int]:
    """The home, its venv and the private runtime dir made; the launch on the home's venv
    (a pip install lands in the home: ``runtime.local.userenv``, whose kernel spec makes a
    warm server's kernels the venv's too); a fresh token, marker and port."""
    launch.home.mkdir(parents=True, exist_ok=True)
    launch.runtime_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(launch.runtime_dir, 0o700)
    if launch.uid is not None:  # the user's own, before anything of theirs is made
        tenancy.own(launch.home, launch.uid)
        tenancy.own(launch.runtime_dir, launch.uid)
    try:
        own = userenv.ensure(launch.home, launch.python, launch.uid)
    except userenv.UserEnvError as exc:
        raise ServerStartError(f"the workspace's venv: {exc}") from exc
    launch = replace(launch, python=str(own.python), extra_env={**own.env, **launch.extra_env})
    return launch, os.urandom(32).hex(), launch.marker or uuid.uuid4().hex, supervisor.free_port()


def _record(launch: ServerLaunch, popen: subprocess.Popen[bytes], create_time: float,
            log_offset: int, *, port: int, token: str, marker: str) -> ServerProcess:
    return ServerProcess(
        workspace_id=launch.workspace_id,
        pid=popen.pid,
        port=port,
        token=token,
        marker=marker,
        create_time=create_time,
        started_at=time.time(),
        log_path=str(launch.log_path),
        log_offset=log_offset,
        python=launch.python,
        ide=launch.ide,
        base_path=base_path(launch),
        popen=popen,
    )


def wait_ready(server: ServerProcess, *, timeout: float) -> float:
    """Poll the server's readiness path until it answers 200 (with the token); the
    seconds it took.
    On exit or timeout the server is stopped and ServerStartError raised with its log."""
    began = time.monotonic()
    session = requests.Session()
    session.trust_env = False  # loopback probes never go through a proxy
    headers = {"Authorization": f"token {server.token}"}

    def answers(_: ServerProcess, seconds: float) -> bool:
        with contextlib.suppress(requests.RequestException):
            response = session.get(f"{server.base_url}{server.ready_path}", headers=headers,
                                   timeout=seconds)
            return response.status_code == 200
        return False

    def gone(_: ServerProcess) -> str | None:
        if server.is_alive():
            return None
        code = server.popen.poll() if server.popen is not None else None
        return f"exited with code {code}" if code is not None else "exited"

    try:
        ready, failed = supervisor.await_ready([server], answers=answers, gone=gone,
                                               timeout=timeout, interval=_POLL, probe_timeout=2)
    finally:
        session.close()
    if ready:
        return ready[0][1] - began
    why = failed[0][1]
    with contextlib.suppress(ServerError):
        stop(server, grace=2)
    raise ServerStartError(_with_tail(
        f"the server {why} before it answered" if why else
        f"the server did not answer on port {server.port} within {timeout:g}s", server))


def stop(server: ServerProcess, *, grace: float) -> None:
    """Stop the server and everything it started; returns when none of it is left.
    Idempotent. Raises ServerStopError if something survives SIGKILL."""
    left = supervisor.terminate(lambda: _tree(server), grace=grace)
    if server.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.popen.wait(timeout=supervisor.KILL_WAIT)
    if left:
        raise ServerStopError(
            f"{server.workspace_id}: processes survived SIGKILL: {sorted(p.pid for p in left)}"
        )


def stop_marked(marker: str, *, grace: float) -> None:
    """Stop every process of the start whose marker is ``marker`` (its server, kernels and
    their children), known to the agent or not. Raises ServerStopError if any survived."""
    left = supervisor.terminate(lambda: _marked(marker, []), grace=grace)
    if left:
        raise ServerStopError(f"processes of start {marker} survived SIGKILL: "
                              f"{sorted(p.pid for p in left)}")


def _tree(server: ServerProcess) -> list[psutil.Process]:
    """Live processes that belong to this start of the server: its group and descendants,
    and every process whose environment carries this start's marker (kernels, which
    jupyter_client starts in sessions of their own, and their children)."""
    found = supervisor.process_tree(server.pid, server.create_time)
    for pid, create_time in server.kernels:
        found += supervisor.process_tree(int(pid), create_time)
    return _marked(server.marker, found)


def _marked(marker: str, found: list[psutil.Process]) -> list[psutil.Process]:
    """``found`` and every other live process whose environment carries ``marker``."""
    known = {p.pid for p in found} | {os.getpid()}
    for proc in psutil.process_iter():
        if proc.pid in known:
            continue
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
    return supervisor.merge(found)


def _with_tail(message: str, server: ServerProcess) -> str:
    return f"{message}; last lines of {server.log_path}:\n{server.log_tail()}"
