"""Capacity on the Firestore emulator: the node's accelerator counters (``nodes/{node}``)
and the teams' usage move in ONE transaction with the workspace, so requests racing for
the last declared L4 from two function instances (no shared lock) admit exactly one and
queue the rest; a lender's borrowing cohort is read in the same transaction; and the
scheduler's pass over the real queries preempts by pause, then starts the waiting request
once the preempted one has paused."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud import firestore

from events import SnapshotFinished, WorkspaceReady, WorkspaceRequested, new_event
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.fleet_store import FleetStore
from functions.domain.catalog import Catalog
from functions.handlers import lifecycle, scheduler
from functions.handlers.deps import Deps
from functions.ports import RuntimeStatus
from runtime.local.publisher import RecordingPublisher

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-node-1"


def catalog(*, l4s: int = 1, cohort: bool = False) -> Catalog:
    data = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
    data["scheduling"] = {
        "priority_classes": [{"id": "interactive", "value": 1000},
                             {"id": "background", "value": 100}],
        "defaults": {"workspace": "interactive"},
        "nodes": [{"id": NODE, "accelerators": {"nvidia-l4": l4s}}]}
    gpu = next(p for p in data["profiles"] if p["id"] == "gpu-small")
    low = copy.deepcopy(gpu)
    low.update(id="gpu-low", title="Low-priority L4", scheduling={"priority_class": "background"})
    data["profiles"].append(low)
    for team in data["teams"]:
        team["profiles"].append("gpu-low")
        team["quotas"]["gpus"] = 4 if not cohort else (2 if team["id"] == "ml-a" else 1)
        if cohort:
            team["cohort"] = "research"
    return Catalog.from_config(data)


class Node:
    """The runtime of one node: it reports its name; provisions and restores succeed."""

    name = "node"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def capabilities(self) -> dict[str, Any]:
        return {"node": NODE, "accelerators": {}, "ides": ["jupyterlab"]}

    def provision(self, spec: Any) -> None:
        self.calls.append(("provision", spec.workspace_id))

    def restore(self, spec: Any, snapshot_id: str, **options: Any) -> None:
        self.calls.append(("restore", spec.workspace_id))

    def snapshot(self, spec: Any, snapshot_id: str, **options: Any) -> None:
        self.calls.append(("snapshot", spec.workspace_id))

    def release(self, workspace_id: str) -> None:
        self.calls.append(("release", workspace_id))

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        self.calls.append(("destroy", workspace_id))

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        return None

    def list(self) -> list[RuntimeStatus]:
        return []

    def activity(self, workspace_id: str) -> dict[str, Any]:
        return {"last_activity": NOW.isoformat(), "busy_kernels": 0, "connections": 0,
                "observed_at": NOW.isoformat()}

    def progress(self, workspace_id: str) -> None:
        return None


def make_deps(db: firestore.Client, cat: Catalog, runtime: Node | None = None) -> Deps:
    return Deps(store=FirestoreStore(db), bus=RecordingPublisher(), runtime=runtime or Node(),
                snapshots=None, catalog=lambda: cat, clock=lambda: NOW,  # type: ignore[arg-type]
                snapshot_bucket="b", dead_letters=None,  # type: ignore[arg-type]
                fleet=FleetStore(db))  # type: ignore[arg-type]


@pytest.fixture
def db(emulator_env: dict[str, str]) -> firestore.Client:
    client = firestore.Client(project=emulator_env["STASIS_PROJECT"])
    for team in ("ml-a", "ml-b"):
        client.collection("teams").document(team).set(
            {"id": team, "usage": {"workspaces": 0, "gpus": 0, "tpus": 0, "snapshot_bytes": 0}})
    return client


def state(db: firestore.Client, ws_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = db.collection("workspaces").document(ws_id).get().to_dict()
    return doc


def used(db: firestore.Client) -> dict[str, int]:
    snap = db.collection("nodes").document(NODE).get()
    return dict((snap.to_dict() or {}).get("used") or {}) if snap.exists else {}


def gpus(db: firestore.Client, team: str) -> int:
    return int(db.collection("teams").document(team).get().to_dict()["usage"]["gpus"])


def race(db: firestore.Client, cat: Catalog, requests: list[tuple[str, str, str]]) -> None:
    """Each request from its own function instance (client, store), started together and
    with no shared lock: only the Firestore transaction arbitrates."""
    import functions.adapters.firestore_store as module

    barrier = threading.Barrier(len(requests))

    def go(team: str, name: str, profile: str) -> None:
        deps = make_deps(firestore.Client(project=db.project), cat)
        event = new_event(WorkspaceRequested(team, "alice" if team == "ml-a" else "carol",
                                             name, profile), source="//test")
        barrier.wait()
        lifecycle.handle(event, deps, "on_workspace_requested")

    real = module._lock
    module._lock = lambda name: threading.Lock()  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=go, args=r) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        module._lock = real  # type: ignore[assignment]


def test_two_teams_racing_for_the_last_declared_l4_admit_one_and_queue_the_other(
        db: firestore.Client) -> None:
    cat = catalog(l4s=1)
    race(db, cat, [("ml-a", "one", "gpu-small"), ("ml-b", "two", "gpu-small"),
                   ("ml-a", "three", "gpu-small")])
    states = sorted(state(db, ws)["state"] for ws in ("ml-a--one", "ml-b--two", "ml-a--three"))
    assert states == ["PROVISIONING", "QUEUED", "QUEUED"]
    assert used(db) == {"nvidia-l4": 1}
    assert gpus(db, "ml-a") + gpus(db, "ml-b") == 1
    queued = [ws for ws in ("ml-a--one", "ml-b--two", "ml-a--three")
              if state(db, ws)["state"] == "QUEUED"]
    assert all("no node has 1 x nvidia-l4 free: 1/1 (1 declared)" in state(db, ws)[
        "state_message"] for ws in queued)


def test_a_team_borrows_from_its_cohort_only_what_the_cohort_leaves_unused(
        db: firestore.Client) -> None:
    # ml-a 2, ml-b 1 GPU: together 3; four requests of ml-b race for them.
    cat = catalog(l4s=8, cohort=True)
    race(db, cat, [("ml-b", f"w{i}", "gpu-small") for i in range(4)])
    states = sorted(state(db, f"ml-b--w{i}")["state"] for i in range(4))
    assert states == ["PROVISIONING"] * 3 + ["QUEUED"]
    assert gpus(db, "ml-b") == 3 and used(db) == {"nvidia-l4": 3}
    [waiting] = [state(db, f"ml-b--w{i}") for i in range(4)
                 if state(db, f"ml-b--w{i}")["state"] == "QUEUED"]
    assert "cohort research has none idle to lend (3/3 in use)" in waiting["state_message"]


def test_the_pass_over_the_real_queries_preempts_by_pause_then_starts_the_request(
        db: firestore.Client) -> None:
    cat = catalog(l4s=1)
    deps = make_deps(db, cat)

    def handle(payload: Any, consumer: str) -> None:
        lifecycle.handle(new_event(payload, source="//test"), deps, consumer)

    handle(WorkspaceRequested("ml-a", "alice", "low", "gpu-low"), "on_workspace_requested")
    handle(WorkspaceReady("ml-a--low", "http://low", "h"), "on_workspace_ready")
    handle(WorkspaceRequested("ml-b", "carol", "high", "gpu-small"), "on_workspace_requested")
    # The queued request's outbox ran a pass: it asked to preempt the idle low one.
    [verdict] = [e for e in deps.bus.events if e.name == "workspace.scheduled"]
    assert (verdict.payload.action, verdict.payload.workspace_id,
            verdict.payload.for_workspace) == ("preempt", "ml-a--low", "ml-b--high")
    lifecycle.handle(verdict, deps, "on_workspace_scheduled")
    low = state(db, "ml-a--low")
    assert (low["state"], low["preempted_by"]) == ("PAUSING", "ml-b--high")
    handle(SnapshotFinished("ml-a--low", low["pending_snapshot"], True, bytes=10, uri="gs://b/s"),
           "on_snapshot_finished")
    assert state(db, "ml-a--low")["state"] == "QUEUED"
    admits = [e for e in deps.bus.events
              if e.name == "workspace.scheduled" and e.payload.action == "admit"]
    assert [(e.payload.workspace_id, e.payload.node) for e in admits] == [("ml-b--high", NODE)]
    lifecycle.handle(admits[0], deps, "on_workspace_scheduled")
    assert (state(db, "ml-b--high")["state"], used(db)) == ("PROVISIONING", {"nvidia-l4": 1})
    assert (gpus(db, "ml-a"), gpus(db, "ml-b")) == (0, 1)
    # the pass is a read: run again, the same verdicts under the same ids, nothing new
    again = scheduler.run(deps)
    assert again.plan.admits == [] and again.plan.preemptions == []
    assert again.plan.waits["ml-a--low"].position == 1
