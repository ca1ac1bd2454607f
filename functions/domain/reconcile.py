"""The reconciler's rules: compare what Firestore says with what the runtime runs.

Pure: the caller passes the workspaces, the runtime's view and ``now``. The plan is a list
of events to publish (the reconciler changes state only through events, like everyone
else) and of orphan processes to release. Event ids derive from the workspace version, so
running the reconciler twice before the first repair lands has one effect. Sandboxes
(:func:`sandbox_repairs`): a RUNNING one silent past its wall clock + grace ends
``runtime_lost``, which frees its team slot. Local jobs (:func:`lost_jobs`): a RUNNING one
whose workspace's server has stopped since it started ends ``runtime_lost``, which gives
the team's accelerators back. A RUNNING workspace whose server the runtime no longer runs
(a Spot VM reclaimed, a killed process) gets workspace.preempted ``server_lost``: the
lifecycle pauses it from its latest snapshot (or fails it without one) and gives its quota
back. Profiles with ``checkpoint_every_seconds`` get a checkpoint that often
(:func:`checkpoints_due`). A ledger entry whose outbox is still unsent past
``RELAY_AFTER`` (its event's deliveries spent while the node agent was away) is relayed:
its event goes to its consumer again, which sends the outbox as a redelivery would
(:func:`relays_due`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from events.payloads import (
    JobFinished,
    SandboxFinished,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePreempted,
    WorkspaceRuntimeFailed,
    WorkspaceScheduled,
)
from functions.domain.jobs import Job, JobState
from functions.domain.lifecycle import Reason, State, Workspace
from functions.domain.sandboxes import Sandbox, overdue

#: How long a transition may wait on the runtime before it counts as stuck.
STUCK_AFTER: Mapping[State, timedelta] = {
    State.PROVISIONING: timedelta(minutes=5),
    State.PAUSING: timedelta(minutes=10),
    State.RESUMING: timedelta(minutes=10),
    State.DELETING: timedelta(minutes=5),
}
#: States in which no runtime process may exist.
NOTHING_RUNS = frozenset({State.PAUSED, State.DELETED, State.FAILED, State.QUEUED})


@dataclass(frozen=True)
class RuntimeView:
    """What the runtime reports for one workspace."""

    running: bool
    operation: str | None = None


@dataclass(frozen=True)
class Repair:
    workspace_id: str
    why: str
    event: Any | None = None
    event_id: str | None = None
    release: bool = False


@dataclass(frozen=True)
class SandboxRepair:
    """A RUNNING sandbox whose runtime never reported: ended ``runtime_lost``."""

    sandbox_id: str
    why: str
    event: SandboxFinished
    event_id: str


@dataclass(frozen=True)
class JobRepair:
    """A RUNNING local job whose kernel is gone with its workspace's server: ``runtime_lost``."""

    job_id: str
    why: str
    event: JobFinished
    event_id: str


@dataclass(frozen=True)
class Relay:
    """A pending ledger entry whose event goes to its consumer again."""

    key: str
    consumer: str
    why: str


@dataclass
class Plan:
    repairs: list[Repair] = field(default_factory=list)
    sandboxes: list[SandboxRepair] = field(default_factory=list)
    jobs: list[JobRepair] = field(default_factory=list)
    relays: list[Relay] = field(default_factory=list)
    #: What the scheduler's pass of the same run did (``functions.handlers.scheduler``).
    schedule: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.repairs) or bool(self.sandboxes) or bool(self.jobs) or \
            bool(self.relays)


#: A pending outbox younger than this may still be sent by its event's redelivery (Pub/Sub
#: retries for a few minutes, up to 60 s apart); older, its deliveries are spent.
RELAY_AFTER = timedelta(minutes=2)
#: Past this the relay stops trying an outbox (it is logged; the entry expires with the
#: ledger): a command that failed for a day will not succeed on the next run.
RELAY_WITHIN = timedelta(days=1)


def relays_due(pending: Iterable[tuple[str, str, datetime]], consumers: Iterable[str],
               now: datetime, after: timedelta = RELAY_AFTER,
               within: timedelta = RELAY_WITHIN) -> tuple[list[Relay], list[Relay]]:
    """(due, given up) among the pending entries ``(key, consumer, processed_at)``. Only
    entries of an event function (``consumers``) are relayed: an internal signal's entry
    (a destroy's ``internal-destroyed``) is sent again by its outer event's, which stays
    pending while the inner one fails."""
    known = set(consumers)
    due: list[Relay] = []
    given_up: list[Relay] = []
    for key, consumer, processed_at in pending:
        age = now - processed_at
        if consumer not in known or age < after:
            continue
        why = f"outbox unsent for {int(age.total_seconds())}s"
        (due if age <= within else given_up).append(Relay(key, consumer, why))
    return due, given_up


def plan(workspaces: Iterable[Workspace], runtime: Mapping[str, RuntimeView], now: datetime,
         stuck_after: Mapping[State, timedelta] = STUCK_AFTER, *,
         observed_at: datetime | None = None) -> Plan:
    """The repairs, ``runtime`` having been listed at ``observed_at`` (before the
    workspaces were read: a server started since is not taken for lost)."""
    result = Plan()
    known: set[str] = set()
    for ws in workspaces:
        known.add(ws.id)
        view = runtime.get(ws.id)
        if ws.state == State.RUNNING and (view is None or not view.running) and \
                (view is None or view.operation is None):
            result.repairs.append(_lost(ws, observed_at or now))
            continue
        limit = stuck_after.get(ws.state)
        if limit is not None and ws.transition_started_at is not None:
            waited = now - ws.transition_started_at
            busy = view is not None and view.operation is not None
            if waited > limit and not busy:
                result.repairs.append(_unstick(ws, waited))
                continue
        if ws.state in NOTHING_RUNS and view is not None and view.running:
            # A server that outlived its state (a release that failed half-way).
            result.repairs.append(Repair(ws.id, f"a server still runs while {ws.state}",
                                         release=True))
    for ws_id, view in runtime.items():
        if ws_id not in known and view.running:
            result.repairs.append(Repair(ws_id, "a server runs for an unknown workspace",
                                         release=True))
    return result


def _lost(ws: Workspace, seen: datetime) -> Repair:
    """A RUNNING workspace the runtime no longer runs: its server vanished."""
    why = "RUNNING, but the runtime no longer runs its server"
    event = WorkspacePreempted(workspace_id=ws.id, node=ws.node or "unknown",
                               preempted_at=seen.isoformat(), cause="server_lost",
                               detail=f"the reconciler found it {why}")
    return Repair(ws.id, why, event=event, event_id=f"reconcile-{ws.id}-v{ws.version}-lost")


def checkpoints_due(workspaces: Iterable[Workspace], every: Mapping[str, int], now: datetime,
                    *, memory_snapshots: Callable[[Workspace], bool] | None = None
                    ) -> list[Repair]:
    """A checkpoint for each RUNNING workspace whose profile takes one every ``every[profile]``
    seconds, when that long has passed since its last one (or since it became RUNNING,
    whose snapshot is as good) and none is in flight. None for a workspace whose memory
    must not be snapshotted (``memory_snapshots(ws)``, by default what it recorded): the
    transition would refuse every one (``memory_snapshots_off``), each refusal audited."""
    allowed = memory_snapshots or (lambda ws: ws.memory_snapshots)
    repairs = []
    for ws in workspaces:
        seconds = every.get(ws.profile)
        if ws.state != State.RUNNING or not seconds or ws.pending_checkpoint:
            continue
        if not allowed(ws):  # a home-only workspace has no checkpoint to take
            continue
        since = ws.last_checkpoint_at or ws.updated_at
        if since is not None and now - since < timedelta(seconds=seconds):
            continue
        event = WorkspaceScheduled(ws.id, ws.version, "checkpoint",
                                   message=f"a checkpoint every {seconds // 60} min")
        repairs.append(Repair(ws.id, f"checkpoint due (every {seconds}s)", event=event,
                              event_id=f"reconcile-{ws.id}-v{ws.version}-checkpoint"))
    return repairs


def _unstick(ws: Workspace, waited: timedelta) -> Repair:
    detail = f"{ws.state} for {int(waited.total_seconds())}s with no runtime operation"
    event_id = f"reconcile-{ws.id}-v{ws.version}"
    event: Any
    if ws.state == State.PAUSING:
        event = SnapshotFinished(workspace_id=ws.id, snapshot_id=ws.pending_snapshot or "none",
                                 succeeded=False, error=f"snapshot lost: {detail}")
    elif ws.state == State.DELETING:
        event = WorkspaceDeleteRequested(workspace_id=ws.id, actor="reconciler",
                                         keep_home=ws.keep_home)
    else:
        operation = "provision" if ws.state == State.PROVISIONING else "resume"
        event = WorkspaceRuntimeFailed(workspace_id=ws.id, operation=operation,
                                       reason=f"stuck: {detail}")
    return Repair(ws.id, detail, event=event, event_id=event_id)


#: How long past its wall clock a RUNNING sandbox may stay silent: the runtime's own monitor
#: stops it at the wall clock, then collects the patch and uploads it.
SANDBOX_GRACE = timedelta(minutes=5)


def sandbox_repairs(sandboxes: Iterable[Sandbox], now: datetime,
                    grace: timedelta = SANDBOX_GRACE) -> list[SandboxRepair]:
    """RUNNING sandboxes past their wall clock + ``grace``: each gets a sandbox.finished
    ``runtime_lost``, so its slot goes to the next one in its team's queue. The event id
    derives from the sandbox's version: repeated runs before the first lands have one
    effect, and a sandbox that already ended is no longer RUNNING."""
    repairs = []
    for sandbox in overdue(list(sandboxes), now, grace):
        assert sandbox.started_at is not None  # overdue() only returns started ones
        ran = int((now - sandbox.started_at).total_seconds())
        why = (f"RUNNING for {ran}s, past its wall clock of "
               f"{sandbox.limits.wall_clock_seconds}s + {int(grace.total_seconds())}s grace, "
               "and the runtime never reported")
        event = SandboxFinished(sandbox_id=sandbox.id, succeeded=False,
                                termination="runtime_lost", error=f"runtime lost: {why}")
        repairs.append(SandboxRepair(sandbox.id, why, event,
                                     f"reconcile-{sandbox.id}-v{sandbox.version}"))
    return repairs


#: How long after its workspace's server stopped a local job may still report its own end:
#: a kernel that saw its job end just before the pause publishes job.finished on its way
#: out, and that real outcome should win over ``runtime_lost``. (Either order releases the
#: accelerators once: ``functions.domain.jobs.finish`` ignores a job that already ended.)
JOB_GRACE = timedelta(seconds=30)
#: Workspace states whose server has been stopped (or never ran the job's kernel): PAUSED
#: and FAILED stop it before the state commits, RESUMING / PROVISIONING / REQUESTED start a
#: new one. Not PAUSING (a failed snapshot leaves the kernel, and its job, running) nor
#: DELETING (it ends DELETED or gone, which count).
SERVER_GONE = frozenset({State.PAUSED, State.FAILED, State.DELETED, State.RESUMING,
                         State.PROVISIONING, State.REQUESTED})
#: A RUNNING workspace whose latest transition was one of these got a new server then.
NEW_SERVER = frozenset({str(Reason.READY), str(Reason.RESUMED)})


def lost_jobs(jobs: Iterable[Job], workspaces: Mapping[str, Workspace | None], now: datetime,
              grace: timedelta = JOB_GRACE) -> list[JobRepair]:
    """RUNNING ``local`` jobs whose workspace's server stopped after they started, more than
    ``grace`` ago: each gets a job.finished ``runtime_lost``.

    A local job's hosts are children of the kernel that submitted it, and that kernel
    reports its end; pausing or deleting the workspace (or a resume, which starts a new
    server) kills both, so nobody else would. ``workspaces`` maps each job's workspace id
    to its document (None: gone). A job of a workspace whose server still runs is left
    alone, and so are jobs of other runtimes (a cluster's JobSet outlives the workspace).
    The event id derives from the job: repeated runs before the first lands have one effect.
    """
    repairs = []
    for job in jobs:
        if job.state != JobState.RUNNING or job.runtime != "local" or not job.workspace_id:
            continue
        started = job.started_at or job.submitted_at
        if started is None:
            continue
        ws = workspaces.get(job.workspace_id)
        if ws is None:
            since, what = started, "is gone"
        elif ws.state in SERVER_GONE:
            since, what = max(started, ws.updated_at or started), f"is {ws.state}"
        elif (ws.state == State.RUNNING and ws.state_reason in NEW_SERVER
              and ws.updated_at is not None and ws.updated_at > started):
            since, what = ws.updated_at, f"got a new server ({ws.state_reason})"
        else:
            continue
        if now - since <= grace:
            continue
        why = (f"workspace {job.workspace_id} {what} for "
               f"{int((now - since).total_seconds())}s, and with it the kernel that ran job "
               f"{job.id} ({job.hosts} x {job.profile}) and its hosts")
        duration = max(0, int((now - started).total_seconds() * 1000))
        event = JobFinished(job_id=job.id, succeeded=False, termination="runtime_lost",
                            error=f"runtime lost: {why}", duration_ms=duration)
        repairs.append(JobRepair(job.id, why, event, f"reconcile-{job.id}-lost"))
    return repairs


#: How long a kubernetes job may be RUNNING without a JobSet: the control plane applies it
#: right after admission (the ledger's outbox), so only a lost one stays missing longer.
CLUSTER_JOB_GRACE = timedelta(minutes=5)


def lost_cluster_jobs(jobs: Iterable[Job], jobsets: Iterable[str], now: datetime,
                      grace: timedelta = CLUSTER_JOB_GRACE) -> list[JobRepair]:
    """RUNNING ``kubernetes`` jobs, admitted more than ``grace`` ago, that have no JobSet
    in the cluster (``jobsets``: the job ids that have one): deleted outside Stasis, or by
    their TTL while the monitor was down, so nobody will report their end. Each gets a
    job.finished ``runtime_lost``, which gives the team's accelerators back."""
    present = set(jobsets)
    repairs = []
    for job in jobs:
        if job.state != JobState.RUNNING or job.runtime != "kubernetes" or job.id in present:
            continue
        started = job.started_at or job.submitted_at
        if started is None or now - started <= grace:
            continue
        why = (f"job {job.id} ({job.hosts} x {job.profile}) has been RUNNING for "
               f"{int((now - started).total_seconds())}s without a JobSet in the cluster")
        event = JobFinished(job_id=job.id, succeeded=False, termination="runtime_lost",
                            error=f"runtime lost: {why}",
                            duration_ms=max(0, int((now - started).total_seconds() * 1000)))
        repairs.append(JobRepair(job.id, why, event, f"reconcile-{job.id}-no-jobset"))
    return repairs
