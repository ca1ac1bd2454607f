"""The admin catalog: IDEs, environments, hardware profiles and teams, and the rules that
resolve a user's request against them.

Admins describe what is offered in one YAML file (``stasis admin apply FILE.yaml``). The
adapter validates it against ``schemas/config.schema.json`` and hands the plain dict to
this module, which adds what a JSON Schema cannot say:

- :func:`validate_config` reports *every* cross-reference and semantic problem (unknown
  ids, redirect chains and cycles, a deprecated environment without a message, duplicate
  ids or members, an unapproved environment allowed by a profile, ...) with a JSON-pointer
  path, so an admin fixes the whole file in one pass. It never raises, even on input that
  failed the schema, because the CLI shows schema errors and these problems together.
- :class:`Catalog` is the validated, typed view, with the resolution rules used when a
  workspace is provisioned: every ``resolve_*`` returns either :class:`Resolved` (maybe
  with notices such as a deprecation warning) or a :class:`Refusal` whose message tells the
  user what to do instead.
- :func:`config_documents` turns a config into the Firestore documents described by
  ``schemas/documents/{ide,environment,profile,team}.json``.

Environment status, in one place:

========== ====================================================================
approved   offered and listed
deprecated still works, every use warns with the environment's ``message``
hidden     retired: not listed, new workspaces are refused (message shown)
unapproved not vetted yet: refused, and no profile may allow it
========== ====================================================================

An environment with a ``redirect`` (any status but approved) sends new requests to its
successor, with a notice "python-3-9 was replaced by python-3-11". Redirects are one hop:
the successor must exist, be usable and not redirect itself.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from fractions import Fraction
from typing import Any, Generic, TypeAlias, TypeVar

# --------------------------------------------------------------------------------------------
# Kinds and reasons
# --------------------------------------------------------------------------------------------


class IdeKind(StrEnum):
    JUPYTERLAB = "jupyterlab"
    VSCODE = "vscode"


class EnvironmentStatus(StrEnum):
    APPROVED = "approved"
    DEPRECATED = "deprecated"
    HIDDEN = "hidden"
    UNAPPROVED = "unapproved"


class Provisioning(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class AcceleratorKind(StrEnum):
    GPU = "gpu"
    TPU = "tpu"


class IdleEffect(StrEnum):
    PAUSE = "pause"
    NONE = "none"


class SnapshotMethod(StrEnum):
    KERNEL = "kernel"
    POD = "pod"


class WhenFull(StrEnum):
    """What a request that does not fit its team's quota or the capacity becomes."""

    QUEUE = "queue"
    REFUSE = "refuse"


class WorkKind(StrEnum):
    """The kinds of work a priority class may be the default of."""

    WORKSPACE = "workspace"
    JOB = "job"
    SANDBOX = "sandbox"


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class RefusalReason(StrEnum):
    """Why a request was refused; str values so a typo is a NameError, not a new reason."""

    UNKNOWN_TEAM = "unknown_team"
    UNKNOWN_PROFILE = "unknown_profile"
    PROFILE_NOT_ALLOWED = "profile_not_allowed"
    UNKNOWN_ENVIRONMENT = "unknown_environment"
    ENVIRONMENT_HIDDEN = "environment_hidden"
    ENVIRONMENT_UNAPPROVED = "environment_unapproved"
    ENVIRONMENT_NOT_ALLOWED = "environment_not_allowed"
    UNKNOWN_IDE = "unknown_ide"
    IDE_UNAVAILABLE = "ide_unavailable"
    IDE_NOT_ALLOWED = "ide_not_allowed"
    ACCELERATOR_UNAVAILABLE = "accelerator_unavailable"
    # quotas (functions.domain.quota)
    WORKSPACE_QUOTA_EXCEEDED = "workspace_quota_exceeded"
    GPU_QUOTA_EXCEEDED = "gpu_quota_exceeded"
    TPU_QUOTA_EXCEEDED = "tpu_quota_exceeded"
    SNAPSHOT_QUOTA_EXCEEDED = "snapshot_quota_exceeded"
    # capacity (functions.domain.scheduling)
    NO_CAPACITY = "no_capacity"


class NoticeKind(StrEnum):
    DEPRECATED = "deprecated"
    REDIRECTED = "redirected"


@dataclass(frozen=True)
class Refusal:
    """A request that will not be served, and a message that tells the user what to do."""

    reason: RefusalReason
    message: str

    @property
    def ok(self) -> bool:
        return False


@dataclass(frozen=True)
class Notice:
    """Something the user should read although the request goes ahead."""

    kind: NoticeKind
    message: str


T = TypeVar("T")


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A request that goes ahead with ``value``; ``notices`` are shown to the user."""

    value: T
    notices: tuple[Notice, ...] = ()

    @property
    def ok(self) -> bool:
        return True


#: The outcome of every ``resolve_*``: branch with ``isinstance(result, Refusal)``.
Resolution: TypeAlias = Resolved[T] | Refusal


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file: where (a JSON pointer) and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '/'}: {self.message}"


class ConfigError(ValueError):
    """A config that cannot become a :class:`Catalog`; ``problems`` lists every reason."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid config:\n" + "\n".join(f"  {p}" for p in self.problems))


# --------------------------------------------------------------------------------------------
# Quantities
# --------------------------------------------------------------------------------------------

_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)?")
_CPU = re.compile(r"(?P<number>[0-9]+)(?P<milli>m)|(?P<number_>[0-9]+(?:\.[0-9]+)?)")


def parse_quantity(text: str) -> int:
    """Bytes in a Kubernetes quantity: ``"4Gi"`` -> 4294967296.

    The subset Stasis accepts: a plain or decimal number with an optional suffix ``Ki Mi Gi
    Ti`` (powers of 1024) or ``k M G T`` (powers of 1000). A fraction of a byte rounds up,
    as Kubernetes does. Raises ``ValueError`` with a message that shows the expected form.
    """
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        millis = isinstance(text, str) and text.endswith("m")
        hint = " (the m suffix is for cpu only)" if millis else ""
        raise ValueError(
            f"{text!r} is not a quantity{hint}: write a number with an optional suffix "
            'Ki, Mi, Gi, Ti, k, M, G or T, e.g. "4Gi"'
        )
    return math.ceil(Fraction(match["number"]) * _SUFFIXES[match["suffix"] or ""])


def parse_cpu_millis(value: object) -> int:
    """Thousandths of a CPU: ``2`` -> 2000, ``0.5`` -> 500, ``"500m"`` -> 500, ``"1.5"`` -> 1500.

    A fraction of a millicpu rounds up, as Kubernetes does; millicpus themselves are whole.
    Raises ``ValueError`` unless the result is at least one millicpu.
    """
    number: Fraction | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = Fraction(value) * 1000
    elif isinstance(value, float) and math.isfinite(value):
        number = Fraction(repr(value)) * 1000
    elif isinstance(value, str) and (match := _CPU.fullmatch(value)):
        number = (Fraction(match["number"]) if match["milli"]
                  else Fraction(match["number_"]) * 1000)
    if number is None:
        raise ValueError(f"{value!r} is not a cpu amount: write a number such as 2 or 0.5, or "
                         'millicpus such as "500m"')
    millis = math.ceil(number)
    if millis < 1:
        raise ValueError(f"cpu must be more than 0, got {value!r}")
    return millis


def format_quantity(n: int) -> str:
    """The shortest exact binary quantity for ``n`` bytes: 53687091200 -> ``"50Gi"``."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        if n and n % _SUFFIXES[suffix] == 0:
            return f"{n // _SUFFIXES[suffix]}{suffix}"
    return str(n)


def human_bytes(n: int) -> str:
    """``n`` bytes for people, at most one decimal: ``"50Gi"``, ``"1.5Gi"``, ``"512"``."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIXES[suffix]
        if abs(n) >= unit:
            return f"{round(n / unit, 1):g}{suffix}"
    return str(n)


def accelerator_kind(accelerator_type: str) -> AcceleratorKind:
    """TPU types start with ``tpu-`` (GKE's names); everything else is a GPU."""
    return AcceleratorKind.TPU if accelerator_type.startswith("tpu-") else AcceleratorKind.GPU


def topology_chips(topology: str) -> int:
    """Chips in a TPU topology: ``"2x4"`` -> 8. Raises ``ValueError`` if malformed."""
    parts = topology.split("x")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{topology!r} is not a TPU topology: write e.g. 2x4 or 2x2x4")
    return math.prod(int(p) for p in parts)


# --------------------------------------------------------------------------------------------
# The catalog's entries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ide:
    id: str
    title: str
    kind: IdeKind
    image: str | None = None
    #: Binaries the local runtime needs on PATH to serve this IDE (e.g. ``code-server``).
    requires: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Ide:
        return cls(id=entry["id"], title=entry["title"], kind=IdeKind(entry["kind"]),
                   image=entry.get("image"), requires=tuple(entry.get("requires", ())))


@dataclass(frozen=True)
class Environment:
    id: str
    title: str
    image: str
    status: EnvironmentStatus
    #: Local runtime: path of a Python interpreter or venv, or ``default`` (the agent's own).
    python: str = "default"
    message: str | None = None
    redirect: str | None = None
    #: False: its workspaces' memory is never snapshotted (pause keeps only the home).
    memory_snapshots: bool = True

    @property
    def usable(self) -> bool:
        """Whether a new workspace may use it directly (no redirect involved)."""
        return self.status in (EnvironmentStatus.APPROVED, EnvironmentStatus.DEPRECATED)

    @property
    def listed(self) -> bool:
        """Whether users are shown it when they ask what is available."""
        return self.usable and self.redirect is None

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Environment:
        return cls(id=entry["id"], title=entry["title"], image=entry["image"],
                   status=EnvironmentStatus(entry["status"]),
                   python=entry.get("python", "default"), message=entry.get("message"),
                   redirect=entry.get("redirect"),
                   memory_snapshots=bool(entry.get("memory_snapshots", True)))


@dataclass(frozen=True)
class Accelerator:
    type: str
    count: int
    topology: str | None = None

    @property
    def kind(self) -> AcceleratorKind:
        return accelerator_kind(self.type)

    def __str__(self) -> str:
        return f"{self.count} x {self.type}"


@dataclass(frozen=True)
class Toleration:
    """A Kubernetes toleration; :meth:`to_k8s` gives the pod-spec form."""

    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Toleration:
        return cls(key=entry.get("key"), operator=entry.get("operator", "Equal"),
                   value=entry.get("value"), effect=entry.get("effect"),
                   toleration_seconds=entry.get("tolerationSeconds"))

    def to_k8s(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"key": self.key, "operator": self.operator,
                                "value": self.value, "effect": self.effect,
                                "tolerationSeconds": self.toleration_seconds}
        return {k: v for k, v in spec.items() if v is not None}


@dataclass(frozen=True)
class Disk:
    size: str
    size_bytes: int
    #: None: the cluster's default storage class.
    storage_class: str | None = None


@dataclass(frozen=True)
class IdleRule:
    idle_seconds: int
    min_running_seconds: int
    effect: IdleEffect


@dataclass(frozen=True)
class IdlePolicy:
    """Data for the idle rules (``functions.domain`` idle module); checked in order."""

    rules: tuple[IdleRule, ...]
    grace_after_resume_seconds: int = 0
    max_age_seconds: int | None = None

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> IdlePolicy:
        rules = tuple(IdleRule(r["idle_seconds"], r.get("min_running_seconds", 0),
                               IdleEffect(r["effect"])) for r in entry["rules"])
        return cls(rules, entry.get("grace_after_resume_seconds", 0),
                   entry.get("max_age_seconds"))


@dataclass(frozen=True)
class Retention:
    max_age_days: int
    keep_last: int
    delete_with_workspace: bool = True

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Retention:
        return cls(entry["max_age_days"], entry["keep_last"],
                   entry.get("delete_with_workspace", True))

    def overridden(self, override: Mapping[str, Any] | None) -> Retention:
        """This retention with a team's override applied field by field."""
        if not override:
            return self
        return Retention(override.get("max_age_days", self.max_age_days),
                         override.get("keep_last", self.keep_last),
                         override.get("delete_with_workspace", self.delete_with_workspace))


@dataclass(frozen=True)
class SnapshotPolicy:
    method: SnapshotMethod
    retention: Retention


@dataclass(frozen=True)
class ProfileScheduling:
    """A profile's queueing, preemption and checkpoint policy (``functions.domain.scheduling``
    applies it)."""

    #: None: the team's class, else the default class of workspaces.
    priority_class: str | None = None
    when_full: WhenFull = WhenFull.QUEUE
    #: None: a queued request waits until it is cancelled.
    max_wait_seconds: int | None = None
    #: None: a busy kernel is never preempted; else only this long after a warning.
    preempt_busy_after_seconds: int | None = None
    #: None: no periodic checkpoints (Spot profiles should have them).
    checkpoint_every_seconds: int | None = None

    @classmethod
    def from_config(cls, entry: Mapping[str, Any] | None) -> ProfileScheduling:
        entry = entry or {}
        return cls(entry.get("priority_class"), WhenFull(entry.get("when_full", "queue")),
                   entry.get("max_wait_seconds"), entry.get("preempt_busy_after_seconds"),
                   entry.get("checkpoint_every_seconds"))


@dataclass(frozen=True)
class Profile:
    """A hardware profile: what a workspace runs on, what it costs, when it pauses."""

    id: str
    title: str
    cpu_millis: int
    memory: str
    memory_bytes: int
    provisioning: Provisioning
    hourly_cost: float
    disk: Disk
    idle_policy: IdlePolicy
    snapshot: SnapshotPolicy
    accelerator: Accelerator | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    reservation: str | None = None
    #: Allowed environment ids; None: every usable environment.
    environments: tuple[str, ...] | None = None
    #: Allowed IDE ids; None: every IDE.
    ides: tuple[str, ...] | None = None
    scheduling: ProfileScheduling = ProfileScheduling()
    #: "required": only where each workspace gets an OS user of its own.
    isolation: str = "best_effort"

    @property
    def cpus(self) -> float:
        return self.cpu_millis / 1000

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Profile:
        acc = entry.get("accelerator")
        disk = entry["disk"]
        snapshot = entry["snapshot"]
        envs, ides = entry.get("environments"), entry.get("ides")
        return cls(
            id=entry["id"], title=entry["title"], cpu_millis=parse_cpu_millis(entry["cpu"]),
            memory=entry["memory"], memory_bytes=parse_quantity(entry["memory"]),
            provisioning=Provisioning(entry["provisioning"]),
            hourly_cost=float(entry["hourly_cost"]),
            disk=Disk(disk["size"], parse_quantity(disk["size"]), disk.get("storage_class")),
            idle_policy=IdlePolicy.from_config(entry["idle_policy"]),
            snapshot=SnapshotPolicy(SnapshotMethod(snapshot["method"]),
                                    Retention.from_config(snapshot["retention"])),
            accelerator=(Accelerator(acc["type"], acc["count"], acc.get("topology"))
                         if acc else None),
            node_selector=dict(entry.get("node_selector", {})),
            tolerations=tuple(Toleration.from_config(t) for t in entry.get("tolerations", ())),
            reservation=entry.get("reservation"),
            environments=tuple(envs) if envs is not None else None,
            ides=tuple(ides) if ides is not None else None,
            scheduling=ProfileScheduling.from_config(entry.get("scheduling")),
            isolation=str(entry.get("isolation") or "best_effort"),
        )


@dataclass(frozen=True)
class Member:
    user: str
    role: Role
    slack_user_id: str | None = None


@dataclass(frozen=True)
class Quotas:
    """A team's limits; usage against them is ``functions.domain.quota``'s business."""

    workspaces: int
    gpus: int
    tpus: int
    snapshot_bytes: int

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Quotas:
        return cls(entry["workspaces"], entry["gpus"], entry["tpus"],
                   parse_quantity(entry["snapshot_bytes"]))


@dataclass(frozen=True)
class Team:
    id: str
    title: str
    members: tuple[Member, ...]
    quotas: Quotas
    profiles: tuple[str, ...]
    contact: str | None = None
    #: Overrides of the profiles' snapshot retention, field by field.
    retention: Mapping[str, Any] | None = None
    #: The class of all of this team's work (wins over the profile's); None: the profile's.
    priority_class: str | None = None
    #: Teams of one cohort lend each other the GPU/TPU quota they leave unused.
    cohort: str | None = None
    #: How far over its own quota the team may borrow ({"gpus": n, "tpus": n}); a missing
    #: counter: as much as the cohort has unused.
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)
    #: False: its workspaces' memory is never snapshotted (pause keeps only the home).
    memory_snapshots: bool = True
    #: "required": only where each workspace gets an OS user of its own.
    isolation: str = "best_effort"

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Team:
        members = tuple(Member(m["user"], Role(m["role"]), m.get("slack_user_id"))
                        for m in entry["members"])
        return cls(id=entry["id"], title=entry["title"], members=members,
                   quotas=Quotas.from_config(entry["quotas"]),
                   profiles=tuple(entry["profiles"]), contact=entry.get("contact"),
                   retention=entry.get("retention"), priority_class=entry.get("priority_class"),
                   cohort=entry.get("cohort"),
                   borrowing_limit=dict(entry.get("borrowing_limit") or {}),
                   memory_snapshots=bool(entry.get("memory_snapshots", True)),
                   isolation=str(entry.get("isolation") or "best_effort"))

    def member(self, user: str) -> Member | None:
        return next((m for m in self.members if m.user == user), None)

    @property
    def admins(self) -> tuple[str, ...]:
        return tuple(m.user for m in self.members if m.role == Role.ADMIN)

    @property
    def who_to_ask(self) -> str:
        """Whom a refused user should ask: the contact, else the team's admins."""
        if self.contact:
            return self.contact
        if self.admins:
            return f"a team admin ({', '.join(self.admins)})"
        return "a Stasis admin"


@dataclass(frozen=True)
class PriorityClass:
    """Who goes first: a higher ``value`` is admitted first and may preempt lower ones."""

    id: str
    value: int
    description: str = ""


#: The one class of a config without a ``scheduling`` section.
DEFAULT_PRIORITY = PriorityClass("default", 0, "every request alike")


@dataclass(frozen=True)
class DeclaredNode:
    """Accelerators an admin declares for a node of the local runtime (no GPU behind them)."""

    id: str
    accelerators: Mapping[str, int]


@dataclass(frozen=True)
class Scheduling:
    """The ``scheduling`` section: priority classes, the default class of each kind of work,
    declared capacity of local nodes."""

    priority_classes: Mapping[str, PriorityClass] = field(
        default_factory=lambda: {DEFAULT_PRIORITY.id: DEFAULT_PRIORITY})
    defaults: Mapping[str, str] = field(default_factory=dict)
    nodes: Mapping[str, DeclaredNode] = field(default_factory=dict)

    @classmethod
    def from_config(cls, entry: Mapping[str, Any] | None) -> Scheduling:
        entry = entry or {}
        classes = {c["id"]: PriorityClass(c["id"], c["value"], c.get("description", ""))
                   for c in entry.get("priority_classes") or ()}
        return cls(classes or {DEFAULT_PRIORITY.id: DEFAULT_PRIORITY},
                   dict(entry.get("defaults") or {}),
                   {n["id"]: DeclaredNode(n["id"], dict(n["accelerators"]))
                    for n in entry.get("nodes") or ()})

    def lowest(self) -> PriorityClass:
        return min(self.priority_classes.values(), key=lambda c: c.value)


@dataclass(frozen=True)
class Pricing:
    """USD per GB-month of persistent disk and of snapshot storage."""

    disk_gb_month: float = 0.0
    snapshot_gb_month: float = 0.0


@dataclass(frozen=True)
class Selection:
    """What a workspace request resolved to, ready for provisioning."""

    team: Team
    profile: Profile
    environment: Environment
    ide: Ide


# --------------------------------------------------------------------------------------------
# The catalog and its resolution rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Catalog:
    """The validated catalog; mappings keep the config file's order."""

    ides: Mapping[str, Ide]
    environments: Mapping[str, Environment]
    profiles: Mapping[str, Profile]
    teams: Mapping[str, Team]
    pricing: Pricing = Pricing()
    scheduling: Scheduling = Scheduling()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Catalog:
        """The catalog of a config, or ``ConfigError`` listing every problem.

        Keys the config schema does not know (document metadata such as ``applied_at_ms``)
        are ignored, so the documents read back from Firestore can be passed as well:
        ``{"ides": [...], "environments": [...], "profiles": [...], "teams": [...]}``.
        """
        problems = validate_config(config)
        if problems:
            raise ConfigError(problems)
        try:
            pricing = config.get("pricing") or {}
            return cls(
                ides={e["id"]: Ide.from_config(e) for e in config["ides"]},
                environments={e["id"]: Environment.from_config(e)
                              for e in config["environments"]},
                profiles={e["id"]: Profile.from_config(e) for e in config["profiles"]},
                teams={e["id"]: Team.from_config(e) for e in config["teams"]},
                pricing=Pricing(float(pricing.get("disk_gb_month", 0.0)),
                                float(pricing.get("snapshot_gb_month", 0.0))),
                scheduling=Scheduling.from_config(config.get("scheduling")),
            )
        except (KeyError, TypeError, ValueError) as error:
            # Only reachable for a config that skipped the schema.
            raise ConfigError([Problem("", f"does not match schemas/config.schema.json: "
                                           f"{error!r}")]) from error

    # -- lookups ---------------------------------------------------------------------------

    def knows(self, *, team: str | None = None, member: str | None = None,
              slack_user: str | None = None, profile: str | None = None,
              environment: str | None = None, ide: str | None = None) -> bool:
        """Whether it has every one named: the team; the member (of that team, or of any);
        the Slack user's mapping; the profile (offered to that team); the environment; the
        IDE. A cached catalog that does not is read again before a request is refused for
        it (``functions.ports.catalog_knowing``)."""
        found = self.teams.get(team) if team is not None else None
        if team is not None and found is None:
            return False
        scope = [found] if found is not None else list(self.teams.values())
        return all((
            member is None or any(t.member(member) is not None for t in scope),
            slack_user is None or self.user_for_slack(slack_user) is not None,
            profile is None or (profile in self.profiles
                                and (found is None or profile in found.profiles)),
            environment is None or environment in self.environments,
            ide is None or ide in self.ides,
        ))

    def listed_environments(self) -> tuple[Environment, ...]:
        return tuple(e for e in self.environments.values() if e.listed)

    def profiles_for(self, team_id: str) -> tuple[Profile, ...]:
        team = self.teams.get(team_id)
        if team is None:
            return ()
        return tuple(self.profiles[p] for p in team.profiles if p in self.profiles)

    def teams_of(self, user: str) -> tuple[Team, ...]:
        return tuple(t for t in self.teams.values() if t.member(user) is not None)

    def user_for_slack(self, slack_user_id: str) -> str | None:
        """The Stasis user a Slack user acts as (validation keeps the mapping one-to-one)."""
        for team in self.teams.values():
            for member in team.members:
                if member.slack_user_id == slack_user_id:
                    return member.user
        return None

    def available_ides(self, installed: Set[str]) -> frozenset[str]:
        """The IDEs a runtime with the ``installed`` binaries can serve."""
        return frozenset(i.id for i in self.ides.values() if set(i.requires) <= installed)

    def priority_for(self, team_id: str, profile_id: str | None = None,
                     kind: WorkKind = WorkKind.WORKSPACE) -> PriorityClass:
        """The priority class of a team's work: the team's own class, else the profile's,
        else the default class of its kind, else the lowest class there is."""
        classes = self.scheduling.priority_classes
        team = self.teams.get(team_id)
        profile = self.profiles.get(profile_id or "")
        for name in (team.priority_class if team else None,
                     profile.scheduling.priority_class if profile else None,
                     self.scheduling.defaults.get(str(kind))):
            if name is not None and name in classes:
                return classes[name]
        return self.scheduling.lowest()

    def memory_snapshots_for(self, team_id: str, environment_id: str) -> bool:
        """Whether a workspace of ``team_id`` on ``environment_id`` may have its memory
        snapshotted: memory snapshots copy whatever data was in memory, so either the
        environment or the team saying ``memory_snapshots: false`` keeps them off."""
        team = self.teams.get(team_id)
        env = self.environments.get(environment_id)
        return (team is None or team.memory_snapshots) and (env is None or env.memory_snapshots)

    def isolation_required_by(self, team_id: str, profile_id: str) -> list[str]:
        """What asks that a workspace of ``team_id`` on ``profile_id`` run only as an OS
        user of its own ("team t", "profile p"): the runtime refuses it, with its reason,
        where it cannot give one."""
        team, profile = self.teams.get(team_id), self.profiles.get(profile_id)
        return ([f"team {team_id}"] if team and team.isolation == "required" else []) + (
            [f"profile {profile_id}"] if profile and profile.isolation == "required" else [])

    def retention_for(self, team_id: str, profile_id: str) -> Retention:
        """The profile's snapshot retention with the team's override applied."""
        retention = self.profiles[profile_id].snapshot.retention
        team = self.teams.get(team_id)
        return retention.overridden(team.retention if team else None)

    # -- resolution ------------------------------------------------------------------------

    def resolve_environment(self, env_id: str) -> Resolution[Environment]:
        """The environment a new workspace asking for ``env_id`` gets."""
        env = self.environments.get(env_id)
        listed = [e.id for e in self.listed_environments()]
        if env is None:
            return Refusal(RefusalReason.UNKNOWN_ENVIRONMENT,
                           f"there is no environment {env_id}.{_suggest(env_id, listed)} "
                           f"Available: {_ids(listed)}.")
        if env.redirect is not None:
            # Validation guarantees one hop to a usable environment.
            successor = self.environments[env.redirect]
            replaced = f"{env.id} was replaced by {successor.id}"
            notices = [Notice(NoticeKind.REDIRECTED,
                              f"{replaced}: {env.message}" if env.message else replaced)]
            notices.extend(_deprecation(successor))
            return Resolved(successor, tuple(notices))
        if env.status == EnvironmentStatus.HIDDEN:
            why = f": {env.message.rstrip(' .')}" if env.message else ""
            return Refusal(RefusalReason.ENVIRONMENT_HIDDEN,
                           f"environment {env.id} is no longer offered{why}. "
                           f"Use one of: {_ids(listed)}.")
        if env.status == EnvironmentStatus.UNAPPROVED:
            return Refusal(RefusalReason.ENVIRONMENT_UNAPPROVED,
                           f"environment {env.id} is not approved yet; ask an admin to approve "
                           f"it, or use one of: {_ids(listed)}.")
        return Resolved(env, tuple(_deprecation(env)))

    def resolve_profile(self, team_id: str, profile_id: str) -> Resolution[Profile]:
        """The profile ``profile_id`` if the team may use it."""
        team = self.teams.get(team_id)
        if team is None:
            return Refusal(RefusalReason.UNKNOWN_TEAM,
                           f"there is no team {team_id}."
                           f"{_suggest(team_id, list(self.teams))}")
        allowed = list(team.profiles)
        profile = self.profiles.get(profile_id)
        if profile is None:
            return Refusal(RefusalReason.UNKNOWN_PROFILE,
                           f"there is no profile {profile_id}."
                           f"{_suggest(profile_id, allowed)} "
                           f"Profiles for team {team.id}: {_ids(allowed)}.")
        if profile.id not in allowed:
            return Refusal(RefusalReason.PROFILE_NOT_ALLOWED,
                           f"profile {profile.id} is not available to team {team.id}; ask "
                           f"{team.who_to_ask} to add it, or use one of: {_ids(allowed)}.")
        return Resolved(profile)

    def resolve_ide(self, ide_id: str, available_ides: Set[str]) -> Resolution[Ide]:
        """The IDE ``ide_id`` if this runtime can serve it (``available_ides``)."""
        ide = self.ides.get(ide_id)
        usable = [i for i in self.ides if i in available_ides]
        if ide is None:
            return Refusal(RefusalReason.UNKNOWN_IDE,
                           f"there is no IDE {ide_id}.{_suggest(ide_id, list(self.ides))} "
                           f"Available: {_ids(usable)}.")
        if ide.id not in available_ides:
            why = f"{', '.join(ide.requires)} not installed" if ide.requires else "not supported"
            instead = f"use {' or '.join(usable)}" if usable else "no IDE is available here"
            return Refusal(RefusalReason.IDE_UNAVAILABLE,
                           f"{ide.id} is not available on this runtime ({why}); {instead}")
        return Resolved(ide)

    def resolve_request(
        self,
        team_id: str,
        profile_id: str,
        environment_id: str,
        ide_id: str,
        *,
        available_ides: Set[str],
        host_capabilities: Mapping[str, Any] | None = None,
    ) -> Resolution[Selection]:
        """A whole workspace request: profile for the team, environment and IDE allowed on
        that profile, and (local runtime) hardware this host has. First refusal wins;
        notices of the steps that succeeded are kept."""
        profile_r = self.resolve_profile(team_id, profile_id)
        if isinstance(profile_r, Refusal):
            return profile_r
        profile = profile_r.value
        env_r = self.resolve_environment(environment_id)
        if isinstance(env_r, Refusal):
            return env_r
        env = env_r.value
        allowed_envs = (profile.environments if profile.environments is not None
                        else tuple(e.id for e in self.environments.values() if e.usable))
        if env.id not in allowed_envs:
            offered = [e for e in allowed_envs if e in self.environments
                       and self.environments[e].listed]
            return Refusal(RefusalReason.ENVIRONMENT_NOT_ALLOWED,
                           f"environment {env.id} is not offered on profile {profile.id}; "
                           f"use one of: {_ids(offered)}.")
        ide_r = self.resolve_ide(ide_id, available_ides)
        if isinstance(ide_r, Refusal):
            return ide_r
        ide = ide_r.value
        if profile.ides is not None and ide.id not in profile.ides:
            return Refusal(RefusalReason.IDE_NOT_ALLOWED,
                           f"{ide.id} is not offered on profile {profile.id}; "
                           f"use {' or '.join(profile.ides)}.")
        if host_capabilities is not None:
            refusal = check_hardware(profile, host_capabilities)
            if refusal is not None:
                return refusal
        selection = Selection(self.teams[team_id], profile, env, ide)
        return Resolved(selection, profile_r.notices + env_r.notices + ide_r.notices)


def check_hardware(profile: Profile, host_capabilities: Mapping[str, Any]) -> Refusal | None:
    """None if this host has the accelerators ``profile`` needs, else why not.

    ``host_capabilities`` is what the local runtime detects: ``{"accelerators":
    {"nvidia-l4": 1}, "cpus": 2, "memory_bytes": N}``. Only what the host *lacks* is refused
    (a GPU, a TPU); CPU and memory are not, because the local runtime caps them to what the
    host has, so a laptop can still run a large CPU profile. Without an ``accelerators`` key
    (a runtime that does not report them, such as a cluster) nothing is checked; an empty
    mapping means the host has none. Types match as in :func:`accelerator_matches`.
    """
    acc = profile.accelerator
    if acc is None or host_capabilities.get("accelerators") is None:
        return None
    have = {t: n for t, n in (host_capabilities.get("accelerators") or {}).items()
            if isinstance(t, str) and isinstance(n, int) and n > 0}
    same_kind = {t: n for t, n in have.items() if accelerator_kind(t) == acc.kind}
    matching = sum(n for t, n in same_kind.items() if accelerator_matches(acc.type, t))
    if matching >= acc.count:
        return None
    kind = acc.kind.upper()
    if not same_kind:
        host = f"this host has no {kind}"
    elif matching == 0:
        host = "this host has " + ", ".join(f"{n} x {t}" for t, n in sorted(same_kind.items()))
    else:
        host = f"this host has only {matching} x {acc.type}"
    return Refusal(RefusalReason.ACCELERATOR_UNAVAILABLE,
                   f"profile {profile.id} needs {acc} but {host}: choose a profile without "
                   f"{kind}s here, or use a cluster that has {acc.type}")


def accelerator_matches(wanted: str, have: str) -> bool:
    """Whether a host accelerator ``have`` serves a profile's ``wanted`` type.

    The catalog uses GKE's names ("nvidia-tesla-t4", "nvidia-h100-80gb"); the local runtime
    derives names from ``nvidia-smi`` ("nvidia-t4", "nvidia-h100"). A "tesla" token is
    ignored and one name may extend the other by a suffix, the same rule as
    ``runtime/local/host.py``'s ``same_accelerator``.
    """

    def norm(key: str) -> str:
        return re.sub(r"-tesla(?=-)", "", key.lower())

    a, b = norm(wanted), norm(have)
    return a == b or a.startswith(b + "-") or b.startswith(a + "-")


def _deprecation(env: Environment) -> list[Notice]:
    if env.status != EnvironmentStatus.DEPRECATED:
        return []
    return [Notice(NoticeKind.DEPRECATED, f"{env.id} is deprecated: {env.message}")]


def _suggest(wrong: str, candidates: list[str]) -> str:
    """A sentence ``Did you mean x?`` (with a leading space) for a refusal, or nothing."""
    close = difflib.get_close_matches(wrong, candidates, n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def _did_you_mean(wrong: str, candidates: list[str]) -> str:
    """``; did you mean x?`` for a problem message, or nothing."""
    close = difflib.get_close_matches(wrong, candidates, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _known(what: str, ids: Iterable[str]) -> str:
    return f" (known {what}: {_ids(ids)})"


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(ids) or "none"


# --------------------------------------------------------------------------------------------
# Validation: everything the schema cannot say
# --------------------------------------------------------------------------------------------

_ID = re.compile(r"(?!.*--)[a-z][a-z0-9-]{1,38}[a-z0-9]")
_SECTIONS = ("ides", "environments", "profiles", "teams")
_GKE_GPU = "cloud.google.com/gke-accelerator"
_GKE_TPU = "cloud.google.com/gke-tpu-accelerator"
_GKE_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
_GKE_SPOT = "cloud.google.com/gke-spot"


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): ``pointer("profiles", 0, "a/b")`` -> ``/profiles/0/a~1b``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def validate_config(config: Mapping[str, Any]) -> list[Problem]:
    """Every problem of ``config`` the JSON Schema cannot express; empty when it is sound.

    Never raises: input that also fails the schema is reported as far as it can be read.
    """
    if not isinstance(config, Mapping):
        return [Problem("", "the config must be a mapping with ides, environments, profiles "
                            "and teams")]
    problems: list[Problem] = []
    sections: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    ids: dict[str, dict[str, int]] = {}
    for name in _SECTIONS:
        sections[name] = _entries(config, name, problems)
        ids[name] = _unique_ids(name, sections[name], problems)
    env_by_id: dict[str, Mapping[str, Any]] = {}
    for _, env in sections["environments"]:
        if isinstance(env.get("id"), str):
            env_by_id.setdefault(env["id"], env)  # a duplicate is reported; the first counts
    _check_environments(sections["environments"], env_by_id, problems)
    _check_profiles(sections["profiles"], env_by_id, ids["ides"], problems)
    _check_teams(sections["teams"], ids["profiles"], problems)
    _check_pricing(config.get("pricing"), problems)
    _check_scheduling(config.get("scheduling"), sections["profiles"], sections["teams"],
                      problems)
    return problems


def _entries(config: Mapping[str, Any], name: str,
             problems: list[Problem]) -> list[tuple[int, Mapping[str, Any]]]:
    section = config.get(name)
    if section is None:
        problems.append(Problem(pointer(name), f"{name} is required (a list)"))
        return []
    if not isinstance(section, list):
        problems.append(Problem(pointer(name), f"{name} must be a list"))
        return []
    entries = []
    for i, entry in enumerate(section):
        if isinstance(entry, Mapping):
            entries.append((i, entry))
        else:
            problems.append(Problem(pointer(name, i), "must be a mapping"))
    return entries


def _unique_ids(name: str, entries: list[tuple[int, Mapping[str, Any]]],
                problems: list[Problem]) -> dict[str, int]:
    """Id -> index of its first entry; a repeat or a malformed id is a problem."""
    first: dict[str, int] = {}
    for i, entry in entries:
        entry_id = entry.get("id")
        if not isinstance(entry_id, str) or not _ID.fullmatch(entry_id):
            problems.append(Problem(pointer(name, i, "id"),
                                    f"{entry_id!r} is not an id: 3-40 lowercase letters, digits "
                                    "and single dashes, starting with a letter"))
        elif entry_id in first:
            problems.append(Problem(pointer(name, i, "id"),
                                    f"duplicate id {entry_id}: already used by "
                                    f"{pointer(name, first[entry_id])}"))
        else:
            first[entry_id] = i
    return first


def _check_environments(entries: list[tuple[int, Mapping[str, Any]]],
                        env_by_id: Mapping[str, Mapping[str, Any]],
                        problems: list[Problem]) -> None:
    known = list(env_by_id)
    for i, env in entries:
        env_id, status, redirect = env.get("id"), env.get("status"), env.get("redirect")
        message = env.get("message")
        if status == EnvironmentStatus.DEPRECATED and not (
                isinstance(message, str) and message.strip()):
            problems.append(Problem(pointer("environments", i, "message"),
                                    f"deprecated environment {env_id} needs a message that tells "
                                    "users what to use instead"))
        if redirect is None:
            continue
        at = pointer("environments", i, "redirect")
        if not isinstance(redirect, str):
            problems.append(Problem(at, "redirect must be an environment id"))
            continue
        if status == EnvironmentStatus.APPROVED:
            problems.append(Problem(pointer("environments", i, "status"),
                                    f"approved environment {env_id} redirects to {redirect}, so "
                                    "nobody can get it: set status to deprecated or hidden, or "
                                    "remove the redirect"))
        target = env_by_id.get(redirect)
        if redirect == env_id:
            problems.append(Problem(at, f"{env_id} redirects to itself; point it at its "
                                        "successor"))
        elif target is None:
            problems.append(Problem(at, f"redirect to unknown environment {redirect}"
                                        f"{_did_you_mean(redirect, known)}"
                                        f"{_known('environments', known)}"))
        elif target.get("redirect") is not None:
            chain = _redirect_chain(env_by_id, str(env_id))
            if chain[-1] in chain[:-1]:
                problems.append(Problem(at, "redirect cycle " + " -> ".join(chain)
                                        + ": point each of them at a final environment"))
            else:
                problems.append(Problem(at, f"{env_id} redirects to {redirect}, which itself "
                                            f"redirects to {target.get('redirect')}; point "
                                            f"{env_id} at {chain[-1]} directly"))
        elif target.get("status") not in (EnvironmentStatus.APPROVED,
                                          EnvironmentStatus.DEPRECATED):
            problems.append(Problem(at, f"{env_id} redirects to {redirect}, which is "
                                        f"{target.get('status')}; redirect to an approved or "
                                        "deprecated environment"))


def _redirect_chain(env_by_id: Mapping[str, Mapping[str, Any]], start: str) -> list[str]:
    """``start`` and the redirects after it, up to the end or the first repeat."""
    chain = [start]
    while True:
        nxt = env_by_id.get(chain[-1], {}).get("redirect")
        if not isinstance(nxt, str) or nxt not in env_by_id:
            return chain
        chain.append(nxt)
        if nxt in chain[:-1]:
            return chain


def _check_profiles(entries: list[tuple[int, Mapping[str, Any]]],
                    env_by_id: Mapping[str, Mapping[str, Any]], ide_ids: Mapping[str, int],
                    problems: list[Problem]) -> None:
    for i, profile in entries:
        def at(*parts: str | int, _i: int = i) -> str:
            return pointer("profiles", _i, *parts)

        _parsed(at("cpu"), profile.get("cpu"), parse_cpu_millis, problems)
        _parsed(at("memory"), profile.get("memory"), parse_quantity, problems)
        disk = profile.get("disk")
        if isinstance(disk, Mapping):
            _parsed(at("disk", "size"), disk.get("size"), parse_quantity, problems)
        _non_negative(at("hourly_cost"), profile.get("hourly_cost"), problems, number=True)
        _check_accelerator(profile, at, problems)
        provisioning = profile.get("provisioning")
        if profile.get("reservation") and provisioning == Provisioning.SPOT:
            problems.append(Problem(at("reservation"),
                                    "Spot VMs cannot consume reservations: use on-demand "
                                    "provisioning or remove the reservation"))
        selector = profile.get("node_selector")
        if (isinstance(selector, Mapping) and selector.get(_GKE_SPOT) == "true"
                and provisioning == Provisioning.ON_DEMAND):
            problems.append(Problem(at("node_selector", _GKE_SPOT),
                                    "provisioning is on-demand but the node selector asks for "
                                    "Spot nodes: set provisioning: spot or remove the label"))
        tolerations = profile.get("tolerations")
        for j, toleration in enumerate(tolerations if isinstance(tolerations, list) else []):
            if (isinstance(toleration, Mapping) and toleration.get("operator") == "Exists"
                    and toleration.get("value") is not None):
                problems.append(Problem(at("tolerations", j, "value"),
                                        "operator Exists takes no value: remove the value or "
                                        "use operator Equal"))
        allowed = _id_list(profile, "environments", at, problems)
        for j, env_id in allowed:
            env = env_by_id.get(env_id)
            if env is None:
                problems.append(Problem(at("environments", j),
                                        f"unknown environment {env_id}"
                                        f"{_did_you_mean(env_id, list(env_by_id))}"
                                        f"{_known('environments', env_by_id)}"))
            elif env.get("status") == EnvironmentStatus.UNAPPROVED and env.get("redirect") is None:
                problems.append(Problem(at("environments", j),
                                        f"environment {env_id} is unapproved: approve it or "
                                        "remove it from this profile"))
            elif (isinstance(env.get("redirect"), str)
                  and env["redirect"] not in {e for _, e in allowed}):
                problems.append(Problem(at("environments", j),
                                        f"environment {env_id} redirects to {env['redirect']}, "
                                        "which this profile does not allow: add it"))
        for j, ide_id in _id_list(profile, "ides", at, problems):
            if ide_id not in ide_ids:
                problems.append(Problem(at("ides", j), f"unknown IDE {ide_id}"
                                                       f"{_did_you_mean(ide_id, list(ide_ids))}"
                                                       f"{_known('IDEs', ide_ids)}"))


def _check_accelerator(profile: Mapping[str, Any], at: Callable[..., str],
                       problems: list[Problem]) -> None:
    acc = profile.get("accelerator")
    if not isinstance(acc, Mapping) or not isinstance(acc.get("type"), str):
        return
    acc_type, count, topology = acc["type"], acc.get("count"), acc.get("topology")
    kind = accelerator_kind(acc_type)
    count_ok = isinstance(count, int) and not isinstance(count, bool) and count >= 1
    if not count_ok:
        problems.append(Problem(at("accelerator", "count"),
                                f"count must be a whole number >= 1, got {count!r}"))
    if kind == AcceleratorKind.TPU and topology is None:
        problems.append(Problem(at("accelerator", "topology"),
                                f"TPU {acc_type} needs a topology such as 2x4"))
    elif kind == AcceleratorKind.GPU and topology is not None:
        problems.append(Problem(at("accelerator", "topology"),
                                f"topology applies to TPUs only; remove it from {acc_type}"))
    elif kind == AcceleratorKind.TPU:
        try:
            chips = topology_chips(str(topology))
        except ValueError as error:
            problems.append(Problem(at("accelerator", "topology"), str(error)))
        else:
            if isinstance(count, int) and count_ok and chips % count != 0:
                problems.append(Problem(at("accelerator", "topology"),
                                        f"topology {topology} has {chips} chips, which is not "
                                        f"a multiple of count {count}"))
    selector = profile.get("node_selector")
    if not isinstance(selector, Mapping):
        return
    expected = ({_GKE_GPU: acc_type} if kind == AcceleratorKind.GPU
                else {_GKE_TPU: acc_type, _GKE_TOPOLOGY: topology})
    for label, value in expected.items():
        if label in selector and value is not None and selector[label] != value:
            problems.append(Problem(at("node_selector", label),
                                    f"{label} is {selector[label]!r} but the accelerator says "
                                    f"{value!r}; make them agree"))
    wrong_label, wrong_kind = ((_GKE_TPU, "TPU") if kind == AcceleratorKind.GPU
                               else (_GKE_GPU, "GPU"))
    if wrong_label in selector:
        problems.append(Problem(at("node_selector", wrong_label),
                                f"{wrong_label} selects {wrong_kind} nodes but the accelerator "
                                f"is a {kind.upper()}"))


def _check_teams(entries: list[tuple[int, Mapping[str, Any]]], profile_ids: Mapping[str, int],
                 problems: list[Problem]) -> None:
    # Across teams a user may appear many times, but one Slack id is one Stasis user.
    slack_owner: dict[str, tuple[str, str]] = {}
    user_slack: dict[str, tuple[str, str]] = {}
    for i, team in entries:
        def at(*parts: str | int, _i: int = i) -> str:
            return pointer("teams", _i, *parts)

        for j, profile_id in _id_list(team, "profiles", at, problems):
            if profile_id not in profile_ids:
                problems.append(Problem(at("profiles", j),
                                        f"unknown profile {profile_id}"
                                        f"{_did_you_mean(profile_id, list(profile_ids))}"
                                        f"{_known('profiles', profile_ids)}"))
        members = team.get("members")
        seen: dict[str, int] = {}
        for j, member in enumerate(members if isinstance(members, list) else []):
            if not isinstance(member, Mapping) or not isinstance(member.get("user"), str):
                problems.append(Problem(at("members", j), "a member needs a user"))
                continue
            user, slack = member["user"], member.get("slack_user_id")
            if user in seen:
                problems.append(Problem(at("members", j, "user"),
                                        f"{user} is listed twice in team {team.get('id')} "
                                        f"(first at {at('members', seen[user])})"))
                continue
            seen[user] = j
            if not isinstance(slack, str):
                continue
            here = at("members", j, "slack_user_id")
            owner = slack_owner.setdefault(slack, (user, here))
            if owner[0] != user:
                problems.append(Problem(here, f"Slack user {slack} already acts as {owner[0]} "
                                              f"(at {owner[1]}); one Slack user is one Stasis "
                                              "user"))
            known = user_slack.setdefault(user, (slack, here))
            if known[0] != slack:
                problems.append(Problem(here, f"{user} has Slack user {known[0]} at {known[1]}; "
                                              "use the same one everywhere"))
        quotas = team.get("quotas")
        if isinstance(quotas, Mapping):
            for key in ("workspaces", "gpus", "tpus"):
                _non_negative(at("quotas", key), quotas.get(key), problems, number=False)
            _parsed(at("quotas", "snapshot_bytes"), quotas.get("snapshot_bytes"), parse_quantity,
                    problems)


def _check_pricing(pricing: object, problems: list[Problem]) -> None:
    if isinstance(pricing, Mapping):
        for key in ("disk_gb_month", "snapshot_gb_month"):
            if key in pricing:
                _non_negative(pointer("pricing", key), pricing[key], problems, number=True)


def _check_scheduling(scheduling: object, profiles: list[tuple[int, Mapping[str, Any]]],
                      teams: list[tuple[int, Mapping[str, Any]]],
                      problems: list[Problem]) -> None:
    """Priority classes unique and every reference to one known; declared nodes unique; a
    profile's queue policy and a team's borrowing coherent."""
    section = scheduling if isinstance(scheduling, Mapping) else {}
    classes: dict[str, int] = {}
    entries = section.get("priority_classes")
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        class_id = entry.get("id") if isinstance(entry, Mapping) else None
        if isinstance(class_id, str) and class_id in classes:
            first = pointer("scheduling", "priority_classes", classes[class_id])
            problems.append(Problem(pointer("scheduling", "priority_classes", i, "id"),
                                    f"duplicate priority class {class_id}: already at {first}"))
        elif isinstance(class_id, str):
            classes[class_id] = i
    known = list(classes) or [DEFAULT_PRIORITY.id]

    def check_class(path: str, name: object) -> None:
        if isinstance(name, str) and name not in known:
            problems.append(Problem(path, f"unknown priority class {name}"
                                          f"{_did_you_mean(name, known)}"
                                          f"{_known('priority classes', known)}"))

    defaults = section.get("defaults")
    for kind, name in (defaults.items() if isinstance(defaults, Mapping) else ()):
        check_class(pointer("scheduling", "defaults", kind), name)
    seen: dict[str, int] = {}
    nodes = section.get("nodes")
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        node_id = node.get("id") if isinstance(node, Mapping) else None
        if isinstance(node_id, str) and node_id in seen:
            problems.append(Problem(pointer("scheduling", "nodes", i, "id"),
                                    f"node {node_id} is declared twice (first at "
                                    f"{pointer('scheduling', 'nodes', seen[node_id])})"))
        elif isinstance(node_id, str):
            seen[node_id] = i
    for i, profile in profiles:
        policy = profile.get("scheduling")
        if not isinstance(policy, Mapping):
            continue
        check_class(pointer("profiles", i, "scheduling", "priority_class"),
                    policy.get("priority_class"))
        if policy.get("when_full") == WhenFull.REFUSE and "max_wait_seconds" in policy:
            problems.append(Problem(pointer("profiles", i, "scheduling", "max_wait_seconds"),
                                    "a profile that refuses when full queues nothing to wait: "
                                    "remove max_wait_seconds or set when_full: queue"))
    for i, team in teams:
        check_class(pointer("teams", i, "priority_class"), team.get("priority_class"))
        if team.get("borrowing_limit") is not None and team.get("cohort") is None:
            problems.append(Problem(pointer("teams", i, "borrowing_limit"),
                                    "a team borrows only from its cohort: set cohort or remove "
                                    "borrowing_limit"))


def _id_list(entry: Mapping[str, Any], key: str, at: Callable[..., str],
             problems: list[Problem]) -> list[tuple[int, str]]:
    value = entry.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(Problem(at(key), f"{key} must be a list of ids"))
        return []
    found = []
    for j, item in enumerate(value):
        if isinstance(item, str):
            found.append((j, item))
        else:
            problems.append(Problem(at(key, j), f"{item!r} is not an id"))
    return found


def _parsed(path: str, value: object, parse: Callable[[Any], int],
            problems: list[Problem]) -> None:
    if value is None:
        return  # missing: the schema's to report
    try:
        parse(value)
    except ValueError as error:
        problems.append(Problem(path, str(error)))


def _non_negative(path: str, value: object, problems: list[Problem], *, number: bool) -> None:
    if value is None:
        return
    valid_type = (int, float) if number else int
    if isinstance(value, bool) or not isinstance(value, valid_type):
        kind = "a number" if number else "a whole number"
        problems.append(Problem(path, f"must be {kind} >= 0, got {value!r}"))
    elif not math.isfinite(value) or value < 0:
        problems.append(Problem(path, f"must be >= 0, got {value!r}"))


# --------------------------------------------------------------------------------------------
# Firestore documents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigDocuments:
    """The documents one ``stasis admin apply`` writes, keyed by id.

    Suggested paths: ``catalog/ides/items/{id}``, ``catalog/environments/items/{id}``,
    ``catalog/profiles/items/{id}``, ``catalog/pricing`` and ``teams/{id}``. Team documents
    carry no ``usage``: counters belong to transactions, so the adapter merges these fields
    into an existing team and sets ``usage`` to zeros only when it creates the document.
    """

    ides: dict[str, dict[str, Any]]
    environments: dict[str, dict[str, Any]]
    profiles: dict[str, dict[str, Any]]
    teams: dict[str, dict[str, Any]]
    pricing: dict[str, Any]
    revision: str
    #: The ``scheduling`` section as written (priority classes, defaults, declared nodes).
    scheduling: dict[str, Any] = field(default_factory=dict)


def config_revision(config: Mapping[str, Any]) -> str:
    """sha256 of the config's canonical JSON: equal configs, equal revisions."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_documents(config: Mapping[str, Any], *, applied_at: datetime,
                     applied_by: str) -> ConfigDocuments:
    """The Firestore documents of a sound config (``ConfigError`` otherwise).

    Each document is the config entry as written plus ``applied_at_ms``, ``applied_by`` and
    ``revision``; team documents add ``member_ids`` and ``slack_user_ids`` so the store can
    find a user's teams with one ``array_contains`` query.
    """
    if applied_at.tzinfo is None:
        raise ValueError("applied_at must be timezone-aware")
    Catalog.from_config(config)  # raises ConfigError with every problem
    revision = config_revision(config)
    meta = {"applied_at_ms": int(applied_at.timestamp() * 1000), "applied_by": applied_by,
            "revision": revision}

    def docs(name: str) -> dict[str, dict[str, Any]]:
        return {e["id"]: {**_plain(e), **meta} for e in config[name]}

    teams = docs("teams")
    for team in teams.values():
        team["member_ids"] = [m["user"] for m in team["members"]]
        team["slack_user_ids"] = [m["slack_user_id"] for m in team["members"]
                                  if m.get("slack_user_id")]
    pricing = {**_plain(config.get("pricing") or {}), **meta}
    return ConfigDocuments(docs("ides"), docs("environments"), docs("profiles"), teams, pricing,
                           revision, _plain(config.get("scheduling") or {}))


def _plain(value: Any) -> Any:
    """A deep copy made of dicts and lists only, safe to hand to a client library."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value

