"""The workspace lifecycle: a pure transition function and nothing else.

``decide(workspace, event, now) -> Decision`` says what a workspace becomes when an event
arrives, which commands the runtime must carry out, why (a named Reason), and the
workspace.state_changed it tells (the shape every family's decision has:
``functions.domain.decision``). Handlers load, call ``decide``, persist and execute; they
never branch on state themselves. Illegal, stale
and duplicate events are decided here too, as refusals with their reason, so a document is
never changed by an event that should not change it.

    REQUESTED -> (QUEUED ->) PROVISIONING -> RUNNING <-> PAUSING -> PAUSED
    PAUSED -> (QUEUED ->) RESUMING -> RUNNING
    any state -> DELETING -> DELETED          PROVISIONING / RESUMING failure -> FAILED
    PAUSING failure (snapshot failed) -> RUNNING, with the reason recorded
    RESUMING refused with the snapshot intact (integrity, accelerator) -> PAUSED
    RUNNING -> PAUSED home-only where memory snapshots are off (no snapshot), and its
        resume PAUSED -> RESUMING provisions fresh kernels on the kept home
    QUEUED past its maximum wait -> FAILED; a queued resume cancelled -> PAUSED
    RUNNING preempted for a higher-priority request -> PAUSING -> QUEUED (its resume waits)
    RUNNING / RESUMING whose server vanished (Spot, a lost node, a killed process)
        -> PAUSED from its last snapshot, saying how much work was lost; FAILED
        without one (or while PROVISIONING)

QUEUED is a create or resume that its team's quota or the capacity cannot take now
(:func:`enqueue`; the handler decides that with ``functions.domain.admission``); the
scheduler (``functions.domain.scheduling``) starts it, fails it past its profile's maximum
wait, or preempts for it, each through a workspace.scheduled event that names the version
it saw, so a stale one changes nothing. A checkpoint (Spot profiles) is a snapshot the
workspace takes while it keeps RUNNING: it becomes the snapshot a vanished server is
recovered from. Checkpoints and preemption warnings are *notes*: they bump the version but
keep the state, its reason and ``updated_at`` (the idle clock).

A runtime alert (a container OOM-killed, GPU memory near full) changes no state: it is
noted on a RUNNING workspace's document (``runtime_alert``) for its owner to read.

Snapshots are anchored here: a finished snapshot's manifest sha256 is kept on the
workspace with ``current_snapshot``, every ``Restore`` carries it (the runtime refuses a
manifest that does not match before reading anything else), and the next ``Snapshot``
names it as its *base*, whose stored parts the capture need not send again.

Memory snapshots copy whatever data was in memory; an environment or team may turn them
off (``Catalog.memory_snapshots_for``, which the handler records on the workspace as
``memory_snapshots`` before deciding). Such a workspace is never snapshotted: its pause
releases the server and keeps only the home (``paused_home_only``), its resume provisions a
fresh server on that home, and it takes no checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from events.payloads import (
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspacePreempted,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    WorkspaceRuntimeAlert,
    WorkspaceRuntimeFailed,
    WorkspaceScheduled,
    WorkspaceStateChanged,
    workspace_id,
)


class State(StrEnum):
    REQUESTED = "REQUESTED"
    QUEUED = "QUEUED"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    RESUMING = "RESUMING"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"


class Reason(StrEnum):
    """Why a decision was taken; str values so a typo is a NameError, not a new reason."""

    CREATED = "created"
    READY = "ready"
    RESUMED = "resumed"
    PAUSE_STARTED = "pause_started"
    PAUSED = "paused"
    #: Memory snapshots are off: the server was released, only the home disk is kept.
    PAUSED_HOME_ONLY = "paused_home_only"
    SNAPSHOT_FAILED = "snapshot_failed"
    RESUME_STARTED = "resume_started"
    DELETE_STARTED = "delete_started"
    DELETE_RETRIED = "delete_retried"
    DELETED = "deleted"
    PROVISION_FAILED = "provision_failed"
    RESUME_FAILED = "resume_failed"
    #: The snapshot's manifest or a part is not what was recorded: nothing was unpickled;
    #: the workspace stays PAUSED with the snapshot kept for inspection.
    SNAPSHOT_INTEGRITY = "snapshot_integrity"
    #: The target cannot take the snapshot (its device arrays need an accelerator it
    #: lacks); PAUSED, so the owner can resume on another profile or onto CPU.
    RESTORE_REFUSED = "restore_refused"
    #: The runtime restarted during the resume (the local node agent killed and started
    #: again): nothing of the snapshot or the home was changed, so the workspace is PAUSED
    #: with its snapshot and can be resumed again.
    RESUME_INTERRUPTED = "resume_interrupted"
    STUCK = "stuck"
    QUEUED = "queued"
    REQUEUED = "requeued"
    QUEUE_CANCELLED = "queue_cancelled"
    QUEUE_EXPIRED = "queue_expired"
    PREEMPTED = "preempted"
    RECOVERED = "recovered"
    RUNTIME_ALERT = "runtime_alert"
    # notes: accepted, the state stays
    CHECKPOINT_STARTED = "checkpoint_started"
    CHECKPOINTED = "checkpointed"
    CHECKPOINT_FAILED = "checkpoint_failed"
    PREEMPTION_WARNING = "preemption_warning"
    STILL_QUEUED = "still_queued"
    # refusals
    #: A person's request (chat, the portal) for what the catalog does not let them do.
    NOT_PERMITTED = "not_permitted"
    UNKNOWN_WORKSPACE = "unknown_workspace"
    NAME_IN_USE = "name_in_use"
    ALREADY_RUNNING = "already_running"
    ALREADY_PAUSING = "already_pausing"
    ALREADY_PAUSED = "already_paused"
    ALREADY_RESUMING = "already_resuming"
    ALREADY_DELETED = "already_deleted"
    NOT_RUNNING = "not_running"
    NOT_PAUSED = "not_paused"
    NO_SNAPSHOT = "no_snapshot"
    STALE_READY = "stale_ready"
    STALE_SNAPSHOT = "stale_snapshot"
    STALE_FAILURE = "stale_failure"
    ADMISSION_REFUSED = "admission_refused"
    ALREADY_QUEUED = "already_queued"
    STALE_SCHEDULE = "stale_schedule"
    ALREADY_CHECKPOINTING = "already_checkpointing"
    STALE_PREEMPTION = "stale_preemption"
    PREEMPTED_WHILE_PAUSING = "preempted_while_pausing"
    STALE_ALERT = "stale_alert"
    MEMORY_SNAPSHOTS_OFF = "memory_snapshots_off"


#: Accepted decisions that keep the state: the version moves, nothing else the idle clock
#: or the cost rollup reads does.
NOTES = frozenset({Reason.CHECKPOINT_STARTED, Reason.CHECKPOINTED, Reason.CHECKPOINT_FAILED,
                   Reason.PREEMPTION_WARNING, Reason.STILL_QUEUED})


#: States in which a workspace holds its hardware (accelerators, CPU, memory).
HOLDS_HARDWARE = frozenset({State.PROVISIONING, State.RUNNING, State.PAUSING, State.RESUMING})
#: States in which a workspace counts against the team's workspace quota.
HOLDS_SLOT = frozenset(set(State) - {State.DELETED, State.FAILED})
#: States that wait on the runtime; the reconciler watches how long they last.
IN_TRANSITION = frozenset({State.PROVISIONING, State.PAUSING, State.RESUMING, State.DELETING})


@dataclass(frozen=True)
class Workspace:
    """The workspace document, as the domain sees it."""

    id: str
    team: str
    owner: str
    name: str
    profile: str
    ide: str = "jupyterlab"
    environment: str = "python-3-11"
    state: State = State.REQUESTED
    state_reason: str = ""
    state_message: str = ""
    version: int = 0
    url: str | None = None
    runtime_handle: str | None = None
    current_snapshot: str | None = None
    #: sha256 of ``current_snapshot``'s manifest (None for snapshots taken before it was
    #: recorded, and for ``pod`` snapshots).
    current_manifest_sha256: str | None = None
    pending_snapshot: str | None = None
    transition_started_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    first_start_ms: int | None = None
    last_pause_ms: int | None = None
    last_resume_ms: int | None = None
    last_activity: datetime | None = None
    reply_to: str | None = None
    keep_home: bool = False
    pause_cause: str | None = None
    #: QUEUED: since when, for what (``create`` or ``resume``).
    queued_at: datetime | None = None
    queued_for: str | None = None
    #: A queued resume's ``--device-arrays-to-cpu``, kept for the Restore that starts it.
    queued_device_arrays_to_cpu: bool = False
    #: Its priority class and value (``Catalog.priority_for``), set when it asks to run.
    priority: int = 0
    priority_class: str | None = None
    #: The node whose accelerators it holds, where the control plane counts capacity.
    node: str | None = None
    #: The request it was preempted for (PAUSING, then QUEUED for its resume).
    preempted_by: str | None = None
    preemption_warned_at: datetime | None = None
    #: Periodic checkpoints: the one in flight, and when the last one was taken.
    pending_checkpoint: str | None = None
    last_checkpoint_at: datetime | None = None
    #: Seconds of work lost when its server vanished (since the snapshot it came back to).
    lost_work_seconds: int | None = None
    #: QUEUED in the cluster's own queue (``kueue``: its pod exists, gated, until Kueue
    #: admits it), not the control plane's.
    queued_by: str | None = None
    #: This incarnation of the id (:func:`incarnation_id`), set when it is created and never
    #: that of a later workspace of the same id: agent links name it, so a deleted
    #: workspace's links never reach the one created after it. None: created before.
    incarnation: str | None = None
    #: Whether its memory may be snapshotted (``Catalog.memory_snapshots_for``, recorded by
    #: the handler on every event, so a change of the admin file applies to the next one).
    memory_snapshots: bool = True
    #: Paused without a memory snapshot: its resume starts fresh kernels on the home.
    paused_home_only: bool = False

    def to_doc(self) -> dict[str, Any]:
        """The ``workspaces/{id}`` document."""
        doc = dataclasses.asdict(self)
        doc["state"] = str(self.state)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Workspace:
        """A workspace from its document (fields it does not know are ignored)."""
        data = {k: v for k, v in doc.items() if k in _FIELDS}
        data["state"] = State(data.get("state", State.REQUESTED))
        return cls(**data)


_FIELDS = frozenset(f.name for f in dataclasses.fields(Workspace))


# Commands: what the runtime (or storage) is asked to do once the decision is persisted.
@dataclass(frozen=True)
class Provision:
    workspace_id: str


@dataclass(frozen=True)
class Snapshot:
    workspace_id: str
    snapshot_id: str
    #: The snapshot this one follows (the workspace's current one) and its manifest's
    #: sha256: its parts are in the pool already, and it is protected from retention
    #: until this one is recorded, so they cannot be deleted meanwhile.
    base: str | None = None
    base_manifest_sha256: str | None = None


@dataclass(frozen=True)
class Release:
    """Stop the workspace's processes and free its hardware; home stays."""

    workspace_id: str


@dataclass(frozen=True)
class Restore:
    workspace_id: str
    snapshot_id: str
    #: What the manifest must hash to; the runtime refuses anything else.
    manifest_sha256: str | None = None
    device_arrays_to_cpu: bool = False


@dataclass(frozen=True)
class Destroy:
    workspace_id: str
    keep_home: bool


@dataclass(frozen=True)
class DiscardSnapshot:
    """Delete a snapshot's objects (partial after a failure, or orphaned by a deletion)."""

    workspace_id: str
    snapshot_id: str


@dataclass(frozen=True)
class Schedule:
    """Look at the queue now: accelerators were freed, or a request joined it
    (``functions.domain.scheduling`` decides what starts)."""

    reason: str


Command = Provision | Snapshot | Release | Restore | Destroy | DiscardSnapshot | Schedule

#: States no server is decided into: a Provision or Restore found there is stale.
_STOPPED = frozenset({State.PAUSED, State.FAILED, State.DELETING, State.DELETED})


def outdated(command: Command, ws: Workspace | None) -> str | None:
    """Why ``command`` no longer applies to the workspace as it is now (None: carry it out).

    An outbox is sent again when its event is redelivered after a crash between the commit
    and mark-done, and by then the workspace may have moved on. A Release is decided only
    into PAUSED, FAILED or QUEUED; replayed into the resume that followed, it withdrew that
    resume and left the workspace RESUMING for the reconciler (found by the chaos test).
    A Provision or Restore replayed after a pause would start a server for a paused
    workspace; a Restore of an older snapshot would start the wrong one."""
    if ws is None:
        return None
    if isinstance(command, Release) and ws.state in HOLDS_HARDWARE:
        return f"the workspace is {ws.state} now: it holds its server again"
    if isinstance(command, Provision | Restore) and ws.state in _STOPPED:
        return f"the workspace is {ws.state} now"
    if isinstance(command, Restore) and command.snapshot_id != ws.current_snapshot:
        return f"its snapshot is {ws.current_snapshot} now, not {command.snapshot_id}"
    return None


@dataclass(frozen=True)
class RuntimeDestroyed:
    """Internal signal: the runtime finished destroying the workspace (and its snapshots)."""

    workspace_id: str
    released_snapshot_bytes: int = 0


Signal = (
    WorkspaceRequested
    | WorkspaceReady
    | WorkspaceRuntimeFailed
    | WorkspacePauseRequested
    | SnapshotFinished
    | WorkspaceResumeRequested
    | WorkspaceDeleteRequested
    | WorkspaceScheduled
    | WorkspacePreempted
    | WorkspaceRuntimeAlert
    | RuntimeDestroyed
)


@dataclass(frozen=True)
class Decision:
    """The outcome of one event: accepted (the workspace changes) or refused (it does not)."""

    accepted: bool
    reason: Reason
    workspace: Workspace | None
    commands: tuple[Command, ...] = ()
    message: str = ""
    previous_state: State | None = None
    #: Tell the owner although the state stays (a preemption warning).
    notify: bool = False

    @property
    def changed_state(self) -> bool:
        return (
            self.accepted
            and self.workspace is not None
            and self.workspace.state != self.previous_state
        )

    @property
    def events(self) -> tuple[WorkspaceStateChanged, ...]:
        """workspace.state_changed when the state changed, or the owner is to be told
        (notify, audit)."""
        ws = self.workspace
        if not (self.changed_state or (self.accepted and self.notify)) or ws is None:
            return ()
        return (WorkspaceStateChanged(
            workspace_id=ws.id, team=ws.team, owner=ws.owner, name=ws.name,
            from_state=str(self.previous_state) if self.previous_state else None,
            to_state=str(ws.state), reason=str(self.reason), version=ws.version,
            message=self.message, url=ws.url, reply_to=ws.reply_to),)

    def outcome(self) -> dict[str, Any]:
        """What the request's ledger entry says (``stasis ws ... --wait`` reads it)."""
        ws = self.workspace
        return {"accepted": self.accepted, "reason": str(self.reason), "message": self.message,
                "state": str(ws.state) if ws is not None else None}


def decide(workspace: Workspace | None, event: Signal, now: datetime) -> Decision:
    """What ``event`` does to ``workspace`` at ``now``. Pure; never raises for a legal input."""
    if isinstance(event, WorkspaceRequested):
        return _on_requested(workspace, event, now)
    if workspace is None or (
        workspace.state == State.DELETED and not isinstance(event, WorkspaceDeleteRequested)
    ):
        # An event for a workspace that does not exist (any more): nothing to do, except
        # that a snapshot finishing after the deletion left objects nobody owns.
        orphan: tuple[Command, ...] = ()
        if isinstance(event, SnapshotFinished) and event.succeeded:
            orphan = (DiscardSnapshot(event.workspace_id, event.snapshot_id),)
        return _refuse(workspace, Reason.UNKNOWN_WORKSPACE, "no such workspace", orphan)
    if isinstance(event, WorkspaceReady):
        return _on_ready(workspace, event, now)
    if isinstance(event, WorkspaceRuntimeFailed):
        return _on_runtime_failed(workspace, event, now)
    if isinstance(event, WorkspacePauseRequested):
        return _on_pause(workspace, event, now)
    if isinstance(event, SnapshotFinished):
        return _on_snapshot_finished(workspace, event, now)
    if isinstance(event, WorkspaceResumeRequested):
        return _on_resume(workspace, event, now)
    if isinstance(event, WorkspaceDeleteRequested):
        return _on_delete(workspace, event, now)
    if isinstance(event, WorkspaceScheduled):
        return _on_scheduled(workspace, event, now)
    if isinstance(event, WorkspacePreempted):
        return _on_preempted(workspace, event, now)
    if isinstance(event, WorkspaceRuntimeAlert):
        return _on_runtime_alert(workspace, event)
    return _on_destroyed(workspace, now)


def refuse_admission(
    workspace: Workspace | None, request: WorkspaceRequested, message: str, now: datetime
) -> Decision:
    """A request the catalog or the quota refused: recorded as FAILED, holding nothing.

    The document is the request's (owner, profile, reply_to: the refusal goes to whoever
    asked), not the DELETED or FAILED one it replaces, whose snapshot is gone or kept
    elsewhere; only the version continues, so event ids derived from it stay unique.
    """
    fresh = _new_workspace(request, now, workspace)
    failed = _move(fresh, State.FAILED, Reason.ADMISSION_REFUSED, now, message=message,
                   version=_version(workspace))
    return Decision(True, Reason.ADMISSION_REFUSED, failed, (), message, _state(workspace))


def enqueue(decision: Decision, why: str, now: datetime) -> Decision:
    """A create or resume (``decision``: to PROVISIONING or RESUMING) that its team's quota
    or the capacity cannot take now: QUEUED instead, holding its slot and nothing else,
    saying what it waits for. The scheduler starts it when it fits."""
    ws = decision.workspace
    assert ws is not None and ws.state in (State.PROVISIONING, State.RESUMING)
    queued_for = "create" if ws.state == State.PROVISIONING else "resume"
    message = f"queued: {why}"
    to_cpu = any(isinstance(c, Restore) and c.device_arrays_to_cpu for c in decision.commands)
    queued = dataclasses.replace(
        ws, state=State.QUEUED, state_reason=str(Reason.QUEUED), state_message=message,
        queued_at=now, queued_for=queued_for, transition_started_at=None, node=None,
        queued_device_arrays_to_cpu=to_cpu)
    return Decision(True, Reason.QUEUED, queued, (), message, decision.previous_state)


def enqueue_in_cluster(decision: Decision, queue: str, now: datetime) -> Decision:
    """A create or resume (to PROVISIONING or RESUMING), or a preempted workspace's queued
    resume, on a runtime whose cluster admits accelerators itself (Kueue): QUEUED, with its
    pod made now (Provision, or Restore of its snapshot) so the cluster's queue sees it;
    the cluster's admission, or the pod's readiness, starts it (:func:`decide`)."""
    ws = decision.workspace
    assert ws is not None
    message = f"queued: waiting for {queue} to admit it"
    if ws.state == State.QUEUED:  # requeued after a preemption: its resume waits there
        queued = dataclasses.replace(ws, queued_by=queue, state_message=message)
        if _starts_fresh(ws):
            return dataclasses.replace(decision, workspace=queued, message=message,
                                       commands=(*decision.commands, Provision(ws.id)))
        assert ws.current_snapshot
        return dataclasses.replace(decision, workspace=queued, message=message, commands=(
            *decision.commands,
            Restore(ws.id, ws.current_snapshot, ws.current_manifest_sha256,
                    ws.queued_device_arrays_to_cpu)))
    waiting = enqueue(decision, f"waiting for {queue} to admit it", now).workspace
    assert waiting is not None
    return Decision(True, Reason.QUEUED, dataclasses.replace(waiting, queued_by=queue),
                    decision.commands, message, decision.previous_state)


def still_queued(ws: Workspace, why: str) -> Decision:
    """The scheduler's start of ``ws`` no longer fits (taken meanwhile): it keeps waiting,
    at a new version, so the next pass's verdict is a new request."""
    message = f"queued: {why}"
    return Decision(True, Reason.STILL_QUEUED, _note(ws, state_message=message), (), message,
                    ws.state)


#: What the owner reads when a pause they did not ask for (no ``detail``) starts.
_PAUSE_CAUSES: dict[str, str] = {
    "idle": "paused by the idle policy",
    "schedule": "paused on schedule",
    "reconciler": "paused by the reconciler",
    "admin": "paused by an admin",
    "preempted": "paused for a higher-priority request",
}


#: ``schemas/events/snapshot.finished.json``: snapshot ids match ^[a-z0-9][a-z0-9-]{0,80}$.
_SNAPSHOT_ID_MAX = 81


def snapshot_id_for(workspace: Workspace) -> str:
    """Deterministic, so a retried pause names the same snapshot.

    ``<workspace id>-v<version>``; an id too long for the contract keeps a prefix and
    adds a digest of the whole id, so it stays deterministic and distinct.
    """
    suffix = f"-v{workspace.version + 1}"
    if len(workspace.id) + len(suffix) <= _SNAPSHOT_ID_MAX:
        return workspace.id + suffix
    digest = hashlib.sha256(workspace.id.encode()).hexdigest()[:12]
    prefix = workspace.id[:_SNAPSHOT_ID_MAX - len(suffix) - len(digest) - 1]
    return f"{prefix}-{digest}{suffix}"


def _on_requested(ws: Workspace | None, event: WorkspaceRequested, now: datetime) -> Decision:
    if ws is not None and ws.state not in (State.DELETED, State.FAILED):
        # The name is taken by a live workspace (also covers a duplicate request).
        return _refuse(ws, Reason.NAME_IN_USE,
                       f"workspace {ws.name} already exists ({ws.state}); pick another name")
    if ws is not None and ws.state == State.FAILED and ws.current_snapshot:
        # A failed resume keeps its snapshot; re-creating would silently lose it.
        return _refuse(ws, Reason.NAME_IN_USE,
                       f"workspace {ws.name} failed but keeps snapshot {ws.current_snapshot}: "
                       "resume it or delete it first")
    fresh = _new_workspace(event, now, ws)
    provisioning = _move(fresh, State.PROVISIONING, Reason.CREATED, now, version=_version(ws),
                         transition_started_at=now)
    return Decision(True, Reason.CREATED, provisioning, (Provision(fresh.id),),
                    previous_state=_state(ws))


def _on_ready(ws: Workspace, event: WorkspaceReady, now: datetime) -> Decision:
    if ws.state == State.QUEUED and ws.queued_by:
        # The cluster admitted its pod, which is up: the start and its readiness in one
        # (the report of the admission may come after the pod's).
        reason = Reason.RESUMED if ws.queued_for == "resume" else Reason.READY
        running = _move(ws, State.RUNNING, reason, now, url=event.url,
                        runtime_handle=event.runtime_handle, transition_started_at=None,
                        last_activity=now, queued_at=None, queued_for=None, queued_by=None,
                        preempted_by=None)
        return Decision(True, reason, running, previous_state=ws.state)
    if ws.state == State.PROVISIONING:
        running = _move(ws, State.RUNNING, Reason.READY, now, url=event.url,
                        runtime_handle=event.runtime_handle, transition_started_at=None,
                        first_start_ms=_elapsed_ms(ws, now), last_activity=now)
        return Decision(True, Reason.READY, running, previous_state=ws.state)
    if ws.state == State.RESUMING:
        fresh = "resumed with fresh kernels; the home is as it was" if ws.paused_home_only \
            else ""
        running = _move(ws, State.RUNNING, Reason.RESUMED, now, message=fresh, url=event.url,
                        runtime_handle=event.runtime_handle, transition_started_at=None,
                        last_resume_ms=_elapsed_ms(ws, now), last_activity=now,
                        paused_home_only=False)
        return Decision(True, Reason.RESUMED, running, previous_state=ws.state)
    if ws.state == State.RUNNING:
        return _refuse(ws, Reason.ALREADY_RUNNING, "already running")
    # A ready report for a workspace that moved on (paused, deleting): out of order.
    return _refuse(ws, Reason.STALE_READY, f"ready reported while {ws.state}")


def _on_runtime_failed(ws: Workspace, event: WorkspaceRuntimeFailed, now: datetime) -> Decision:
    if ws.state == State.PROVISIONING and event.operation == "provision":
        failed = _move(ws, State.FAILED, Reason.PROVISION_FAILED, now, message=event.reason,
                       transition_started_at=None)
        return Decision(True, Reason.PROVISION_FAILED, failed, (Release(ws.id),), event.reason,
                        ws.state)
    resuming = ws.state == State.RESUMING and (event.operation == "resume" or (
        event.operation == "provision" and ws.paused_home_only))
    if resuming and event.cause in _KEEPS_PAUSED:
        # Nothing was restored and the snapshot (home-only: the home) is as it was: the
        # workspace is paused, not failed; the snapshot stays the current one, for
        # inspection or another try.
        reason = _KEEPS_PAUSED[event.cause]
        paused = _move(ws, State.PAUSED, reason, now, message=event.reason,
                       transition_started_at=None, url=None)
        return Decision(True, reason, paused, (Release(ws.id),), event.reason, ws.state)
    if resuming:
        # The snapshot (home-only: the home) is kept, so the user can retry or delete.
        failed = _move(ws, State.FAILED, Reason.RESUME_FAILED, now, message=event.reason,
                       transition_started_at=None)
        return Decision(True, Reason.RESUME_FAILED, failed, (Release(ws.id),), event.reason,
                        ws.state)
    return _refuse(ws, Reason.STALE_FAILURE, f"{event.operation} failure reported while {ws.state}")


#: Resume failures that leave the snapshot intact, by the runtime's ``cause``.
_KEEPS_PAUSED: dict[str | None, Reason] = {
    Reason.SNAPSHOT_INTEGRITY.value: Reason.SNAPSHOT_INTEGRITY,
    Reason.RESTORE_REFUSED.value: Reason.RESTORE_REFUSED,
    "interrupted": Reason.RESUME_INTERRUPTED,
}
#: The reasons of a resume that ended PAUSED, not RUNNING (a client waiting for RUNNING
#: stops there).
RESUME_KEPT_PAUSED = frozenset(reason.value for reason in _KEEPS_PAUSED.values())


def _on_pause(ws: Workspace, event: WorkspacePauseRequested, now: datetime) -> Decision:
    if ws.state == State.QUEUED and event.cause == "preempted":
        # A preemption reported late (a cluster's queue evicting what it already gave back):
        # the workspace is paused and waits already; this is no cancellation.
        return _refuse(ws, Reason.STALE_PREEMPTION, "preempted while QUEUED: it waits already")
    if ws.state == State.QUEUED and ws.queued_for == "resume":
        # Cancelling a queued resume: it stays paused, its snapshot as it was.
        paused = _move(ws, State.PAUSED, Reason.QUEUE_CANCELLED, now,
                       message="the queued resume was cancelled", queued_at=None,
                       queued_for=None, preempted_by=None, queued_by=None,
                       queued_device_arrays_to_cpu=False)
        gated: tuple[Command, ...] = (Release(ws.id),) if ws.queued_by else ()
        return Decision(True, Reason.QUEUE_CANCELLED, paused, gated, paused.state_message,
                        ws.state)
    if ws.state == State.QUEUED:
        return _refuse(ws, Reason.NOT_RUNNING, "a queued create has nothing to pause; cancel "
                                               "it with `stasis ws delete`")
    if ws.state == State.PAUSING:
        return _refuse(ws, Reason.ALREADY_PAUSING, "already pausing")
    if ws.state == State.PAUSED:
        return _refuse(ws, Reason.ALREADY_PAUSED, "already paused")
    if ws.state != State.RUNNING:
        return _refuse(ws, Reason.NOT_RUNNING, f"cannot pause while {ws.state}; wait until RUNNING")
    if not ws.memory_snapshots:
        return _pause_home_only(ws, event, now)
    snapshot_id = snapshot_id_for(ws)
    # Whoever did not ask for the pause is told why: the message goes on the document and
    # on the state change (the idle policy says how long the workspace was idle).
    message = event.detail or _PAUSE_CAUSES.get(event.cause, "")
    pausing = _move(ws, State.PAUSING, Reason.PAUSE_STARTED, now, message=message,
                    pending_snapshot=snapshot_id, transition_started_at=now,
                    pause_cause=event.cause, pending_checkpoint=None, preempted_by=None,
                    preemption_warned_at=None)
    snapshot = Snapshot(ws.id, snapshot_id, ws.current_snapshot, ws.current_manifest_sha256)
    return Decision(True, Reason.PAUSE_STARTED, pausing, (snapshot,), message,
                    previous_state=ws.state)


#: What a home-only pause says (the front doors' pause answer: ``frontdoor.pause_answer``).
HOME_ONLY = "keeps only the home disk: kernels start fresh on resume"


def _pause_home_only(ws: Workspace, event: WorkspacePauseRequested, now: datetime) -> Decision:
    """Memory snapshots are off: no Snapshot (nothing of its memory is written anywhere),
    the server released, PAUSED at once with only its home kept, saying so."""
    why = event.detail or _PAUSE_CAUSES.get(event.cause, "")
    message = f"memory snapshots are off: {HOME_ONLY}" + (f" ({why})" if why else "")
    paused = _move(ws, State.PAUSED, Reason.PAUSED_HOME_ONLY, now, message=message,
                   paused_home_only=True, pause_cause=event.cause, pending_snapshot=None,
                   pending_checkpoint=None, transition_started_at=None, last_pause_ms=0,
                   url=None, node=None, preempted_by=None, preemption_warned_at=None)
    return Decision(True, Reason.PAUSED_HOME_ONLY, paused, (Release(ws.id),), message,
                    previous_state=ws.state)


def _starts_fresh(ws: Workspace) -> bool:
    """Its resume provisions fresh kernels on the home instead of restoring a snapshot:
    it paused home-only, or memory snapshots are off now (an older snapshot's memory is
    not brought back either)."""
    return ws.paused_home_only or not ws.memory_snapshots


def _on_snapshot_finished(ws: Workspace, event: SnapshotFinished, now: datetime) -> Decision:
    if ws.state == State.RUNNING and ws.pending_checkpoint == event.snapshot_id:
        return _on_checkpoint_finished(ws, event, now)
    if ws.state != State.PAUSING or ws.pending_snapshot != event.snapshot_id:
        # Late or foreign snapshot: keep the document; its objects belong to nobody.
        commands: tuple[Command, ...] = ()
        if event.succeeded and event.snapshot_id != ws.current_snapshot:
            commands = (DiscardSnapshot(ws.id, event.snapshot_id),)
        return _refuse(ws, Reason.STALE_SNAPSHOT,
                       f"snapshot {event.snapshot_id} finished while {ws.state}", commands)
    if not event.succeeded:
        message = event.error or "the snapshot failed"
        running = _move(ws, State.RUNNING, Reason.SNAPSHOT_FAILED, now, message=message,
                        pending_snapshot=None, transition_started_at=None)
        return Decision(True, Reason.SNAPSHOT_FAILED, running,
                        (DiscardSnapshot(ws.id, event.snapshot_id),), message, ws.state)
    # A pause the owner did not ask for keeps saying why once it is done.
    message = ws.state_message if ws.pause_cause not in (None, "user") else ""
    if ws.pause_cause == "preempted":
        # Preempted by pause: its live state is safe, and its resume waits its turn.
        queued = _move(ws, State.QUEUED, Reason.REQUEUED, now, message=message,
                       current_snapshot=event.snapshot_id,
                       current_manifest_sha256=event.manifest_sha256, pending_snapshot=None,
                       transition_started_at=None, last_pause_ms=_elapsed_ms(ws, now),
                       url=None, queued_at=now, queued_for="resume", node=None)
        return Decision(True, Reason.REQUEUED, queued, (Release(ws.id),), message, ws.state)
    paused = _move(ws, State.PAUSED, Reason.PAUSED, now, message=message,
                   current_snapshot=event.snapshot_id,
                   current_manifest_sha256=event.manifest_sha256, pending_snapshot=None,
                   transition_started_at=None, last_pause_ms=_elapsed_ms(ws, now), url=None,
                   node=None)
    return Decision(True, Reason.PAUSED, paused, (Release(ws.id),), message,
                    previous_state=ws.state)


def _on_checkpoint_finished(ws: Workspace, event: SnapshotFinished, now: datetime) -> Decision:
    """A checkpoint of a RUNNING workspace ended: on success it is the snapshot a vanished
    server comes back to (the one before it stays until retention expires it)."""
    if not event.succeeded:
        message = f"checkpoint failed: {event.error or 'the snapshot failed'}"
        failed = _note(ws, pending_checkpoint=None)
        return Decision(True, Reason.CHECKPOINT_FAILED, failed,
                        (DiscardSnapshot(ws.id, event.snapshot_id),), message, ws.state)
    done = _note(ws, pending_checkpoint=None, current_snapshot=event.snapshot_id,
                 current_manifest_sha256=event.manifest_sha256, last_checkpoint_at=now)
    return Decision(True, Reason.CHECKPOINTED, done, (),
                    f"checkpoint {event.snapshot_id} taken", ws.state)


def _on_resume(ws: Workspace, event: WorkspaceResumeRequested, now: datetime) -> Decision:
    if ws.state == State.QUEUED:
        return _refuse(ws, Reason.ALREADY_QUEUED, f"already queued to {ws.queued_for}")
    if ws.state == State.RUNNING:
        return _refuse(ws, Reason.ALREADY_RUNNING, "already running")
    if ws.state == State.RESUMING:
        return _refuse(ws, Reason.ALREADY_RESUMING, "already resuming")
    if ws.state not in (State.PAUSED, State.FAILED):
        return _refuse(ws, Reason.NOT_PAUSED, f"cannot resume while {ws.state}")
    if _starts_fresh(ws):
        message = "memory snapshots are off: fresh kernels start on the kept home"
        resuming = _move(ws, State.RESUMING, Reason.RESUME_STARTED, now, message=message,
                         transition_started_at=now, profile=event.profile or ws.profile,
                         paused_home_only=True)
        return Decision(True, Reason.RESUME_STARTED, resuming, (Provision(ws.id),), message,
                        ws.state)
    if not ws.current_snapshot:
        return _refuse(ws, Reason.NO_SNAPSHOT, "there is no snapshot to resume from")
    resuming = _move(ws, State.RESUMING, Reason.RESUME_STARTED, now, transition_started_at=now,
                     profile=event.profile or ws.profile)
    restore = Restore(ws.id, ws.current_snapshot, ws.current_manifest_sha256,
                      event.device_arrays_to_cpu)
    return Decision(True, Reason.RESUME_STARTED, resuming, (restore,), previous_state=ws.state)


def _on_delete(ws: Workspace, event: WorkspaceDeleteRequested, now: datetime) -> Decision:
    if ws.state == State.DELETED:
        return _refuse(ws, Reason.ALREADY_DELETED, "already deleted")
    if ws.state == State.DELETING:
        # Re-issue: the first attempt may have died half-way; destroying is idempotent.
        # The first request's keep_home stands: a retry must not delete a kept home.
        return Decision(True, Reason.DELETE_RETRIED, ws, (Destroy(ws.id, ws.keep_home),),
                        previous_state=ws.state)
    destroy = Destroy(ws.id, event.keep_home)
    deleting = _move(ws, State.DELETING, Reason.DELETE_STARTED, now, transition_started_at=now,
                     keep_home=event.keep_home)
    return Decision(True, Reason.DELETE_STARTED, deleting, (destroy,), previous_state=ws.state)


def _on_scheduled(ws: Workspace, event: WorkspaceScheduled, now: datetime) -> Decision:
    """The scheduler's verdict on the version of ``ws`` it saw (a stale one changes nothing)."""
    if event.version != ws.version:
        return _refuse(ws, Reason.STALE_SCHEDULE,
                       f"{event.action} decided at version {event.version}; the workspace is "
                       f"at {ws.version} ({ws.state})")
    if event.action in ("admit", "expire") and ws.state != State.QUEUED:
        return _refuse(ws, Reason.STALE_SCHEDULE, f"{event.action} while {ws.state}")
    if event.action in ("preempt", "warn", "checkpoint") and ws.state != State.RUNNING:
        return _refuse(ws, Reason.STALE_SCHEDULE, f"{event.action} while {ws.state}")
    waited = _human_seconds(now - ws.queued_at) if ws.queued_at else ""
    if event.action == "admit" and ws.queued_by:
        # Its pod exists already: the cluster's queue admitted it, it starts now.
        state = State.RESUMING if ws.queued_for == "resume" else State.PROVISIONING
        reason = Reason.RESUME_STARTED if ws.queued_for == "resume" else Reason.CREATED
        message = f"admitted by {ws.queued_by} after waiting {waited}" + (
            f": {event.message}" if event.message else "")
        started = _move(ws, state, reason, now, message=message, transition_started_at=now,
                        queued_at=None, queued_for=None, queued_by=None, preempted_by=None,
                        queued_device_arrays_to_cpu=False)
        return Decision(True, reason, started, (), message, ws.state)
    if event.action == "admit" and ws.queued_for == "resume" and _starts_fresh(ws):
        message = "fresh kernels start on the kept home after waiting " + waited
        resuming = _move(ws, State.RESUMING, Reason.RESUME_STARTED, now, message=message,
                         transition_started_at=now, node=event.node, queued_at=None,
                         queued_for=None, preempted_by=None, queued_device_arrays_to_cpu=False,
                         paused_home_only=True)
        return Decision(True, Reason.RESUME_STARTED, resuming, (Provision(ws.id),), message,
                        ws.state)
    if event.action == "admit" and ws.queued_for == "resume":
        if not ws.current_snapshot:
            return _refuse(ws, Reason.NO_SNAPSHOT, "there is no snapshot to resume from")
        message = f"started after waiting {waited}" + (f": {event.message}" if event.message
                                                      else "")
        resuming = _move(ws, State.RESUMING, Reason.RESUME_STARTED, now, message=message,
                         transition_started_at=now, node=event.node, queued_at=None,
                         queued_for=None, preempted_by=None, queued_device_arrays_to_cpu=False)
        restore = Restore(ws.id, ws.current_snapshot, ws.current_manifest_sha256,
                          ws.queued_device_arrays_to_cpu)
        return Decision(True, Reason.RESUME_STARTED, resuming, (restore,), message, ws.state)
    if event.action == "admit":
        message = f"started after waiting {waited}" + (f": {event.message}" if event.message
                                                      else "")
        provisioning = _move(ws, State.PROVISIONING, Reason.CREATED, now, message=message,
                             transition_started_at=now, node=event.node, queued_at=None,
                             queued_for=None)
        return Decision(True, Reason.CREATED, provisioning, (Provision(ws.id),), message,
                        ws.state)
    if event.action == "expire":
        # A queued resume keeps its snapshot: the owner may resume again, or delete.
        failed = _move(ws, State.FAILED, Reason.QUEUE_EXPIRED, now, message=event.message,
                       queued_at=None, queued_for=None, preempted_by=None, queued_by=None)
        gated: tuple[Command, ...] = (Release(ws.id),) if ws.queued_by else ()
        return Decision(True, Reason.QUEUE_EXPIRED, failed, gated, event.message, ws.state)
    if event.action == "preempt" and not ws.memory_snapshots:
        # No snapshot: its server goes now, only its home kept; its resume waits its turn.
        message = f"{event.message}: memory snapshots are off, {HOME_ONLY}".lstrip(": ")
        queued = _move(ws, State.QUEUED, Reason.REQUEUED, now, message=message,
                       paused_home_only=True, pause_cause="preempted",
                       preempted_by=event.for_workspace, transition_started_at=None,
                       pending_checkpoint=None, preemption_warned_at=None, url=None,
                       queued_at=now, queued_for="resume", node=None)
        return Decision(True, Reason.REQUEUED, queued, (Release(ws.id),), message, ws.state)
    if event.action == "preempt":
        snapshot_id = snapshot_id_for(ws)
        pausing = _move(ws, State.PAUSING, Reason.PAUSE_STARTED, now, message=event.message,
                        pending_snapshot=snapshot_id, transition_started_at=now,
                        pause_cause="preempted", preempted_by=event.for_workspace,
                        pending_checkpoint=None, preemption_warned_at=None)
        return Decision(True, Reason.PAUSE_STARTED, pausing, (Snapshot(
            ws.id, snapshot_id, ws.current_snapshot, ws.current_manifest_sha256),),
                        event.message, ws.state)
    if event.action == "warn":
        warned = _note(ws, preemption_warned_at=now, state_message=event.message)
        return Decision(True, Reason.PREEMPTION_WARNING, warned, (), event.message, ws.state,
                        notify=True)
    # checkpoint
    if not ws.memory_snapshots:
        return _refuse(ws, Reason.MEMORY_SNAPSHOTS_OFF,
                       "memory snapshots are off for this workspace: no checkpoint")
    if ws.pending_checkpoint:
        return _refuse(ws, Reason.ALREADY_CHECKPOINTING,
                       f"checkpoint {ws.pending_checkpoint} is still being taken")
    snapshot_id = snapshot_id_for(ws)
    checkpointing = _note(ws, pending_checkpoint=snapshot_id)
    return Decision(True, Reason.CHECKPOINT_STARTED, checkpointing,
                    # incremental: only the parts that changed since the current snapshot
                    (Snapshot(ws.id, snapshot_id, ws.current_snapshot,
                              ws.current_manifest_sha256),), f"checkpoint {snapshot_id} started",
                    ws.state)


#: States whose server a lost node or a killed server takes with it (PAUSING is left to the
#: snapshot's outcome).
_ON_A_NODE = frozenset({State.PROVISIONING, State.RUNNING, State.RESUMING})


def _on_preempted(ws: Workspace, event: WorkspacePreempted, now: datetime) -> Decision:
    """The server is gone (its Spot VM was reclaimed, its node deleted, its process
    killed): PAUSED from the latest snapshot -- the last checkpoint, or the pause it last
    resumed from -- saying how much work was lost, or FAILED with the reason if there is
    none. Either way it holds no hardware any more (the handler gives the quota back)."""
    lost = _parse_time(event.preempted_at)
    if ws.state == State.PAUSING:
        # The snapshot may still complete (GKE finishes a Pod Snapshot it has begun) or
        # fail; either outcome comes as snapshot.finished and decides.
        return _refuse(ws, Reason.PREEMPTED_WHILE_PAUSING,
                       f"node {event.node} went away while PAUSING; the snapshot decides")
    started = ws.transition_started_at if ws.state != State.RUNNING else ws.updated_at
    if ws.state not in _ON_A_NODE or (started is not None and lost is not None
                                      and started > lost):
        # Nothing runs, or this server started after the loss (a resume onto another node).
        return _refuse(ws, Reason.STALE_PREEMPTION,
                       f"node {event.node} went away at {event.preempted_at}, while {ws.state}"
                       f" since {started.isoformat() if started else 'unknown'}")
    what = {"spot_preemption": f"node {event.node} was preempted (Spot)",
            "node_deleted": f"node {event.node} was removed from the cluster",
            "server_lost": f"the server on node {event.node} vanished"}.get(
        event.cause, f"node {event.node} went away")
    when = lost or now
    clear: dict[str, Any] = {"transition_started_at": None, "url": None, "node": None,
                             "pending_snapshot": None, "pending_checkpoint": None}
    if ws.state != State.PROVISIONING and not ws.memory_snapshots:
        # Nothing of its memory was ever kept: it is paused with its home, as a pause is.
        message = (f"{what} at {when:%H:%M:%S}: its kernels' memory is gone; memory "
                   f"snapshots are off, so it {HOME_ONLY}. Resume with "
                   f"`stasis ws resume {ws.name} --team {ws.team}`")
        paused = _move(ws, State.PAUSED, Reason.PAUSED_HOME_ONLY, now, message=message,
                       paused_home_only=True, **clear)
        return Decision(True, Reason.PAUSED_HOME_ONLY, paused, (Release(ws.id),), message,
                        ws.state)
    if ws.state == State.PROVISIONING or not ws.current_snapshot:
        message = (f"{what} at {when:%H:%M:%S}: the server and its kernels' memory are gone "
                   "and there is no snapshot to resume from: delete it and create it again")
        failed = _move(ws, State.FAILED, Reason.PREEMPTED, now, message=message, **clear)
        return Decision(True, Reason.PREEMPTED, failed, (Release(ws.id),), message, ws.state)
    since = ws.last_checkpoint_at or ws.updated_at
    lost_seconds = (0 if ws.state == State.RESUMING or since is None
                    else max(0, int((when - since).total_seconds())))
    taken = "its last checkpoint" if ws.last_checkpoint_at else "the snapshot it resumed from"
    message = (f"{what} at {when:%H:%M:%S}: paused from {taken} ({ws.current_snapshot}); "
               f"{_human_seconds(timedelta(seconds=lost_seconds))} of work since then is lost."
               f" Resume with `stasis ws resume {ws.name} --team {ws.team}`")
    paused = _move(ws, State.PAUSED, Reason.RECOVERED, now, message=message,
                   lost_work_seconds=lost_seconds, **clear)
    return Decision(True, Reason.RECOVERED, paused, (Release(ws.id),), message, ws.state)


def _on_runtime_alert(ws: Workspace, event: WorkspaceRuntimeAlert) -> Decision:
    """Noted on a RUNNING workspace (its message, the audit log); no transition, so its
    version and the moment it became RUNNING (the idle clock) stay as they are."""
    seen = _parse_time(event.observed_at)
    if ws.state != State.RUNNING:
        return _refuse(ws, Reason.STALE_ALERT, f"{event.alert} reported while {ws.state}")
    if seen is not None and ws.updated_at is not None and seen < ws.updated_at:
        return _refuse(ws, Reason.STALE_ALERT,
                       f"{event.alert} seen at {event.observed_at}, before this server started")
    noted = dataclasses.replace(ws, state_message=event.detail)
    return Decision(True, Reason.RUNTIME_ALERT, noted, (), event.detail, ws.state)


def _parse_time(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _human_seconds(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _note(ws: Workspace, **changes: Any) -> Workspace:
    """A note on ``ws``: a new version, same state, reason and ``updated_at``."""
    return dataclasses.replace(ws, version=ws.version + 1, **changes)


def _on_destroyed(ws: Workspace, now: datetime) -> Decision:
    if ws.state != State.DELETING:
        return _refuse(ws, Reason.STALE_FAILURE, f"destroyed while {ws.state}")
    # The runtime destroyed the snapshots with the workspace: no reference may outlive them.
    deleted = _move(ws, State.DELETED, Reason.DELETED, now, transition_started_at=None, url=None,
                    pending_snapshot=None, current_snapshot=None, current_manifest_sha256=None,
                    node=None, queued_at=None, queued_for=None)
    return Decision(True, Reason.DELETED, deleted, previous_state=ws.state)


def _new_workspace(event: WorkspaceRequested, now: datetime,
                   prior: Workspace | None) -> Workspace:
    wid = workspace_id(event.team, event.name)
    return Workspace(id=wid, team=event.team, owner=event.owner,
                     name=event.name, profile=event.profile, ide=event.ide,
                     environment=event.environment, created_at=now, reply_to=event.reply_to,
                     incarnation=incarnation_id(wid, _version(prior) + 1, now))


def incarnation_id(wid: str, version: int, created_at: datetime) -> str:
    """The id of one incarnation of workspace ``wid``: 128 bits of SHA-256 over the id, the
    version it starts at and when. The version never goes back for an id (a re-created
    workspace continues its predecessor's), so two incarnations never share one; the time
    keeps them apart even if a purged document let the version start over."""
    text = f"{wid}|{version}|{created_at.isoformat()}"
    return "inc-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _move(ws: Workspace, state: State, reason: Reason, now: datetime, *, message: str = "",
          **changes: Any) -> Workspace:
    version = changes.pop("version", ws.version)
    return dataclasses.replace(ws, state=state, state_reason=str(reason), state_message=message,
                               version=version + 1, updated_at=now, **changes)


def _refuse(ws: Workspace | None, reason: Reason, message: str,
            commands: tuple[Command, ...] = ()) -> Decision:
    return Decision(False, reason, ws, commands, message, _state(ws))


def _state(ws: Workspace | None) -> State | None:
    return ws.state if ws is not None else None


def _version(ws: Workspace | None) -> int:
    return ws.version if ws is not None else 0


def _elapsed_ms(ws: Workspace, now: datetime) -> int | None:
    if ws.transition_started_at is None:
        return None
    return max(0, int((now - ws.transition_started_at).total_seconds() * 1000))


__all__ = [
    "HOLDS_HARDWARE",
    "HOLDS_SLOT",
    "HOME_ONLY",
    "IN_TRANSITION",
    "NOTES",
    "Command",
    "Decision",
    "Destroy",
    "DiscardSnapshot",
    "Provision",
    "Reason",
    "Release",
    "Restore",
    "RuntimeDestroyed",
    "Schedule",
    "Signal",
    "Snapshot",
    "State",
    "Workspace",
    "decide",
    "enqueue",
    "enqueue_in_cluster",
    "refuse_admission",
    "snapshot_id_for",
    "still_queued",
]
