"""Kueue on GKE: every object built from the admin file validates against the Kueue v0.19.2
CRDs (``tests/data/crds/kueue.x-k8s.io.json``, strictly: a misspelt field is an error);
the ClusterQueues carry the teams' quotas, cohorts, borrowing limits and preemption; pods
and JobSets carry the queue labels; a Workload's conditions read as Kueue means them and the
monitor's Kueue watch turns them into the lifecycle's events; and the lifecycle keeps a
cluster-queued workspace QUEUED, its pod gated, until Kueue admits it."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import crd_schemas
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from crd_schemas import jobset_schema

from events import WorkspacePauseRequested, WorkspaceReady
from events.payloads import WorkspaceScheduled
from functions.domain import admission
from functions.domain.catalog import Catalog, WorkKind
from functions.domain.lifecycle import (
    Decision,
    Provision,
    Reason,
    Release,
    Restore,
    State,
    Workspace,
    decide,
    enqueue_in_cluster,
)
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects.meta import ANN_VERSION, ANN_WORKSPACE_ID, MANAGED_BY, STASIS
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.workspace import shape_of, workspace_pod
from runtime.kubernetes.kueue_watch import KueueWatch

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.35"
KUEUE = ClusterSettings(kueue=True, kueue_provisioning=True)
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def catalog() -> Catalog:
    data = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
    data["scheduling"] = {"priority_classes": [
        {"id": "interactive", "value": 1000, "description": "at the keyboard"},
        {"id": "batch", "value": 500}], "defaults": {"workspace": "interactive",
                                                     "job": "batch"}}
    for team in data["teams"]:
        team["cohort"] = "research"
    data["teams"][1]["borrowing_limit"] = {"gpus": 2}
    return Catalog.from_config(data)


CATALOG = catalog()


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(
            kubernetes_validate.utils.schema_contents))
        yield


def validate_kueue(obj: dict[str, Any]) -> None:
    crd_schemas.validate_kueue(obj)
    assert obj["metadata"]["labels"][MANAGED_BY] == STASIS


def test_every_kueue_object_validates_against_the_transcribed_crds() -> None:
    objects = [*kueue.cluster_objects(CATALOG, KUEUE),
               *(kueue.local_queue(t, KUEUE) for t in CATALOG.teams)]
    assert {o["kind"] for o in objects} == {
        "ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue",
        "AdmissionCheck", "ProvisioningRequestConfig"}
    for obj in objects:
        validate_kueue(obj)
    # and a misspelt field is refused, as the API server would prune it
    bad = copy.deepcopy(kueue.cluster_queue(CATALOG.teams["ml-a"], CATALOG, KUEUE))
    bad["spec"]["cohort"] = "research"  # v1beta1's name; v1beta2 says cohortName
    with pytest.raises(jsonschema.ValidationError):
        validate_kueue(bad)


def test_the_cluster_queues_are_the_teams_quotas_cohorts_and_preemption() -> None:
    queue = kueue.cluster_queue(CATALOG.teams["ml-b"], CATALOG, KUEUE)
    spec = queue["spec"]
    assert queue["metadata"]["name"] == "stasis-ml-b"
    assert spec["namespaceSelector"] == {"matchLabels": {
        "kubernetes.io/metadata.name": "stasis-ml-b"}}
    assert spec["cohortName"] == "research" and spec["queueingStrategy"] == "BestEffortFIFO"
    assert spec["preemption"] == {"withinClusterQueue": "LowerPriority",
                                  "reclaimWithinCohort": "Any",
                                  "borrowWithinCohort": {"policy": "LowerPriority"}}
    cpu, gpus = spec["resourceGroups"]
    assert cpu["coveredResources"] == ["cpu", "memory"]
    # 4 workspaces x its largest profile (gpu-small: 4 CPUs, 16Gi)
    assert cpu["flavors"][0]["resources"] == [
        {"name": "cpu", "nominalQuota": "16000m"}, {"name": "memory",
                                                   "nominalQuota": str(4 * 16 * 2**30)}]
    assert gpus == {"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "stasis-nvidia-l4-spot", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": 1, "borrowingLimit": 2}]}]}
    assert spec["admissionChecksStrategy"] == {"admissionChecks": [
        {"name": "stasis-dws", "onFlavors": ["stasis-nvidia-l4-spot"]}]}
    tpus = kueue.cluster_queue(CATALOG.teams["ml-a"], CATALOG)["spec"]["resourceGroups"][2]
    assert tpus["coveredResources"] == ["google.com/tpu"]
    assert tpus["flavors"][0]["resources"][0]["nominalQuota"] == 8
    assert "admissionChecksStrategy" not in kueue.cluster_queue(
        CATALOG.teams["ml-a"], CATALOG)["spec"]


def test_flavors_and_priority_classes_come_from_the_admin_file() -> None:
    flavors = {f["metadata"]["name"]: f["spec"].get("nodeLabels")
               for f in kueue.resource_flavors(CATALOG)}
    assert flavors == {
        "stasis-default": None,
        "stasis-nvidia-l4-spot": {"cloud.google.com/gke-accelerator": "nvidia-l4",
                                  "cloud.google.com/gke-spot": "true"},
        "stasis-tpu-v5-lite-podslice-2x4": {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "2x4"}}
    assert [(c["metadata"]["name"], c["value"], c.get("description"))
            for c in kueue.priority_classes(CATALOG)] == [
        ("interactive", 1000, "at the keyboard"), ("batch", 500, None)]


def test_a_workspace_pod_waits_gated_in_its_teams_queue_and_is_held_for_a_pause() -> None:
    shape = shape_of(workspace_id="ml-a--nb", team="ml-a", owner="alice", ide="jupyterlab",
                     environment=admission.environment_of(CATALOG, "python-3-11"),
                     profile=admission.profile_of(CATALOG, "gpu-small"), settings=KUEUE,
                     priority_class="interactive")
    pod = workspace_pod(shape, KUEUE, requestid="r1", requested_at_ms=1, version=3)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert (labels[kueue.QUEUE_LABEL], labels[kueue.PRIORITY_LABEL]) == ("stasis",
                                                                       "interactive")
    assert pod["metadata"]["annotations"][ANN_VERSION] == "3"
    assert spec["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    assert spec["terminationGracePeriodSeconds"] == 120
    assert {c["name"]: c["lifecycle"]["preStop"]["exec"]["command"]
            for c in spec["containers"]} == {"workspace": ["sleep", "115"],
                                             "snapshot-agent": ["sleep", "115"]}
    plain = workspace_pod(dataclasses.replace(shape), ClusterSettings(), requestid="r1",
                          requested_at_ms=1)
    assert kueue.QUEUE_LABEL not in plain["metadata"]["labels"]
    assert "schedulingGates" not in plain["spec"]


def test_a_jobset_carries_its_queue_and_the_jobs_class() -> None:
    spec = js.JobSpec(job_id="job-1", team="ml-a", namespace="stasis-ml-a", image="python",
                      command=js.HOST_COMMAND, profile=CATALOG.profiles["tpu-v5e-8"], hosts=1,
                      labels=kueue.queue_labels(CATALOG.priority_for(
                          "ml-a", "tpu-v5e-8", WorkKind.JOB).id))
    obj = js.jobset(spec)
    jsonschema.validate(obj, jobset_schema())
    assert obj["metadata"]["labels"][kueue.PRIORITY_LABEL] == "batch"
    assert obj["metadata"]["labels"][kueue.QUEUE_LABEL] == "stasis"


# -- Workloads --------------------------------------------------------------------------------


def workload(pod: str, *conditions: tuple[str, str, str], flavors: dict[str, str] | None = None
             ) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"pod-{pod}-1a2b3", "namespace": "stasis-ml-a",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                          "uid": "u-1", "controller": True}]},
        "spec": {"queueName": "stasis", "priority": 1000, "podSets": [
            {"name": "main", "count": 1, "template": {"spec": {"containers": []}}}]},
        "status": {"conditions": [
            {"type": t, "status": s, "reason": r, "message": f"{t} {r}",
             "lastTransitionTime": "2026-06-01T12:00:00Z", "observedGeneration": 1}
            for t, s, r in conditions]}}
    if flavors:
        obj["status"]["admission"] = {"clusterQueue": "stasis-ml-a", "podSetAssignments": [
            {"name": "main", "flavors": flavors, "count": 1}]}
    return obj


@pytest.mark.parametrize(("conditions", "state", "reason"), [
    ((), "pending", ""),
    ((("QuotaReserved", "False", "Pending"),), "pending", "Pending"),
    ((("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "False",
                                                  "UnsatisfiedAdmissionChecks")),
     "pending", "QuotaReserved"),
    ((("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted")),
     "admitted", "Admitted"),
    ((("Admitted", "True", "Admitted"), ("Evicted", "True", "Preempted")), "evicted",
     "Preempted"),
])
def test_a_workloads_conditions_read_as_kueue_means_them(
        conditions: tuple[tuple[str, str, str], ...], state: str, reason: str) -> None:
    obj = workload("ws-ml-a-nb", *conditions, flavors={"nvidia.com/gpu": "stasis-l4"})
    validate_kueue({**obj, "metadata": {**obj["metadata"],
                                        "labels": {MANAGED_BY: STASIS}}})
    verdict = kueue.workload_verdict(obj)
    assert (verdict.state, verdict.reason) == (state, reason)
    assert kueue.owner_pod(obj) == "ws-ml-a-nb"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {"Pod": [], "Workload": []}

    def list(self, kind: str, namespace: str | None, selector: str | None = None
             ) -> list[dict[str, Any]]:
        return self.objects[kind]


class Bus:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, event: Any) -> str:
        self.events.append(event)
        return event.id


def pod(name: str, version: int, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "stasis-ml-a",
                         "labels": {MANAGED_BY: STASIS},
                         "annotations": {ANN_WORKSPACE_ID: "ml-a--nb", ANN_VERSION: str(version)}},
            "status": status}


def test_the_kueue_watch_reports_an_admission_once_and_a_preemption_as_a_pause() -> None:
    kube, bus = FakeKube(), Bus()
    watch = KueueWatch(kube, bus)
    kube.objects["Pod"] = [pod("ws-ml-a-nb", 5)]
    kube.objects["Workload"] = [workload("ws-ml-a-nb", ("QuotaReserved", "False", "Pending"))]
    assert watch.sync() is True and bus.events == []
    kube.objects["Workload"] = [workload("ws-ml-a-nb", ("QuotaReserved", "True", "x"),
                                         ("Admitted", "True", "Admitted"),
                                         flavors={"nvidia.com/gpu": "stasis-nvidia-l4-spot"})]
    watch.sync()
    watch.sync()
    [admitted] = bus.events
    assert admitted.payload == WorkspaceScheduled(
        "ml-a--nb", 5, "admit", message="Kueue admitted it on stasis-nvidia-l4-spot")
    assert admitted.requestid == admitted.id
    # Kueue preempts it: the pod is terminating (its preStop holds it), the Workload evicted
    kube.objects["Pod"][0]["metadata"]["deletionTimestamp"] = "2026-06-01T12:05:00Z"
    kube.objects["Workload"][0]["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted",
         "message": "Preempted to accommodate a workload (UID: u-9) due to prioritization "
                    "in the ClusterQueue"})
    watch.sync()
    paused = bus.events[-1].payload
    assert isinstance(paused, WorkspacePauseRequested)
    assert (paused.cause, paused.actor) == ("preempted", "kueue")
    assert "Kueue preempted it (Preempted to accommodate a workload" in paused.detail


def test_a_pod_marked_for_termination_by_kueue_is_paused_too() -> None:
    kube, bus = FakeKube(), Bus()
    kube.objects["Pod"] = [pod("ws-ml-a-nb", 7, conditions=[
        {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted",
         "message": "Evicted by Kueue"}])]
    KueueWatch(kube, bus).sync()
    [event] = bus.events
    assert event.payload.cause == "preempted" and "Evicted by Kueue" in event.payload.detail


# -- the lifecycle with a cluster's queue ------------------------------------------------------


WS = Workspace(id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile="gpu-small",
               created_at=NOW)


def test_a_cluster_queued_workspace_waits_with_its_pod_and_starts_when_admitted() -> None:
    from events import WorkspaceRequested

    created = decide(None, WorkspaceRequested("ml-a", "alice", "nb", "gpu-small"), NOW)
    queued = enqueue_in_cluster(created, "kueue", NOW)
    ws = queued.workspace
    assert ws is not None and (ws.state, ws.queued_by, ws.queued_for) == (
        State.QUEUED, "kueue", "create")
    assert queued.commands == (Provision("ml-a--nb"),)  # its pod is made, gated
    admitted = decide(ws, WorkspaceScheduled(ws.id, ws.version, "admit",
                                             message="Kueue admitted it"), NOW)
    assert admitted.workspace is not None and admitted.workspace.state == State.PROVISIONING
    assert admitted.commands == ()  # the pod exists already
    assert admitted.message.startswith("admitted by kueue after waiting")
    # the pod's readiness may be reported first: it starts and runs in one
    ready = decide(ws, WorkspaceReady(ws.id, "http://nb", "h"), NOW)
    assert ready.workspace is not None and ready.workspace.state == State.RUNNING
    assert ready.reason == Reason.READY


def test_a_cluster_queued_request_expired_or_cancelled_gives_its_gated_pod_up() -> None:
    ws = dataclasses.replace(WS, state=State.QUEUED, version=4, queued_by="kueue",
                             queued_for="resume", current_snapshot="s", queued_at=NOW)
    expired = decide(ws, WorkspaceScheduled(ws.id, 4, "expire", message="waited"), NOW)
    assert (expired.reason, expired.commands) == (Reason.QUEUE_EXPIRED, (Release(ws.id),))
    cancelled = decide(ws, WorkspacePauseRequested(ws.id, "alice"), NOW)
    assert (cancelled.reason, cancelled.commands) == (Reason.QUEUE_CANCELLED,
                                                      (Release(ws.id),))


def test_a_preempted_workspaces_resume_waits_in_the_clusters_queue() -> None:
    requeued = Decision(True, Reason.REQUEUED, dataclasses.replace(
        WS, state=State.QUEUED, queued_for="resume", current_snapshot="snap-9"),
        (Release(WS.id),), "paused for x", State.PAUSING)
    queued = enqueue_in_cluster(requeued, "kueue", NOW)
    assert queued.workspace is not None and queued.workspace.queued_by == "kueue"
    assert queued.commands == (Release(WS.id), Restore(WS.id, "snap-9"))


def test_terraform_gets_kueues_objects_in_a_tier_of_their_own() -> None:
    from deploy import cluster

    config = ROOT / "examples/stasis.yaml"
    tiers = cluster.kubernetes_objects(*cluster.teams_and_classes(config),
                                       catalog=cluster.admin_catalog(config))["manifests"]
    assert {k.split("/")[0] for k in tiers["kueue"]} == {
        "resourceflavor", "workloadpriorityclass", "clusterqueue", "localqueue"}
    assert "localqueue/stasis-ml-a/stasis" in tiers["kueue"]
    assert not any("kueue" in v for t in ("cluster", "namespaced") for v in tiers[t].values()
                   if '"kueue.x-k8s.io/' in v)
