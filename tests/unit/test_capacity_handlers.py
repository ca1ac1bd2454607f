"""When the GPUs run out, through the handlers on the in-memory ledger: a create that does
not fit waits QUEUED, the scheduler's pass preempts a lower-priority idle workspace by
pause, the preempted one's resume waits and starts when the capacity comes back; a queued
request past its maximum wait fails with the reason; a cancelled one leaves nothing; a
checkpoint is taken while RUNNING and a vanished server comes back PAUSED from it with its
quota given back; a team borrows from its cohort inside the admission's transaction.

Every event the handlers publish is delivered to the lifecycle (or dropped, for the chat
notifier) by :func:`deliver`, as the push subscriptions would; the runtime's own reports
(ready, snapshot finished) are sent by the test, as a node agent would.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from store_fakes import Clock, MemoryDb, RecordingRuntime, handler_deps, published

from events import (
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import WorkspaceScheduled
from functions.domain.catalog import Catalog
from functions.handlers import lifecycle, reconciler, scheduler
from functions.ports import RuntimeStatus
from functions.routes import ROUTES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
NODE = "gpu-node-1"
LOW, HIGH = "ml-a--low", "ml-b--high"


def config(**changes: Any) -> dict[str, Any]:
    """The example with priority classes, one declared L4 on NODE and a low-priority GPU
    profile (gpu-low: background) beside gpu-small (interactive)."""
    data = copy.deepcopy(EXAMPLE)
    data["scheduling"] = {
        "priority_classes": [{"id": "interactive", "value": 1000},
                             {"id": "background", "value": 100}],
        "defaults": {"workspace": "interactive"},
        "nodes": [{"id": NODE, "accelerators": {"nvidia-l4": 1}}],
    }
    gpu = next(p for p in data["profiles"] if p["id"] == "gpu-small")
    low = copy.deepcopy(gpu)
    low.update(id="gpu-low", title="Low-priority L4")
    low["scheduling"] = {"priority_class": "background", "checkpoint_every_seconds": 600}
    data["profiles"].append(low)
    for team in data["teams"]:
        team["profiles"].append("gpu-low")
    for key, value in changes.items():
        data[key] = value
    return data


class Node(RecordingRuntime):
    """The runtime of one node (it reports its name) with idle kernels, and servers that
    the test can kill."""

    def __init__(self) -> None:
        super().__init__()
        self.running: set[str] = set()
        self.specs: list[Any] = []

    def capabilities(self) -> dict[str, Any]:
        return {"node": NODE, **super().capabilities()}

    def provision(self, spec: Any) -> None:
        super().provision(spec)
        self.running.add(spec.workspace_id)
        self.specs.append(spec)

    def restore(self, spec: Any, snapshot_id: str, **options: Any) -> None:
        super().restore(spec, snapshot_id, **options)
        self.running.add(spec.workspace_id)

    def release(self, workspace_id: str) -> None:
        super().release(workspace_id)
        self.running.discard(workspace_id)

    def list(self) -> list[RuntimeStatus]:
        return [RuntimeStatus(ws, True) for ws in sorted(self.running)]

    def activity(self, workspace_id: str) -> dict[str, Any] | None:
        if workspace_id not in self.running:
            return None
        return {"last_activity": "2026-06-01T11:00:00+00:00", "busy_kernels": 0,
                "connections": 0, "observed_at": "2026-06-01T12:00:00+00:00"}


def _deps(data: dict[str, Any] | None = None) -> Any:
    db = MemoryDb()
    for team in ("ml-a", "ml-b"):
        db.put("teams", team, {"id": team, "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    catalog = Catalog.from_config(data or config())
    return handler_deps(catalog, db=db, runtime=Node(), clock=Clock())


def deliver(deps: Any) -> None:
    """Deliver every event published since the last delivery to the lifecycle's functions
    that take it (a redelivery of an earlier one would change nothing: the ledger)."""
    bus = deps.bus
    while getattr(deps, "delivered", 0) < len(bus.events):
        event = bus.events[deps.delivered if hasattr(deps, "delivered") else 0]
        deps.delivered = getattr(deps, "delivered", 0) + 1
        for name, route in ROUTES.items():
            if getattr(route, "event", None) == event.name and route.handler is lifecycle.handle:
                lifecycle.handle(event, deps, name)


def ws(deps: Any, ws_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = deps.store.db.get("workspaces", ws_id)
    return doc


def gpus(deps: Any, team: str) -> int:
    return int(deps.store.db.get("teams", team)["usage"]["gpus"])


def node_used(deps: Any) -> dict[str, int]:
    return dict((deps.store.db.get("nodes", NODE) or {}).get("used") or {})


def ready(deps: Any, ws_id: str) -> None:
    lifecycle.handle(new_event(WorkspaceReady(ws_id, f"http://{ws_id}", "h"),
                               source="//runtime"), deps, "on_workspace_ready")
    deliver(deps)


def snapshot_done(deps: Any, ws_id: str) -> str:
    snapshot_id = ws(deps, ws_id)["pending_snapshot"] or ws(deps, ws_id)["pending_checkpoint"]
    lifecycle.handle(new_event(SnapshotFinished(ws_id, snapshot_id, True, bytes=1000,
                                                uri=f"gs://b/{snapshot_id}"),
                               source="//runtime"), deps, "on_snapshot_finished")
    deliver(deps)
    return str(snapshot_id)


def create(deps: Any, team: str, name: str, profile: str, owner: str) -> None:
    lifecycle.handle(new_event(WorkspaceRequested(team, owner, name, profile),
                               source="//test"), deps, "on_workspace_requested")
    deliver(deps)


# -- the story of issue 19, in memory -----------------------------------------------------------


def test_a_higher_priority_create_preempts_an_idle_workspace_by_pause_and_both_run_in_turn(
) -> None:
    deps = _deps()
    create(deps, "ml-a", "low", "gpu-low", "alice")
    assert ws(deps, LOW)["state"] == "PROVISIONING" and ws(deps, LOW)["node"] == NODE
    assert (ws(deps, LOW)["priority"], ws(deps, LOW)["priority_class"]) == (100, "background")
    # The node agent is told the declared accelerators it serves without a device.
    extra = deps.runtime.specs[-1].extra
    assert (extra["node"], extra["declared_accelerators"]) == (NODE, {"nvidia-l4": 1})
    assert (extra["priority_class"], extra["version"]) == ("background", 1)
    ready(deps, LOW)
    assert node_used(deps) == {"nvidia-l4": 1}

    create(deps, "ml-b", "high", "gpu-small", "carol")
    # QUEUED, then the pass preempted the idle low-priority workspace for it.
    assert ws(deps, HIGH)["state"] == "QUEUED"
    assert ws(deps, HIGH)["state_message"].startswith(
        "queued: no node has 1 x nvidia-l4 free: 1/1 (1 declared) nvidia-l4 in use")
    low = ws(deps, LOW)
    assert (low["state"], low["pause_cause"], low["preempted_by"]) == (
        "PAUSING", "preempted", HIGH)
    assert low["state_message"].startswith(f"paused with its state for {HIGH} (interactive)")
    assert gpus(deps, "ml-a") == 1  # still held until the snapshot is taken

    snapshot = snapshot_done(deps, LOW)
    low = ws(deps, LOW)
    assert (low["state"], low["queued_for"], low["current_snapshot"]) == (
        "QUEUED", "resume", snapshot)
    assert gpus(deps, "ml-a") == 0
    high = ws(deps, HIGH)
    assert (high["state"], high["node"]) == ("PROVISIONING", NODE)
    assert high["state_message"].startswith("started after waiting")
    ready(deps, HIGH)
    changes = [(c.workspace_id, c.to_state, c.reason)
               for c in published(deps, "workspace.state_changed")]
    assert (LOW, "QUEUED", "requeued") in changes and (HIGH, "RUNNING", "ready") in changes
    view = scheduler.outlook(deps, [LOW])
    assert view[LOW].position == 1
    assert view[LOW].message.startswith("no node has 1 x nvidia-l4 free")

    lifecycle.handle(new_event(WorkspacePauseRequested(HIGH, "carol"), source="//test"), deps,
                     "on_pause_requested")
    deliver(deps)
    snapshot_done(deps, HIGH)
    assert ws(deps, HIGH)["state"] == "PAUSED"
    low = ws(deps, LOW)
    assert low["state"] == "RESUMING" and ("restore", LOW, snapshot) in deps.runtime.calls
    ready(deps, LOW)
    assert ws(deps, LOW)["state"] == "RUNNING"
    assert node_used(deps) == {"nvidia-l4": 1}
    assert (gpus(deps, "ml-a"), gpus(deps, "ml-b")) == (1, 0)


def test_a_stale_verdict_changes_nothing_and_a_start_that_no_longer_fits_keeps_waiting(
) -> None:
    deps = _deps()
    create(deps, "ml-a", "low", "gpu-low", "alice")
    ready(deps, LOW)
    create(deps, "ml-b", "high", "gpu-low", "carol")  # the same priority: no preemption
    queued = ws(deps, HIGH)
    assert queued["state"] == "QUEUED" and ws(deps, LOW)["state"] == "RUNNING"
    # A start decided on an old version is stale; one that no longer fits keeps waiting
    # at a new version, so the next pass asks again.
    old = WorkspaceScheduled(HIGH, queued["version"] - 1, "admit", node=NODE)
    assert not lifecycle.handle(new_event(old, source="//test"), deps,
                                "on_workspace_scheduled").accepted
    now = WorkspaceScheduled(HIGH, queued["version"], "admit", node=NODE)
    decision = lifecycle.handle(new_event(now, source="//test"), deps, "on_workspace_scheduled")
    assert decision.accepted and decision.reason == "still_queued"
    after = ws(deps, HIGH)
    assert (after["state"], after["version"]) == ("QUEUED", queued["version"] + 1)
    assert node_used(deps) == {"nvidia-l4": 1} and gpus(deps, "ml-b") == 0


def test_a_queued_request_past_its_maximum_wait_fails_with_the_reason() -> None:
    data = config()
    gpu = next(p for p in data["profiles"] if p["id"] == "gpu-small")
    gpu["scheduling"] = {"max_wait_seconds": 600}
    deps = _deps(data)
    create(deps, "ml-b", "first", "gpu-small", "carol")
    ready(deps, "ml-b--first")
    create(deps, "ml-b", "second", "gpu-small", "carol")
    assert ws(deps, "ml-b--second")["state"] == "QUEUED"
    assert scheduler.run(deps).plan.expiries == []
    deps.clock.advance(seconds=601)
    result = reconciler.reconcile(deps)
    deliver(deps)
    assert result.schedule["expire"] == ["ml-b--second"]
    failed = ws(deps, "ml-b--second")
    assert (failed["state"], failed["state_reason"]) == ("FAILED", "queue_expired")
    assert failed["state_message"].startswith(
        "waited 10m, the most its profile allows (10m): team ml-b uses 1/1 GPUs")
    assert deps.store.db.get("teams", "ml-b")["usage"]["workspaces"] == 1  # its slot is back


def test_a_cancelled_queued_create_leaves_nothing_behind() -> None:
    deps = _deps()
    create(deps, "ml-b", "first", "gpu-small", "carol")
    create(deps, "ml-b", "second", "gpu-small", "carol")
    assert ws(deps, "ml-b--second")["state"] == "QUEUED"
    lifecycle.handle(new_event(WorkspaceDeleteRequested("ml-b--second", "carol"),
                               source="//test"), deps, "on_delete_requested")
    deliver(deps)
    gone = ws(deps, "ml-b--second")
    assert gone["state"] == "DELETED" and gone["node"] is None
    assert deps.store.db.get("teams", "ml-b")["usage"] == {"workspaces": 1, "gpus": 1,
                                                           "tpus": 0, "snapshot_bytes": 0}
    assert not [c for c in deps.runtime.calls if c[1] == "ml-b--second" and c[0] != "destroy"]
    assert deps.store.db.collection("snapshots") == {}


def test_a_cancelled_queued_resume_stays_paused_with_its_snapshot() -> None:
    deps = _deps()
    create(deps, "ml-a", "low", "gpu-low", "alice")
    ready(deps, LOW)
    create(deps, "ml-b", "high", "gpu-small", "carol")
    snapshot = snapshot_done(deps, LOW)
    assert ws(deps, LOW)["state"] == "QUEUED"
    lifecycle.handle(new_event(WorkspacePauseRequested(LOW, "alice"), source="//test"), deps,
                     "on_pause_requested")
    low = ws(deps, LOW)
    assert (low["state"], low["state_reason"], low["current_snapshot"]) == (
        "PAUSED", "queue_cancelled", snapshot)
    resumed = lifecycle.handle(new_event(WorkspaceResumeRequested(LOW, "alice"),
                                         source="//test"), deps, "on_resume_requested")
    assert resumed.reason == "queued"  # still no L4 free: it waits again


def test_a_queued_resume_keeps_its_device_arrays_to_cpu_for_the_restore_that_starts_it(
) -> None:
    deps = _deps()
    create(deps, "ml-a", "low", "gpu-low", "alice")
    ready(deps, LOW)
    create(deps, "ml-b", "high", "gpu-small", "carol")
    snapshot_done(deps, LOW)
    lifecycle.handle(new_event(WorkspacePauseRequested(LOW, "alice"), source="//test"), deps,
                     "on_pause_requested")  # cancels the resume the preemption queued
    asked = lifecycle.handle(new_event(WorkspaceResumeRequested(
        LOW, "alice", device_arrays_to_cpu=True), source="//test"), deps, "on_resume_requested")
    assert asked.reason == "queued" and ws(deps, LOW)["queued_device_arrays_to_cpu"] is True
    ready(deps, HIGH)
    lifecycle.handle(new_event(WorkspacePauseRequested(HIGH, "carol"), source="//test"), deps,
                     "on_pause_requested")
    deliver(deps)
    snapshot_done(deps, HIGH)
    low = ws(deps, LOW)
    assert low["state"] == "RESUMING" and low["queued_device_arrays_to_cpu"] is False
    assert deps.runtime.anchors[-1][1] is True  # the Restore that started it asked for CPU


# -- Spot: checkpoints, and a vanished server ---------------------------------------------------


def test_a_checkpoint_while_running_then_a_vanished_server_pauses_from_it() -> None:
    deps = _deps()
    create(deps, "ml-a", "low", "gpu-low", "alice")
    ready(deps, LOW)
    assert reconciler.reconcile(deps).repairs == []  # too early for a checkpoint
    deps.clock.advance(seconds=600)
    reconciler.reconcile(deps)
    deliver(deps)
    running = ws(deps, LOW)
    assert running["state"] == "RUNNING" and running["pending_checkpoint"]
    checkpoint = snapshot_done(deps, LOW)
    running = ws(deps, LOW)
    assert (running["state"], running["current_snapshot"], running["pending_checkpoint"]) == (
        "RUNNING", checkpoint, None)
    assert running["last_checkpoint_at"] == deps.clock()
    assert deps.store.db.get("snapshots", checkpoint)["status"] == "ready"
    assert "release" not in [c[0] for c in deps.runtime.calls]  # it kept running

    deps.clock.advance(seconds=90)
    deps.runtime.running.discard(LOW)  # the server is killed
    result = reconciler.reconcile(deps)
    [repair] = result.repairs
    assert repair.event.cause == "server_lost"
    deliver(deps)
    lost = ws(deps, LOW)
    assert (lost["state"], lost["state_reason"], lost["lost_work_seconds"]) == (
        "PAUSED", "recovered", 90)
    assert "1m 30s of work since then is lost" in lost["state_message"]
    assert gpus(deps, "ml-a") == 0 and node_used(deps) == {"nvidia-l4": 0}
    lifecycle.handle(new_event(WorkspaceResumeRequested(LOW, "alice"), source="//test"), deps,
                     "on_resume_requested")
    assert ("restore", LOW, checkpoint) in deps.runtime.calls
    # Repeated runs before the repair lands have one effect.
    assert reconciler.reconcile(deps).repairs == []


# -- borrowing inside the admission's transaction -----------------------------------------------


def test_a_home_only_workspace_is_never_asked_for_a_checkpoint() -> None:
    """memory_snapshots: false (the team's, here): the reconciler asks no checkpoint of it,
    so none is refused and audited every round; its neighbour still gets one."""
    data = config()
    next(t for t in data["teams"] if t["id"] == "ml-a")["memory_snapshots"] = False
    deps = _deps(data)
    create(deps, "ml-a", "low", "gpu-low", "alice")
    ready(deps, LOW)
    for _ in range(3):
        deps.clock.advance(seconds=700)
        assert reconciler.reconcile(deps).repairs == []
        deliver(deps)
    assert ws(deps, LOW)["pending_checkpoint"] is None
    assert not [a for a in deps.store.db.collection("audit").values()
                if "checkpoint" in str(a)]
    # The admin file turns it off after the workspace recorded it on: skipped too.
    on = _deps()
    create(on, "ml-a", "low", "gpu-low", "alice")
    ready(on, LOW)
    on.clock.advance(seconds=700)
    [due] = reconciler.reconcile(on, fix=False).repairs
    assert due.event.action == "checkpoint"
    on.catalog = lambda: Catalog.from_config(data)
    assert reconciler.reconcile(on, fix=False).repairs == []


@pytest.mark.parametrize(("limit", "state"), [(None, "PROVISIONING"), (0, "QUEUED")])
def test_a_team_borrows_its_cohorts_idle_quota_within_its_limit(limit: int | None,
                                                                 state: str) -> None:
    data = config()
    data["scheduling"]["nodes"] = [{"id": NODE, "accelerators": {"nvidia-l4": 4}}]
    for team in data["teams"]:
        team["cohort"] = "research"
        if limit is not None and team["id"] == "ml-b":
            team["borrowing_limit"] = {"gpus": limit}
    deps = _deps(data)
    create(deps, "ml-b", "first", "gpu-small", "carol")
    create(deps, "ml-b", "second", "gpu-small", "carol")
    assert ws(deps, "ml-b--second")["state"] == state
    assert gpus(deps, "ml-b") == (2 if state == "PROVISIONING" else 1)
