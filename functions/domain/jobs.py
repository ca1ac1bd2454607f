"""Scale-out jobs: the pure rules (state machine, accelerator demand, admission, release).

A job is one function run on ``hosts`` hosts of a profile (a multi-host TPU slice on GKE, or
``hosts`` processes on the local runtime). It holds ``profile accelerators x hosts`` of the
team's accelerator quota from admission until it ends, and no workspace slot (it belongs to
a workspace, which already holds one). ``jobs/{id}`` and the team's ``usage`` change in the
same transaction (``functions.adapters.job_store``), with :func:`submit` and :func:`finish`.

States::

    SUBMITTED --admitted--> RUNNING --finished--> SUCCEEDED | FAILED | CANCELLED
        \\--refused--> REFUSED

A redelivered job.submitted for a job already known changes nothing; a job.finished for a
job already ended, or never admitted, releases nothing (quota is never released twice).

Admission checks, in the order workspaces use (the catalog, then the hardware, then the
quota, so nobody is sent to an admin for quota that this node could not use anyway): the
team and profile, ``hosts``, this node's accelerators for a ``local`` job (all its hosts
run on the one node: it must have ``profile accelerators x hosts``; a cluster places hosts
on its own nodes and reports no accelerators, so nothing is checked there), the team's
quota. Refusals speak of the job and what to do about it.

A decision also carries what the job runtime must do (a kubernetes job's :class:`StartJob`
once admitted, :class:`CancelJob` once ended) and the job.state_changed of the change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from events.payloads import JobStateChanged, JobSubmitted
from functions.domain.catalog import (
    Profile,
    Quotas,
    Refusal,
    RefusalReason,
    accelerator_kind,
    check_hardware,
)
from functions.domain.quota import Admitted, Usage, accelerators_of, admit, release

MAX_HOSTS = 1024
#: Where a job's hosts run when the control plane starts them (a JobSet per job); a
#: ``local`` job's hosts are the submitting kernel's own children.
KUBERNETES = "kubernetes"


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REFUSED = "REFUSED"


#: States that hold the team's accelerators.
HOLDS_ACCELERATORS = frozenset({JobState.RUNNING})
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                      JobState.REFUSED})
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.RUNNING, JobState.REFUSED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    **{s: frozenset() for s in TERMINAL},
}


class IllegalTransition(ValueError):
    pass


def can_move(current: JobState, target: JobState) -> bool:
    return target in TRANSITIONS[current]


def move(current: JobState, target: JobState) -> JobState:
    if not can_move(current, target):
        raise IllegalTransition(f"a job cannot go from {current} to {target}")
    return target


def demand_of(profile: Profile, hosts: int) -> Usage:
    """The accelerators a job needs: the profile's accelerators on each of its hosts."""
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be a whole number from 1 to {MAX_HOSTS}, got {hosts!r}")
    per_host = accelerators_of(profile)
    return Usage(gpus=per_host.gpus * hosts, tpus=per_host.tpus * hosts)


@dataclass(frozen=True)
class Job:
    """``jobs/{id}``: what was asked, where it is, and how it ended."""

    id: str
    team: str
    owner: str
    profile: str
    hosts: int
    state: JobState
    gpus: int = 0
    tpus: int = 0
    workspace_id: str | None = None
    runtime: str = "local"
    function: str = ""
    message: str = ""
    log_uri: str | None = None
    exit_status: int | None = None
    failed_host: int | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None

    @property
    def demand(self) -> Usage:
        return Usage(gpus=self.gpus, tpus=self.tpus)

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.id, "team": self.team, "owner": self.owner, "profile": self.profile,
            "hosts": self.hosts, "state": str(self.state), "gpus": self.gpus,
            "tpus": self.tpus, "workspace_id": self.workspace_id, "runtime": self.runtime,
            "function": self.function, "message": self.message, "log_uri": self.log_uri,
            "exit_status": self.exit_status, "failed_host": self.failed_host,
            "submitted_at": self.submitted_at, "started_at": self.started_at,
            "finished_at": self.finished_at, "duration_ms": self.duration_ms,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Job:
        names = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in doc.items() if k in names}
        values["state"] = JobState(values["state"])
        return cls(**values)


#: A job request is the job.submitted payload itself, as the lifecycle takes its events.
Request = JobSubmitted


# Commands: what the job runtime is asked to do once the decision is committed.
@dataclass(frozen=True)
class StartJob:
    """Start an admitted kubernetes job (its JobSet); the function is at ``payload_uri``."""

    job_id: str
    team: str
    owner: str
    profile: str
    hosts: int
    payload_uri: str | None
    topology: str | None = None
    workspace_id: str | None = None


@dataclass(frozen=True)
class CancelJob:
    """Release an ended kubernetes job's hosts (its JobSet and Service are deleted)."""

    job_id: str
    team: str


Command = StartJob | CancelJob


@dataclass(frozen=True)
class Decision:
    """What a handler writes: the job (None: nothing to write) and the team's new usage
    (None: unchanged); what the job runtime must do, and the job's state change."""

    job: Job | None
    usage: Usage | None
    accepted: bool
    reason: str
    message: str
    commands: tuple[Command, ...] = ()
    events: tuple[JobStateChanged, ...] = ()

    def outcome(self) -> dict[str, Any]:
        """What the request's ledger entry says."""
        return {"accepted": self.accepted, "reason": self.reason, "message": self.message,
                "state": str(self.job.state) if self.job else None}


def changed(before: JobState | None, after: Job, reason: str) -> JobStateChanged:
    """The job.state_changed of ``after``, which was ``before`` (None: just submitted)."""
    return JobStateChanged(
        job_id=after.id, team=after.team, owner=after.owner,
        from_state=str(before) if before is not None else None, to_state=str(after.state),
        reason=reason, message=after.message, workspace_id=after.workspace_id,
        runtime=after.runtime)


def submit(request: Request, *, existing: Job | None, profile: Profile | None,
           team_profiles: tuple[str, ...] | None, quotas: Quotas | None, usage: Usage,
           now: datetime, contact: str | None = None,
           host_capabilities: Mapping[str, Any] | None = None) -> Decision:
    """Admit a job (RUNNING, its accelerators added to ``usage``) or refuse it (REFUSED).

    ``host_capabilities``: what the runtime reports (``Runtime.capabilities``); None checks
    no hardware."""
    if existing is not None:
        return Decision(None, None, existing.state != JobState.REFUSED, "duplicate",
                        f"job {request.job_id} is already {existing.state}")

    def refused(reason: str, message: str) -> Decision:
        job = Job(request.job_id, request.team, request.owner, request.profile, request.hosts,
                  JobState.REFUSED, workspace_id=request.workspace_id, runtime=request.runtime,
                  function=request.function, message=message, submitted_at=now,
                  finished_at=now)
        return Decision(job, None, False, reason, message,
                        events=(changed(None, job, reason),))

    if quotas is None:
        return refused("unknown_team", f"team {request.team} is not in the catalog")
    if profile is None:
        return refused("unknown_profile", f"profile {request.profile} is not in the catalog")
    if team_profiles is not None and profile.id not in team_profiles:
        return refused("profile_not_allowed",
                       f"team {request.team} may not use profile {profile.id}")
    try:
        demand = demand_of(profile, request.hosts)
    except ValueError as exc:
        return refused("bad_request", str(exc))
    missing = hardware_refusal(request, profile, host_capabilities)
    if missing is not None:
        return refused(str(RefusalReason.ACCELERATOR_UNAVAILABLE), missing)
    outcome = admit(quotas, usage, demand, request.team, contact=contact)
    if isinstance(outcome, Refusal):
        return refused(str(outcome.reason),
                       _quota_message(request, profile, demand, usage, quotas, outcome,
                                      contact))
    assert isinstance(outcome, Admitted)
    job = Job(request.job_id, request.team, request.owner, profile.id, request.hosts,
              JobState.RUNNING, gpus=demand.gpus, tpus=demand.tpus,
              workspace_id=request.workspace_id, runtime=request.runtime,
              function=request.function, log_uri=request.log_uri,
              message=f"running on {request.hosts} x {profile.id}", submitted_at=now,
              started_at=now)
    start = (StartJob(job.id, job.team, job.owner, job.profile, job.hosts,
                      request.payload_uri, request.topology, job.workspace_id),)
    return Decision(job, outcome.usage, True, "admitted", job.message,
                    commands=start if job.runtime == KUBERNETES else (),
                    events=(changed(None, job, "admitted"),))


def hardware_refusal(request: Request, profile: Profile,
                     host_capabilities: Mapping[str, Any] | None) -> str | None:
    """Why this node cannot run a ``local`` job's hosts (they all run here), or None."""
    acc = profile.accelerator
    if acc is None or host_capabilities is None or request.runtime != "local":
        return None
    total = replace(acc, count=acc.count * request.hosts)
    if check_hardware(replace(profile, accelerator=total), host_capabilities) is None:
        return None
    kind = acc.kind.upper()
    same_kind = sorted((t, n) for t, n in (host_capabilities.get("accelerators") or {}).items()
                       if isinstance(t, str) and isinstance(n, int) and n > 0
                       and accelerator_kind(t) == acc.kind)
    have = (", ".join(f"{n} x {t}" for t, n in same_kind) if same_kind else f"no {kind}")
    each = "" if request.hosts == 1 else f" ({request.hosts} hosts x {acc.count}, all here)"
    return (f"job {request.job_id} ({request.hosts} x {profile.id}) needs {total}{each} on "
            f"this node, which has {have}: submit it with a profile without {kind}s here, "
            f"or from a workspace on a cluster that has {acc.type}")


def _quota_message(request: Request, profile: Profile, demand: Usage, usage: Usage,
                   quotas: Quotas, refusal: Refusal, contact: str | None) -> str:
    what = f"job {request.job_id} ({request.hosts} x {profile.id})"
    for reason, unit, used, needed, limit in (
        (RefusalReason.GPU_QUOTA_EXCEEDED, "GPUs", usage.gpus, demand.gpus, quotas.gpus),
        (RefusalReason.TPU_QUOTA_EXCEEDED, "TPU chips", usage.tpus, demand.tpus, quotas.tpus),
    ):
        if refusal.reason != reason or limit <= 0:
            continue
        if needed > limit:  # waiting would not help
            fits = limit // (needed // request.hosts)
            smaller = (f"use at most {fits} host{'s' if fits > 1 else ''}" if fits else
                       "choose a smaller profile")
            return (f"{what} needs {needed} {unit}, more than team {request.team}'s "
                    f"allowance of {limit}: {smaller}, or ask {contact or 'your team admin'} "
                    f"for more")
        return (f"{what} needs {needed} {unit} but team {request.team} uses {used}/{limit}: "
                f"wait for one of its jobs to end, or pause a workspace that holds some "
                f"(see `stasis jobs list` and `stasis ws list`)")
    return f"{what} refused: {refusal.message}"


def finish(job: Job | None, *, job_id: str, succeeded: bool, termination: str,
           exit_status: int | None, failed_host: int | None, error: str | None,
           log_uri: str | None, usage: Usage, now: datetime) -> Decision:
    """End a running job and give its accelerators back; anything else changes nothing."""
    if job is None:
        return Decision(None, None, False, "unknown_job", f"job {job_id} is not known")
    if job.state not in HOLDS_ACCELERATORS:
        return Decision(None, None, False, "not_running",
                        f"job {job_id} is {job.state}: nothing to release")
    target = (JobState.SUCCEEDED if succeeded else
              JobState.CANCELLED if termination == "cancelled" else JobState.FAILED)
    move(job.state, target)
    started = job.started_at or job.submitted_at
    duration = int((now - started).total_seconds() * 1000) if started else None
    message = ("succeeded" if succeeded else
               error or f"{str(target).lower()} ({termination})")
    ended = replace(job, state=target, message=message, exit_status=exit_status,
                    failed_host=failed_host, log_uri=log_uri or job.log_uri,
                    finished_at=now, duration_ms=duration)
    reason = str(target).lower()
    # Whoever reports the end, a kubernetes job's hosts go with it (the slice is freed).
    cancel = (CancelJob(job.id, job.team),) if job.runtime == KUBERNETES else ()
    return Decision(ended, release(usage, job.demand), True, reason, message,
                    commands=cancel, events=(changed(job.state, ended, reason),))
