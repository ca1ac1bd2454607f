"""The reconciler's plan: stuck transitions become events, orphan servers get released."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from events.payloads import (
    SandboxFinished,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspaceRuntimeFailed,
)
from functions.domain.jobs import Job, JobState
from functions.domain.lifecycle import State, Workspace
from functions.domain.reconcile import JOB_GRACE, RuntimeView, lost_jobs, plan, sandbox_repairs
from functions.domain.sandboxes import Limits, Sandbox, SandboxState
from functions.handlers.deps import Deps
from functions.handlers.reconciler import reconcile, summary

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


# -- sandboxes whose runtime went silent ---------------------------------------------------------

def sbx(sandbox_id: str, state: SandboxState, *, ran: timedelta | None, wall_clock: int = 900,
        version: int = 2) -> Sandbox:
    return Sandbox(id=sandbox_id, team="ml-a", requester="alice", repository="/r",
                   command="make", base_ref="HEAD",
                   limits=Limits(600, 2**30, wall_clock, 64), allowed_network=(),
                   state=state, reason="admitted", requestid="r-" + sandbox_id,
                   requested_at=NOW - timedelta(hours=3), version=version,
                   started_at=NOW - ran if ran is not None else None)


def test_a_silent_sandbox_past_its_wall_clock_and_grace_ends_runtime_lost() -> None:
    lost = sbx("sbx-lost", SandboxState.RUNNING, ran=timedelta(seconds=900 + 301))
    within_grace = sbx("sbx-late", SandboxState.RUNNING, ran=timedelta(seconds=900 + 299))
    queued = sbx("sbx-queued", SandboxState.QUEUED, ran=None)
    ended = sbx("sbx-ended", SandboxState.SUCCEEDED, ran=timedelta(hours=2))
    [repair] = sandbox_repairs([lost, within_grace, queued, ended], NOW)
    assert repair.sandbox_id == "sbx-lost"
    assert repair.event == SandboxFinished(sandbox_id="sbx-lost", succeeded=False,
                                           termination="runtime_lost", error=repair.event.error)
    assert "1201s" in repair.why and "wall clock of 900s" in repair.why
    # The id derives from the version: a second run before the first lands has one effect.
    assert repair.event_id == "reconcile-sbx-lost-v2"
    assert sandbox_repairs([lost], NOW)[0].event_id == repair.event_id
    promoted_again = dataclasses.replace(lost, version=5)
    assert sandbox_repairs([promoted_again], NOW)[0].event_id == "reconcile-sbx-lost-v5"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, event: Any) -> str:
        self.events.append(event)
        return event.id


class _Sandboxes:
    def __init__(self, *sandboxes: Sandbox) -> None:
        self.sandboxes = sandboxes
        self.asked: list[Any] = []

    def list(self, *, team: str | None = None, states: Any = None,
             limit: int = 200) -> list[Sandbox]:
        self.asked.append(states)
        return [s for s in self.sandboxes if states is None or s.state in states]


class _NoWorkspaces:
    def list_workspaces(self, **_: Any) -> list[Any]:
        return []

    def pending(self, **_: Any) -> list[Any]:  # no ledger entry waits for the relay
        return []


class _NothingRuns:
    def list(self) -> list[Any]:
        return []


def _reconciler_deps(store: _Sandboxes | None, bus: _Recorder) -> Deps:
    return Deps(store=_NoWorkspaces(), bus=bus, runtime=_NothingRuns(),  # type: ignore[arg-type]
                snapshots=None, catalog=lambda: None, clock=lambda: NOW,  # type: ignore[arg-type]
                snapshot_bucket="b", dead_letters=None,  # type: ignore[arg-type]
                sandboxes=SimpleNamespace(store=store) if store is not None else None)


def test_the_reconciler_publishes_runtime_lost_once_per_version_and_dry_run_publishes_none(
) -> None:
    lost = sbx("sbx-lost", SandboxState.RUNNING, ran=timedelta(hours=1))
    fine = sbx("sbx-fine", SandboxState.RUNNING, ran=timedelta(minutes=1))
    store, bus = _Sandboxes(lost, fine), _Recorder()
    dry = reconcile(_reconciler_deps(store, bus), fix=False)
    assert [r.sandbox_id for r in dry.sandboxes] == ["sbx-lost"] and bus.events == []
    assert store.asked == [(SandboxState.RUNNING,)]
    result = reconcile(_reconciler_deps(store, bus))
    reconcile(_reconciler_deps(store, bus))
    assert [(e.name, e.id, e.requestid, e.payload.termination) for e in bus.events] == [
        ("sandbox.finished", "reconcile-sbx-lost-v2", "reconcile-sbx-lost-v2",
         "runtime_lost")] * 2  # the same id twice: the handler's ledger keeps one effect
    assert summary(result) == [{"sandbox_id": "sbx-lost", "why": result.sandboxes[0].why,
                                "action": "SandboxFinished"}]
    # Where sandboxes do not run, the reconciler does not ask.
    assert not reconcile(_reconciler_deps(None, bus), fix=False)


# -- local jobs whose kernel went with their workspace's server ----------------------------------

JOB_START = NOW - timedelta(hours=1)


def local_job(job_id: str = "job-1", *, state: JobState = JobState.RUNNING,
              runtime: str = "local", workspace_id: str | None = "ml-a--nb") -> Job:
    return Job(id=job_id, team="ml-a", owner="alice", profile="tpu-v5e-8", hosts=2,
               state=state, tpus=16, workspace_id=workspace_id, runtime=runtime,
               submitted_at=JOB_START, started_at=JOB_START)


def ws_at(state: State, reason: str, changed: timedelta) -> Workspace:
    """The job's workspace, its latest transition ``changed`` before NOW."""
    return ws(state, state_reason=reason, updated_at=NOW - changed)


PAST = JOB_GRACE + timedelta(seconds=1)
WITHIN = JOB_GRACE - timedelta(seconds=1)


@pytest.mark.parametrize(("job", "workspace", "lost"), [
    # its server stopped: paused, failed, deleted, gone, or being replaced
    (local_job(), ws_at(State.PAUSED, "paused", PAST), "is PAUSED"),
    (local_job(), ws_at(State.FAILED, "runtime_failed", PAST), "is FAILED"),
    (local_job(), ws_at(State.DELETED, "deleted", PAST), "is DELETED"),
    (local_job(), None, "is gone"),
    (local_job(), ws_at(State.RESUMING, "resume_started", PAST), "is RESUMING"),
    # paused and resumed since the job started: a new server, a new kernel
    (local_job(), ws_at(State.RUNNING, "resumed", PAST), "got a new server (resumed)"),
    (local_job(), ws_at(State.RUNNING, "ready", PAST), "got a new server (ready)"),
    # the kernel that ran it may still report its own end
    (local_job(), ws_at(State.PAUSED, "paused", WITHIN), None),
    # the server that ran it still runs
    (local_job(), ws_at(State.RUNNING, "resumed", timedelta(hours=2)), None),
    (local_job(), ws_at(State.RUNNING, "snapshot_failed", PAST), None),
    # a failed snapshot leaves the kernel running; a delete ends DELETED or gone
    (local_job(), ws_at(State.PAUSING, "pause_started", timedelta(hours=1)), None),
    (local_job(), ws_at(State.DELETING, "delete_started", PAST), None),
    # not held, not tied to a workspace's kernel
    (local_job(state=JobState.SUCCEEDED), None, None),
    (local_job(runtime="kubernetes"), None, None),
    (local_job(workspace_id=None), None, None),
])
def test_a_local_job_whose_server_stopped_ends_runtime_lost(
        job: Job, workspace: Workspace | None, lost: str | None) -> None:
    repairs = lost_jobs([job], {"ml-a--nb": workspace}, NOW)
    if lost is None:
        assert repairs == []
        return
    [repair] = repairs
    assert repair.job_id == job.id and lost in repair.why
    assert repair.event.job_id == job.id and not repair.event.succeeded
    assert repair.event.termination == "runtime_lost" and lost in (repair.event.error or "")
    assert repair.event.duration_ms == 3_600_000
    assert repair.event_id == "reconcile-job-1-lost"  # one effect however often it runs


class _Jobs:
    def __init__(self, *jobs: Job) -> None:
        self.jobs = jobs
        self.asked: list[Any] = []

    def list(self, *, states: Any = None, limit: int = 500) -> list[Job]:
        self.asked.append(states)
        return [j for j in self.jobs if states is None or j.state in states]


class _Workspaces(_NoWorkspaces):
    def __init__(self, **docs: Workspace) -> None:
        self.docs = docs

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        return self.docs.get(workspace_id)


def test_the_reconciler_ends_lost_jobs_once_and_dry_run_publishes_none() -> None:
    lost = local_job("job-lost", workspace_id="ml-a--paused")
    alive = local_job("job-alive", workspace_id="ml-a--nb")
    done = local_job("job-done", state=JobState.SUCCEEDED, workspace_id="ml-a--paused")
    store = _Workspaces(**{"ml-a--paused": ws_at(State.PAUSED, "paused", PAST),
                           "ml-a--nb": ws_at(State.RUNNING, "ready", timedelta(hours=2))})
    jobs, bus = _Jobs(lost, alive, done), _Recorder()

    def deps() -> Deps:
        return dataclasses.replace(_reconciler_deps(None, bus), store=store, jobs=jobs)

    dry = reconcile(deps(), fix=False)
    assert [r.job_id for r in dry.jobs] == ["job-lost"] and bus.events == []
    assert jobs.asked == [(JobState.RUNNING,)]
    result = reconcile(deps())
    reconcile(deps())
    assert [(e.name, e.id, e.payload.job_id, e.payload.termination) for e in bus.events] == [
        ("job.finished", "reconcile-job-lost-lost", "job-lost", "runtime_lost")] * 2
    assert summary(result)[-1] == {"job_id": "job-lost", "why": result.jobs[0].why,
                                   "action": "JobFinished"}


def test_an_unreachable_runtime_answers_503_with_the_reason() -> None:
    from functions.handlers import scheduled
    from functions.ports import RuntimeUnavailable

    class Runtime:
        def list(self) -> list[Any]:
            raise RuntimeUnavailable("node agent at http://127.0.0.1:1 unreachable")

    fake = SimpleNamespace(store=SimpleNamespace(list_workspaces=lambda states: [],
                                                 pending=lambda: []),
                           runtime=Runtime(), clock=lambda: datetime.now(UTC),
                           sandboxes=None, jobs=None, consumers={})
    body, status = scheduled.reconcile(SimpleNamespace(args={}), fake)
    assert status == 503 and "node agent at http://127.0.0.1:1 unreachable" in body["error"]
