"""The admission story with Kueue, against kmock's Kubernetes emulator and the official
client: the control plane's lifecycle and scheduler (on the in-memory ledger), the
Kubernetes runtime with ``STASIS_K8S_KUEUE`` and the monitor's Kueue watch, the test
playing Kueue (it writes the Workloads and removes the gate, as Kueue's controller would),
the kubelet and GKE's Pod Snapshot controller.

alice's low-priority workspace waits QUEUED with its pod gated until Kueue admits it, then
runs; carol's higher-priority one queues behind it; Kueue preempts alice's to admit
carol's: the eviction becomes a pause with its state (a Pod Snapshot, taken while the pod's
preStop holds it), after which alice's resume waits in Kueue's queue again, its restored
pod gated; carol's is admitted and runs. Every Workload written validates against the
transcribed Kueue CRD."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schemas import validate_kueue
from k8s_emulator import EmulatedCluster, emulated_cluster
from kubernetes import client
from store_fakes import Clock, MemoryDb, handler_deps
from test_kubernetes_runtime import FakeSidecars, gke_completes_snapshot, kubelet_ready

from events import WorkspaceRequested, new_event
from functions.domain.catalog import Catalog
from functions.handlers import lifecycle
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects.meta import MANAGED_BY, STASIS
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.workspace import workspace_names
from functions.kubernetes.workspaces import KubernetesRuntime
from functions.routes import ROUTES
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.kueue_watch import KueueWatch
from runtime.kubernetes.monitor import Monitor

ROOT = Path(__file__).resolve().parents[2]
LOW, HIGH = "ml-a--low", "ml-b--high"
SETTINGS = ClusterSettings(kueue=True)


def catalog() -> Catalog:
    data = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
    data["scheduling"] = {"priority_classes": [{"id": "interactive", "value": 1000},
                                               {"id": "background", "value": 100}],
                          "defaults": {"workspace": "interactive"}}
    gpu = next(p for p in data["profiles"] if p["id"] == "gpu-small")
    low = copy.deepcopy(gpu)
    low.update(id="gpu-low", title="Low-priority L4", scheduling={"priority_class": "background"})
    data["profiles"].append(low)
    for team in data["teams"]:
        team["profiles"].append("gpu-low")
    return Catalog.from_config(data)


CATALOG = catalog()


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with emulated_cluster() as running:
        yield running


class Story:
    def __init__(self, cluster: EmulatedCluster) -> None:
        self.cluster = cluster
        db = MemoryDb()
        for team in ("ml-a", "ml-b"):
            db.put("teams", team, {"id": team, "usage": {"workspaces": 0, "gpus": 0,
                                                         "tpus": 0, "snapshot_bytes": 0}})
        runtime = KubernetesRuntime(cluster.api_client, settings=SETTINGS,
                                    catalog=lambda: CATALOG, token_factory=lambda: "t0k3n")
        self.deps = handler_deps(CATALOG, db=db, runtime=runtime,  # type: ignore[arg-type]
                                 clock=Clock())
        reader = KubeCluster(cluster.api_client)
        self.monitor = Monitor(reader, self.deps.bus, FakeSidecars(), settings=SETTINGS,
                               clock=lambda: datetime.now(UTC))
        self.kueue = KueueWatch(reader, self.deps.bus)
        self.delivered = 0

    def deliver(self) -> None:
        """The monitor's and the control plane's events to the lifecycle, as pushed."""
        bus = self.deps.bus
        while self.delivered < len(bus.events):
            event = bus.events[self.delivered]
            self.delivered += 1
            for name, route in ROUTES.items():
                if getattr(route, "event", None) == event.name and \
                        route.handler is lifecycle.handle:
                    lifecycle.handle(event, self.deps, name)

    def watch(self) -> None:
        self.kueue.sync()
        self.monitor.sync()
        self.deliver()

    def ws(self, ws_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.deps.store.db.get("workspaces", ws_id)
        return doc

    def pod(self, ws_id: str) -> dict[str, Any]:
        names = workspace_names(ws_id.split("--")[0], ws_id)
        return json.loads(client.CoreV1Api(self.cluster.api_client).read_namespaced_pod(
            names.pod, names.namespace, _preload_content=False).data)

    def kueue_decides(self, ws_id: str, *conditions: tuple[str, str, str]) -> None:
        """Play Kueue: the pod's Workload with these conditions (created, or updated)."""
        pod = self.pod(ws_id)
        meta = pod["metadata"]
        name = f"pod-{meta['name']}"
        workload = {
            "apiVersion": kueue.KUEUE_API, "kind": "Workload",
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "labels": {MANAGED_BY: STASIS},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                              "name": meta["name"], "uid": "u-" + name}]},
            "spec": {"queueName": kueue.LOCAL_QUEUE, "podSets": [
                {"name": "main", "count": 1, "template": {"spec": pod["spec"]}}]},
            "status": {"conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{r} by the test's Kueue",
                 "lastTransitionTime": "2026-06-01T12:00:00Z"} for t, s, r in conditions]}}
        validate_kueue(workload)
        api = client.CustomObjectsApi(self.cluster.api_client)
        group, version = kueue.KUEUE_API.split("/")
        try:
            api.create_namespaced_custom_object(group, version, meta["namespace"],
                                                "workloads", workload)
        except client.exceptions.ApiException:
            api.patch_namespaced_custom_object(group, version, meta["namespace"],
                                               "workloads", name, workload)

    def admit(self, ws_id: str, restored_from: str | None = None) -> None:
        """Kueue admits the pod's Workload and removes its gate; the pod starts."""
        self.kueue_decides(ws_id, ("QuotaReserved", "True", "QuotaReserved"),
                           ("Admitted", "True", "Admitted"))
        names = workspace_names(ws_id.split("--")[0], ws_id)
        client.CoreV1Api(self.cluster.api_client).patch_namespaced_pod(
            names.pod, names.namespace, {"spec": {"schedulingGates": []}},
            _preload_content=False)

    def kubelet(self, ws_id: str, restored_from: str | None = None) -> None:
        team = ws_id.split("--")[0]
        kubelet_ready(self.cluster, type("Spec", (), {"team": team, "workspace_id": ws_id})(),
                      restored_from=restored_from)


def test_kueue_admits_queues_and_preempts_by_pause(cluster: EmulatedCluster) -> None:
    story = Story(cluster)
    deps = story.deps

    def request(team: str, owner: str, name: str, profile: str) -> None:
        lifecycle.handle(new_event(WorkspaceRequested(team, owner, name, profile),
                                   source="//test"), deps, "on_workspace_requested")
        story.deliver()

    request("ml-a", "alice", "low", "gpu-low")
    low = story.ws(LOW)
    assert (low["state"], low["queued_by"], low["state_message"]) == (
        "QUEUED", "kueue", "queued: waiting for kueue to admit it")
    pod = story.pod(LOW)
    assert pod["spec"]["schedulingGates"] == [{"name": kueue.ADMISSION_GATE}]
    assert pod["metadata"]["labels"][kueue.PRIORITY_LABEL] == "background"
    local_queue = client.CustomObjectsApi(cluster.api_client).get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "stasis-ml-a", "localqueues", "stasis")
    validate_kueue(local_queue)
    story.kueue_decides(LOW, ("QuotaReserved", "False", "Pending"))
    story.watch()
    assert story.ws(LOW)["state"] == "QUEUED"  # pending in Kueue: still waiting

    story.admit(LOW)
    story.watch()
    assert story.ws(LOW)["state"] == "PROVISIONING"  # admitted: the pod is no longer gated
    story.kubelet(LOW)
    story.watch()
    assert story.ws(LOW)["state"] == "RUNNING"
    assert deps.store.db.get("teams", "ml-a")["usage"]["gpus"] == 1

    request("ml-b", "carol", "high", "gpu-small")
    assert story.ws(HIGH)["state"] == "QUEUED"
    story.kueue_decides(HIGH, ("QuotaReserved", "False", "Pending"))
    # Kueue preempts alice's for carol's: the Workload is evicted, the pod marked; its
    # preStop holds it while the control plane pauses it.
    story.kueue_decides(LOW, ("Admitted", "True", "Admitted"),
                        ("Evicted", "True", "Preempted"))
    story.watch()
    pausing = story.ws(LOW)
    assert (pausing["state"], pausing["pause_cause"]) == ("PAUSING", "preempted")
    assert "Kueue preempted it (Preempted by the test's Kueue)" in pausing["state_message"]
    snapshot_id = pausing["pending_snapshot"]
    ps_name = gke_completes_snapshot(cluster, type("Spec", (), {
        "team": "ml-a", "workspace_id": LOW})(), snapshot_id)
    story.watch()
    requeued = story.ws(LOW)
    assert (requeued["state"], requeued["queued_for"], requeued["queued_by"]) == (
        "QUEUED", "resume", "kueue")
    assert requeued["current_snapshot"] == snapshot_id
    assert deps.store.db.get("teams", "ml-a")["usage"]["gpus"] == 0
    story.deliver()
    # Kubernetes' garbage collector takes the evicted Workload with its pod; a late report
    # of that eviction changes nothing (the resume already waits).
    story.kueue.sync()
    story.deliver()
    assert story.ws(LOW)["state"] == "QUEUED"
    client.CustomObjectsApi(cluster.api_client).delete_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "stasis-ml-a", "workloads",
        f"pod-{story.pod(LOW)['metadata']['name']}")
    restored = story.pod(LOW)  # re-created from its Pod Snapshot, gated again
    assert restored["metadata"]["annotations"]["podsnapshot.gke.io/ps-name"] == ps_name
    assert restored["spec"]["schedulingGates"] == [{"name": kueue.ADMISSION_GATE}]

    story.admit(HIGH)
    story.kubelet(HIGH)
    story.watch()
    assert story.ws(HIGH)["state"] == "RUNNING"
    assert deps.store.db.get("teams", "ml-b")["usage"]["gpus"] == 1
    assert story.ws(LOW)["state"] == "QUEUED"
