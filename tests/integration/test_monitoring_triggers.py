"""Monitoring triggers against the real emulators: the ``on_monitoring`` consumer, the idle
handler and the lifecycle, with Firestore (store and ledger) real.

The notifications are the real-format payloads of ``tests/data/monitoring/``, restamped to
the test's clock (``stack.monitoring.restamp``, as `stasis events monitoring --restamp`
does) and delivered as the functions framework hands a Pub/Sub push to an event function
(a CloudEvent carrying the message), through ``delivery.deliver_raw``.
Events the handlers publish are delivered in-process to the handlers ``functions/routes.py``
names, after a round trip through their Pub/Sub form. Workspaces run on the null runtime,
whose node-agent activity comes from a table the test controls (as in test_upkeep.py), or,
for lost nodes, on the Kubernetes runtime against kmock's emulator, where the test plays
the scheduler (a pod's ``spec.nodeName``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudevents.http import CloudEvent
from google.cloud import firestore

from events import Event, WorkspaceRequested, from_pubsub, new_event, to_pubsub
from functions.adapters.firestore_store import FirestoreStore, workspace_to_doc
from functions.adapters.null_runtime import NullRuntime
from functions.adapters.snapshots import SnapshotStore, storage_client
from functions.delivery import MAX_DELIVERY_ATTEMPTS, deliver_raw
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from functions.handlers import monitoring
from functions.handlers.deps import Deps
from functions.routes import ROUTES
from stack import admin, topology
from stack.monitoring import restamp
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "monitoring"
CONFIG = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
CATALOG = Catalog.from_config(CONFIG)
DELIVERED = {"on_workspace_requested", "on_workspace_ready", "on_pause_requested",
             "on_snapshot_finished", "on_idle_detected", "on_workspace_preempted",
             "on_runtime_alert"}
CONSUMER = "on_monitoring"
NODE = "gke-stasis-prod-gpu-l4-spot-5b909138-nr65"


class Bus:
    """Records what is published and dead-lettered; ``pump`` delivers to the handlers."""

    def __init__(self) -> None:
        self.queue: list[Event[Any]] = []
        self.published: list[Event[Any]] = []
        self.dead: list[dict[str, Any]] = []

    def publish(self, event: Event[Any]) -> str:
        data, attributes = to_pubsub(event)
        wire = from_pubsub(data, attributes)
        self.queue.append(wire)
        self.published.append(wire)
        return event.id

    def dead_letter(self, consumer: str, data: bytes, attributes: dict[str, str], *,
                    reason: str, attempts: int, message_id: str = "") -> str:
        self.dead.append({"consumer": consumer, "data": data, "reason": reason,
                          "attempts": attempts, "message_id": message_id})
        return f"dead-{len(self.dead)}"

    def named(self, name: str) -> list[Event[Any]]:
        return [e for e in self.published if e.name == name]


class ActiveRuntime(NullRuntime):
    """The null runtime, with the node agent's activity signals from a table."""

    def __init__(self, bus: Bus) -> None:
        super().__init__(bus)
        self.signals: dict[str, dict[str, Any]] = {}

    def activity(self, workspace_id: str) -> dict[str, Any] | None:
        return self.signals.get(workspace_id)


@dataclasses.dataclass
class Harness:
    db: firestore.Client
    deps: Deps
    bus: Bus
    runtime: ActiveRuntime
    now: datetime

    def pump(self) -> None:
        while self.bus.queue:
            event = self.bus.queue.pop(0)
            for route in ROUTES.values():
                if route.event == event.name and route.function in DELIVERED:
                    route.handler(event, self.deps, route.function)

    def create(self, name: str, profile: str = "gpu-small") -> Workspace:
        self.bus.publish(new_event(WorkspaceRequested(team="ml-a", owner="alice", name=name,
                                                      profile=profile), source="//test"))
        self.pump()
        ws = self.deps.store.get_workspace(f"ml-a--{name}")
        assert ws is not None and ws.state == State.RUNNING
        return ws

    def kernels(self, ws_id: str, *, idle_for: timedelta, busy: int = 0) -> None:
        self.runtime.signals[ws_id] = {
            "last_activity": (self.now - idle_for).isoformat(), "busy_kernels": busy,
            "connections": 1, "observed_at": self.now.isoformat()}

    def push(self, payload: Any, *, message_id: str = "m-1") -> monitoring.Outcome:
        """Deliver ``payload`` as the monitoring topic's push subscription would."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        pushed = CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                             "source": f"//pubsub.googleapis.com/topics/{monitoring.TOPIC}",
                             "id": message_id},
                            {"message": {"data": base64.b64encode(data).decode(),
                                         "messageId": message_id}})
        outcomes: list[monitoring.Outcome] = []
        deliver_raw(pushed, CONSUMER,
                    lambda m, deps, c: outcomes.append(monitoring.handle(m, deps, c)), self.deps)
        self.pump()
        return outcomes[0] if outcomes else monitoring.Outcome()

    def doc(self, ws_id: str) -> dict[str, Any]:
        return self.db.collection("workspaces").document(ws_id).get().to_dict() or {}


def saved(name: str, now: datetime) -> Any:
    return restamp(json.loads((DATA / f"{name}.json").read_text()), now)


@pytest.fixture
def h(emulator_env: dict[str, str], tmp_path: Path) -> Iterator[Harness]:
    project, bucket = emulator_env["STASIS_PROJECT"], emulator_env["STASIS_SNAPSHOT_BUCKET"]
    admin.apply(Settings(project=project, data_dir=tmp_path), CONFIG, actor="test")
    topology.ensure_bucket(project, bucket)
    db = firestore.Client(project=project)
    bus = Bus()
    runtime = ActiveRuntime(bus)
    harness = Harness(db, None, bus, runtime,  # type: ignore[arg-type]
                      datetime.now(UTC).replace(microsecond=0))
    harness.deps = Deps(
        store=FirestoreStore(db), bus=bus, runtime=runtime,
        snapshots=SnapshotStore(db, storage_client(project), bucket),
        catalog=lambda: CATALOG, clock=lambda: harness.now, snapshot_bucket=bucket,
        dead_letters=bus)
    yield harness


# --- a GPU-idle alert is evidence; the idle policy decides -----------------------------------
def test_a_gpu_idle_incident_pauses_an_idle_workspace_with_the_evidence(h: Harness) -> None:
    ws = h.create("llm-finetune")
    h.now += timedelta(hours=2)
    h.kernels(ws.id, idle_for=timedelta(minutes=30))
    outcome = h.push(saved("cloud-monitoring-gpu-idle", h.now - timedelta(seconds=40)))
    assert [e.name for e in outcome.published] == ["workspace.idle_detected"]
    assert outcome.published[0].payload.cause == "gpu_idle"
    doc = h.doc(ws.id)
    assert (doc["state"], doc["pause_cause"]) == ("PAUSED", "idle")
    assert doc["state_message"].startswith("idle policy: no activity for 30m; profile "
                                           "gpu-small pauses after 20m idle (rule 1)")
    assert "GPU duty cycle 0% (under 10% for 20m) (Cloud Monitoring incident" in \
        doc["state_message"]
    assert h.bus.dead == []


def test_a_gpu_idle_incident_does_not_pause_a_busy_kernel_and_a_replay_changes_nothing(
        h: Harness) -> None:
    ws = h.create("llm-finetune")
    h.now += timedelta(hours=2)
    h.kernels(ws.id, idle_for=timedelta(hours=2), busy=1)  # a cell has run for 2 h
    incident = saved("cloud-monitoring-gpu-idle", h.now - timedelta(seconds=40))
    before = h.doc(ws.id)
    assert len(h.push(incident).published) == 1
    assert h.doc(ws.id) == before and h.bus.named("workspace.pause_requested") == []
    # The cell ends; the same incident delivered again (Pub/Sub redelivery, a replay) is
    # the same evidence already weighed: it changes nothing.
    h.kernels(ws.id, idle_for=timedelta(hours=2))
    assert h.push(incident, message_id="m-2").published == []
    assert h.doc(ws.id) == before and len(h.bus.named("workspace.idle_detected")) == 1
    assert h.bus.dead == []


def test_without_the_kernels_state_a_quiet_gpu_pauses_nothing(h: Harness) -> None:
    ws = h.create("llm-finetune")
    h.now += timedelta(hours=2)  # no activity table entry: the runtime cannot say
    h.push(saved("cloud-monitoring-gpu-idle", h.now))
    assert h.doc(ws.id)["state"] == "RUNNING"


# --- bad input: a reason in the dead letters, nothing changed -------------------------------
def test_bad_notifications_are_dead_lettered_with_their_reason(h: Harness) -> None:
    ws = h.create("llm-finetune")
    h.now += timedelta(hours=2)
    h.kernels(ws.id, idle_for=timedelta(hours=2))
    before = h.doc(ws.id)
    fresh = saved("cloud-monitoring-gpu-idle", h.now)
    old = saved("cloud-monitoring-gpu-idle", h.now - timedelta(hours=1))
    other = json.loads(json.dumps(fresh))
    other["incident"]["metadata"]["user_labels"]["stasis.dev/workspace"] = "ml-a-gone--0a1b2c3d4e"
    closed = saved("cloud-monitoring-gpu-idle-closed", h.now)
    cases = [(b"<html>not json</html>", "malformed: not JSON"),
             (closed, "closed: incident 0.nv2r1nqj2j3k"),
             (old, "stale: incident 0.nv2r1nqj2j3k"),
             (other, "unknown_workspace: pod label stasis.dev/workspace=ml-a-gone--0a1b2c3d4e "
                     "(team ml-a) matches no workspace that holds hardware in team ml-a"),
             (saved("cloud-monitoring-other-policy", h.now), "unsupported: incident "),
             (saved("cloud-logging-pod-deleted", h.now), "unsupported: log entry "
                                                         "io.k8s.core.v1.pods.delete")]
    for index, (payload, reason) in enumerate(cases):
        h.push(payload, message_id=f"bad-{index}")
        assert h.bus.dead[-1]["reason"].startswith(reason), h.bus.dead[-1]["reason"]
        assert h.bus.dead[-1]["consumer"] == CONSUMER
    assert len(h.bus.dead) == len(cases)
    assert h.doc(ws.id) == before and h.bus.named("workspace.idle_detected") == []


def test_a_temporary_failure_is_retried_then_dead_lettered_with_the_last_error(
        h: Harness) -> None:
    h.create("llm-finetune")

    def unreachable() -> list[Any]:
        raise ConnectionError("Firestore unavailable")

    h.deps.store.list_workspaces = lambda **_: unreachable()  # type: ignore[method-assign]
    incident = saved("cloud-monitoring-gpu-idle", h.now)
    for attempt in range(1, MAX_DELIVERY_ATTEMPTS):
        with pytest.raises(ConnectionError):
            h.push(incident, message_id="flaky")
        assert h.bus.dead == [], attempt
    h.push(incident, message_id="flaky")
    assert h.bus.dead[0]["reason"] == (f"failed {MAX_DELIVERY_ATTEMPTS} times, last error: "
                                       "ConnectionError: Firestore unavailable")


# --- runtime alerts are noted for the owner -------------------------------------------------
def test_an_oom_kill_is_noted_on_the_workspace_and_in_the_audit_log(h: Harness) -> None:
    ws = h.create("llm-finetune")
    h.now += timedelta(minutes=5)
    h.push(saved("cloud-monitoring-oom-killed", h.now))
    doc = h.doc(ws.id)
    assert (doc["state"], doc["version"]) == ("RUNNING", ws.version)
    assert doc["state_message"].startswith("container workspace was OOM-killed")
    audit = [a.to_dict() for a in h.db.collection("audit").stream()]
    assert any(a["action"] == "workspace.runtime_alert" and
               a["outcome"] == "accepted: runtime_alert" for a in audit)


# --- a lost node: the workspaces the runtime placed there --------------------------------------
@pytest.fixture
def cluster() -> Iterator[Any]:
    from k8s_emulator import emulated_cluster

    with emulated_cluster() as running:
        yield running


def test_a_spot_preemption_pauses_the_workspace_on_that_node_only_from_its_snapshot(h: Harness,
                                                                 cluster: Any) -> None:
    from kubernetes import client

    from functions.handlers.commands import workspace_spec
    from functions.kubernetes.objects.workspace import workspace_names
    from functions.kubernetes.workspaces import KubernetesRuntime

    runtime = KubernetesRuntime(cluster.api_client, catalog=lambda: CATALOG,
                                token_factory=lambda: "t0k3n")
    h.deps.runtime = runtime
    core = client.CoreV1Api(cluster.api_client)
    started = h.now - timedelta(hours=1)
    placed = {}
    for name, node in (("llm-finetune", NODE), ("vision", "gke-stasis-prod-gpu-l4-other")):
        ws = Workspace(id=f"ml-a--{name}", team="ml-a", owner="alice", name=name,
                       profile="gpu-small", state=State.RUNNING, state_reason="resumed",
                       version=5, current_snapshot=f"ml-a--{name}-v3", updated_at=started,
                       created_at=started - timedelta(days=1))
        h.db.collection("workspaces").document(ws.id).set(workspace_to_doc(ws))
        runtime.provision(workspace_spec(ws, h.deps, "r-1"))
        names = workspace_names("ml-a", ws.id)
        core.patch_namespaced_pod(names.pod, names.namespace, {"spec": {"nodeName": node}},
                                  _preload_content=False)
        placed[ws.id] = names
    # What the two admissions counted (each gpu-small holds one L4).
    h.db.collection("teams").document("ml-a").update(
        {"usage": {"workspaces": 2, "gpus": 2, "tpus": 0, "snapshot_bytes": 0}})
    assert {s.workspace_id: s.detail["node"] for s in runtime.list()} == {
        "ml-a--llm-finetune": NODE, "ml-a--vision": "gke-stasis-prod-gpu-l4-other"}

    outcome = h.push(saved("cloud-logging-spot-preemption", h.now - timedelta(seconds=20)))
    assert [(e.name, e.subject) for e in outcome.published] == [
        ("workspace.preempted", "ml-a--llm-finetune")]
    lost = h.doc("ml-a--llm-finetune")
    # It had a snapshot to fall back on: PAUSED from it, the lost work said.
    assert (lost["state"], lost["state_reason"]) == ("PAUSED", "recovered")
    assert lost["current_snapshot"] == "ml-a--llm-finetune-v3"
    assert lost["state_message"].startswith(f"node {NODE} was preempted (Spot) at ")
    usage = h.db.collection("teams").document("ml-a").get().to_dict()["usage"]
    # Its L4 comes back now; PAUSED, it keeps its workspace slot (home and snapshot remain).
    assert (usage["gpus"], usage["workspaces"]) == (1, 2)
    # The lifecycle's Release deleted what was left of its pod; the other one still runs.
    pods = [p.metadata.name for p in core.list_namespaced_pod(placed["ml-a--vision"].namespace)
            .items]
    assert pods == [placed["ml-a--vision"].pod]
    assert h.doc("ml-a--vision")["state"] == "RUNNING"
    assert h.bus.dead == []
