"""Agent sandboxes on the local runtime: the node agent's endpoints and its runner.

Served by the node agent (``register_sandboxes`` adds them to its Flask app), on
127.0.0.1 only, JSON in and out, errors ``{"error": message}`` with the agent's codes:

    GET    /sandboxes              {"isolation": {...}, "sandboxes": [status, ...]}
    PUT    /sandboxes/<id>         body: the run spec (``functions.domain.sandboxes.RunSpec``)
                                   -> 202; sandbox.finished when it ends
    GET    /sandboxes/<id>         state (running, suspended, finished, reported), pid,
                                   result, suspension, ...
    POST   /sandboxes/<id>/resume  let a suspended sandbox go on -> 200 (idempotent)
    DELETE /sandboxes/<id>         cancel a running or suspended sandbox -> 200 (it reports
                                   ``cancelled``)

Why endpoints on the node agent rather than a sandbox service of its own: the agent already
is the local runtime's one door (the control plane knows its URL, ``stasis up`` starts and
waits for it, ``stasis down`` stops it), it already publishes the runtime's events, and a
sandbox needs nothing the agent's process holds: each one runs under a monitor process of
its own (``runtime.local.sandbox_task``) that outlives an agent restart. The runner here
only validates, decides the isolation, starts monitors and reports what they leave.

Isolation is decided once per agent by a probe (``detect_isolation``), never assumed, and
fails closed (``Isolation.refusal``): a sandbox whose network namespace, mount namespace or
user drop the probe did not verify (each probed on its own) is refused with the reason
(409: the control plane records it FAILED) unless unisolated sandboxes are allowed (the
team's admin policy in the run spec, or this node's STASIS_SANDBOX_ALLOW_UNISOLATED, which
wins: ``unisolated_allowed``); a root agent whose drop failed refuses every sandbox (never
a task as root). RLIMIT_NPROC applies always.

- **mounts**: in a mount namespace of its own the task finds the agent's data dir (state,
  tokens, homes), every sandbox's directory but its own, the code the agent and kernels
  import and their venv (``SandboxRunner.hidden``) under an empty read-only tmpfs; with a
  root agent its working copy, home and tmp share one tmpfs of its disk quota (the
  monitor's, ``runtime.local.sandbox_task``).

- **network**: when the probe shows that a process in a new network namespace cannot reach
  a server on the host's loopback nor re-enter the host's namespace, a sandbox without
  allowed destinations runs there (loopback only). Otherwise every result says, in its
  ``network`` field, that network isolation is NOT enforced on this host, and why.
  A sandbox with allowed destinations runs on the host network; the local runtime does
  not filter by destination, and its result says so (the Kubernetes runtime does, with a
  NetworkPolicy: ``functions.kubernetes.objects.sandbox``).
- **users**: an agent running as root gives each sandbox a user of its own (uid
  200000 + n, no supplementary groups): it cannot read root's files, signal other
  processes, or leave its namespace, and RLIMIT_NPROC counts its processes alone. The
  task's tools must then be readable by others (/usr/bin; not a Python under /root), and
  sandbox directories live where others can traverse (``sandbox_root``). An agent running
  as a normal user runs sandboxes as that user, in a user namespace for the network.
  The uid is leased host-wide (``runtime.local.uids``) before it is given: no other agent on
  the host gives it (nor kills its processes at its own clean-up) while the sandbox is live;
  it is given up when the sandbox's result is reported (and any lease of a sandbox that is
  no longer live, at the agent's next sandbox start).

Idle suspension (``limits.idle_seconds``): the monitor holds an idle task and writes
``suspended.json``; the agent's watcher publishes it as sandbox.suspended, once per
suspension (requestid ``<request>.suspend-<n>``, the ``suspension.reported`` marker), and a
resume is SIGUSR1 to the monitor. How the task is held, and that its memory stays
resident, is ``runtime.local.sandbox_task``'s to say.

Crash recovery: a restarted agent (``recover``) waits for monitors still running, and
reports results left unreported; a sandbox whose monitor died without a result is reported
``runtime_lost``. A sandbox is reported once (the ``reported`` marker), and reporting again
is harmless anyway (the control plane's ledger drops a second sandbox.finished).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, jsonify, request

from events import SandboxFinished, SandboxSuspended, crashpoints, new_event
from runtime import supervisor
from runtime.local.node import BadRequest, NotFound, Refused
from runtime.local.publisher import Publisher
from runtime.local.sandbox_task import DISK_BYTES, EXEC_PATH, reachable_by_others
from runtime.local.settings import AgentSettings
from runtime.local.uids import HostUids, UidTaken

log = logging.getLogger(__name__)

SANDBOX_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
UID_BASE = 200_000
UID_COUNT = 50_000
LIMIT_KEYS = ("cpu_seconds", "memory_bytes", "wall_clock_seconds", "processes")
FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The node admin's consent to sandboxes whose isolation the probe could not verify.
ALLOW_UNISOLATED = "STASIS_SANDBOX_ALLOW_UNISOLATED"
#: More directories a task must not see (``SandboxRunner.hidden``), ``:``-separated.
HIDE = "STASIS_SANDBOX_HIDE"
_PROBE_TIMEOUT = 20.0
_HOW_TO_ALLOW = ("An admin may allow unisolated sandboxes (allow_unisolated: true in the "
                 "sandboxes section of the admin file, or STASIS_SANDBOX_ALLOW_UNISOLATED=1 "
                 "on this node)")
_FINISHED_FIELDS = {f.name for f in dataclasses.fields(SandboxFinished)}
_SUSPENDED_FIELDS = {f.name for f in dataclasses.fields(SandboxSuspended)}
_LIVE = ("running", "suspended")
_WATCH_SECONDS = 0.2


@dataclass(frozen=True)
class Isolation:
    """What this host lets the runner enforce, as the probe found it."""

    network: bool
    separate_users: bool
    detail: str
    #: Why a root agent's sandboxes cannot get a user of their own ("" when they can).
    users_detail: str = ""
    #: Whether a mount namespace hides the agent's state, homes and code (probed itself).
    mounts: bool = False
    mounts_detail: str = ""

    def refusal(self, allowed: list[str], *, agent_uid: int,
                allow_unisolated: bool) -> str | None:
        """Why this host must not run a sandbox (None: it may). Fails closed: what the probe
        did not verify is refused unless unisolated sandboxes are allowed (the admin
        policy, or this node's override: ``unisolated_allowed``); a task never runs as
        root."""
        if agent_uid == 0 and not self.separate_users:
            # Without a verified drop the task would be root on this host.
            return ("refused: the sandbox's own user could not be verified on this host "
                    f"({self.users_detail or 'the probe did not drop privileges'}), and a "
                    "task never runs as root")
        if allow_unisolated:
            return None
        if not allowed and not self.network:
            return ("refused: network isolation could not be verified on this host "
                    f"({self.detail}); the task would reach this host's loopback services. "
                    f"{_HOW_TO_ALLOW}")
        if not self.mounts:
            return ("refused: the mount namespace that hides the node agent's state, the "
                    "workspaces' homes and the kernels' code could not be verified on this "
                    f"host ({self.mounts_detail or 'not probed'}); the task could read them. "
                    f"{_HOW_TO_ALLOW}")
        if agent_uid != 0:
            return (f"refused: the node agent runs as uid {agent_uid}, not root, so the task "
                    "would run as the agent's own user (its state, every workspace's home "
                    f"and token readable). {_HOW_TO_ALLOW}")
        return None

    def statement(self, allowed: list[str]) -> str:
        """The ``network`` field of a sandbox's result: what it could reach, as enforced."""
        if allowed:
            return (f"host network, opened for {', '.join(allowed)}: the local runtime does "
                    "not filter by destination, so the task could also reach other hosts and "
                    "this host's loopback services")
        if self.network:
            return ("none: a network namespace with loopback only (probed: the host's "
                    "loopback is unreachable and the host namespace cannot be re-entered)")
        return (f"NOT ENFORCED on this host ({self.detail}): the task could reach the "
                "network and this host's loopback services")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def detect_isolation(python: str = sys.executable) -> Isolation:
    """Probe, in a fresh process, what a sandbox here can be kept from: the network, the
    mount namespace (a directory with a readable file is hidden, one under it kept) and
    the user drop, each on its own."""
    separate_users = os.geteuid() == 0
    probe_uid = UID_BASE + UID_COUNT - 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server, \
            tempfile.TemporaryDirectory(prefix="stasis-probe-") as scratch:
        hidden, kept = Path(scratch) / "hidden", Path(scratch) / "hidden" / "kept"
        kept.mkdir(parents=True)
        (hidden / "secret").write_text("the agent's state\n")
        (kept / "marker").write_text("the sandbox's own directory\n")
        for path, mode in ((Path(scratch), 0o711), (hidden, 0o711), (kept, 0o755),
                           (hidden / "secret", 0o644), (kept / "marker", 0o644)):
            os.chmod(path, mode)
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        argv = [python, "-I", str(EXEC_PATH), "--probe", "--port",
                str(server.getsockname()[1]), "--hide", str(hidden), "--keep", str(kept)]
        if separate_users:
            argv += ["--uid", str(probe_uid), "--gid", str(probe_uid)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT,
                                  env={"PATH": FALLBACK_PATH}, cwd="/", check=False)
            report = json.loads(done.stdout or "{}")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            return Isolation(False, False, f"the isolation probe failed: {exc}",
                             mounts_detail=f"the isolation probe failed: {exc}")
    users_detail = ""
    if separate_users and (report.get("user") is not True or report.get("uid") != probe_uid):
        separate_users = False
        users_detail = str(report.get("user_why") or f"the probe ran as uid {report.get('uid')}")
    mounts = report.get("mounts") is True
    mounts_detail = ("a mount namespace hides the agent's state, homes and code"
                     if mounts else str(report.get("mounts_why") or "no report"))
    if report.get("network"):
        users = "; each sandbox runs as its own user" if separate_users else ""
        return Isolation(True, separate_users,
                         f"network namespaces (host loopback {report.get('host_loopback')}, "
                         f"setns: {report.get('setns')}){users}", users_detail,
                         mounts, mounts_detail)
    why = report.get("why") or (done.stderr.strip().splitlines() or ["no report"])[-1]
    return Isolation(False, separate_users, str(why), users_detail, mounts, mounts_detail)


def sandbox_root(settings: AgentSettings, isolation: Isolation,
                 environ: Mapping[str, str] = os.environ) -> Path:
    """Where sandbox directories live: ``STASIS_SANDBOX_DIR``, else ``<data dir>/sandboxes``.
    When sandboxes run as users of their own, that place must be traversable by them; if it
    is not (a data dir under /root or a 0700 tmp dir), a directory of this data dir's own
    under the system's temporary directory is used instead, and logged."""
    chosen = Path(environ.get("STASIS_SANDBOX_DIR") or settings.data_dir / "sandboxes")
    if not isolation.separate_users or reachable_by_others(str(chosen.parent)):
        return chosen
    digest = hashlib.sha256(str(settings.data_dir).encode()).hexdigest()[:12]
    fallback = Path(tempfile.gettempdir()) / f"stasis-sandboxes-{digest}"
    log.info("sandboxes: %s is not reachable by sandbox users; using %s", chosen, fallback)
    return fallback


def candidate_roots(settings: AgentSettings,
                    environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Every place ``sandbox_root`` may choose (to find sandboxes without probing)."""
    digest = hashlib.sha256(str(settings.data_dir).encode()).hexdigest()[:12]
    return [Path(environ.get("STASIS_SANDBOX_DIR") or settings.data_dir / "sandboxes"),
            Path(tempfile.gettempdir()) / f"stasis-sandboxes-{digest}"]


def parse_run_spec(sandbox_id: str, body: Any) -> dict[str, Any]:
    """The run spec of a PUT, checked; BadRequest names what is wrong."""
    if not SANDBOX_ID.fullmatch(sandbox_id or ""):
        raise BadRequest(f"not a sandbox id: {sandbox_id!r} (lowercase letters, digits, "
                         "dashes; 3 to 63 characters)")
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a run spec (a JSON object)")
    if body.get("sandbox_id") != sandbox_id:
        raise BadRequest(f"the spec is for sandbox {body.get('sandbox_id')!r}, not {sandbox_id}")
    spec: dict[str, Any] = {"sandbox_id": sandbox_id}
    for name in ("team", "repository", "base_ref", "command", "requestid", "bucket", "prefix"):
        value = body.get(name)
        if not isinstance(value, str) or not value.strip():
            raise BadRequest(f"{name} is required (a non-empty string)")
        spec[name] = value
    limits = body.get("limits")
    if not isinstance(limits, Mapping):
        raise BadRequest("limits must be an object")
    spec["limits"] = {}
    for name in LIMIT_KEYS:
        value = limits.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"limits.{name} must be a whole number of at least 1")
        spec["limits"][name] = value
    # Optional: a control plane from before idle suspension sends none (never suspend).
    idle = limits.get("idle_seconds", 0)
    if isinstance(idle, bool) or not isinstance(idle, int) or idle < 0:
        raise BadRequest("limits.idle_seconds must be a whole number of at least 0")
    spec["limits"]["idle_seconds"] = idle
    # Optional: a control plane from before disk quotas sends none (the default quota).
    disk = limits.get("disk_bytes", DISK_BYTES)
    if isinstance(disk, bool) or not isinstance(disk, int) or disk < 1:
        raise BadRequest("limits.disk_bytes must be a whole number of at least 1")
    spec["limits"]["disk_bytes"] = disk
    allowed = body.get("allowed_network") or []
    if not isinstance(allowed, list) or not all(isinstance(a, str) and a for a in allowed):
        raise BadRequest("allowed_network must be a list of destinations")
    spec["allowed_network"] = list(allowed)
    consent = body.get("allow_unisolated", False)
    if not isinstance(consent, bool):
        raise BadRequest("allow_unisolated must be true or false")
    spec["allow_unisolated"] = consent
    return spec


def unisolated_allowed(spec: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """Whether this sandbox may run where isolation is unverified. The team's admin policy
    (``allow_unisolated`` in the admin file's ``sandboxes`` section, carried in the run
    spec) decides, unless this node's admin set STASIS_SANDBOX_ALLOW_UNISOLATED: ``1`` allows
    every sandbox on this node (a single-user host), ``0`` refuses them whatever the policy
    says. The node's setting wins: it is the one who knows the host."""
    node = environ.get(ALLOW_UNISOLATED, "").strip().lower()
    if node in ("1", "true", "yes"):
        return True
    if node in ("0", "false", "no"):
        return False
    return bool(spec.get("allow_unisolated"))


class SandboxRunner:
    def __init__(
        self,
        settings: AgentSettings,
        publisher: Publisher,
        *,
        isolation: Isolation | None = None,
        root: Path | None = None,
        environ: Mapping[str, str] | None = None,
        python: str = sys.executable,
        recover: bool = True,
        uids: HostUids | None = None,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        self.isolation = isolation or detect_isolation(python)
        self.root = root or sandbox_root(settings, self.isolation, self.environ)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        self._uids = uids or HostUids(self.root)
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        log.info("sandboxes in %s; isolation: %s", self.root, self.isolation.detail)
        if recover:
            self.recover()

    # -- start -----------------------------------------------------------------------------

    def start(self, sandbox_id: str, body: Any) -> dict[str, Any]:
        spec = parse_run_spec(sandbox_id, body)
        directory = self.root / sandbox_id
        with self._lock:
            if (directory / "spec.json").exists():
                known = self._spec(sandbox_id)
                if known.get("requestid") != spec["requestid"]:
                    raise Refused(f"sandbox {sandbox_id} already exists on this node for "
                                  "another request")
                state = self._state(sandbox_id)
                if state == "reported":
                    # The control plane asks again after a crash: tell it again.
                    self._spawn(sandbox_id, self._report, sandbox_id, True)
                return {"sandbox_id": sandbox_id, "accepted": True,
                        "detail": f"already {state}"}
            refused = self.isolation.refusal(
                list(spec["allowed_network"]), agent_uid=os.geteuid(),
                allow_unisolated=unisolated_allowed(spec, self.environ))
            if refused is not None:  # nothing is written: the control plane records FAILED
                raise Refused(f"sandbox {sandbox_id} {refused}")
            if not self.root.is_dir():  # removed under a running agent (a cleanup)
                self.root.mkdir(parents=True, exist_ok=True)
                os.chmod(self.root, 0o711)
            directory.mkdir(mode=0o711, exist_ok=True)  # exists: a start that crashed
            os.chmod(directory, 0o711)
            spec.update(self._decisions(spec))
            supervisor.write_json(directory / "spec.json", spec)
            self._launch(spec)
        return {"sandbox_id": sandbox_id, "accepted": True, "detail": "started",
                "network": spec["network"]}

    def _decisions(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """How this sandbox is isolated on this host (recorded in its spec)."""
        allowed = list(spec["allowed_network"])
        uid = self._free_uid(spec["sandbox_id"]) if self.isolation.separate_users else None
        path = self.environ.get("PATH") or FALLBACK_PATH
        if uid is not None:
            path = ":".join(p for p in path.split(":") if reachable_by_others(p)) or \
                FALLBACK_PATH
        hide = self.hidden() if self.isolation.mounts else []
        path = ":".join(p for p in path.split(":") if not _under(p, hide)) or FALLBACK_PATH
        return {
            "uid": uid, "gid": uid,
            "hide": hide, "keep": [str(self.root / spec["sandbox_id"])],
            # The monitor mounts it in a mount namespace of its own: root only.
            "disk_quota": self.isolation.mounts and os.geteuid() == 0,
            "net": "isolated" if self.isolation.network and not allowed else "host",
            "isolation": self.isolation.network,
            "network": self.isolation.statement(allowed),
            "python": self.python, "path": path,
            "started_at": datetime.now(UTC).isoformat(),
        }

    def hidden(self) -> list[str]:
        """What a task must not see: the agent's data directory (its state and tokens, the
        workspaces' homes), every sandbox's directory (its own is kept), the code the
        agent and the kernels import, the virtual environment they run in, and what the
        node's admin adds (``STASIS_SANDBOX_HIDE``: directories separated by ``:``, for
        example a shared dataset cache or another code tree)."""
        paths = [self.settings.data_dir, self.root, self.settings.repo_root,
                 *(p for p in self.environ.get(HIDE, "").split(":") if p.strip())]
        if sys.prefix != sys.base_prefix:  # a venv: the kernels' packages
            paths.append(Path(sys.prefix))
        return sorted({str(Path(p).resolve()) for p in paths})

    def _free_uid(self, sandbox_id: str) -> int:
        """A uid no live sandbox of this agent has, no process on the host runs as and no
        other agent on the host holds, leased to ``sandbox_id``."""
        with self._lock:
            live_ids = {d.name for d in self._dirs() if self._state(d.name) in _LIVE}
            for uid, key in self._uids.held().items():
                if key.startswith("sandbox:") and key.removeprefix("sandbox:") not in live_ids:
                    self._uids.release(uid, key)
            taken = {self._spec(name).get("uid") for name in live_ids}
            candidates = (UID_BASE + n for n in range(UID_COUNT - 1)
                          if UID_BASE + n not in taken)
            try:
                return self._uids.claim(f"sandbox:{sandbox_id}", candidates)
            except UidTaken:
                raise Refused("no free sandbox user left on this node") from None

    def _launch(self, spec: Mapping[str, Any]) -> None:
        directory = self.root / spec["sandbox_id"]
        repo_root = str(self.settings.repo_root)
        python_path = os.pathsep.join(p for p in (repo_root, self.environ.get("PYTHONPATH"))
                                      if p)
        monitor = supervisor.spawn(
            [self.python, "-m", "runtime.local.sandbox_task", str(directory)],
            log_path=directory / "monitor.log", cwd=Path(repo_root),
            env={**self.environ, "PYTHONPATH": python_path})
        supervisor.write_json(directory / "monitor.json",
                              {"pid": monitor.pid, "create_time": monitor.create_time})
        log.info("sandbox %s: monitor pid %d (%s)", spec["sandbox_id"], monitor.pid, spec["net"])
        self._spawn(spec["sandbox_id"], self._wait_popen, spec["sandbox_id"], monitor.popen)

    # -- watching and reporting ------------------------------------------------------------

    def _wait_popen(self, sandbox_id: str, popen: subprocess.Popen[bytes]) -> None:
        while popen.poll() is None:
            self._report_suspension(sandbox_id)
            time.sleep(_WATCH_SECONDS)
        self._report(sandbox_id)

    def _wait_pid(self, sandbox_id: str) -> None:
        while self._monitor_alive(sandbox_id):
            self._report_suspension(sandbox_id)
            time.sleep(_WATCH_SECONDS)
        self._report(sandbox_id)

    def _report_suspension(self, sandbox_id: str) -> None:
        """Publish the monitor's latest suspension, once. One that is over already (the
        sandbox was resumed or cancelled before it was published) is not news."""
        directory = self.root / sandbox_id
        held = _read_json(directory / "suspended.json")
        sequence = int(held.get("sequence") or 0)
        if sequence <= int(_read_json(directory / "suspension.reported").get("sequence") or 0):
            return
        if held.get("state") == "suspended":
            payload = SandboxSuspended(**{k: v for k, v in (held.get("payload") or {}).items()
                                          if k in _SUSPENDED_FIELDS})
            requestid = f"{self._spec(sandbox_id).get('requestid')}.suspend-{sequence}"
            try:
                self.publisher.publish(new_event(payload, source=self.settings.event_source,
                                                 requestid=requestid))
            except Exception:
                log.exception("sandbox %s: publishing sandbox.suspended failed (retried)",
                              sandbox_id)
                return
        supervisor.write_json(directory / "suspension.reported",
                              {"sequence": sequence, "at": datetime.now(UTC).isoformat()})

    def _report(self, sandbox_id: str, again: bool = False) -> None:
        directory = self.root / sandbox_id
        with self._lock:
            if (directory / "reported").exists() and not again:
                return
            payload = self._finished(sandbox_id)
            spec = self._spec(sandbox_id)
            event = new_event(payload, source=self.settings.event_source,
                              requestid=spec.get("requestid"))
            if isinstance(spec.get("uid"), int):
                # It ended: its uid may go to another (a process still running as it keeps
                # it from any claim anyway).
                self._uids.release(spec["uid"], f"sandbox:{sandbox_id}")
        crashpoints.reach("sandbox.result_uploaded")
        for attempt in range(3):
            try:
                message_id = self.publisher.publish(event)
                break
            except Exception:
                log.exception("sandbox %s: publishing sandbox.finished failed (attempt %d)",
                              sandbox_id, attempt + 1)
                time.sleep(2.0 * (attempt + 1))
        else:
            return  # left unreported: the next start of the agent reports it
        supervisor.write_json(directory / "reported",
                              {"message_id": message_id, "at": datetime.now(UTC).isoformat()})

    def _finished(self, sandbox_id: str) -> SandboxFinished:
        directory = self.root / sandbox_id
        try:
            result = json.loads((directory / "result.json").read_text())
            return SandboxFinished(**{k: v for k, v in result.items() if k in _FINISHED_FIELDS})
        except (OSError, ValueError, TypeError) as exc:
            tail = _tail_text(directory / "monitor.log")
            return SandboxFinished(
                sandbox_id=sandbox_id, succeeded=False, termination="runtime_lost",
                network=self._spec(sandbox_id).get("network", ""),
                error=f"the sandbox's monitor ended without a result ({exc}); its last "
                      f"words: {tail or '(none)'}")

    def recover(self) -> None:
        """Report what finished while no agent was watching; watch what still runs."""
        for directory in self._dirs():
            sandbox_id = directory.name
            state = self._state(sandbox_id)
            if state in _LIVE:
                self._spawn(sandbox_id, self._wait_pid, sandbox_id)
            elif state == "finished":
                self._spawn(sandbox_id, self._report, sandbox_id)

    # -- reads and cancel --------------------------------------------------------------------

    def status(self, sandbox_id: str) -> dict[str, Any]:
        if not SANDBOX_ID.fullmatch(sandbox_id or "") or \
                not (self.root / sandbox_id / "spec.json").exists():
            raise NotFound(f"sandbox {sandbox_id} is not known on this node")
        spec = self._spec(sandbox_id)
        monitor = _read_json(self.root / sandbox_id / "monitor.json")
        result = _read_json(self.root / sandbox_id / "result.json") or None
        held = _read_json(self.root / sandbox_id / "suspended.json")
        return {
            "sandbox_id": sandbox_id, "state": self._state(sandbox_id),
            "pid": monitor.get("pid"), "started_at": spec.get("started_at"),
            "uid": spec.get("uid"), "network": spec.get("network"), "net": spec.get("net"),
            "requestid": spec.get("requestid"), "result": result,
            "dir": str(self.root / sandbox_id),
            "suspension": {k: held.get(k) for k in ("sequence", "state", "method", "since",
                                                    "held_seconds")} if held else None,
        }

    def list(self) -> list[dict[str, Any]]:
        return [self.status(d.name) for d in self._dirs()]

    def cancel(self, sandbox_id: str) -> dict[str, Any]:
        """Ask a running or suspended sandbox's monitor to stop it (a suspended one is
        let go first); it still collects the patch and reports ``cancelled``. Idempotent."""
        status = self.status(sandbox_id)
        if status["state"] not in _LIVE:
            return {"sandbox_id": sandbox_id, "cancelled": False, "state": status["state"]}
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(status["pid"]), signal.SIGTERM)
        return {"sandbox_id": sandbox_id, "cancelled": True, "state": status["state"]}

    def resume(self, sandbox_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """Let a suspended sandbox go on (SIGUSR1 to its monitor, which thaws it); answers
        once the monitor says it runs again. Idempotent: a sandbox that is not suspended
        is answered with its state and nothing is done."""
        status = self.status(sandbox_id)
        if status["state"] != "suspended":
            return {"sandbox_id": sandbox_id, "resumed": False, "state": status["state"]}
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(status["pid"]), signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while self._state(sandbox_id) == "suspended" and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"sandbox_id": sandbox_id, "resumed": True, "state": self._state(sandbox_id)}

    def wait_idle(self, timeout: float = 120.0) -> bool:
        """Wait until every watcher thread ended (tests)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                threads = list(self._threads)
            if not threads:
                return True
            if time.monotonic() > deadline:
                return False
            threads[0].join(max(0.0, deadline - time.monotonic()))

    # -- helpers -----------------------------------------------------------------------------

    def _dirs(self) -> list[Path]:
        return sorted(d for d in self.root.iterdir()
                      if d.is_dir() and (d / "spec.json").exists())

    def _spec(self, sandbox_id: str) -> dict[str, Any]:
        return _read_json(self.root / sandbox_id / "spec.json")

    def _state(self, sandbox_id: str) -> str:
        directory = self.root / sandbox_id
        if (directory / "reported").exists():
            return "reported"
        if self._monitor_alive(sandbox_id):
            held = _read_json(directory / "suspended.json")
            return "suspended" if held.get("state") == "suspended" else "running"
        return "finished"

    def _monitor_alive(self, sandbox_id: str) -> bool:
        monitor = _read_json(self.root / sandbox_id / "monitor.json")
        if not monitor:
            return False
        try:
            return supervisor.same_process(int(monitor["pid"]), float(monitor["create_time"]))
        except (KeyError, TypeError, ValueError):
            return False

    def _spawn(self, sandbox_id: str, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except Exception:
                log.exception("sandbox %s: %s failed", sandbox_id, target.__name__)

        thread = threading.Thread(target=run, name=f"sandbox:{sandbox_id}", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()


def _under(path: str, directories: list[str]) -> bool:
    return any((path.rstrip("/") + "/").startswith(d.rstrip("/") + "/") for d in directories)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tail_text(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_bytes()[-4096:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


# -- the HTTP side ---------------------------------------------------------------------------


def register_sandboxes(app: Flask, settings: AgentSettings, publisher: Publisher | None) -> None:
    """Add the sandbox endpoints to the node agent's app.

    The runner (an isolation probe, a directory) is built on the first sandbox request, or
    at once when sandboxes from an earlier run are on disk (they may need reporting)."""
    holder: dict[str, SandboxRunner] = {}
    lock = threading.Lock()

    def runner() -> SandboxRunner:
        with lock:
            if "runner" not in holder:
                if publisher is None:
                    raise Refused("this node agent has no publisher: sandboxes cannot report")
                holder["runner"] = SandboxRunner(settings, publisher)
            return holder["runner"]

    def on_disk() -> bool:
        return any(root.is_dir() and any(root.iterdir()) for root in candidate_roots(settings))

    app.config["sandboxes"] = runner
    if publisher is not None and on_disk():
        threading.Thread(target=runner, name="sandbox-recovery", daemon=True).start()

    bp = Blueprint("sandboxes", __name__)

    @bp.get("/sandboxes")
    def list_sandboxes() -> Any:
        if "runner" not in holder and app.config["sandboxes"] is runner and not on_disk():
            return jsonify(isolation=None, root=None, sandboxes=[])  # none ever ran here
        run = app.config["sandboxes"]()
        return jsonify(isolation=run.isolation.to_json(), root=str(run.root),
                       sandboxes=run.list())

    @bp.put("/sandboxes/<sandbox_id>")
    def start(sandbox_id: str) -> Any:
        return jsonify(app.config["sandboxes"]().start(sandbox_id,
                                                       request.get_json(silent=True))), 202

    @bp.get("/sandboxes/<sandbox_id>")
    def status(sandbox_id: str) -> Any:
        return jsonify(app.config["sandboxes"]().status(sandbox_id))

    @bp.post("/sandboxes/<sandbox_id>/resume")
    def resume(sandbox_id: str) -> Any:
        return jsonify(app.config["sandboxes"]().resume(sandbox_id))

    @bp.delete("/sandboxes/<sandbox_id>")
    def cancel(sandbox_id: str) -> Any:
        return jsonify(app.config["sandboxes"]().cancel(sandbox_id))

    app.register_blueprint(bp)
