"""The reconciler's plan: stuck transitions become events, orphan servers get released."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events.payloads import SnapshotFinished, WorkspaceDeleteRequested, WorkspaceRuntimeFailed
from functions.domain.lifecycle import State, Workspace
from functions.domain.reconcile import RuntimeView, plan

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def ws(state: State, *, waited: timedelta | None = None, **kw: object) -> Workspace:
    started = NOW - waited if waited is not None else None
    return Workspace(id="ml-a--nb", team="ml-a", owner="dev", name="nb", profile="cpu-small",
                     state=state, version=4, transition_started_at=started, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("state", "event_type"), [
    (State.PAUSING, SnapshotFinished),
    (State.PROVISIONING, WorkspaceRuntimeFailed),
    (State.RESUMING, WorkspaceRuntimeFailed),
    (State.DELETING, WorkspaceDeleteRequested),
])
def test_a_stuck_transition_is_repaired_by_an_event(state: State, event_type: type) -> None:
    stuck = ws(state, waited=timedelta(hours=1), pending_snapshot="ml-a--nb-v4")
    [repair] = plan([stuck], {}, NOW).repairs
    assert isinstance(repair.event, event_type)
    assert repair.event_id == "reconcile-ml-a--nb-v4"  # same version, same id: one effect
    if state == State.PAUSING:
        assert repair.event.snapshot_id == "ml-a--nb-v4" and not repair.event.succeeded
        assert "snapshot lost" in (repair.event.error or "")


def test_a_young_or_busy_transition_is_left_alone() -> None:
    young = ws(State.PAUSING, waited=timedelta(seconds=30))
    assert not plan([young], {}, NOW)
    old_but_busy = ws(State.PAUSING, waited=timedelta(hours=1))
    assert not plan([old_but_busy], {"ml-a--nb": RuntimeView(True, "snapshot")}, NOW)


@pytest.mark.parametrize("state", [State.PAUSED, State.FAILED, State.DELETED])
def test_a_server_that_outlived_its_state_is_released(state: State) -> None:
    [repair] = plan([ws(state)], {"ml-a--nb": RuntimeView(running=True)}, NOW).repairs
    assert repair.release and repair.event is None


def test_a_server_of_an_unknown_workspace_is_released_and_running_ones_kept() -> None:
    runtime = {"ml-a--nb": RuntimeView(True), "ml-z--ghost": RuntimeView(True)}
    repairs = plan([ws(State.RUNNING)], runtime, NOW).repairs
    assert [(r.workspace_id, r.release) for r in repairs] == [("ml-z--ghost", True)]
