"""Agent sandboxes: the pure rules. Who may run one, with which limits, reaching what, how
many at once, and what a sandbox becomes when its task ends.

A sandbox runs one task command in its own working copy of a repository and returns the
diff against the base ref for review (never applied automatically). Its life:

    QUEUED -> RUNNING -> SUCCEEDED | FAILED | TIMED_OUT | KILLED
                 ^  |
                 |  v  (idle past its idle_seconds limit)
               SUSPENDED  -> (cancelled, lost) KILLED | FAILED
    (a request that is refused is recorded FAILED at once, holding no slot)

- **Policy** (:class:`SandboxPolicy`): limits (CPU seconds, memory, wall clock, processes,
  disk) with a default and a maximum, a per-team concurrency cap, a bound on the queue,
  the network destinations a team may open, the repositories it may name (any, unless the
  policy lists patterns), and whether it consents to hosts whose isolation the runtime
  could not verify (``allow_unisolated``, default false: such a sandbox is refused). It
  is read from the optional ``sandboxes`` section of the applied admin config
  (``catalog/current``); every field has a default, so a config without the section gets
  :data:`DEFAULT_POLICY`. Team entries under ``teams`` override the global fields one by
  one.
- **Admission** (:func:`admit`): over the cap a request is QUEUED with its position, never
  refused silently; only a full queue, a non-member, limits above the maximum, a network
  destination or a repository the policy does not permit are refused, each with a message
  that says what to do. The queue is first in, first out: a request never overtakes one
  already waiting.
- **Completion** (:func:`finish`): the runtime's report becomes a terminal state with a
  named reason; the slot it held goes to the first queued sandbox(es).
- **Idle** (:func:`suspend`, :func:`request_resume`): a task that makes no progress for
  its ``idle_seconds`` is held by the runtime and reported suspended; its slot goes to
  the queue. A runtime that only reports idleness (a cluster) is commanded to suspend by
  :func:`idle_detected`. A resume request takes a slot when one is free, else waits in the same
  queue as new requests (first in, first out) and is resumed, not started, when promoted.
- **Network**: none by default. A destination is permitted when it equals a policy entry,
  falls under a ``*.suffix`` entry, or (an address or CIDR) lies inside a policy CIDR.

Each decision (:class:`Decision`) also carries what the runtime must do (start, resume,
suspend, clean up, release: the commands below) and a sandbox.state_changed for every
record whose state it changes. Everything here is a function of its inputs and ``now``;
the handler loads and persists.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from events.payloads import (
    SandboxFinished,
    SandboxIdleDetected,
    SandboxStateChanged,
    SandboxSuspended,
)
from functions.domain.catalog import Problem, Role, Team, human_bytes, parse_quantity


class SandboxState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    #: Held by the runtime after idling; no slot, no CPU (see sandbox.suspended).
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    KILLED = "KILLED"


TERMINAL = frozenset(
    {SandboxState.SUCCEEDED, SandboxState.FAILED, SandboxState.TIMED_OUT, SandboxState.KILLED}
)


class Termination(StrEnum):
    """How the runtime says a task ended (``SandboxFinished.termination``)."""

    EXITED = "exited"
    WALL_CLOCK_EXCEEDED = "wall_clock_exceeded"
    CPU_TIME_EXCEEDED = "cpu_time_exceeded"
    MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
    KILLED = "killed"
    CANCELLED = "cancelled"
    FAILED_TO_START = "failed_to_start"
    RUNTIME_LOST = "runtime_lost"


class Reason(StrEnum):
    """Why a sandbox is where it is; str values so a typo is a NameError, not a new reason."""

    ADMITTED = "admitted"
    QUEUED = "queued"
    PROMOTED = "promoted"
    SUCCEEDED = "succeeded"
    EXITED_NONZERO = "exited_nonzero"
    WALL_CLOCK_EXCEEDED = "wall_clock_exceeded"
    CPU_TIME_EXCEEDED = "cpu_time_exceeded"
    MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
    KILLED = "killed"
    CANCELLED = "cancelled"
    FAILED_TO_START = "failed_to_start"
    RUNTIME_LOST = "runtime_lost"
    SUSPENDED_IDLE = "suspended_idle"
    RESUMED = "resumed"
    RESUME_QUEUED = "resume_queued"
    #: An idle report on which the control plane commands the runtime to suspend.
    SUSPENDING_IDLE = "suspending_idle"
    # refusals of a request: recorded FAILED, holding no slot
    UNKNOWN_TEAM = "unknown_team"
    NOT_A_MEMBER = "not_a_member"
    READ_ONLY_MEMBER = "read_only_member"
    INVALID_POLICY = "invalid_policy"
    INVALID_LIMITS = "invalid_limits"
    LIMIT_ABOVE_MAXIMUM = "limit_above_maximum"
    NETWORK_NOT_PERMITTED = "network_not_permitted"
    REPOSITORY_NOT_PERMITTED = "repository_not_permitted"
    QUEUE_FULL = "queue_full"
    # refusals that change nothing
    SANDBOX_ID_IN_USE = "sandbox_id_in_use"
    UNKNOWN_SANDBOX = "unknown_sandbox"
    ALREADY_FINISHED = "already_finished"
    NOT_STARTED = "not_started"
    NOT_RUNNING = "not_running"
    NOT_SUSPENDED = "not_suspended"
    ALREADY_SUSPENDED = "already_suspended"
    STALE_REPORT = "stale_report"
    RESUME_ALREADY_QUEUED = "resume_already_queued"
    IDLE_SUSPENSION_OFF = "idle_suspension_off"
    NOT_IDLE_LONG_ENOUGH = "not_idle_long_enough"


#: Termination -> (state, reason).
_OUTCOME: dict[Termination, tuple[SandboxState, Reason]] = {
    Termination.WALL_CLOCK_EXCEEDED: (SandboxState.TIMED_OUT, Reason.WALL_CLOCK_EXCEEDED),
    Termination.CPU_TIME_EXCEEDED: (SandboxState.TIMED_OUT, Reason.CPU_TIME_EXCEEDED),
    Termination.MEMORY_LIMIT_EXCEEDED: (SandboxState.KILLED, Reason.MEMORY_LIMIT_EXCEEDED),
    Termination.KILLED: (SandboxState.KILLED, Reason.KILLED),
    Termination.CANCELLED: (SandboxState.KILLED, Reason.CANCELLED),
    Termination.FAILED_TO_START: (SandboxState.FAILED, Reason.FAILED_TO_START),
    Termination.RUNTIME_LOST: (SandboxState.FAILED, Reason.RUNTIME_LOST),
}

# --------------------------------------------------------------------------------------------
# Limits and policy
# --------------------------------------------------------------------------------------------

LIMIT_FIELDS = ("cpu_seconds", "memory", "wall_clock_seconds", "processes", "idle_seconds",
                "disk")
#: The disk quota of a sandbox recorded before quotas existed, and the default one.
DEFAULT_DISK_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Limits:
    """What one sandbox is held to. ``processes`` bounds how many processes it may have at
    once (enforced where the runtime can give each sandbox a user of its own).
    ``idle_seconds``: a task making no progress (no CPU time, no I/O) that long is
    suspended; 0 means never, and ranks above every other value (:func:`limit_rank`).
    ``disk_bytes``: what its working copy, home and temporary files may hold together
    (past it a write fails with ENOSPC; the host's disk is not touched)."""

    cpu_seconds: int
    memory_bytes: int
    wall_clock_seconds: int
    processes: int
    idle_seconds: int = 0
    disk_bytes: int = DEFAULT_DISK_BYTES

    def to_doc(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Limits:
        # A record admitted before idle suspension existed was never meant to be suspended.
        return cls(int(doc["cpu_seconds"]), int(doc["memory_bytes"]),
                   int(doc["wall_clock_seconds"]), int(doc["processes"]),
                   int(doc.get("idle_seconds", 0)),
                   int(doc.get("disk_bytes", DEFAULT_DISK_BYTES)))

    def describe(self) -> str:
        idle = (f"suspended after {self.idle_seconds} s idle" if self.idle_seconds
                else "never suspended")
        return (f"{self.cpu_seconds} CPU s, {human_bytes(self.memory_bytes)} memory, "
                f"{self.wall_clock_seconds} s wall clock, {self.processes} processes, "
                f"{human_bytes(self.disk_bytes)} disk, {idle}")


DEFAULT_LIMITS = Limits(cpu_seconds=600, memory_bytes=2 * 2**30, wall_clock_seconds=900,
                        processes=256, idle_seconds=600, disk_bytes=DEFAULT_DISK_BYTES)
MAXIMUM_LIMITS = Limits(cpu_seconds=3600, memory_bytes=8 * 2**30, wall_clock_seconds=3600,
                        processes=1024, idle_seconds=3600, disk_bytes=16 * 2**30)
_NAMES = ("cpu_seconds", "memory_bytes", "wall_clock_seconds", "processes", "idle_seconds",
          "disk_bytes")
#: The asked-for name of each limit whose recorded name differs (a quantity in bytes).
_QUANTITIES = {"memory": "memory_bytes", "disk": "disk_bytes"}


def limit_rank(name: str, value: int) -> float:
    """A limit's value for comparisons: ``idle_seconds`` 0 (never suspend) holds compute
    longest, so it ranks above any number of seconds."""
    return float("inf") if name == "idle_seconds" and value == 0 else float(value)


@dataclass(frozen=True)
class SandboxPolicy:
    """A team's sandbox policy, defaults filled in."""

    defaults: Limits = DEFAULT_LIMITS
    maximum: Limits = MAXIMUM_LIMITS
    #: Sandboxes of one team running at once; more are queued.
    concurrency: int = 2
    #: Sandboxes of one team waiting at once; more are refused (loudly).
    max_queued: int = 20
    #: Destinations a request may allow: host names, ``*.suffix`` wildcards, CIDRs.
    network: tuple[str, ...] = ()
    #: Repositories a request may name (glob patterns over the path or URL as given,
    #: e.g. ``/srv/git/*`` or ``https://github.com/org/*``); None: any.
    repositories: tuple[str, ...] | None = None
    #: The admin's consent to run a sandbox on a host whose isolation (network namespace,
    #: mount namespace, a user of its own) the runtime could not verify. Never a task as
    #: root, whatever this says; recorded on each sandbox at admission.
    allow_unisolated: bool = False


DEFAULT_POLICY = SandboxPolicy()


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    message: str


_POLICY_KEYS = ("defaults", "maximum", "concurrency", "max_queued", "network", "repositories",
                "allow_unisolated")


def policy_problems(section: Mapping[str, Any] | None) -> list[Problem]:
    """Every problem of a config's ``sandboxes`` section, with its JSON pointer (for
    ``stasis admin apply``). Never raises."""
    problems: list[Problem] = []
    if section is None:
        return problems
    if not isinstance(section, Mapping):
        return [Problem("/sandboxes", "must be a mapping")]
    _check_level(section, "/sandboxes", problems, allow_teams=True)
    teams = section.get("teams") or {}
    if not isinstance(teams, Mapping):
        problems.append(Problem("/sandboxes/teams", "must map team ids to overrides"))
    else:
        for team_id, override in teams.items():
            path = f"/sandboxes/teams/{team_id}"
            if not isinstance(override, Mapping):
                problems.append(Problem(path, "must be a mapping"))
                continue
            _check_level(override, path, problems, allow_teams=False)
    if not problems:
        for team_id in [None, *teams]:
            policy = _merged(section, team_id)
            for name in _NAMES:
                if limit_rank(name, getattr(policy.defaults, name)) > \
                        limit_rank(name, getattr(policy.maximum, name)):
                    where = f"/sandboxes/teams/{team_id}" if team_id else "/sandboxes"
                    problems.append(Problem(
                        where, f"default {name} is above the maximum "
                               f"({getattr(policy.defaults, name)} > "
                               f"{getattr(policy.maximum, name)})"))
    return problems


def _check_level(level: Mapping[str, Any], path: str, problems: list[Problem], *,
                 allow_teams: bool) -> None:
    known = (*_POLICY_KEYS, "teams") if allow_teams else _POLICY_KEYS
    for key in level:
        if key not in known:
            problems.append(Problem(f"{path}/{key}", f"unknown key; known: {', '.join(known)}"))
    for which in ("defaults", "maximum"):
        limits = level.get(which)
        if limits is None:
            continue
        if not isinstance(limits, Mapping):
            problems.append(Problem(f"{path}/{which}", "must be a mapping of limits"))
            continue
        for key, value in limits.items():
            why = _limit_problem(str(key), value)
            if why:
                problems.append(Problem(f"{path}/{which}/{key}", why))
    for key in ("concurrency", "max_queued"):
        value = level.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < (1 if key == "concurrency" else 0)):
            problems.append(Problem(f"{path}/{key}", "must be a whole number"
                                    + (" of at least 1" if key == "concurrency" else " >= 0")))
    if "allow_unisolated" in level and not isinstance(level["allow_unisolated"], bool):
        problems.append(Problem(f"{path}/allow_unisolated", "must be true or false"))
    network = level.get("network")
    if network is not None and (not isinstance(network, list)
                                or not all(isinstance(n, str) and n for n in network)):
        problems.append(Problem(f"{path}/network", "must be a list of destinations"))
    repositories = level.get("repositories")
    if repositories is not None and (not isinstance(repositories, list) or not all(
            isinstance(r, str) and r.strip() for r in repositories)):
        problems.append(Problem(f"{path}/repositories",
                                "must be a list of repository patterns"))


def _limit_problem(key: str, value: Any) -> str | None:
    if key not in LIMIT_FIELDS:
        return f"unknown limit; known: {', '.join(LIMIT_FIELDS)}"
    try:
        _limit_value(key, value)
    except ValueError as exc:
        return str(exc)
    return None


def _limit_value(key: str, value: Any) -> int:
    """The value of one asked-for limit, in its unit (memory in bytes)."""
    if key in _QUANTITIES:
        if isinstance(value, bool):
            raise ValueError(f"{key} must be a quantity like '2Gi', got {value!r}")
        number = value if isinstance(value, int) else parse_quantity(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    else:
        number = value
    least = 0 if key == "idle_seconds" else 1
    if number < least:
        raise ValueError(f"{key} must be at least {least}, got {value!r}")
    return number


def _limits_over(base: Limits, asked: Mapping[str, Any]) -> Limits:
    changes: dict[str, int] = {}
    for key, value in asked.items():
        name = _QUANTITIES.get(key, key)
        changes[name] = _limit_value(key, value)
    return dataclasses.replace(base, **changes)


def _merged(section: Mapping[str, Any], team_id: str | None) -> SandboxPolicy:
    levels: list[Mapping[str, Any]] = [section]
    teams = section.get("teams") or {}
    if team_id is not None and isinstance(teams, Mapping) and team_id in teams:
        levels.append(teams[team_id])
    policy = DEFAULT_POLICY
    for level in levels:
        policy = SandboxPolicy(
            defaults=_limits_over(policy.defaults, level.get("defaults") or {}),
            maximum=_limits_over(policy.maximum, level.get("maximum") or {}),
            concurrency=int(level.get("concurrency", policy.concurrency)),
            max_queued=int(level.get("max_queued", policy.max_queued)),
            network=tuple(level.get("network", policy.network)),
            repositories=(tuple(level["repositories"]) if level.get("repositories") is not None
                          else policy.repositories),
            allow_unisolated=bool(level.get("allow_unisolated", policy.allow_unisolated)),
        )
    return policy


def resolve_policy(section: Mapping[str, Any] | None, team_id: str) -> SandboxPolicy | Refusal:
    """The policy for ``team_id`` from a config's ``sandboxes`` section (None: defaults).

    A section with problems refuses rather than guessing: running a task under limits
    nobody chose is worse than telling the admin the policy is broken.
    """
    if section is None:
        return DEFAULT_POLICY
    problems = policy_problems(section)
    if problems:
        listed = "; ".join(str(p) for p in problems[:3])
        return Refusal(Reason.INVALID_POLICY,
                       f"the sandbox policy is invalid ({listed}); ask an admin to fix the "
                       "sandboxes section of the admin config")
    return _merged(section, team_id)


def resolve_limits(asked: Mapping[str, Any], policy: SandboxPolicy,
                   team_id: str) -> Limits | Refusal:
    """The limits a request runs under: what it asked for, the policy's defaults for the
    rest. Asking above the maximum is refused, naming the limit and the maximum."""
    unknown = sorted(set(asked) - set(LIMIT_FIELDS))
    if unknown:
        return Refusal(Reason.INVALID_LIMITS,
                       f"unknown limits {', '.join(unknown)}; known: {', '.join(LIMIT_FIELDS)}")
    try:
        limits = _limits_over(policy.defaults, asked)
    except ValueError as exc:
        return Refusal(Reason.INVALID_LIMITS, str(exc))
    over: list[str] = []
    for name in _NAMES:
        label = next((k for k, v in _QUANTITIES.items() if v == name), name)
        value, maximum = getattr(limits, name), getattr(policy.maximum, name)
        if limit_rank(name, value) > limit_rank(name, maximum) and label in asked:
            shown = (f"{human_bytes(value)} > {human_bytes(maximum)}" if label in _QUANTITIES
                     else f"{value or 'never'} > {maximum}")
            over.append(f"{label} {shown}")
    if over:
        return Refusal(Reason.LIMIT_ABOVE_MAXIMUM,
                       f"asked above team {team_id}'s sandbox maximum: {'; '.join(over)}; "
                       "ask for less or ask an admin to raise the maximum")
    # A default above the maximum cannot pass policy_problems; clamp all the same.
    return Limits(*(_lower(n, getattr(limits, n), getattr(policy.maximum, n))
                    for n in _NAMES))


def _lower(name: str, a: int, b: int) -> int:
    return a if limit_rank(name, a) <= limit_rank(name, b) else b


def destination_permitted(destination: str, permitted: Sequence[str]) -> bool:
    """Whether ``destination`` (a host name, an address or a CIDR) is covered by one of
    the policy's entries: the same name, a ``*.suffix`` wildcard, or a containing CIDR."""
    wanted = destination.strip().lower().rstrip(".")
    network = _as_network(wanted)
    for entry in permitted:
        allowed = entry.strip().lower().rstrip(".")
        if wanted == allowed:
            return True
        if allowed.startswith("*.") and network is None and wanted.endswith(allowed[1:]):
            return True
        allowed_net = _as_network(allowed)
        if network is not None and allowed_net is not None and \
                network.version == allowed_net.version and network.subnet_of(allowed_net):  # type: ignore[arg-type]
            return True
    return False


def _as_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def check_network(asked: Sequence[str], policy: SandboxPolicy, team: Team) -> Refusal | None:
    """None when every asked destination is permitted by the policy (none asked: none
    needed), else a refusal naming the ones that are not and whom to ask."""
    refused = [d for d in asked if not destination_permitted(d, policy.network)]
    if not refused:
        return None
    permitted = ", ".join(policy.network) if policy.network else "none"
    return Refusal(Reason.NETWORK_NOT_PERMITTED,
                   f"network destinations not permitted for team {team.id}'s sandboxes: "
                   f"{', '.join(refused)} (permitted: {permitted}); run without them or ask "
                   f"{team.who_to_ask}")


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamQueue:
    """The sandboxes of one team that hold a slot, and those waiting, in order."""

    running: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()

    def position(self, sandbox_id: str) -> int | None:
        """1-based place in the queue, None when not queued."""
        return self.queued.index(sandbox_id) + 1 if sandbox_id in self.queued else None

    def to_doc(self) -> dict[str, Any]:
        return {"running": list(self.running), "queued": list(self.queued)}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> TeamQueue:
        doc = doc or {}
        return cls(tuple(doc.get("running") or ()), tuple(doc.get("queued") or ()))


@dataclass(frozen=True)
class Sandbox:
    """The ``sandboxes/{id}`` document."""

    id: str
    team: str
    requester: str
    repository: str
    command: str
    base_ref: str
    limits: Limits
    allowed_network: tuple[str, ...]
    state: SandboxState
    reason: str
    requestid: str
    requested_at: datetime
    message: str = ""
    version: int = 1
    queue_position: int | None = None
    reply_to: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_status: int | None = None
    termination: str | None = None
    error: str | None = None
    patch_uri: str | None = None
    log_uri: str | None = None
    patch_bytes: int = 0
    files_changed: tuple[str, ...] = ()
    base_sha: str | None = None
    duration_ms: int = 0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    #: The network as the runtime enforced it (e.g. "none: loopback only"), or a plain
    #: statement that isolation is not enforced on that host.
    network: str = ""
    #: Idle suspension: when the current one began (None: not suspended), the time spent
    #: suspended before it, how many there were, and the latest checkpoint patch.
    suspended_at: datetime | None = None
    suspended_ms: int = 0
    suspensions: int = 0
    checkpoint_uri: str | None = None
    checkpoint_bytes: int = 0
    #: The team's policy at admission consented to a host whose isolation is unverified.
    allow_unisolated: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_doc(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["state"] = str(self.state)
        doc["limits"] = self.limits.to_doc()
        doc["allowed_network"] = list(self.allowed_network)
        doc["files_changed"] = list(self.files_changed)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Sandbox:
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in doc.items() if k in known}
        data["state"] = SandboxState(data["state"])
        data["limits"] = Limits.from_doc(data["limits"])
        data["allowed_network"] = tuple(data.get("allowed_network") or ())
        data["files_changed"] = tuple(data.get("files_changed") or ())
        return cls(**data)


@dataclass(frozen=True)
class Request:
    """A sandbox.requested event's payload, as admission sees it."""

    sandbox_id: str
    team: str
    requester: str
    repository: str
    command: str
    base_ref: str
    limits: Mapping[str, Any]
    allowed_network: tuple[str, ...]
    requestid: str
    reply_to: str | None = None


# Commands: what the sandbox runtime is asked to do once the decision is committed.
@dataclass(frozen=True)
class StartSandbox:
    """Start an admitted (or promoted) sandbox."""

    sandbox_id: str


@dataclass(frozen=True)
class ResumeSandbox:
    """Let a suspended sandbox that got a slot go on."""

    sandbox_id: str


@dataclass(frozen=True)
class SuspendSandbox:
    """Suspend a running sandbox: its ``sequence``-th suspension, after ``idle_seconds``
    (on a runtime that only reports idleness, like a cluster)."""

    sandbox_id: str
    team: str
    sequence: int
    idle_seconds: int


@dataclass(frozen=True)
class CleanUpSandbox:
    """Free what an ended sandbox still holds on its runtime (a cluster's Pod, Secret,
    policies and bundle)."""

    sandbox_id: str
    team: str


@dataclass(frozen=True)
class ReleaseSandbox:
    """Free the compute of a suspended sandbox whose state a Pod Snapshot keeps."""

    sandbox_id: str
    team: str


Command = StartSandbox | ResumeSandbox | SuspendSandbox | CleanUpSandbox | ReleaseSandbox
#: A suspension whose state lives in a Pod Snapshot: the Pod itself can go.
POD_METHOD = "pod"


@dataclass(frozen=True)
class Decision:
    """What to write, what the runtime must do, and what changed.

    ``sandboxes``: records to write (the subject first, then promoted ones); ``queue``: the
    team's new queue (None: unchanged); ``positions``: every still-queued id with its new
    1-based position and message; ``commands``: for the runtime, in order; ``events``: a
    sandbox.state_changed for each record whose state changed.
    """

    accepted: bool
    reason: Reason
    message: str
    sandboxes: tuple[Sandbox, ...] = ()
    queue: TeamQueue | None = None
    positions: tuple[tuple[str, int, str], ...] = ()
    commands: tuple[Command, ...] = ()
    events: tuple[SandboxStateChanged, ...] = ()

    @property
    def subject(self) -> Sandbox | None:
        return self.sandboxes[0] if self.sandboxes else None

    @property
    def start(self) -> tuple[str, ...]:
        """The ids the runtime must start now, in order."""
        return tuple(c.sandbox_id for c in self.commands if isinstance(c, StartSandbox))

    @property
    def resume(self) -> tuple[str, ...]:
        """The suspended ids the runtime must resume now."""
        return tuple(c.sandbox_id for c in self.commands if isinstance(c, ResumeSandbox))

    @property
    def suspend(self) -> tuple[SuspendSandbox, ...]:
        return tuple(c for c in self.commands if isinstance(c, SuspendSandbox))

    def outcome(self) -> dict[str, Any]:
        """What the request's ledger entry says (a link's ``POST .../sandboxes`` reads it)."""
        subject = self.subject
        return {"accepted": self.accepted, "reason": str(self.reason), "message": self.message,
                "state": str(subject.state) if subject is not None else None,
                "queue_position": subject.queue_position if subject is not None else None,
                "started": list(self.start), "resumed": list(self.resume)}


def changed(before: SandboxState | None, after: Sandbox,
            suspension: SandboxSuspended | None = None) -> SandboxStateChanged:
    """The sandbox.state_changed of ``after``, which was ``before`` (None: a new record);
    a suspension carries what the runtime reported about it."""
    change = SandboxStateChanged(
        sandbox_id=after.id, team=after.team, requester=after.requester,
        from_state=str(before) if before is not None else None, to_state=str(after.state),
        reason=after.reason, version=after.version, message=after.message)
    if suspension is None:
        return change
    return dataclasses.replace(
        change, idle_seconds=suspension.idle_seconds, method=suspension.method,
        checkpoint_uri=suspension.checkpoint_uri,
        checkpoint_files=len(suspension.files_changed))


# --------------------------------------------------------------------------------------------
# Admission and completion
# --------------------------------------------------------------------------------------------


def admit(request: Request, *, team: Team | None, policy: SandboxPolicy | Refusal,
          queue: TeamQueue, existing: Sandbox | None, now: datetime) -> Decision:
    """Admit a request: RUNNING at once, QUEUED with its position, or refused (FAILED)."""
    if existing is not None:
        # The same request again is stopped by the ledger; this is another request
        # reusing the id, and overwriting the first sandbox would lose it.
        return Decision(False, Reason.SANDBOX_ID_IN_USE,
                        f"sandbox id {request.sandbox_id} is already in use "
                        f"({existing.state}); request again with a new id")
    refusal = _refusal(request, team, policy)
    if refusal is not None:
        record = _record(request, DEFAULT_LIMITS, SandboxState.FAILED, refusal.reason,
                         f"refused: {refusal.message}", now)
        return Decision(False, refusal.reason, record.message, (record,),
                        events=(changed(None, record),))
    assert isinstance(policy, SandboxPolicy)
    limits = resolve_limits(request.limits, policy, request.team)
    assert isinstance(limits, Limits)  # checked by _refusal
    if len(queue.queued) >= policy.max_queued and not _slot_free(queue, policy):
        message = (f"refused: team {request.team} already has {len(queue.queued)} sandboxes "
                   f"waiting (the policy's max_queued); try again when some have finished")
        record = _record(request, limits, SandboxState.FAILED, Reason.QUEUE_FULL, message, now,
                         policy)
        return Decision(False, Reason.QUEUE_FULL, message, (record,),
                        events=(changed(None, record),))
    waiting = TeamQueue(queue.running, (*queue.queued, request.sandbox_id))
    filled, promoted = _fill(waiting, policy)
    if request.sandbox_id in promoted:
        message = (f"running: {len(filled.running)}/{policy.concurrency} of team "
                   f"{request.team}'s sandbox slots in use; limits {limits.describe()}")
        record = dataclasses.replace(
            _record(request, limits, SandboxState.RUNNING, Reason.ADMITTED, message, now,
                    policy),
            started_at=now)
    else:
        position = filled.position(request.sandbox_id) or 0
        message = queued_message(request.team, position, filled, policy)
        record = dataclasses.replace(
            _record(request, limits, SandboxState.QUEUED, Reason.QUEUED, message, now,
                    policy),
            queue_position=position)
    return Decision(True, Reason(record.reason), message, (record,), filled,
                    positions=_positions(request.team, filled, policy),
                    commands=tuple(StartSandbox(p) for p in promoted
                                   if p == request.sandbox_id),
                    events=(changed(None, record),))


def _refusal(request: Request, team: Team | None,
             policy: SandboxPolicy | Refusal) -> Refusal | None:
    if team is None:
        return Refusal(Reason.UNKNOWN_TEAM, f"there is no team {request.team}")
    member = team.member(request.requester)
    if member is None:
        return Refusal(Reason.NOT_A_MEMBER,
                       f"{request.requester} is not a member of team {team.id}; ask "
                       f"{team.who_to_ask}")
    if member.role == Role.VIEWER:
        return Refusal(Reason.READ_ONLY_MEMBER,
                       f"{request.requester} may only view team {team.id}'s work; ask "
                       f"{team.who_to_ask} for the member role")
    if isinstance(policy, Refusal):
        return policy
    limits = resolve_limits(request.limits, policy, team.id)
    if isinstance(limits, Refusal):
        return limits
    return (check_network(request.allowed_network, policy, team)
            or check_repository(request.repository, policy, team))


def repository_permitted(repository: str, patterns: Sequence[str]) -> bool:
    """Whether ``repository`` matches one of the policy's glob patterns. A local path is
    normalised first, so ``/srv/git/../etc`` is not under ``/srv/git/*``."""
    wanted = repository.strip()
    if wanted.startswith("/"):
        wanted = posixpath.normpath(wanted)
    return any(fnmatch.fnmatchcase(wanted, pattern.strip()) for pattern in patterns)


def check_repository(repository: str, policy: SandboxPolicy, team: Team) -> Refusal | None:
    if policy.repositories is None or repository_permitted(repository,
                                                            policy.repositories):
        return None
    allowed = ", ".join(policy.repositories) or "none"
    return Refusal(Reason.REPOSITORY_NOT_PERMITTED,
                   f"repository {repository} is not one team {team.id}'s sandboxes may use "
                   f"(the policy permits: {allowed}); ask {team.who_to_ask} to add it")


def _record(request: Request, limits: Limits, state: SandboxState, reason: Reason,
            message: str, now: datetime, policy: SandboxPolicy = DEFAULT_POLICY) -> Sandbox:
    return Sandbox(
        id=request.sandbox_id, team=request.team, requester=request.requester,
        repository=request.repository, command=request.command, base_ref=request.base_ref,
        limits=limits, allowed_network=tuple(request.allowed_network), state=state,
        reason=str(reason), requestid=request.requestid, requested_at=now, message=message,
        reply_to=request.reply_to, allow_unisolated=policy.allow_unisolated,
        finished_at=now if state in TERMINAL else None)


def _slot_free(queue: TeamQueue, policy: SandboxPolicy) -> bool:
    return len(queue.running) < policy.concurrency


def _fill(queue: TeamQueue, policy: SandboxPolicy) -> tuple[TeamQueue, tuple[str, ...]]:
    """Move queued sandboxes, first come first served, into free slots."""
    free = max(0, policy.concurrency - len(queue.running))
    promoted = queue.queued[:free]
    return TeamQueue((*queue.running, *promoted), queue.queued[free:]), promoted


def queued_message(team: str, position: int, queue: TeamQueue, policy: SandboxPolicy) -> str:
    return (f"queued: team {team} runs {len(queue.running)}/{policy.concurrency} sandboxes; "
            f"position {position} of {len(queue.queued)}")


def _positions(team: str, queue: TeamQueue,
               policy: SandboxPolicy) -> tuple[tuple[str, int, str], ...]:
    return tuple((sandbox_id, i + 1, queued_message(team, i + 1, queue, policy))
                 for i, sandbox_id in enumerate(queue.queued))


def outcome_of(report: SandboxFinished) -> tuple[SandboxState, Reason]:
    """The terminal state and reason of a runtime report."""
    try:
        termination = Termination(report.termination)
    except ValueError:
        return SandboxState.FAILED, Reason.KILLED
    if termination == Termination.EXITED:
        if report.succeeded and report.exit_status in (0, None):
            return SandboxState.SUCCEEDED, Reason.SUCCEEDED
        return SandboxState.FAILED, Reason.EXITED_NONZERO
    return _OUTCOME[termination]


def finish(sandbox: Sandbox | None, report: SandboxFinished, *, policy: SandboxPolicy | Refusal,
           queue: TeamQueue, load: Callable[[str], Sandbox | None], now: datetime) -> Decision:
    """Record a runtime report, free the slot, start the next queued sandbox(es)."""
    if sandbox is None:
        return Decision(False, Reason.UNKNOWN_SANDBOX,
                        f"no sandbox {report.sandbox_id}: a report for a sandbox never admitted")
    if sandbox.terminal:
        return Decision(False, Reason.ALREADY_FINISHED,
                        f"sandbox {sandbox.id} already ended {sandbox.state} ({sandbox.reason})")
    if sandbox.state == SandboxState.QUEUED:
        # The runtime is only asked to run admitted sandboxes: a report for a queued one is
        # out of order, and it must not free a slot the sandbox never held.
        return Decision(False, Reason.NOT_STARTED,
                        f"sandbox {sandbox.id} is queued, not running: report ignored")
    state, reason = outcome_of(report)
    ended = dataclasses.replace(
        sandbox, state=state, reason=str(reason), version=sandbox.version + 1,
        finished_at=now, exit_status=report.exit_status, termination=report.termination,
        error=report.error, patch_uri=report.patch_uri, log_uri=report.log_uri,
        patch_bytes=report.patch_bytes, files_changed=tuple(report.files_changed),
        base_sha=report.base_sha, duration_ms=report.duration_ms,
        cpu_seconds=report.cpu_seconds, peak_memory_bytes=report.peak_memory_bytes,
        network=report.network, queue_position=None)
    if sandbox.suspended_at is not None:
        # Ended while held (cancelled, lost): the time held is not run time.
        ended = dataclasses.replace(
            ended, suspended_at=None,
            suspended_ms=sandbox.suspended_ms + _ms(now - sandbox.suspended_at))
    ended = dataclasses.replace(ended, message=review_message(ended))
    # A sandbox suspended with its resume queued leaves the queue as well.
    freed = TeamQueue(tuple(r for r in queue.running if r != sandbox.id),
                      tuple(q for q in queue.queued if q != sandbox.id))
    # What it held on the runtime goes once its end is recorded.
    return _released(ended, changed(sandbox.state, ended), reason, freed, policy, load, now,
                     first=(CleanUpSandbox(sandbox.id, sandbox.team),))


def _released(subject: Sandbox, change: SandboxStateChanged, reason: Reason, freed: TeamQueue,
              policy: SandboxPolicy | Refusal, load: Callable[[str], Sandbox | None],
              now: datetime, *, first: tuple[Command, ...] = ()) -> Decision:
    """``subject`` gave up its slot: fill the free slots from the queue, first come first
    served, starting queued sandboxes and resuming suspended ones (after ``first``)."""
    # A broken policy must not strand the queue: promote under the default cap.
    cap = policy if isinstance(policy, SandboxPolicy) else DEFAULT_POLICY
    filled, promoted = _promote(freed, cap, load, now)
    records = tuple(after for _before, after in promoted)
    return Decision(True, reason, subject.message, (subject, *records), filled,
                    positions=_positions(subject.team, filled, cap),
                    commands=(*first,
                              *(StartSandbox(p.id) for p in records
                                if p.reason == Reason.PROMOTED),
                              *(ResumeSandbox(p.id) for p in records
                                if p.reason == Reason.RESUMED)),
                    events=(change, *(changed(before, after) for before, after in promoted)))


def _promote(queue: TeamQueue, policy: SandboxPolicy, load: Callable[[str], Sandbox | None],
             now: datetime) -> tuple[TeamQueue, list[tuple[SandboxState, Sandbox]]]:
    """The queue with its free slots filled, and each promoted record with its state before."""
    filled, promoted_ids = _fill(queue, policy)
    promoted: list[tuple[SandboxState, Sandbox]] = []
    for sandbox_id in promoted_ids:
        waiting = load(sandbox_id)
        if waiting is not None and waiting.state == SandboxState.QUEUED:
            promoted.append((waiting.state, dataclasses.replace(
                waiting, state=SandboxState.RUNNING, reason=str(Reason.PROMOTED),
                version=waiting.version + 1, started_at=now, queue_position=None,
                message=f"running after {_waited(waiting, now)} in the queue; limits "
                        f"{waiting.limits.describe()}")))
        elif waiting is not None and waiting.state == SandboxState.SUSPENDED:
            promoted.append((waiting.state, _resumed(waiting, now, queued=True)))
        else:
            # A queue entry without its waiting record (should not happen): drop it.
            filled = TeamQueue(tuple(r for r in filled.running if r != sandbox_id),
                               filled.queued)
    return filled, promoted


def _resumed(sandbox: Sandbox, now: datetime, *, queued: bool) -> Sandbox:
    held = _ms(now - sandbox.suspended_at) if sandbox.suspended_at is not None else 0
    waited = " (its resume waited for a slot)" if queued else ""
    return dataclasses.replace(
        sandbox, state=SandboxState.RUNNING, reason=str(Reason.RESUMED),
        version=sandbox.version + 1, suspended_at=None, suspended_ms=sandbox.suspended_ms + held,
        queue_position=None,
        message=f"resumed after {held // 1000} s suspended{waited}; limits "
                f"{sandbox.limits.describe()}")


def _ms(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds() * 1000))


# --------------------------------------------------------------------------------------------
# Idle suspension and resume
# --------------------------------------------------------------------------------------------


def suspend(sandbox: Sandbox | None, report: SandboxSuspended, *, policy: SandboxPolicy | Refusal,
            queue: TeamQueue, load: Callable[[str], Sandbox | None],
            now: datetime) -> Decision:
    """Record that the runtime holds an idle sandbox: SUSPENDED, its slot to the queue."""
    if sandbox is None:
        return Decision(False, Reason.UNKNOWN_SANDBOX,
                        f"no sandbox {report.sandbox_id}: a suspension of a sandbox never "
                        "admitted")
    if sandbox.terminal:
        return Decision(False, Reason.ALREADY_FINISHED,
                        f"sandbox {sandbox.id} already ended {sandbox.state} ({sandbox.reason})")
    if report.sequence <= sandbox.suspensions:
        # An older suspension arriving late (the sandbox was resumed since): nothing to do.
        return Decision(False, Reason.STALE_REPORT,
                        f"suspension {report.sequence} of sandbox {sandbox.id} is not newer "
                        f"than the {sandbox.suspensions} recorded: ignored")
    if sandbox.state == SandboxState.SUSPENDED:
        return Decision(False, Reason.ALREADY_SUSPENDED,
                        f"sandbox {sandbox.id} is already suspended")
    if sandbox.state != SandboxState.RUNNING:
        # Only a running task can idle; a queued one never reached the runtime.
        return Decision(False, Reason.NOT_RUNNING,
                        f"sandbox {sandbox.id} is {sandbox.state}, not running: "
                        "suspension ignored")
    held = dataclasses.replace(
        sandbox, state=SandboxState.SUSPENDED, reason=str(Reason.SUSPENDED_IDLE),
        version=sandbox.version + 1, suspended_at=now, suspensions=report.sequence,
        checkpoint_uri=report.checkpoint_uri or sandbox.checkpoint_uri,
        checkpoint_bytes=report.checkpoint_bytes if report.checkpoint_uri
        else sandbox.checkpoint_bytes,
        files_changed=tuple(report.files_changed) or sandbox.files_changed,
        cpu_seconds=max(sandbox.cpu_seconds, report.cpu_seconds))
    held = dataclasses.replace(held, message=suspended_message(held, report))
    freed = TeamQueue(tuple(r for r in queue.running if r != sandbox.id), queue.queued)
    # A Pod Snapshot keeps the state: the Pod itself can go (a local freeze holds it).
    release = ((ReleaseSandbox(sandbox.id, sandbox.team),) if report.method == POD_METHOD
               else ())
    return _released(held, changed(sandbox.state, held, report), Reason.SUSPENDED_IDLE, freed,
                     policy, load, now, first=release)


def idle_detected(sandbox: Sandbox | None, report: SandboxIdleDetected) -> Decision:
    """A runtime saw a sandbox idle: command its suspension when it is RUNNING, may be
    suspended, and was idle at least its limit; anything else changes nothing. The
    record stays RUNNING until the runtime reports sandbox.suspended (:func:`suspend`)."""
    if sandbox is None:
        return Decision(False, Reason.UNKNOWN_SANDBOX,
                        f"no sandbox {report.sandbox_id}: an idle report for a sandbox never "
                        "admitted")
    if sandbox.terminal:
        return Decision(False, Reason.ALREADY_FINISHED,
                        f"sandbox {sandbox.id} already ended {sandbox.state} ({sandbox.reason})")
    if sandbox.state == SandboxState.SUSPENDED:
        return Decision(False, Reason.ALREADY_SUSPENDED,
                        f"sandbox {sandbox.id} is already suspended")
    if sandbox.state != SandboxState.RUNNING:
        return Decision(False, Reason.NOT_RUNNING,
                        f"sandbox {sandbox.id} is {sandbox.state}, not running: idle report "
                        "ignored")
    if report.sequence <= sandbox.suspensions:
        # About the period before a suspension already recorded (resumed since).
        return Decision(False, Reason.STALE_REPORT,
                        f"idle report {report.sequence} of sandbox {sandbox.id} is not newer "
                        f"than the {sandbox.suspensions} suspensions recorded: ignored")
    limit = sandbox.limits.idle_seconds
    if limit == 0:
        return Decision(False, Reason.IDLE_SUSPENSION_OFF,
                        f"sandbox {sandbox.id} is never suspended (idle_seconds 0)")
    if report.idle_seconds < limit:
        return Decision(False, Reason.NOT_IDLE_LONG_ENOUGH,
                        f"sandbox {sandbox.id} was idle {report.idle_seconds} s, less than "
                        f"its limit of {limit} s")
    # The runtime's count wins when it is ahead: a snapshot that failed began a
    # suspension the record never saw, and its number must not be reused.
    sequence = max(sandbox.suspensions + 1, report.sequence)
    return Decision(True, Reason.SUSPENDING_IDLE,
                    f"sandbox {sandbox.id} idle {report.idle_seconds} s (limit {limit} s): "
                    f"suspending it (suspension {sequence})",
                    commands=(SuspendSandbox(sandbox.id, sandbox.team, sequence,
                                             report.idle_seconds),))


def suspended_message(sandbox: Sandbox, report: SandboxSuspended) -> str:
    memory = ("memory released" if report.memory_released
              else "its memory stays resident on the node")
    checkpoint = (f"; its changes so far ({len(sandbox.files_changed)} files, "
                  f"{sandbox.checkpoint_bytes} bytes) are at {sandbox.checkpoint_uri}"
                  if sandbox.checkpoint_uri and sandbox.checkpoint_bytes else "")
    return (f"suspended after {report.idle_seconds} s without progress ({report.method}): "
            f"CPU and slot released, {memory}{checkpoint}; resume with "
            f"stasis sandbox resume {sandbox.id}")


def request_resume(sandbox: Sandbox | None, sandbox_id: str, requester: str, *,
                   team: Team | None, policy: SandboxPolicy | Refusal, queue: TeamQueue,
                   now: datetime) -> Decision:
    """A user asks to resume a suspended sandbox: RUNNING when a slot is free (the runtime
    resumes it), else it waits in the team's queue with a position."""
    if sandbox is None:
        return Decision(False, Reason.UNKNOWN_SANDBOX, f"no sandbox {sandbox_id}")
    if team is None:
        return Decision(False, Reason.UNKNOWN_TEAM, f"there is no team {sandbox.team}")
    member = team.member(requester)
    if member is None:
        return Decision(False, Reason.NOT_A_MEMBER,
                        f"{requester} is not a member of team {team.id}; ask {team.who_to_ask}")
    if member.role == Role.VIEWER:
        return Decision(False, Reason.READ_ONLY_MEMBER,
                        f"{requester} may only view team {team.id}'s work; ask "
                        f"{team.who_to_ask} for the member role")
    if sandbox.terminal:
        return Decision(False, Reason.ALREADY_FINISHED,
                        f"sandbox {sandbox.id} already ended {sandbox.state} ({sandbox.reason})")
    if sandbox.state != SandboxState.SUSPENDED:
        return Decision(False, Reason.NOT_SUSPENDED,
                        f"sandbox {sandbox.id} is {sandbox.state}, not suspended: "
                        "nothing to resume")
    cap = policy if isinstance(policy, SandboxPolicy) else DEFAULT_POLICY
    if sandbox.id in queue.queued:
        where = queued_message(sandbox.team, queue.position(sandbox.id) or 0, queue, cap)
        return Decision(False, Reason.RESUME_ALREADY_QUEUED,
                        f"sandbox {sandbox.id}'s resume already waits: {where}")
    # Not bounded by max_queued: that bound is on new work, and this sandbox exists and
    # holds memory already; refusing its resume would only strand it.
    filled, promoted = _fill(TeamQueue(queue.running, (*queue.queued, sandbox.id)), cap)
    if sandbox.id in promoted:
        record = _resumed(sandbox, now, queued=False)
        return Decision(True, Reason.RESUMED, record.message, (record,), filled,
                        positions=_positions(sandbox.team, filled, cap),
                        commands=(ResumeSandbox(sandbox.id),),
                        events=(changed(sandbox.state, record),))
    position = filled.position(sandbox.id) or 0
    record = dataclasses.replace(
        sandbox, reason=str(Reason.RESUME_QUEUED), version=sandbox.version + 1,
        queue_position=position,
        message="resume " + queued_message(sandbox.team, position, filled, cap))
    return Decision(True, Reason.RESUME_QUEUED, record.message, (record,), filled,
                    positions=_positions(sandbox.team, filled, cap))


def _waited(sandbox: Sandbox, now: datetime) -> str:
    seconds = max(0, int((now - sandbox.requested_at).total_seconds()))
    return f"{seconds} s"


def review_message(sandbox: Sandbox) -> str:
    """What the requester reads when a sandbox ends: what happened and how to review."""
    what = {
        Reason.SUCCEEDED: "the task succeeded",
        Reason.EXITED_NONZERO: f"the task exited with status {sandbox.exit_status}",
        Reason.WALL_CLOCK_EXCEEDED: f"stopped: wall clock limit of "
                                    f"{sandbox.limits.wall_clock_seconds} s exceeded",
        Reason.CPU_TIME_EXCEEDED: f"stopped: CPU time limit of {sandbox.limits.cpu_seconds} s "
                                  "exceeded",
        Reason.MEMORY_LIMIT_EXCEEDED: f"stopped: memory limit of "
                                      f"{human_bytes(sandbox.limits.memory_bytes)} exceeded",
        Reason.KILLED: "stopped by a signal",
        Reason.CANCELLED: "cancelled",
        Reason.FAILED_TO_START: "could not start",
        Reason.RUNTIME_LOST: "lost: the runtime stopped reporting",
    }.get(Reason(sandbox.reason), sandbox.reason)
    if sandbox.error and sandbox.reason != Reason.SUCCEEDED:
        what += f" ({sandbox.error})"
    if sandbox.patch_uri and sandbox.patch_bytes:
        files = len(sandbox.files_changed)
        review = (f"; a patch of {files} file{'s' if files != 1 else ''} "
                  f"({sandbox.patch_bytes} bytes) is ready for review: "
                  f"stasis sandbox show {sandbox.id}, then stasis sandbox apply {sandbox.id} "
                  "--to CHECKOUT")
    elif sandbox.patch_uri:
        review = "; the task changed no files"
    else:
        review = ""
    return what + review


def overdue(sandboxes: Sequence[Sandbox], now: datetime,
            grace: timedelta = timedelta(minutes=5)) -> list[Sandbox]:
    """RUNNING sandboxes past their wall clock by more than ``grace``: their runtime never
    reported. A reconciler reports them ``runtime_lost`` so their slots are freed."""
    # Suspended time is not run time: the wall clock stops while a sandbox is held.
    return [s for s in sandboxes
            if s.state == SandboxState.RUNNING and s.started_at is not None
            and now - s.started_at - timedelta(milliseconds=s.suspended_ms)
            > timedelta(seconds=s.limits.wall_clock_seconds) + grace]


@dataclass(frozen=True)
class RunSpec:
    """What the runtime needs to run one admitted sandbox."""

    sandbox_id: str
    team: str
    repository: str
    base_ref: str
    command: str
    limits: Limits
    allowed_network: tuple[str, ...]
    requestid: str
    bucket: str
    prefix: str = field(default="")
    #: The team's policy consents to a host whose isolation is unverified (the runtime
    #: still never runs a task as root).
    allow_unisolated: bool = False

    @classmethod
    def of(cls, sandbox: Sandbox, bucket: str) -> RunSpec:
        return cls(sandbox.id, sandbox.team, sandbox.repository, sandbox.base_ref,
                   sandbox.command, sandbox.limits, sandbox.allowed_network, sandbox.requestid,
                   bucket, result_prefix(sandbox.team, sandbox.id), sandbox.allow_unisolated)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["limits"] = self.limits.to_doc()
        doc["allowed_network"] = list(self.allowed_network)
        return doc


def result_prefix(team: str, sandbox_id: str) -> str:
    """Where a sandbox's patch, log and result live in Cloud Storage."""
    return f"sandboxes/{team}/{sandbox_id}"
