"""Issue 17 §7: environments (or teams) that must not be snapshotted.

Memory snapshots copy whatever data was in memory. Where the admin file says
``memory_snapshots: false``, a pause keeps only the home disk (no Snapshot, no snapshot
record, no bytes charged) and says so, and the resume provisions fresh kernels on it.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from store_fakes import MemoryDb, RecordingRuntime, handler_deps, published

from events import (
    WorkspacePauseRequested,
    WorkspacePreempted,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    WorkspaceRuntimeFailed,
    new_event,
)
from events.payloads import WorkspaceScheduled
from functions.domain import frontdoor
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import (
    Provision,
    Reason,
    Release,
    Restore,
    Snapshot,
    State,
    Workspace,
    decide,
)
from functions.handlers import lifecycle

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
WS = "ml-a--nb"


def _config(*, env: bool = False, team: bool = False) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    if env:
        next(e for e in config["environments"] if e["id"] == "python-3-11")[
            "memory_snapshots"] = False
    if team:
        next(t for t in config["teams"] if t["id"] == "ml-a")["memory_snapshots"] = False
    return config


def _running(**changes: Any) -> Workspace:
    return Workspace(id=WS, team="ml-a", owner="alice", name="nb", profile="cpu-small",
                     state=State.RUNNING, version=2, url="http://nb", updated_at=NOW,
                     memory_snapshots=False, **changes)


# -- the catalog --------------------------------------------------------------------------


def test_either_the_environment_or_the_team_turns_memory_snapshots_off() -> None:
    assert Catalog.from_config(CONFIG).memory_snapshots_for("ml-a", "python-3-11")
    assert not Catalog.from_config(_config(env=True)).memory_snapshots_for("ml-a", "python-3-11")
    by_team = Catalog.from_config(_config(team=True))
    assert not by_team.memory_snapshots_for("ml-a", "python-3-11")
    assert by_team.memory_snapshots_for("ml-b", "python-3-11")


# -- the domain ---------------------------------------------------------------------------


def test_a_pause_without_memory_snapshots_releases_at_once_keeping_only_the_home() -> None:
    decision = decide(_running(), WorkspacePauseRequested(WS, "alice"), NOW)
    assert decision.accepted and decision.reason == Reason.PAUSED_HOME_ONLY
    assert decision.commands == (Release(WS),)
    assert not any(isinstance(c, Snapshot) for c in decision.commands)
    ws = decision.workspace
    assert ws is not None and ws.state == State.PAUSED and ws.paused_home_only
    assert (ws.pending_snapshot, ws.current_snapshot, ws.url) == (None, None, None)
    assert "keeps only the home disk: kernels start fresh on resume" in ws.state_message
    [change] = decision.events
    assert (change.from_state, change.to_state) == ("RUNNING", "PAUSED")


def test_its_resume_provisions_fresh_kernels_and_is_running_when_ready() -> None:
    paused = decide(_running(), WorkspacePauseRequested(WS, "alice"), NOW).workspace
    assert paused is not None
    later = NOW + timedelta(hours=1)
    resumed = decide(paused, WorkspaceResumeRequested(WS, "alice"), later)
    assert resumed.accepted and resumed.commands == (Provision(WS),)
    assert resumed.workspace is not None and resumed.workspace.state == State.RESUMING
    ready = decide(resumed.workspace, WorkspaceReady(WS, "http://nb2", "h"), later)
    assert ready.accepted and ready.reason == Reason.RESUMED
    ws = ready.workspace
    assert ws is not None and ws.state == State.RUNNING and not ws.paused_home_only
    assert "fresh kernels" in ws.state_message


def test_an_older_snapshot_is_not_restored_once_memory_snapshots_are_off() -> None:
    paused = dataclasses.replace(_running(), state=State.PAUSED, current_snapshot="ml-a--nb-v3")
    decision = decide(paused, WorkspaceResumeRequested(WS, "alice"), NOW)
    assert decision.commands == (Provision(WS),)
    assert not any(isinstance(c, Restore) for c in decision.commands)


def test_a_failed_fresh_start_is_a_failed_resume_that_may_be_retried() -> None:
    paused = decide(_running(), WorkspacePauseRequested(WS, "alice"), NOW).workspace
    assert paused is not None
    resuming = decide(paused, WorkspaceResumeRequested(WS, "alice"), NOW).workspace
    assert resuming is not None
    failed = decide(resuming, WorkspaceRuntimeFailed(WS, "provision", "no room"), NOW)
    assert failed.accepted and failed.reason == Reason.RESUME_FAILED
    assert failed.workspace is not None and failed.workspace.state == State.FAILED
    again = decide(failed.workspace, WorkspaceResumeRequested(WS, "alice"), NOW)
    assert again.accepted and again.commands == (Provision(WS),)


def test_no_checkpoint_and_a_preemption_keeps_only_the_home() -> None:
    ws = _running()
    checkpoint = decide(ws, WorkspaceScheduled(WS, 2, "checkpoint"), NOW)
    assert not checkpoint.accepted and checkpoint.reason == Reason.MEMORY_SNAPSHOTS_OFF
    preempt = decide(ws, WorkspaceScheduled(WS, 2, "preempt", for_workspace="ml-b--x"),
                     NOW)
    assert preempt.accepted and preempt.commands == (Release(WS),)
    assert preempt.workspace is not None and preempt.workspace.state == State.QUEUED
    assert preempt.workspace.paused_home_only
    lost = decide(ws, WorkspacePreempted(WS, node="n1", cause="server_lost",
                                         preempted_at=NOW.isoformat()), NOW)
    assert lost.accepted and lost.reason == Reason.PAUSED_HOME_ONLY
    assert lost.workspace is not None and lost.workspace.state == State.PAUSED


def test_the_front_doors_say_the_pause_keeps_only_the_home() -> None:
    ws = dataclasses.replace(_running(), memory_snapshots=True)
    off = Catalog.from_config(_config(env=True))
    preview = frontdoor.preview_transition(off, ws, WorkspacePauseRequested(WS, "alice"), {},
                                           NOW)
    assert preview.refusal is None
    assert preview.notices == (frontdoor.PAUSE_HOME_ONLY,)
    assert "keeps only the home disk: kernels start fresh on resume" in preview.notices[0]
    usual = frontdoor.preview_transition(Catalog.from_config(CONFIG), ws,
                                         WorkspacePauseRequested(WS, "alice"), {}, NOW)
    assert usual.notices == ()


# -- the handler --------------------------------------------------------------------------


def _event(payload: Any) -> Any:
    return new_event(payload, source="//test")


def test_the_handler_pauses_without_a_snapshot_record_and_resumes_fresh() -> None:
    states_at_release: list[str] = []

    class Watching(RecordingRuntime):
        def release(self, workspace_id: str) -> None:
            doc = deps.store.db.get("workspaces", workspace_id)
            states_at_release.append(doc["state"])
            super().release(workspace_id)

    db = MemoryDb()
    db.put("teams", "ml-a", {"id": "ml-a", "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    deps = handler_deps(Catalog.from_config(_config(env=True)), db=db, runtime=Watching())
    lifecycle.handle(_event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small")), deps,
                     "on_workspace_requested")
    lifecycle.handle(_event(WorkspaceReady(WS, "http://nb", "h")), deps, "on_workspace_ready")
    assert deps.store.db.get("workspaces", WS)["memory_snapshots"] is False

    decision = lifecycle.handle(_event(WorkspacePauseRequested(WS, "alice")), deps,
                                "on_pause_requested")
    assert decision is not None and decision.reason == Reason.PAUSED_HOME_ONLY
    assert not any(c[0] == "snapshot" for c in deps.runtime.calls)
    # Released before PAUSED was committed, then again from the outbox.
    assert states_at_release == ["RUNNING", "PAUSED"]
    doc = deps.store.db.get("workspaces", WS)
    assert (doc["state"], doc["paused_home_only"], doc["current_snapshot"]) == (
        "PAUSED", True, None)
    assert "keeps only the home disk" in doc["state_message"]
    assert deps.store.db.collection("snapshots") == {}
    assert deps.store.db.get("teams", "ml-a")["usage"]["snapshot_bytes"] == 0

    lifecycle.handle(_event(WorkspaceResumeRequested(WS, "alice")), deps,
                     "on_resume_requested")
    assert not any(c[0] == "restore" for c in deps.runtime.calls)
    assert [c[0] for c in deps.runtime.calls if c[0] == "provision"] == ["provision"] * 2
    lifecycle.handle(_event(WorkspaceReady(WS, "http://nb", "h")), deps, "on_workspace_ready")
    doc = deps.store.db.get("workspaces", WS)
    assert (doc["state"], doc["paused_home_only"]) == ("RUNNING", False)
    assert [(c.to_state, c.reason) for c in published(deps, "workspace.state_changed")] == [
        ("PROVISIONING", "created"), ("RUNNING", "ready"), ("PAUSED", "paused_home_only"),
        ("RESUMING", "resume_started"), ("RUNNING", "resumed")]


def test_a_refused_pause_stops_nothing() -> None:
    db = MemoryDb()
    db.put("teams", "ml-a", {"id": "ml-a", "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    deps = handler_deps(Catalog.from_config(_config(team=True)), db=db)
    lifecycle.handle(_event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small")), deps,
                     "on_workspace_requested")
    lifecycle.handle(_event(WorkspaceReady(WS, "http://nb", "h")), deps, "on_workspace_ready")
    forged = new_event(WorkspacePauseRequested(WS, "mallory"), source="//stasis/chatops")
    decision = lifecycle.handle(dataclasses.replace(forged, origin="chat"), deps,
                                "on_pause_requested")
    assert decision is not None and decision.reason == Reason.NOT_PERMITTED
    assert not any(c[0] == "release" for c in deps.runtime.calls)
    assert deps.store.db.get("workspaces", WS)["state"] == "RUNNING"


def test_a_fresh_start_the_agent_restart_cut_short_stays_paused() -> None:
    paused = decide(_running(), WorkspacePauseRequested(WS, "alice"), NOW).workspace
    assert paused is not None
    resuming = decide(paused, WorkspaceResumeRequested(WS, "alice"), NOW).workspace
    assert resuming is not None
    cut = decide(resuming, WorkspaceRuntimeFailed(
        WS, "provision", "node agent restarted during the provision", cause="interrupted"), NOW)
    assert cut.accepted and cut.reason == Reason.RESUME_INTERRUPTED
    assert cut.workspace is not None and cut.workspace.state == State.PAUSED
    assert cut.workspace.paused_home_only  # its next resume is a fresh start again
    assert decide(cut.workspace, WorkspaceResumeRequested(WS, "alice"), NOW).commands == (
        Provision(WS),)
