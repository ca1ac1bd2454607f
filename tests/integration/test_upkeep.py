"""Idle auto-pause, retention, orphans and the cost rollup against the real emulators.

Firestore and fake-gcs-server are real; time comes from an injected clock; the runtime is
the null runtime (it answers through the bus as a real one does) and the node agent's
activity signals come from a table the test controls. Events published on the bus are
delivered in-process to the handlers ``functions/routes.py`` names, after a round trip
through their Pub/Sub form, as the push subscriptions deliver them. Every Firestore request
of the code under test goes through one client whose reads and writes are counted at the
RPC level (``harness.metering``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud import firestore

from events import (
    Event,
    SnapshotExpired,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    from_pubsub,
    new_event,
    to_pubsub,
)
from functions.adapters.firestore_store import FirestoreStore, workspace_to_doc
from functions.adapters.fleet_store import FleetStore
from functions.adapters.null_runtime import NullRuntime
from functions.adapters.snapshots import SnapshotStore, storage_client
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from functions.handlers import cost, idle, janitor
from functions.handlers.deps import Deps
from functions.routes import ROUTES
from harness.metering import FirestoreMeter
from stack import admin, topology
from stack.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml"
CONFIG = yaml.safe_load(EXAMPLE.read_text())
CATALOG = Catalog.from_config(CONFIG)
#: The consumers run in-process; chat notifications are someone else's.
DELIVERED = {"on_workspace_requested", "on_workspace_ready", "on_runtime_failed",
             "on_pause_requested", "on_snapshot_finished", "on_resume_requested",
             "on_delete_requested", "on_idle_detected", "on_snapshot_expired"}
GIB = 2**30


class Bus:
    """Records what is published; ``pump`` delivers it to the handlers."""

    def __init__(self) -> None:
        self.queue: list[Event[Any]] = []
        self.published: list[Event[Any]] = []

    def publish(self, event: Event[Any]) -> str:
        data, attributes = to_pubsub(event)  # the wire form, validated both ways
        wire = from_pubsub(data, attributes)
        self.queue.append(wire)
        self.published.append(wire)
        return event.id

    def dead_letter(self, consumer: str, data: bytes, attributes: dict[str, str], *,
                    reason: str, attempts: int, message_id: str = "") -> str:
        raise AssertionError(f"dead-lettered for {consumer}: {reason}")

    def named(self, name: str) -> list[Event[Any]]:
        return [e for e in self.published if e.name == name]


@dataclasses.dataclass
class Harness:
    db: firestore.Client
    meter: FirestoreMeter
    deps: Deps
    bus: Bus
    runtime: NullRuntime
    activity: dict[str, dict[str, Any]]
    now: datetime
    bases: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def tick(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now

    def pump(self) -> None:
        while self.bus.queue:
            event = self.bus.queue.pop(0)
            for route in ROUTES.values():
                if route.event == event.name and route.function in DELIVERED:
                    route.handler(event, self.deps, route.function)

    def publish(self, payload: Any) -> None:
        self.bus.publish(new_event(payload, source="//test"))
        self.pump()

    def create(self, name: str, profile: str = "cpu-small", team: str = "ml-a") -> Workspace:
        owner = {"ml-a": "alice", "ml-b": "carol"}[team]
        self.publish(WorkspaceRequested(team=team, owner=owner, name=name, profile=profile))
        ws = self.workspace(f"{team}--{name}")
        assert ws is not None and ws.state == State.RUNNING, ws
        return ws

    def workspace(self, ws_id: str) -> Workspace | None:
        return self.deps.store.get_workspace(ws_id)

    def doc(self, collection: str, doc_id: str) -> dict[str, Any]:
        snap = self.db.collection(collection).document(doc_id).get()
        assert snap.exists, f"{collection}/{doc_id}"
        return snap.to_dict() or {}

    def active(self, ws_id: str, *, idle_for: timedelta, busy: int = 0) -> None:
        """What the node agent reports for ``ws_id`` from now on."""
        self.activity[ws_id] = {"workspace_id": ws_id,
                                "last_activity": (self.now - idle_for).isoformat(),
                                "busy_kernels": busy, "connections": 1,
                                "observed_at": self.now.isoformat()}

    def sweep(self) -> dict[str, Any]:
        for signals in self.activity.values():
            signals["observed_at"] = self.now.isoformat()
        return idle.sweep(self.deps, activity=self.activity.get)


@pytest.fixture
def h(emulator_env: dict[str, str], tmp_path: Path) -> Iterator[Harness]:
    project, bucket = emulator_env["STASIS_PROJECT"], emulator_env["STASIS_SNAPSHOT_BUCKET"]
    admin.apply(Settings(project=project, data_dir=tmp_path), CONFIG, actor="test")
    topology.ensure_bucket(project, bucket)
    db = firestore.Client(project=project)
    meter = FirestoreMeter.install(db)
    bus = Bus()
    runtime = NullRuntime(bus)
    harness = Harness(db, meter, None, bus, runtime, {},  # type: ignore[arg-type]
                      datetime.now(UTC).replace(microsecond=0) + timedelta(days=1))
    harness.deps = Deps(
        store=FirestoreStore(db), bus=bus, runtime=runtime,
        snapshots=SnapshotStore(db, storage_client(project), bucket),
        catalog=lambda: CATALOG, clock=lambda: harness.now, snapshot_bucket=bucket,
        dead_letters=bus, fleet=FleetStore(db))
    yield harness


# --- idle ------------------------------------------------------------------------------------


def test_an_idle_workspace_is_paused_and_the_owner_told_why(h: Harness) -> None:
    ws = h.create("nb")
    h.tick(hours=2)
    h.active(ws.id, idle_for=timedelta(hours=1, minutes=55))
    report = h.sweep()
    assert [r["workspace_id"] for r in report["idle"]] == [ws.id]
    h.pump()
    doc = h.doc("workspaces", ws.id)
    assert (doc["state"], doc["pause_cause"]) == ("PAUSED", "idle")
    assert doc["state_message"].startswith("idle policy: no activity for 1h 55m; profile "
                                           "cpu-small pauses after 1h idle")
    changes = [e.payload for e in h.bus.named("workspace.state_changed")
               if e.payload.workspace_id == ws.id][-2:]
    assert [(c.to_state, c.reason) for c in changes] == [("PAUSING", "pause_started"),
                                                         ("PAUSED", "paused")]
    assert all(c.message == doc["state_message"] for c in changes)
    [pause] = h.bus.named("workspace.pause_requested")
    assert (pause.payload.actor, pause.payload.cause) == ("idle-policy", "idle")


def test_a_busy_kernel_is_never_paused(h: Harness) -> None:
    ws = h.create("busy")
    h.tick(hours=5)
    h.active(ws.id, idle_for=timedelta(hours=5), busy=1)
    before = h.doc("workspaces", ws.id)
    report = h.sweep()
    assert report["idle"] == [] and report["verdicts"] == {"busy": 1}
    h.pump()
    assert h.doc("workspaces", ws.id) == before
    assert h.bus.named("workspace.idle_detected") == []


def test_a_just_resumed_workspace_is_not_paused_on_a_stale_timestamp(h: Harness) -> None:
    ws = h.create("back")
    h.tick(minutes=30)
    h.publish(WorkspacePauseRequested(workspace_id=ws.id, actor="alice"))
    h.tick(days=3)
    h.publish(WorkspaceResumeRequested(workspace_id=ws.id, actor="alice"))
    assert h.doc("workspaces", ws.id)["state"] == "RUNNING"
    # The restored server says it was last active three days ago (kubeflow#6648).
    stale = timedelta(days=3, minutes=30)
    for minutes, verdict in ((5, "grace"), (25, "too_early")):
        h.tick(minutes=minutes)
        h.active(ws.id, idle_for=stale)
        assert h.sweep()["verdicts"] == {verdict: 1}
    h.pump()
    assert h.doc("workspaces", ws.id)["state"] == "RUNNING"
    h.tick(minutes=31)  # an hour since the resume: idle counts from the resume, not before
    h.active(ws.id, idle_for=stale)
    assert [r["workspace_id"] for r in h.sweep()["idle"]] == [ws.id]
    h.pump()
    assert h.doc("workspaces", ws.id)["state"] == "PAUSED"


def test_the_maximum_age_pauses_an_active_workspace(h: Harness) -> None:
    ws = h.create("long", profile="gpu-small")
    h.tick(hours=12, minutes=1)
    h.active(ws.id, idle_for=timedelta(minutes=1))
    report = h.sweep()
    assert report["verdicts"] == {"max_age": 1}
    h.pump()
    doc = h.doc("workspaces", ws.id)
    assert (doc["state"], doc["pause_cause"]) == ("PAUSED", "schedule")
    assert "running for 12h 1m, the most profile gpu-small allows (12h)" in doc["state_message"]
    assert h.doc("teams", "ml-a")["usage"]["gpus"] == 0  # the GPU went back


def test_repeated_sweeps_pause_once(h: Harness) -> None:
    ws = h.create("twice")
    h.tick(hours=3)
    h.active(ws.id, idle_for=timedelta(hours=2))
    h.sweep()
    h.sweep()  # before the first pause landed: same version, same request
    h.pump()
    assert len(h.bus.named("workspace.pause_requested")) == 2
    assert h.doc("workspaces", ws.id)["version"] == ws.version + 2  # PAUSING, PAUSED
    assert [c[0] for c in h.runtime.calls].count("snapshot") == 1


def _seed(h: Harness, count: int, state: State, *, prefix: str, since: datetime) -> list[str]:
    ids = []
    batch = h.db.batch()
    for i in range(count):
        name = f"{prefix}{i}"
        ws = Workspace(id=f"ml-a--{name}", team="ml-a", owner="alice", name=name,
                       profile="cpu-small", state=state, state_reason="ready", version=2,
                       created_at=since, updated_at=since, last_activity=since)
        batch.set(h.db.collection("workspaces").document(ws.id), workspace_to_doc(ws))
        ids.append(ws.id)
        if len(batch) == 500:
            batch.commit()
            batch = h.db.batch()
    if len(batch):
        batch.commit()
    return ids


def test_a_sweep_in_which_nothing_changed_writes_nothing(h: Harness) -> None:
    since = h.now - timedelta(hours=6)
    running = _seed(h, 1000, State.RUNNING, prefix="r", since=since)
    _seed(h, 1000, State.PAUSED, prefix="p", since=since)  # not candidates: never read
    for ws_id in running:
        h.active(ws_id, idle_for=timedelta(minutes=3))
    h.meter.reset()
    report = h.sweep()
    h.pump()
    assert (report["checked"], report["asked_runtime"], report["idle"]) == (1000, 1000, [])
    assert h.meter.writes == 0 and "commit" not in h.meter.calls
    assert h.meter.reads == 1000  # one query on state == RUNNING: the paused are not read
    assert h.bus.published == []
    # Three go idle: only their pauses write.
    h.tick(hours=1)
    for ws_id in running[:3]:
        h.active(ws_id, idle_for=timedelta(hours=1, minutes=1))
    for ws_id in running[3:]:
        h.active(ws_id, idle_for=timedelta(minutes=1))
    h.meter.reset()
    assert len(h.sweep()["idle"]) == 3
    h.pump()
    # PAUSING and PAUSED of each: the transition's transaction and its ledger marked done.
    assert h.meter.calls["commit"] == 3 * 2 * 2
    assert {h.doc("workspaces", i)["state"] for i in running[:3]} == {"PAUSED"}


# --- retention and orphans ---------------------------------------------------------------------


def _record(h: Harness, ws_id: str, version: int, *, days_old: float, size: int,
            objects: bool = True, status: str = "ready", profile: str = "cpu-small") -> str:
    snap_id = f"{ws_id}-v{version}"
    created = h.now - timedelta(days=days_old)
    h.db.collection("snapshots").document(snap_id).set({
        "workspace": ws_id, "team": ws_id.split("--")[0], "bytes": size, "status": status,
        "profile": profile, "created_at": created, "expires_at": created + timedelta(days=30),
        "uri": f"gs://{h.deps.snapshot_bucket}/snapshots/x"})
    if objects:
        _objects(h, ws_id, snap_id)
    return snap_id


def _objects(h: Harness, ws_id: str, snap_id: str) -> str:
    prefix = f"snapshots/{ws_id.split('--')[0]}/{ws_id}/{snap_id}/"
    bucket = storage_client("x").bucket(h.deps.snapshot_bucket)
    for name in ("k1/part-00000", "manifest.json"):
        bucket.blob(prefix + name).upload_from_string(b"x" * 10)
    return prefix


def _objects_under(h: Harness, prefix: str) -> int:
    client = storage_client("x")
    return len(list(client.list_blobs(client.bucket(h.deps.snapshot_bucket), prefix=prefix)))


def _usage(h: Harness, team: str, snapshot_bytes: int) -> None:
    h.db.collection("teams").document(team).update({"usage.snapshot_bytes": snapshot_bytes})


def _janitor(h: Harness, mode: str) -> dict[str, Any]:
    report = janitor.run(h.deps, mode=mode)
    h.pump()
    return report


def test_keep_last_n_and_max_age_expire_with_objects_and_counters(h: Harness) -> None:
    ws = h.create("keep")
    # cpu-small keeps 5 for 30 days: v1 is 40 days old, v2..v8 are recent.
    ids = [_record(h, ws.id, v, days_old=(40 if v == 1 else 10 - v), size=GIB)
           for v in range(1, 9)]
    _usage(h, "ml-a", 8 * GIB)
    report = _janitor(h, "report")
    assert {r["snapshot_id"]: r["reason"] for r in report["expire"]} == {
        ids[0]: "max_age", ids[1]: "keep_last", ids[2]: "keep_last"}
    assert h.doc("snapshots", ids[0])["status"] == "ready"  # report changes nothing
    report = _janitor(h, "policy")
    assert report["done"]["expiry_events"] == 3
    for snap_id, reason in ((ids[0], "max_age"), (ids[1], "keep_last")):
        doc = h.doc("snapshots", snap_id)
        assert (doc["status"], doc["expired_reason"]) == ("expired", reason)
        assert _objects_under(h, f"snapshots/ml-a/{ws.id}/{snap_id}/") == 0
    assert _objects_under(h, f"snapshots/ml-a/{ws.id}/{ids[3]}/") == 2
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 5 * GIB
    # A redelivered expiry changes nothing more.
    h.bus.publish(h.bus.named("snapshot.expired")[0])
    h.pump()
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 5 * GIB
    assert _janitor(h, "policy")["expire"] == []
    # Deleting the workspace releases what is left, not the expired bytes a second time.
    h.publish(WorkspaceDeleteRequested(workspace_id=ws.id, actor="alice"))
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 0
    assert h.doc("snapshots", ids[0])["status"] == "expired"
    assert h.doc("snapshots", ids[7])["status"] == "deleted"


def test_the_team_bytes_cap_expires_the_oldest_and_spares_the_current_snapshot(
        h: Harness) -> None:
    # ml-b may hold 20 GiB. a is paused on its (oldest) snapshot: it must survive.
    a, b, c = (h.create(f"ws{n}", team="ml-b") for n in "abc")
    h.publish(WorkspacePauseRequested(workspace_id=a.id, actor="carol"))
    current = h.doc("workspaces", a.id)["current_snapshot"]
    h.db.collection("snapshots").document(current).update(
        {"bytes": 8 * GIB, "created_at": h.now - timedelta(days=3)})
    _objects(h, a.id, current)
    old_b = _record(h, b.id, 1, days_old=2, size=8 * GIB)
    new_c = _record(h, c.id, 1, days_old=1, size=8 * GIB)
    _usage(h, "ml-b", 24 * GIB)
    report = _janitor(h, "policy")
    assert [(r["snapshot_id"], r["reason"]) for r in report["expire"]] == [(old_b, "team_bytes")]
    assert h.doc("snapshots", old_b)["status"] == "expired"
    assert h.doc("snapshots", current)["status"] == "ready"
    assert h.doc("snapshots", new_c)["status"] == "ready"
    assert h.doc("teams", "ml-b")["usage"]["snapshot_bytes"] == 16 * GIB
    # The current snapshot is refused even when asked for directly.
    assert janitor.handle_expired(new_event(
        janitor.SnapshotExpired(snapshot_id=current, workspace_id=a.id, team="ml-b", uri="u",
                                bytes=8 * GIB, reason="max_age")), h.deps, "test") == 0
    assert h.doc("snapshots", current)["status"] == "ready"


def test_orphans_seeded_both_ways_are_all_found_and_fixed(h: Harness) -> None:
    ws = h.create("orph")
    kept = _record(h, ws.id, 1, days_old=1, size=GIB)
    no_record = [_objects(h, ws.id, f"{ws.id}-v7"), _objects(h, "ml-b--gone", "ml-b--gone-v3")]
    leftover = _record(h, ws.id, 2, days_old=1, size=GIB, status="expired")  # objects stayed
    no_objects = [_record(h, ws.id, 3, days_old=1, size=GIB, objects=False),
                  _record(h, "ml-a--deleted", 1, days_old=1, size=2 * GIB, objects=False)]
    _usage(h, "ml-a", 4 * GIB)
    h.runtime.running.add("ml-a--nobody")  # a server whose workspace does not exist
    h.tick(hours=2)  # the seeded objects are old enough to judge
    report = _janitor(h, "report")
    assert sorted(o["prefix"] for o in report["orphan_objects"]) == sorted(
        [*no_record, f"snapshots/ml-a/{ws.id}/{leftover}/"])
    assert sorted(r["snapshot_id"] for r in report["orphan_records"]) == sorted(no_objects)
    assert [p["workspace_id"] for p in report["orphan_processes"]] == ["ml-a--nobody"]
    # The deleted workspace's record is also retention's (workspace_deleted): both agree.
    assert report["done"] == {"expiry_events": 0, "objects_deleted": 0, "parts_deleted": 0,
                              "released": 0}

    report = _janitor(h, "fix")
    assert report["done"]["objects_deleted"] == 6 and report["done"]["released"] == 1
    assert "ml-a--nobody" not in h.runtime.running
    for snap_id in no_objects:
        assert h.doc("snapshots", snap_id)["status"] == "expired"
    assert h.doc("snapshots", kept)["status"] == "ready"
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == GIB
    clean = _janitor(h, "report")
    assert (clean["orphan_objects"], clean["orphan_records"], clean["orphan_processes"],
            clean["expire"], clean["usage_drift"]) == ([], [], [], [], {})


def _pause_with_parts(h: Harness, ws_id: str, parts: dict[str, int]) -> str:
    """Pause ``ws_id`` with a runtime that reports a snapshot using these pool parts (named
    by their digest), after storing them and the manifest as the node agent would."""
    pool = f"snapshots/ml-a/{ws_id}/_parts/"
    bucket = storage_client("x").bucket(h.deps.snapshot_bucket)

    def snapshot(spec: Any, snapshot_id: str, **base: Any) -> None:
        h.runtime.calls.append(("snapshot", spec.workspace_id))
        h.bases.append(base)
        for name, size in parts.items():
            bucket.blob(pool + name).upload_from_string(b"p" * size)
        bucket.blob(f"{spec.snapshot_path(snapshot_id)}/manifest.json").upload_from_string(b"{}")
        h.bus.publish(new_event(SnapshotFinished(
            ws_id, snapshot_id, True, bytes=sum(parts.values()), manifest_sha256="ab" * 32,
            parts={pool + name: size for name, size in parts.items()}),
            source="//test", requestid=spec.requestid))

    h.runtime.snapshot = snapshot  # type: ignore[method-assign]
    h.publish(WorkspacePauseRequested(workspace_id=ws_id, actor="alice"))
    current: str = h.doc("workspaces", ws_id)["current_snapshot"]
    return current


def test_shared_parts_are_charged_once_and_deleted_when_no_snapshot_uses_them(
        h: Harness) -> None:
    ws = h.create("inc")
    h.bases = []
    pool = f"snapshots/ml-a/{ws.id}/_parts/"
    _usage(h, "ml-a", 0)
    first = _pause_with_parts(h, ws.id, {"a" * 64: 100, "b" * 64: 100})
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 200
    assert h.doc("snapshots", first)["manifest_sha256"] == "ab" * 32
    h.publish(WorkspaceResumeRequested(workspace_id=ws.id, actor="alice"))
    second = _pause_with_parts(h, ws.id, {"a" * 64: 100, "c" * 64: 50})

    # The second pause named the first as its base; only c is new to the team.
    assert h.bases[-1] == {"base": first, "base_manifest_sha256": "ab" * 32}
    assert h.doc("snapshots", second)["parts"] == {f"_parts/{'a' * 64}": 100,
                                                   f"_parts/{'c' * 64}": 50}
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 250
    # Expiring the first releases b alone, and deletes it: a is the second's too.
    released = janitor.handle_expired(new_event(SnapshotExpired(
        snapshot_id=first, workspace_id=ws.id, team="ml-a", uri="u", bytes=200,
        reason="keep_last"), source="//test"), h.deps, "test")
    assert released == 100
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 150
    assert _objects_under(h, pool) == 2 and _objects_under(h, pool + "b") == 0
    assert _objects_under(h, f"snapshots/ml-a/{ws.id}/{first}/") == 0
    # A part nobody recorded (a capture that failed) goes with the next janitor pass.
    storage_client("x").bucket(h.deps.snapshot_bucket).blob(pool + "f" * 64
                                                            ).upload_from_string(b"x")
    report = _janitor(h, "report")
    assert report["unused_parts"] == {ws.id: {"parts": 1, "bytes": 1}}
    assert report["usage_drift"] == {} and report["orphan_records"] == []
    assert _janitor(h, "policy")["done"]["parts_deleted"] == 1
    assert _objects_under(h, pool) == 2
    h.publish(WorkspaceDeleteRequested(workspace_id=ws.id, actor="alice"))
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 0
    assert _objects_under(h, f"snapshots/ml-a/{ws.id}/") == 0


def test_deleting_a_workspace_keeps_its_snapshots_only_when_the_policy_says_so(
        h: Harness) -> None:
    gone = h.create("gone")
    h.publish(WorkspacePauseRequested(workspace_id=gone.id, actor="alice"))
    snap = h.doc("workspaces", gone.id)["current_snapshot"]
    h.publish(WorkspaceDeleteRequested(workspace_id=gone.id, actor="alice"))
    assert h.doc("workspaces", gone.id)["state"] == "DELETED"
    assert h.doc("snapshots", snap)["status"] == "deleted"  # the default: they go with it

    config = copy.deepcopy(CONFIG)
    next(t for t in config["teams"] if t["id"] == "ml-a")["retention"] = {
        "delete_with_workspace": False}
    keeping = Catalog.from_config(config)
    h.deps.catalog = lambda: keeping
    kept = h.create("kept")
    h.publish(WorkspacePauseRequested(workspace_id=kept.id, actor="alice"))
    snap = h.doc("workspaces", kept.id)["current_snapshot"]
    h.publish(WorkspaceDeleteRequested(workspace_id=kept.id, actor="alice"))
    assert h.doc("workspaces", kept.id)["state"] == "DELETED"
    assert h.doc("snapshots", snap)["status"] == "ready"
    assert janitor.run(h.deps, mode="report")["expire"] == []  # no longer protected, not old
    h.tick(days=31)
    assert [r["snapshot_id"] for r in _janitor(h, "policy")["expire"]] == [snap]
    assert h.doc("snapshots", snap)["status"] == "expired"


def test_a_delete_redelivered_after_a_crash_between_discarding_and_releasing_releases_the_bytes(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # The chaos test's drift: the records were marked deleted, the function died before
    # the transaction that releases their bytes, and the redelivery found nothing live.
    ws = h.create("crashy")
    h.bases = []
    _usage(h, "ml-a", 0)
    _pause_with_parts(h, ws.id, {"a" * 64: 36})
    held = h.doc("teams", "ml-a")["usage"]["snapshot_bytes"]
    assert held == 36
    real = h.deps.snapshots.discard_all

    def dies_after_discarding(workspace_id: str, *, by: str) -> int:
        real(workspace_id, by=by)
        monkeypatch.setattr(h.deps.snapshots, "discard_all", real)  # the next one lives
        raise RuntimeError("killed between discarding and releasing")

    monkeypatch.setattr(h.deps.snapshots, "discard_all", dies_after_discarding)
    delete = new_event(WorkspaceDeleteRequested(workspace_id=ws.id, actor="alice"),
                       source="//test")
    h.bus.publish(delete)
    with pytest.raises(Exception, match="killed between discarding and releasing"):
        h.pump()
    h.bus.queue.clear()
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == held  # not released yet

    h.bus.publish(delete)  # Pub/Sub delivers it again
    h.pump()

    assert h.doc("workspaces", ws.id)["state"] == "DELETED"
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 0
    assert janitor.run(h.deps, mode="report")["usage_drift"] == {}

    # A workspace of the same name, deleted later, releases only its own bytes.
    again = h.create("crashy")
    _pause_with_parts(h, again.id, {"b" * 64: 50})
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 50
    h.publish(WorkspaceDeleteRequested(workspace_id=again.id, actor="alice"))
    assert h.doc("teams", "ml-a")["usage"]["snapshot_bytes"] == 0
    assert janitor.run(h.deps, mode="report")["usage_drift"] == {}


def test_a_deleted_workspaces_links_are_revoked_and_never_reach_its_successor(
        h: Harness) -> None:
    """The resurrected link (issue 18 §4), on Firestore: a link made for one incarnation is
    revoked with it, and refused by a later workspace of the same id (here another owner's)."""
    from functions.adapters.link_store import FirestoreLinkStore
    from functions.domain.catalog import Role
    from functions.domain.links import Link, Operation, Reason, Scope, check_request

    links = FirestoreLinkStore(h.db)
    first = h.create("nb")
    target = links.target(first.id)
    assert target is not None and target.incarnation == first.incarnation is not None
    link = Link(link_id="lnk-0123456789abcdef", workspace=first.id, team="ml-a",
                creator="alice", scope=Scope.EXEC, created_at=h.now,
                expires_at=h.now + timedelta(hours=12), incarnation=target.incarnation)
    links.create_link("f" * 64, link, {"action": "link.created", "actor": "alice"})
    h.publish(WorkspaceDeleteRequested(workspace_id=first.id, actor="alice"))
    revoked = links.get_link("f" * 64)
    assert revoked is not None and revoked.revoked_at is not None
    assert (revoked.revoked_by, revoked.revoke_reason) == ("stasis", "workspace_deleted")

    h.tick(minutes=1)
    h.publish(WorkspaceRequested(team="ml-a", owner="bob", name="nb", profile="cpu-small"))
    later = links.target(first.id)
    assert later is not None and later.owner == "bob" and later.state == "RUNNING"
    assert later.incarnation not in (None, first.incarnation)
    # Even a link that somehow escaped the revocation does not reach the new workspace.
    verdict = check_request(link, now=h.now, workspace_id=first.id,
                            operation=Operation.EXECUTE, creator_role=Role.ADMIN,
                            workspace=later)
    assert verdict.reason == Reason.WORKSPACE_GONE


# --- cost --------------------------------------------------------------------------------------


def test_the_cost_rollup_is_written_and_not_rewritten_when_nothing_moved(h: Harness) -> None:
    h.now = datetime(2031, 5, 3, 9, 0, tzinfo=UTC)
    ws = h.create("costly", profile="gpu-small")
    h.tick(hours=4)
    h.active(ws.id, idle_for=timedelta(hours=2))
    h.sweep()
    h.pump()
    assert h.doc("workspaces", ws.id)["state"] == "PAUSED"
    h.tick(hours=10)
    [doc] = cost.rollup(h.deps, team="ml-a")
    assert doc["written"]
    stored = h.doc("costs", "ml-a")
    assert stored["compute"]["hours"] == pytest.approx(4.0)
    assert stored["compute"]["gpu_hours"] == pytest.approx(4.0)
    assert stored["compute"]["cost"] == pytest.approx(4 * 0.70)
    assert stored["auto_pause"] == {"pauses": 1, "paused_now": 1, "hours_saved": 10.0,
                                    "gpu_hours_saved": 10.0, "cost_saved": 7.0}
    assert stored["month"] == "2031-05" and stored["compute"]["running_now"] == 0
    # Nothing runs: only the disk and snapshots accrue, so a new hour moves the figures;
    # the same moment computed again does not write.
    h.meter.reset()
    [again] = cost.rollup(h.deps, team="ml-a")
    assert not again["written"] and h.meter.writes == 0
