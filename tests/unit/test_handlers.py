"""Every handler against the in-memory ledger and stores (``tests/store_fakes.py``) and
recording runtimes: what it writes, what it asks the runtime, what it tells the bus, and
that a redelivery has one effect. The fake keeps the Firestore adapter's contract
(``tests/integration/test_ledger_contract.py``); the emulator tests of each family stay.

Also the pipeline's outbox: every command type travels as its name and fields and comes
back as the same dataclass.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from store_fakes import (
    NOW,
    Clock,
    MemoryDb,
    RecordingJobRuntime,
    RecordingRuntime,
    handler_deps,
    published,
)

from events import (
    SandboxFinished,
    SandboxRequested,
    SnapshotExpired,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspaceIdleDetected,
    WorkspacePauseRequested,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import JobFinished, JobSubmitted
from functions.domain import idle as idle_rules
from functions.domain.catalog import Catalog
from functions.domain.jobs import CancelJob, StartJob
from functions.domain.lifecycle import (
    Destroy,
    DiscardSnapshot,
    Provision,
    Release,
    Restore,
    Schedule,
    Snapshot,
    State,
    Workspace,
)
from functions.domain.sandboxes import (
    CleanUpSandbox,
    ReleaseSandbox,
    ResumeSandbox,
    StartSandbox,
    SuspendSandbox,
)
from functions.handlers import idle, janitor, jobs, lifecycle, pipeline, reconciler, sandboxes
from functions.handlers.commands import EXECUTORS, Context
from functions.ports import OutboxUnsent, RuntimeUnavailable

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))
WS = "ml-a--nb"


def _event(payload: Any, requestid: str | None = None) -> Any:
    return new_event(payload, source="//test", requestid=requestid)


def _deps(**kw: Any) -> Any:
    db = MemoryDb()
    db.put("teams", "ml-a", {"id": "ml-a", "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    db.put("teams", "ml-b", {"id": "ml-b", "usage": {"workspaces": 1, "gpus": 1, "tpus": 0,
                                                     "snapshot_bytes": 0}})
    return handler_deps(CATALOG, db=db, **kw)


def _doc(deps: Any, collection: str, doc_id: str) -> dict[str, Any] | None:
    doc: dict[str, Any] | None = deps.store.db.get(collection, doc_id)
    return doc


def _usage(deps: Any, team: str = "ml-a") -> dict[str, int]:
    return (_doc(deps, "teams", team) or {})["usage"]  # type: ignore[no-any-return]


def _running(deps: Any) -> Any:
    """A workspace of team ml-a, requested and reported ready."""
    requested = _event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small"), "req-create")
    lifecycle.handle(requested, deps, "on_workspace_requested")
    lifecycle.handle(_event(WorkspaceReady(WS, url="http://nb", runtime_handle="h"),
                            "req-create"), deps, "on_workspace_ready")
    return requested


# -- workspaces ---------------------------------------------------------------------------------


def test_a_request_provisions_once_and_tells_its_state_change() -> None:
    deps = _deps()
    event = _event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small"))
    decision = lifecycle.handle(event, deps, "on_workspace_requested")
    assert decision is not None and decision.accepted
    assert deps.runtime.calls == [("provision", WS)]
    doc = _doc(deps, "workspaces", WS)
    assert doc is not None and (doc["state"], doc["version"]) == ("PROVISIONING", 1)
    assert _usage(deps)["workspaces"] == 1
    [change] = [e for e in deps.bus.events if e.name == "workspace.state_changed"]
    assert (change.id, change.requestid) == (f"{WS}-v1", event.requestid)
    assert (change.payload.from_state, change.payload.to_state) == (None, "PROVISIONING")
    [entry] = deps.store.entries()
    assert (entry["status"], entry["outbox"], entry["workspace_id"]) == ("done", [], WS)
    assert entry["outcome"] == {"accepted": True, "reason": "created", "message": "",
                                "state": "PROVISIONING"}
    [audit] = deps.store.db.collection("audit").values()
    assert (audit["actor"], audit["outcome"], audit["team"]) == ("alice", "accepted: created",
                                                                 "ml-a")

    # The same request again (a redelivery or a retry): nothing decided, nothing sent.
    assert lifecycle.handle(event, deps, "on_workspace_requested") is None
    assert deps.runtime.calls == [("provision", WS)]
    assert len(published(deps, "workspace.state_changed")) == 1
    assert _usage(deps)["workspaces"] == 1


def test_a_refused_provision_is_reported_as_the_runtime_would() -> None:
    deps = _deps(runtime=RecordingRuntime(refuse="this node has no nvidia-l4"))
    event = _event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small"))
    lifecycle.handle(event, deps, "on_workspace_requested")
    [failed] = [e for e in deps.bus.events if e.name == "workspace.runtime_failed"]
    assert failed.requestid == event.requestid
    assert (failed.payload.operation, failed.payload.reason) == (
        "provision", "this node has no nvidia-l4")
    lifecycle.handle(failed, deps, "on_runtime_failed")
    assert _doc(deps, "workspaces", WS)["state"] == "FAILED"  # type: ignore[index]
    assert _usage(deps)["workspaces"] == 0  # FAILED holds no slot


def test_a_request_over_the_gpu_quota_waits_queued_holding_only_its_slot() -> None:
    deps = _deps(runtime=RecordingRuntime(accelerators={"nvidia-l4": 4}))
    event = _event(WorkspaceRequested("ml-b", "carol", "gpu", "gpu-small"))
    decision = lifecycle.handle(event, deps, "on_workspace_requested")
    assert decision is not None and decision.reason == "queued"
    doc = _doc(deps, "workspaces", "ml-b--gpu")
    assert doc is not None and doc["state"] == "QUEUED" and doc["queued_for"] == "create"
    assert "team ml-b uses 1/1 GPUs" in doc["state_message"]
    assert deps.runtime.calls == []
    assert _usage(deps, "ml-b") == {"workspaces": 2, "gpus": 1, "tpus": 0, "snapshot_bytes": 0}
    [change] = published(deps, "workspace.state_changed")
    assert (change.to_state, change.reason) == ("QUEUED", "queued")


def test_a_request_over_quota_on_a_refusing_profile_is_recorded_failed_and_holds_nothing(
) -> None:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    gpu = next(p for p in config["profiles"] if p["id"] == "gpu-small")
    gpu["scheduling"] = {"when_full": "refuse"}
    deps = _deps(runtime=RecordingRuntime(accelerators={"nvidia-l4": 4}))
    deps.catalog = lambda: Catalog.from_config(config)
    event = _event(WorkspaceRequested("ml-b", "carol", "gpu", "gpu-small"))
    decision = lifecycle.handle(event, deps, "on_workspace_requested")
    assert decision is not None and decision.reason == "admission_refused"
    assert "1/1 GPUs" in decision.message
    doc = _doc(deps, "workspaces", "ml-b--gpu")
    assert doc is not None and doc["state"] == "FAILED" and "1/1 GPUs" in doc["state_message"]
    assert deps.runtime.calls == []
    assert _usage(deps, "ml-b") == {"workspaces": 1, "gpus": 1, "tpus": 0, "snapshot_bytes": 0}
    [change] = published(deps, "workspace.state_changed")
    assert (change.to_state, change.reason) == ("FAILED", "admission_refused")


def test_a_pause_releases_the_hardware_before_paused_is_committed() -> None:
    states_at_release: list[str] = []

    class Watching(RecordingRuntime):
        def release(self, workspace_id: str) -> None:
            states_at_release.append(_doc(deps, "workspaces", workspace_id)["state"])  # type: ignore[index]
            super().release(workspace_id)

    deps = _deps(runtime=Watching())
    _running(deps)
    lifecycle.handle(_event(WorkspacePauseRequested(WS, "alice")), deps, "on_pause_requested")
    [snapshot_call] = [c for c in deps.runtime.calls if c[0] == "snapshot"]
    snapshot_id = snapshot_call[2]
    done = _event(SnapshotFinished(WS, snapshot_id, True, bytes=1000, uri="gs://b/s"))
    lifecycle.handle(done, deps, "on_snapshot_finished")
    # Released first on a plain read (still PAUSING), then again from the outbox.
    assert states_at_release == ["PAUSING", "PAUSED"]
    doc = _doc(deps, "workspaces", WS)
    assert doc is not None and (doc["state"], doc["current_snapshot"]) == ("PAUSED", snapshot_id)
    record = _doc(deps, "snapshots", snapshot_id)
    assert record is not None and (record["bytes"], record["status"]) == (1000, "ready")
    assert _usage(deps)["snapshot_bytes"] == 1000
    assert [c.to_state for c in published(deps, "workspace.state_changed")] == [
        "PROVISIONING", "RUNNING", "PAUSING", "PAUSED"]


def test_a_delete_destroys_then_records_deleted_through_the_same_pipeline() -> None:
    deps = _deps()
    _running(deps)
    event = _event(WorkspaceDeleteRequested(WS, "alice", keep_home=True))
    lifecycle.handle(event, deps, "on_delete_requested")
    assert deps.runtime.calls[-1] == ("destroy", WS, "keep_home")
    assert deps.snapshots.discarded == [(WS, "*")]  # the profile's snapshots go with it
    assert _doc(deps, "workspaces", WS)["state"] == "DELETED"  # type: ignore[index]
    consumers = {e["consumer"] for e in deps.store.entries()}
    assert {"on_delete_requested", "internal-destroyed"} <= consumers
    changes = {(c.version, c.to_state) for c in published(deps, "workspace.state_changed")}
    assert {(3, "DELETING"), (4, "DELETED")} <= changes
    assert _usage(deps)["workspaces"] == 0


def test_a_deleted_workspace_revokes_its_links_and_a_new_one_is_another_incarnation() -> None:
    deps = _deps()
    _running(deps)
    first = _doc(deps, "workspaces", WS)
    assert first is not None and str(first["incarnation"]).startswith("inc-")
    link = {"link_id": "lnk-0123456789abcdef", "workspace": WS, "team": "ml-a",
            "creator": "alice", "scope": "exec", "incarnation": first["incarnation"],
            "revoked_at": None}
    deps.store.db.put("links", "a" * 64, link)
    deps.store.db.put("links", "b" * 64, {**link, "workspace": "ml-a--other"})
    lifecycle.handle(_event(WorkspaceDeleteRequested(WS, "alice")), deps, "on_delete_requested")
    revoked = _doc(deps, "links", "a" * 64)
    assert revoked is not None and revoked["revoked_at"] is not None
    assert (revoked["revoked_by"], revoked["revoke_reason"]) == ("stasis", "workspace_deleted")
    assert _doc(deps, "links", "b" * 64)["revoked_at"] is None  # type: ignore[index]
    again = _event(WorkspaceRequested("ml-a", "bob", "nb", "cpu-small"), "req-again")
    lifecycle.handle(again, deps, "on_workspace_requested")  # the same id, by someone else
    second = _doc(deps, "workspaces", WS)
    assert second is not None and (second["state"], second["owner"]) == ("PROVISIONING", "bob")
    assert second["incarnation"] != first["incarnation"]


def test_an_outbox_that_failed_midway_is_sent_again_by_the_redelivery() -> None:
    class Flaky(RecordingRuntime):
        def provision(self, spec: Any) -> None:
            super().provision(spec)
            if len(self.calls) == 1:
                raise RuntimeUnavailable("node agent unreachable")

    deps = _deps(runtime=Flaky())
    event = _event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-small"))
    with pytest.raises(OutboxUnsent) as unsent:
        lifecycle.handle(event, deps, "on_workspace_requested")
    assert isinstance(unsent.value.__cause__, RuntimeUnavailable)
    [entry] = deps.store.entries()
    assert entry["status"] == "pending" and [i.get("command") for i in entry["outbox"]] == [
        "Provision", None]
    assert published(deps, "workspace.state_changed") == []  # the rest of the outbox waits
    assert lifecycle.handle(event, deps, "on_workspace_requested") is None  # decided before
    assert deps.runtime.calls == [("provision", WS), ("provision", WS)]
    assert len(published(deps, "workspace.state_changed")) == 1
    assert [e["status"] for e in deps.store.entries()] == ["done"]


def test_a_replayed_outbox_does_not_release_the_resume_that_followed() -> None:
    """A crash between PAUSED's commit and mark-done: the redelivered snapshot.finished
    sends its outbox again after the owner resumed. Its Release must not withdraw that
    resume (the chaos test found workspaces left RESUMING so), and nothing of the
    replayed outbox may start or stop a server."""
    class LosesTheSecondRelease(RecordingRuntime):
        def release(self, workspace_id: str) -> None:
            super().release(workspace_id)
            if sum(c[0] == "release" for c in self.calls) == 2:  # the outbox's, after commit
                raise RuntimeUnavailable("function host killed")

    deps = _deps(runtime=LosesTheSecondRelease())
    _running(deps)
    lifecycle.handle(_event(WorkspacePauseRequested(WS, "alice")), deps, "on_pause_requested")
    [snapshot_call] = [c for c in deps.runtime.calls if c[0] == "snapshot"]
    done = _event(SnapshotFinished(WS, snapshot_call[2], True, bytes=1000, uri="gs://b/s"))
    with pytest.raises(OutboxUnsent):
        lifecycle.handle(done, deps, "on_snapshot_finished")
    assert _doc(deps, "workspaces", WS)["state"] == "PAUSED"  # type: ignore[index]
    lifecycle.handle(_event(WorkspaceResumeRequested(WS, "alice")), deps, "on_resume_requested")
    assert _doc(deps, "workspaces", WS)["state"] == "RESUMING"  # type: ignore[index]
    calls = list(deps.runtime.calls)
    assert calls[-1][0] == "restore"
    assert lifecycle.handle(done, deps, "on_snapshot_finished") is None  # the redelivery
    assert deps.runtime.calls == calls  # no release of the resuming workspace
    assert _doc(deps, "workspaces", WS)["state"] == "RESUMING"  # type: ignore[index]
    assert [e["status"] for e in deps.store.entries()
            if e["consumer"] == "on_snapshot_finished"] == ["done"]


def test_a_resume_whose_deliveries_were_spent_is_relayed_by_the_reconciler() -> None:
    """The node agent away for longer than the resume's deliveries (the chaos run's seed 88
    dead-lettered one and left the workspace RESUMING): the decision is committed, so the
    reconciler hands the entry's event back to its consumer, which sends the Restore."""
    class Away(RecordingRuntime):
        away = True

        def restore(self, spec: Any, snapshot_id: str, **kw: Any) -> None:
            super().restore(spec, snapshot_id, **kw)
            if self.away:
                raise RuntimeUnavailable("node agent unreachable")

    clock = Clock()
    deps = handler_deps(CATALOG, db=_deps().store.db, runtime=Away(), clock=clock)
    _running(deps)
    lifecycle.handle(_event(WorkspacePauseRequested(WS, "alice")), deps, "on_pause_requested")
    [snapshot_call] = [c for c in deps.runtime.calls if c[0] == "snapshot"]
    lifecycle.handle(_event(SnapshotFinished(WS, snapshot_call[2], True, bytes=10,
                                             uri="gs://b/s")), deps, "on_snapshot_finished")
    resume = _event(WorkspaceResumeRequested(WS, "alice"))
    for _ in range(3):  # its deliveries, all while the agent is away
        with pytest.raises(OutboxUnsent):
            lifecycle.handle(resume, deps, "on_resume_requested")
    restores = sum(c[0] == "restore" for c in deps.runtime.calls)
    assert restores == 3 and _doc(deps, "workspaces", WS)["state"] == "RESUMING"  # type: ignore[index]

    clock.advance(seconds=60)  # too soon: a redelivery may still be on its way
    assert reconciler.reconcile(deps).relays == []
    clock.advance(seconds=90)
    assert [r.consumer for r in reconciler.reconcile(deps, fix=False).relays] == [
        "on_resume_requested"]
    assert sum(c[0] == "restore" for c in deps.runtime.calls) == restores  # a dry run
    relayed = reconciler.reconcile(deps)  # still away: tried, left pending
    assert len(relayed.relays) == 1 and sum(c[0] == "restore" for c in deps.runtime.calls) == 4
    deps.runtime.away = False  # type: ignore[attr-defined]
    assert len(reconciler.reconcile(deps).relays) == 1
    assert deps.runtime.calls[-1][0] == "restore"
    assert [e["status"] for e in deps.store.entries()
            if e["consumer"] == "on_resume_requested"] == ["done"]
    assert deps.store.pending() == [] and reconciler.reconcile(deps).relays == []
    assert _doc(deps, "workspaces", WS)["state"] == "RESUMING"  # type: ignore[index]


def test_a_relay_gives_up_after_a_day_and_skips_internal_entries() -> None:
    from functions.domain.reconcile import relays_due

    pending = [("a", "on_resume_requested", NOW - timedelta(minutes=3)),
               ("b", "internal-destroyed", NOW - timedelta(minutes=3)),
               ("c", "on_job_submitted", NOW - timedelta(days=2)),
               ("d", "on_pause_requested", NOW - timedelta(seconds=30))]
    due, given_up = relays_due(pending, {"on_resume_requested", "on_job_submitted",
                                         "on_pause_requested"}, NOW)
    assert [r.key for r in due] == ["a"] and [r.key for r in given_up] == ["c"]
    assert due[0].why == "outbox unsent for 180s"


def test_a_provision_or_restore_replayed_after_a_pause_starts_nothing() -> None:
    deps = _deps()
    _running(deps)
    lifecycle.handle(_event(WorkspacePauseRequested(WS, "alice")), deps, "on_pause_requested")
    [snapshot_call] = [c for c in deps.runtime.calls if c[0] == "snapshot"]
    lifecycle.handle(_event(SnapshotFinished(WS, snapshot_call[2], True, bytes=10,
                                             uri="gs://b/s")), deps, "on_snapshot_finished")
    calls = list(deps.runtime.calls)
    context = Context(deps, _event(WorkspacePauseRequested(WS, "alice")), "//test",
                      lambda again, consumer: None)
    for command in (Provision(WS), Restore(WS, snapshot_call[2])):
        EXECUTORS[type(command)](command, context)  # as a replayed outbox would
    assert deps.runtime.calls == calls
    EXECUTORS[Release](Release(WS), context)  # a release still applies to a paused one
    assert deps.runtime.calls == [*calls, ("release", WS)]


# -- sandboxes ----------------------------------------------------------------------------------


def test_every_recorded_sandbox_change_is_told_and_the_promoted_one_too() -> None:
    deps = _deps()
    deps.store.db.put("catalog", "current", {"sandboxes": {"concurrency": 1}})
    for sandbox_id in ("sbx-1", "sbx-2"):
        sandboxes.handle(_event(SandboxRequested(sandbox_id, "ml-a", "alice", "/r", "true"),
                                f"req-{sandbox_id}"), deps, "on_sandbox_requested")
    sandboxes.handle(_event(SandboxFinished("sbx-1", True, exit_status=0), "req-sbx-1"),
                     deps, "on_sandbox_finished")
    changes = [(c.sandbox_id, c.from_state, c.to_state, c.version)
               for c in published(deps, "sandbox.state_changed")]
    assert changes == [("sbx-1", None, "RUNNING", 1), ("sbx-2", None, "QUEUED", 1),
                       ("sbx-1", "RUNNING", "SUCCEEDED", 2), ("sbx-2", "QUEUED", "RUNNING", 2)]
    assert [s.sandbox_id for s in deps.sandboxes.runtime.started] == ["sbx-1", "sbx-2"]
    assert deps.sandboxes.runtime.cleaned == [("sbx-1", "ml-a")]
    entry = next(e for e in deps.store.entries() if e["consumer"] == "on_sandbox_finished")
    assert entry["outcome"]["started"] == ["sbx-2"] and entry["sandbox_id"] == "sbx-1"


def test_a_sandbox_event_without_sandboxes_configured_decides_nothing() -> None:
    deps = dataclasses.replace(_deps(), sandboxes=None)
    with pytest.raises(RuntimeError, match="sandboxes are not configured"):
        sandboxes.handle(_event(SandboxRequested("sbx-1", "ml-a", "alice", "/r", "true")),
                         deps, "on_sandbox_requested")
    assert deps.store.entries() == []


# -- jobs ---------------------------------------------------------------------------------------


def _submitted(job_id: str, *, runtime: str = "kubernetes", hosts: int = 1,
               profile: str = "tpu-v5e-8") -> Any:
    return _event(JobSubmitted(job_id=job_id, team="ml-a", owner="alice", profile=profile,
                               hosts=hosts, workspace_id=WS, runtime=runtime,
                               payload_uri=f"gs://bucket/jobs/ml-a/{job_id}/payload.pkl"),
                  f"submit-{job_id}")


def test_a_kubernetes_job_is_started_once_admitted_and_released_when_it_ends() -> None:
    cluster = RecordingJobRuntime()
    deps = _deps(job_runtime=cluster)
    event = _submitted("job-a")
    decision = jobs.handle(event, deps, "on_job_submitted")
    assert decision is not None and decision.accepted
    [run] = cluster.started
    assert (run.job_id, run.hosts, run.requestid, run.image) == (
        "job-a", 1, "submit-job-a", None)  # no workspace document: the runtime's image
    assert _usage(deps)["tpus"] == 8
    assert jobs.handle(event, deps, "on_job_submitted") is None and len(cluster.started) == 1

    jobs.handle(_event(JobFinished("job-a", True, exit_status=0)), deps, "on_job_finished")
    assert cluster.cancelled == [("job-a", "ml-a")]
    assert _usage(deps)["tpus"] == 0
    assert [(c.job_id, c.from_state, c.to_state) for c in published(deps, "job.state_changed")
            ] == [("job-a", None, "RUNNING"), ("job-a", "RUNNING", "SUCCEEDED")]


def test_a_local_job_is_only_booked_and_a_refusal_is_told_too() -> None:
    cluster = RecordingJobRuntime()
    deps = _deps(job_runtime=cluster)
    jobs.handle(_submitted("job-l", runtime="local", profile="cpu-small"), deps,
                "on_job_submitted")
    refused = jobs.handle(_submitted("job-big", hosts=2), deps, "on_job_submitted")
    assert refused is not None and not refused.accepted and "needs 16" in refused.message
    assert cluster.started == []
    assert [(c.job_id, c.to_state) for c in published(deps, "job.state_changed")] == [
        ("job-l", "RUNNING"), ("job-big", "REFUSED")]
    assert _doc(deps, "jobs", "job-big")["state"] == "REFUSED"  # type: ignore[index]


def test_a_kubernetes_job_without_a_job_runtime_fails_to_start() -> None:
    deps = _deps(job_runtime=None)
    jobs.handle(_submitted("job-k"), deps, "on_job_submitted")
    [failed] = [e for e in deps.bus.events if e.name == "job.finished"]
    assert (failed.payload.termination, failed.requestid) == ("failed_to_start",
                                                              "start-failed-job-k")
    assert "no Kubernetes job runtime" in (failed.payload.error or "")
    jobs.handle(failed, deps, "on_job_finished")
    assert _doc(deps, "jobs", "job-k")["state"] == "FAILED"  # type: ignore[index]
    assert _usage(deps)["tpus"] == 0


# -- idle ---------------------------------------------------------------------------------------


def _idle_report(deps: Any, idle_for: timedelta, busy_kernels: int = 0) -> Any:
    now = deps.clock()
    return _event(WorkspaceIdleDetected(WS, last_activity=(now - idle_for).isoformat(),
                                        observed_at=now.isoformat(), busy_kernels=busy_kernels))


def test_an_idle_workspace_is_asked_to_pause_once_per_version() -> None:
    clock = Clock(NOW)
    deps = _deps(clock=clock)
    _running(deps)
    clock.advance(hours=3)
    verdict = idle.handle(_idle_report(deps, timedelta(hours=2)), deps, "on_idle_detected")
    assert verdict is not None and verdict.pause
    [pause] = [e for e in deps.bus.events if e.name == "workspace.pause_requested"]
    ws = Workspace.from_doc(_doc(deps, "workspaces", WS))  # type: ignore[arg-type]
    assert (pause.payload.cause, pause.payload.actor) == ("idle", idle_rules.ACTOR)
    assert pause.requestid == idle_rules.pause_request_id(ws)
    assert "idle" in pause.payload.detail
    lifecycle.handle(pause, deps, "on_pause_requested")
    lifecycle.handle(pause, deps, "on_pause_requested")  # the next sweep's: one pause
    assert [c[0] for c in deps.runtime.calls].count("snapshot") == 1


def test_a_busy_or_unknown_workspace_is_not_paused() -> None:
    clock = Clock(NOW)
    deps = _deps(clock=clock)
    _running(deps)
    clock.advance(hours=3)
    busy = idle.handle(_idle_report(deps, timedelta(hours=2), busy_kernels=1), deps,
                       "on_idle_detected")
    assert busy is not None and not busy.pause
    unknown = _event(WorkspaceIdleDetected("ml-a--ghost", NOW.isoformat(), NOW.isoformat()))
    assert idle.handle(unknown, deps, "on_idle_detected") is None
    assert published(deps, "workspace.pause_requested") == []


def _with_profile(catalog: Catalog, profile_id: str) -> Catalog:
    """``catalog`` as an admin would apply it with one more profile, offered to ml-a."""
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    quick = {**next(p for p in config["profiles"] if p["id"] == "cpu-small"), "id": profile_id,
             "idle_policy": {"rules": [{"idle_seconds": 1, "effect": "pause"}]}}
    config["profiles"].append(quick)
    next(t for t in config["teams"] if t["id"] == "ml-a")["profiles"].append(profile_id)
    return Catalog.from_config(config)


def test_a_profile_applied_since_the_cache_was_read_is_found_not_refused_or_ignored() -> None:
    # One worker's cached catalog predates the admin's apply (bootstrap re-reads it every
    # CATALOG_TTL_SECONDS): the create and the idle report name a profile only the applied
    # catalog has. The handlers read it again instead of refusing the create or ignoring
    # the report (the CI failure of test_upkeep_e2e: an idle report ignored for 10 s).
    clock = Clock(NOW)
    deps = _deps(clock=clock)
    applied = _with_profile(CATALOG, "cpu-quick")
    reads: list[str] = []
    deps.refresh_catalog = lambda: reads.append("read") or applied
    event = _event(WorkspaceRequested("ml-a", "alice", "nb", "cpu-quick"), "req-create")
    decision = lifecycle.handle(event, deps, "on_workspace_requested")
    assert decision is not None and decision.accepted, decision
    assert reads == ["read"]
    lifecycle.handle(_event(WorkspaceReady(WS, url="http://nb", runtime_handle="h"),
                            "req-create"), deps, "on_workspace_ready")
    clock.advance(seconds=5)
    verdict = idle.handle(_idle_report(deps, timedelta(seconds=5)), deps, "on_idle_detected")
    assert verdict is not None and verdict.pause, verdict
    assert len(published(deps, "workspace.pause_requested")) == 1
    # A request the cached catalog knows reads nothing; one the applied catalog does not
    # know either is refused for what it names, after one read.
    reads.clear()
    lifecycle.handle(_event(WorkspaceRequested("ml-a", "alice", "nb2", "cpu-small")), deps,
                     "on_workspace_requested")
    assert reads == []
    refused = lifecycle.handle(_event(WorkspaceRequested("ml-a", "alice", "nb3", "cpu-huge")),
                               deps, "on_workspace_requested")
    assert refused is not None and refused.reason == "admission_refused"
    assert "cpu-huge" in refused.message and "cpu-quick" in refused.message  # the applied one
    assert reads == ["read"]


# -- the janitor --------------------------------------------------------------------------------


def _snapshot(deps: Any, snapshot_id: str, *, size: int = 500, days_old: int = 60) -> None:
    deps.store.db.put("snapshots", snapshot_id, {
        "workspace": WS, "team": "ml-a", "bytes": size, "status": "ready", "profile":
        "cpu-small", "created_at": NOW - timedelta(days=days_old),
        "expires_at": NOW - timedelta(days=days_old - 30)})
    deps.snapshots.objects[f"snapshots/ml-a/{WS}/{snapshot_id}/"] = size
    usage = _usage(deps)
    deps.store.db.put("teams", "ml-a", {"id": "ml-a", "usage": {
        **usage, "snapshot_bytes": usage["snapshot_bytes"] + size}})


def _expired(snapshot_id: str) -> Any:
    return _event(SnapshotExpired(snapshot_id=snapshot_id, workspace_id=WS, team="ml-a",
                                  uri=f"gs://bucket/snapshots/ml-a/{WS}/{snapshot_id}",
                                  bytes=500, reason="max_age"))


def test_the_janitor_expires_old_snapshots_and_releases_their_bytes_once() -> None:
    deps = _deps()
    deps.store.put_workspace(Workspace(WS, "ml-a", "alice", "nb", "cpu-small",
                                       state=State.PAUSED, current_snapshot=f"{WS}-v9"))
    _snapshot(deps, f"{WS}-v2")
    _snapshot(deps, f"{WS}-v9", days_old=1)  # the one resume restores
    report = janitor.run(deps, mode="policy")
    assert [e["snapshot_id"] for e in report["expire"]] == [f"{WS}-v2"]
    [expiry] = [e for e in deps.bus.events if e.name == "snapshot.expired"]
    assert janitor.handle_expired(expiry, deps, "on_snapshot_expired") == 500
    assert deps.snapshots.deleted == [f"snapshots/ml-a/{WS}/{WS}-v2/"]
    assert _doc(deps, "snapshots", f"{WS}-v2")["status"] == "expired"  # type: ignore[index]
    assert _usage(deps)["snapshot_bytes"] == 500
    assert janitor.handle_expired(expiry, deps, "on_snapshot_expired") == 0  # redelivered
    assert _usage(deps)["snapshot_bytes"] == 500


def test_the_janitor_never_expires_what_a_resume_restores() -> None:
    deps = _deps()
    deps.store.put_workspace(Workspace(WS, "ml-a", "alice", "nb", "cpu-small",
                                       state=State.PAUSED, current_snapshot=f"{WS}-v9"))
    _snapshot(deps, f"{WS}-v9")
    assert janitor.handle_expired(_expired(f"{WS}-v9"), deps, "on_snapshot_expired") == 0
    assert deps.snapshots.deleted == []
    assert _doc(deps, "snapshots", f"{WS}-v9")["status"] == "ready"  # type: ignore[index]


# -- the outbox ---------------------------------------------------------------------------------


COMMANDS = [Provision(WS), Snapshot(WS, f"{WS}-v3"), Release(WS), Restore(WS, f"{WS}-v3"),
            Destroy(WS, keep_home=True), DiscardSnapshot(WS, f"{WS}-v3"),
            Schedule("ml-a--nb gave back 1 x nvidia-l4"), StartSandbox("sbx-1"),
            ResumeSandbox("sbx-1"),
            SuspendSandbox("sbx-1", "ml-a", sequence=2, idle_seconds=600),
            CleanUpSandbox("sbx-1", "ml-a"), ReleaseSandbox("sbx-1", "ml-a"),
            StartJob("job-1", "ml-a", "alice", "tpu-v5e-8", 2, "gs://b/p.pkl", "4x4", WS),
            CancelJob("job-1", "ml-a")]


def test_every_command_has_an_executor_and_travels_as_its_type_and_fields() -> None:
    assert {type(c) for c in COMMANDS} == set(EXECUTORS)

    @dataclasses.dataclass(frozen=True)
    class Decided:
        commands: tuple[Any, ...]
        events: tuple[Any, ...] = ()

    outbox = pipeline.encode(Decided(tuple(COMMANDS)), source="//test", requestid="r")  # type: ignore[arg-type]
    assert outbox[0] == {"command": "Provision", "fields": {"workspace_id": WS}}
    assert outbox[-2]["fields"]["topology"] == "4x4"
    assert pipeline.decode(yaml.safe_load(yaml.safe_dump(outbox))) == COMMANDS


def test_an_outbox_item_nobody_knows_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(ValueError, match=r"unknown command.*Teleport"):
        pipeline.decode([{"command": "Teleport", "fields": {}}])
    with pytest.raises(ValueError, match="unknown command"):
        pipeline.decode([{"start": "sbx-1"}])  # the untyped shape of before
