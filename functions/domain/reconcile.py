"""The reconciler's rules: compare what Firestore says with what the runtime runs.

Pure: the caller passes the workspaces, the runtime's view and ``now``. The plan is a list
of events to publish (the reconciler changes state only through events, like everyone
else) and of orphan processes to release. Event ids derive from the workspace version, so
running the reconciler twice before the first repair lands has one effect. Sandboxes
(:func:`sandbox_repairs`): a RUNNING one silent past its wall clock + grace ends
``runtime_lost``, which frees its team slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from events.payloads import (
    SandboxFinished,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspaceRuntimeFailed,
)
from functions.domain.lifecycle import State, Workspace
from functions.domain.sandboxes import Sandbox, overdue

#: How long a transition may wait on the runtime before it counts as stuck.
STUCK_AFTER: Mapping[State, timedelta] = {
    State.PROVISIONING: timedelta(minutes=5),
    State.PAUSING: timedelta(minutes=10),
    State.RESUMING: timedelta(minutes=10),
    State.DELETING: timedelta(minutes=5),
}
#: States in which no runtime process may exist.
NOTHING_RUNS = frozenset({State.PAUSED, State.DELETED, State.FAILED})


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


@dataclass
class Plan:
    repairs: list[Repair] = field(default_factory=list)
    sandboxes: list[SandboxRepair] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.repairs) or bool(self.sandboxes)


def plan(workspaces: Iterable[Workspace], runtime: Mapping[str, RuntimeView], now: datetime,
         stuck_after: Mapping[State, timedelta] = STUCK_AFTER) -> Plan:
    result = Plan()
    known: set[str] = set()
    for ws in workspaces:
        known.add(ws.id)
        view = runtime.get(ws.id)
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
