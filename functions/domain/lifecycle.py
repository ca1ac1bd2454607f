"""The workspace lifecycle: a pure transition function and nothing else.

``decide(workspace, event, now) -> Decision`` says what a workspace becomes when an event
arrives, which commands the runtime must carry out, and why (a named Reason). Handlers load,
call ``decide``, persist and execute; they never branch on state themselves. Illegal, stale
and duplicate events are decided here too, as refusals with their reason, so a document is
never changed by an event that should not change it.

    REQUESTED -> PROVISIONING -> RUNNING <-> PAUSING -> PAUSED -> RESUMING -> RUNNING
    any state -> DELETING -> DELETED          PROVISIONING / RESUMING failure -> FAILED
    PAUSING failure (snapshot failed) -> RUNNING, with the reason recorded
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from events.payloads import (
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    WorkspaceRuntimeFailed,
    workspace_id,
)


class State(StrEnum):
    REQUESTED = "REQUESTED"
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
    SNAPSHOT_FAILED = "snapshot_failed"
    RESUME_STARTED = "resume_started"
    DELETE_STARTED = "delete_started"
    DELETE_RETRIED = "delete_retried"
    DELETED = "deleted"
    PROVISION_FAILED = "provision_failed"
    RESUME_FAILED = "resume_failed"
    STUCK = "stuck"
    # refusals
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


# Commands: what the runtime (or storage) is asked to do once the decision is persisted.
@dataclass(frozen=True)
class Provision:
    workspace_id: str


@dataclass(frozen=True)
class Snapshot:
    workspace_id: str
    snapshot_id: str


@dataclass(frozen=True)
class Release:
    """Stop the workspace's processes and free its hardware; home stays."""

    workspace_id: str


@dataclass(frozen=True)
class Restore:
    workspace_id: str
    snapshot_id: str


@dataclass(frozen=True)
class Destroy:
    workspace_id: str
    keep_home: bool


@dataclass(frozen=True)
class DiscardSnapshot:
    """Delete a snapshot's objects (partial after a failure, or orphaned by a deletion)."""

    workspace_id: str
    snapshot_id: str


Command = Provision | Snapshot | Release | Restore | Destroy | DiscardSnapshot


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

    @property
    def changed_state(self) -> bool:
        return (
            self.accepted
            and self.workspace is not None
            and self.workspace.state != self.previous_state
        )


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
    return _on_destroyed(workspace, now)


def refuse_admission(
    workspace: Workspace | None, request: WorkspaceRequested, message: str, now: datetime
) -> Decision:
    """A request the catalog or the quota refused: recorded as FAILED, holding nothing.

    The document is the request's (owner, profile, reply_to: the refusal goes to whoever
    asked), not the DELETED or FAILED one it replaces, whose snapshot is gone or kept
    elsewhere; only the version continues, so event ids derived from it stay unique.
    """
    fresh = _new_workspace(request, now)
    failed = _move(fresh, State.FAILED, Reason.ADMISSION_REFUSED, now, message=message,
                   version=_version(workspace))
    return Decision(True, Reason.ADMISSION_REFUSED, failed, (), message, _state(workspace))


#: What the owner reads when a pause they did not ask for (no ``detail``) starts.
_PAUSE_CAUSES: dict[str, str] = {
    "idle": "paused by the idle policy",
    "schedule": "paused on schedule",
    "reconciler": "paused by the reconciler",
    "admin": "paused by an admin",
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
    fresh = _new_workspace(event, now)
    provisioning = _move(fresh, State.PROVISIONING, Reason.CREATED, now, version=_version(ws),
                         transition_started_at=now)
    return Decision(True, Reason.CREATED, provisioning, (Provision(fresh.id),),
                    previous_state=_state(ws))


def _on_ready(ws: Workspace, event: WorkspaceReady, now: datetime) -> Decision:
    if ws.state == State.PROVISIONING:
        running = _move(ws, State.RUNNING, Reason.READY, now, url=event.url,
                        runtime_handle=event.runtime_handle, transition_started_at=None,
                        first_start_ms=_elapsed_ms(ws, now), last_activity=now)
        return Decision(True, Reason.READY, running, previous_state=ws.state)
    if ws.state == State.RESUMING:
        running = _move(ws, State.RUNNING, Reason.RESUMED, now, url=event.url,
                        runtime_handle=event.runtime_handle, transition_started_at=None,
                        last_resume_ms=_elapsed_ms(ws, now), last_activity=now)
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
    if ws.state == State.RESUMING and event.operation == "resume":
        # The snapshot is kept, so the user can retry the resume or delete.
        failed = _move(ws, State.FAILED, Reason.RESUME_FAILED, now, message=event.reason,
                       transition_started_at=None)
        return Decision(True, Reason.RESUME_FAILED, failed, (Release(ws.id),), event.reason,
                        ws.state)
    return _refuse(ws, Reason.STALE_FAILURE, f"{event.operation} failure reported while {ws.state}")


def _on_pause(ws: Workspace, event: WorkspacePauseRequested, now: datetime) -> Decision:
    if ws.state == State.PAUSING:
        return _refuse(ws, Reason.ALREADY_PAUSING, "already pausing")
    if ws.state == State.PAUSED:
        return _refuse(ws, Reason.ALREADY_PAUSED, "already paused")
    if ws.state != State.RUNNING:
        return _refuse(ws, Reason.NOT_RUNNING, f"cannot pause while {ws.state}; wait until RUNNING")
    snapshot_id = snapshot_id_for(ws)
    # Whoever did not ask for the pause is told why: the message goes on the document and
    # on the state change (the idle policy says how long the workspace was idle).
    message = event.detail or _PAUSE_CAUSES.get(event.cause, "")
    pausing = _move(ws, State.PAUSING, Reason.PAUSE_STARTED, now, message=message,
                    pending_snapshot=snapshot_id, transition_started_at=now,
                    pause_cause=event.cause)
    return Decision(True, Reason.PAUSE_STARTED, pausing, (Snapshot(ws.id, snapshot_id),),
                    message, previous_state=ws.state)


def _on_snapshot_finished(ws: Workspace, event: SnapshotFinished, now: datetime) -> Decision:
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
    paused = _move(ws, State.PAUSED, Reason.PAUSED, now, message=message,
                   current_snapshot=event.snapshot_id, pending_snapshot=None,
                   transition_started_at=None, last_pause_ms=_elapsed_ms(ws, now), url=None)
    return Decision(True, Reason.PAUSED, paused, (Release(ws.id),), message,
                    previous_state=ws.state)


def _on_resume(ws: Workspace, event: WorkspaceResumeRequested, now: datetime) -> Decision:
    if ws.state == State.RUNNING:
        return _refuse(ws, Reason.ALREADY_RUNNING, "already running")
    if ws.state == State.RESUMING:
        return _refuse(ws, Reason.ALREADY_RESUMING, "already resuming")
    if ws.state not in (State.PAUSED, State.FAILED):
        return _refuse(ws, Reason.NOT_PAUSED, f"cannot resume while {ws.state}")
    if not ws.current_snapshot:
        return _refuse(ws, Reason.NO_SNAPSHOT, "there is no snapshot to resume from")
    resuming = _move(ws, State.RESUMING, Reason.RESUME_STARTED, now, transition_started_at=now,
                     profile=event.profile or ws.profile)
    return Decision(True, Reason.RESUME_STARTED, resuming,
                    (Restore(ws.id, ws.current_snapshot),), previous_state=ws.state)


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


def _on_destroyed(ws: Workspace, now: datetime) -> Decision:
    if ws.state != State.DELETING:
        return _refuse(ws, Reason.STALE_FAILURE, f"destroyed while {ws.state}")
    # The runtime destroyed the snapshots with the workspace: no reference may outlive them.
    deleted = _move(ws, State.DELETED, Reason.DELETED, now, transition_started_at=None, url=None,
                    pending_snapshot=None, current_snapshot=None)
    return Decision(True, Reason.DELETED, deleted, previous_state=ws.state)


def _new_workspace(event: WorkspaceRequested, now: datetime) -> Workspace:
    return Workspace(id=workspace_id(event.team, event.name), team=event.team, owner=event.owner,
                     name=event.name, profile=event.profile, ide=event.ide,
                     environment=event.environment, created_at=now, reply_to=event.reply_to)


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
    "IN_TRANSITION",
    "Command",
    "Decision",
    "Destroy",
    "DiscardSnapshot",
    "Provision",
    "Reason",
    "Release",
    "Restore",
    "RuntimeDestroyed",
    "Signal",
    "Snapshot",
    "State",
    "Workspace",
    "decide",
    "refuse_admission",
    "snapshot_id_for",
]
