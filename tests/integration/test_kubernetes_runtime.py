"""The Kubernetes runtime end to end over HTTP: the adapter and the cluster monitor, through
the official ``kubernetes`` client, against kmock's ``KubernetesEmulator``.

The tests play the parts of the cluster the emulator does not have: the kubelet (a pod's
``Ready`` and ``PodRestored`` conditions), GKE's Pod Snapshot controller (the trigger's
``Triggered`` condition and ``snapshotCreated``, the PodSnapshot and its ``Ready``), and
the snapshot agent sidecar (a fake answering the monitor).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_emulator import EmulatedCluster, emulated_cluster
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events import SnapshotFinished, WorkspaceReady, WorkspaceRuntimeFailed
from functions.domain import admission
from functions.domain.catalog import Catalog
from functions.kubernetes.objects.kinds import PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION
from functions.kubernetes.objects.meta import (
    ANN_RESTORE_REQUEST,
    ANN_SNAPSHOT_REQUEST,
    LABEL_METHOD,
    LABEL_WORKSPACE,
    json_annotation,
)
from functions.kubernetes.objects.podsnapshot import (
    PODSNAPSHOT_API,
    POLICY_NAME,
    PS_NAME_ANNOTATION,
    storage_config_name,
)
from functions.kubernetes.objects.snapshot import snapshot_object_name
from functions.kubernetes.objects.team import QUOTA_NAME, team_namespace_name
from functions.kubernetes.objects.workspace import service_account_name, workspace_names
from functions.kubernetes.workspaces import KubernetesRuntime
from functions.ports import RuntimeRefused, RuntimeUnavailable, WorkspaceSpec
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.monitor import Monitor
from runtime.local.publisher import RecordingPublisher

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
CATALOG = Catalog.from_config(CONFIG)
GROUP, VERSION = PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeSidecars:
    """The pod's snapshot agent, as the monitor sees it."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, dict[str, Any]]] = []
        self.snapshot_job: dict[str, Any] = {"state": "running"}
        self.restore_job: dict[str, Any] = {"state": "running"}
        self.activity: dict[str, Any] = {"last_activity": "2026-01-01T00:00:01+00:00",
                                         "busy_kernels": 0, "kernels": 2, "connections": 1}

    def get(self, pod: dict[str, Any], path: str) -> dict[str, Any] | None:
        if path == "/activity":
            return dict(self.activity)
        if path.startswith("/snapshots/"):
            return dict(self.snapshot_job)
        if path == "/restore":
            return dict(self.restore_job)
        return None

    def post(self, pod: dict[str, Any], path: str, body: Any) -> dict[str, Any] | None:
        self.posts.append((pod["metadata"]["name"], path, dict(body)))
        return {"state": "running"}


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    # One emulator per test: kmock keeps every request and object version, and gets slower
    # as they pile up.
    with emulated_cluster() as running:
        yield running


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def runtime(cluster: EmulatedCluster, clock: Clock) -> KubernetesRuntime:
    return KubernetesRuntime(cluster.api_client, catalog=lambda: CATALOG,
                             clock=clock, token_factory=lambda: "t0k3n")


@pytest.fixture
def bus() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def sidecars() -> FakeSidecars:
    return FakeSidecars()


@pytest.fixture
def monitor(cluster: EmulatedCluster, bus: RecordingPublisher, sidecars: FakeSidecars,
            clock: Clock) -> Monitor:
    from datetime import UTC, datetime

    from runtime.kubernetes.snapshot_tokens import EmulatorTokens

    # as the monitor runs against fake-gcs-server: every request's boundary is built
    return Monitor(KubeCluster(cluster.api_client), bus, sidecars,
                   clock=lambda: datetime.fromtimestamp(clock.now, UTC),
                   tokens=EmulatorTokens())


def spec_for(name: str, profile: str, *, team: str = "ml-a", requestid: str | None = None,
             ide: str = "jupyterlab") -> WorkspaceSpec:
    """A WorkspaceSpec as the lifecycle handler builds it (``workspace_spec``)."""
    ws = f"{team}--{name}"
    return WorkspaceSpec(
        workspace_id=ws, team=team, owner="alice", name=name, ide=ide,
        environment=admission.environment_of(CATALOG, "python-3-11"),
        profile=admission.profile_of(CATALOG, profile), snapshot_bucket="stasis-snapshots",
        snapshot_prefix=f"snapshots/{team}/{ws}", requestid=requestid or uuid.uuid4().hex)


def core(cluster: EmulatedCluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client)


def custom(cluster: EmulatedCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api_client)


def read(fn: Any, *args: Any) -> dict[str, Any] | None:
    """An object as JSON, or None when the API answers 404."""
    import json

    try:
        return json.loads(fn(*args, _preload_content=False).data)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pod_of(cluster: EmulatedCluster, spec: WorkspaceSpec) -> dict[str, Any] | None:
    names = workspace_names(spec.team, spec.workspace_id)
    return read(core(cluster).read_namespaced_pod, names.pod, names.namespace)


def runs_as(cluster: EmulatedCluster, spec: WorkspaceSpec) -> str | None:
    pod = pod_of(cluster, spec)
    return None if pod is None else pod["spec"].get("serviceAccountName")


def kubelet_ready(cluster: EmulatedCluster, spec: WorkspaceSpec, *,
                  restored_from: str | None = None) -> None:
    """Play the kubelet (and GKE's restore): the pod runs and is Ready."""
    names = workspace_names(spec.team, spec.workspace_id)
    conditions = [{"type": "Ready", "status": "True"}]
    if restored_from:
        conditions.append({"type": "PodRestored", "status": "True",
                           "message": f"restored from {restored_from}"})
    core(cluster).patch_namespaced_pod_status(
        names.pod, names.namespace,
        {"status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": conditions}},
        _preload_content=False)


def gke_completes_snapshot(cluster: EmulatedCluster, spec: WorkspaceSpec,
                           snapshot_id: str) -> str:
    """Play GKE's Pod Snapshot controller: a PodSnapshot for the trigger, then Ready."""
    names = workspace_names(spec.team, spec.workspace_id)
    trigger_name = snapshot_object_name(snapshot_id)
    trigger = read(custom(cluster).get_namespaced_custom_object, GROUP, VERSION,
                   names.namespace, "podsnapshotmanualtriggers", trigger_name)
    assert trigger is not None and trigger["spec"] == {"targetPod": names.pod}
    ps_name = uuid.uuid4().hex
    custom(cluster).create_namespaced_custom_object(
        GROUP, VERSION, names.namespace, "podsnapshots",
        {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshot",
         "metadata": {"name": ps_name, "namespace": names.namespace,
                      "labels": {"gke-pod-snapshot-triggered-by": trigger_name}},
         "spec": {"policyName": POLICY_NAME}})
    custom(cluster).patch_namespaced_custom_object_status(
        GROUP, VERSION, names.namespace, "podsnapshotmanualtriggers", trigger_name,
        {"status": {"conditions": [{"type": "Triggered", "status": "True",
                                    "reason": "Complete", "message": "",
                                    "lastTransitionTime": "2026-01-01T00:00:04Z"}],
                    "snapshotCreated": {"name": ps_name}}})
    custom(cluster).patch_namespaced_custom_object_status(
        GROUP, VERSION, names.namespace, "podsnapshots", ps_name,
        {"status": {"conditions": [{"type": "Ready", "status": "True",
                                    "reason": "AllSnapshotsAvailable", "message": "",
                                    "lastTransitionTime": "2026-01-01T00:00:09Z"}],
                    "storageStatus": {"gcs": {"observedGCSPath":
                                              f"gs://stasis-snapshots/snapshots/{spec.team}"
                                              f"/pod/{ps_name}"}}}})
    return ps_name


def workspace_objects(cluster: EmulatedCluster, spec: WorkspaceSpec) -> dict[str, list[str]]:
    """Every object in the team namespace that belongs to the workspace, by kind."""
    import json

    names = workspace_names(spec.team, spec.workspace_id)
    ns = names.namespace
    api = core(cluster)
    found: dict[str, list[str]] = {}
    listings = {
        "Pod": api.list_namespaced_pod, "Service": api.list_namespaced_service,
        "Secret": api.list_namespaced_secret, "ConfigMap": api.list_namespaced_config_map,
        "ServiceAccount": api.list_namespaced_service_account,
        "PersistentVolumeClaim": api.list_namespaced_persistent_volume_claim,
        "NetworkPolicy": client.NetworkingV1Api(cluster.api_client)
        .list_namespaced_network_policy,
    }
    for kind, fn in listings.items():
        items = json.loads(fn(ns, _preload_content=False).data).get("items") or []
        found[kind] = [i["metadata"]["name"] for i in items
                       if (i["metadata"].get("labels") or {}).get(LABEL_WORKSPACE)
                       == names.label]
    for plural in ("podsnapshotmanualtriggers", "podsnapshots"):
        items = json.loads(custom(cluster).list_namespaced_custom_object(
            GROUP, VERSION, ns, plural, _preload_content=False).data).get("items") or []
        # GKE labels PodSnapshots with their trigger only (each test has its own cluster).
        found[plural] = [i["metadata"]["name"] for i in items
                         if (i["metadata"].get("labels") or {}).get(LABEL_WORKSPACE)
                         == names.label
                         or (plural == "podsnapshots" and "gke-pod-snapshot-triggered-by"
                             in (i["metadata"].get("labels") or {}))]
    return {kind: sorted(names_) for kind, names_ in found.items() if names_}


# -- GKE: Pod Snapshots ------------------------------------------------------------------


def test_pod_snapshot_pause_and_resume(cluster: EmulatedCluster, runtime: KubernetesRuntime,
                                       monitor: Monitor, bus: RecordingPublisher,
                                       clock: Clock) -> None:
    spec = spec_for("gpu-nb", "gpu-small", requestid="req-provision")
    names = workspace_names(spec.team, spec.workspace_id)

    # provision: the team's namespace and Pod Snapshot objects, the workspace's objects.
    runtime.provision(spec)
    pod = pod_of(cluster, spec)
    assert pod is not None
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert read(core(cluster).read_namespace, names.namespace) is not None
    assert read(custom(cluster).get_cluster_custom_object, GROUP, VERSION,
                "podsnapshotstorageconfigs", storage_config_name("ml-a"))["spec"] == {
        "snapshotStorageConfig": {"gcs": {"bucket": "stasis-snapshots",
                                          "path": "snapshots/ml-a/pod"}}}
    assert read(custom(cluster).get_namespaced_custom_object, GROUP, VERSION,
                names.namespace, "podsnapshotpolicies", POLICY_NAME) is not None
    quota = read(core(cluster).read_namespaced_resource_quota, QUOTA_NAME, names.namespace)
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"
    assert monitor.sync() is True  # not Ready yet: nothing reported, come back soon
    assert bus.names() == []

    kubelet_ready(cluster, spec)
    monitor.sync()
    ready = bus.wait_for("workspace.ready", timeout=1, workspace_id=spec.workspace_id)
    assert ready.requestid == "req-provision"
    assert ready.payload.url == (f"http://{names.service}.{names.namespace}"
                                 f".svc.cluster.local:8888/w/{spec.workspace_id}/")
    original_spec = pod["spec"]

    # pause: a manual trigger; GKE's controller answers; the monitor reports.
    pause = spec_for("gpu-nb", "gpu-small", requestid="req-pause")
    runtime.snapshot(pause, "snap-1")
    monitor.sync()
    assert "snapshot.finished" not in bus.names()  # GKE has not acted yet
    ps_name = gke_completes_snapshot(cluster, spec, "snap-1")
    monitor.sync()
    finished = bus.wait_for("snapshot.finished", timeout=1, snapshot_id="snap-1")
    assert finished.requestid == "req-pause"
    assert finished.payload == SnapshotFinished(
        workspace_id=spec.workspace_id, snapshot_id="snap-1", succeeded=True, method="pod",
        uri=f"gs://stasis-snapshots/snapshots/ml-a/pod/{ps_name}", bytes=0,
        duration_ms=9000, accelerator="nvidia-l4", accelerator_count=1)

    # the lifecycle releases the hardware: the pod is gone, home and snapshot stay.
    runtime.release(spec.workspace_id)
    assert pod_of(cluster, spec) is None
    runtime.release(spec.workspace_id)  # idempotent
    assert "PersistentVolumeClaim" in workspace_objects(cluster, spec)

    # resume: the identical pod, pinned to the PodSnapshot.
    clock.now += 60
    resume = spec_for("gpu-nb", "gpu-small", requestid="req-resume")
    runtime.restore(resume, "snap-1")
    restored = pod_of(cluster, spec)
    assert restored is not None
    assert restored["metadata"]["annotations"][PS_NAME_ANNOTATION] == ps_name
    assert restored["spec"] == original_spec
    runtime.restore(resume, "snap-1")  # a redelivered resume changes nothing

    clock.now += 4
    kubelet_ready(cluster, spec, restored_from=ps_name)
    monitor.sync()
    resumed = bus.wait_for("workspace.ready", timeout=1, workspace_id=spec.workspace_id,
                           restore_ms=4000)
    assert resumed.requestid == "req-resume"
    assert resumed.payload.kernels_restored == 2  # counted by the agent

    # delete: every object of the workspace goes, the PodSnapshot included.
    assert set(workspace_objects(cluster, spec)) >= {
        "Pod", "Service", "Secret", "ServiceAccount", "ConfigMap", "PersistentVolumeClaim",
        "NetworkPolicy",
        "podsnapshotmanualtriggers", "podsnapshots"}
    runtime.destroy(spec.workspace_id, keep_home=False)
    assert workspace_objects(cluster, spec) == {}
    assert read(custom(cluster).get_namespaced_custom_object, GROUP, VERSION,
                names.namespace, "podsnapshots", ps_name) is None
    runtime.destroy(spec.workspace_id, keep_home=False)  # idempotent
    assert runtime.status(spec.workspace_id) is None


def test_a_cold_started_pod_is_a_failed_resume(cluster: EmulatedCluster,
                                               runtime: KubernetesRuntime, monitor: Monitor,
                                               bus: RecordingPublisher) -> None:
    spec = spec_for("cold", "gpu-small")
    runtime.provision(spec)
    runtime.snapshot(spec_for("cold", "gpu-small"), "snap-cold")
    gke_completes_snapshot(cluster, spec, "snap-cold")
    runtime.release(spec.workspace_id)
    runtime.restore(spec_for("cold", "gpu-small", requestid="req-cold"), "snap-cold")
    names = workspace_names(spec.team, spec.workspace_id)
    core(cluster).patch_namespaced_pod_status(names.pod, names.namespace, {"status": {
        "conditions": [{"type": "Ready", "status": "True"},
                       {"type": "PodRestored", "status": "False", "message": "spec mismatch"}]}},
        _preload_content=False)
    monitor.sync()
    failed = bus.wait_for("workspace.runtime_failed", timeout=1, workspace_id=spec.workspace_id)
    assert failed.payload.operation == "resume"
    assert "spec mismatch" in failed.payload.reason
    assert "workspace.ready" not in [e.name for e in bus.events if e.requestid == "req-cold"]
    runtime.destroy(spec.workspace_id, keep_home=False)


def test_resume_refuses_other_hardware_for_a_pod_snapshot(cluster: EmulatedCluster,
                                                          runtime: KubernetesRuntime) -> None:
    spec = spec_for("picky", "gpu-small")
    runtime.provision(spec)
    runtime.snapshot(spec, "snap-picky")
    gke_completes_snapshot(cluster, spec, "snap-picky")
    runtime.release(spec.workspace_id)
    with pytest.raises(RuntimeRefused, match="1 x nvidia-l4"):
        runtime.restore(spec_for("picky", "cpu-small"), "snap-picky")
    assert pod_of(cluster, spec) is None
    runtime.destroy(spec.workspace_id, keep_home=False)


def test_a_failed_pod_snapshot_is_reported(cluster: EmulatedCluster, runtime: KubernetesRuntime,
                                           monitor: Monitor, bus: RecordingPublisher) -> None:
    spec = spec_for("broken", "gpu-small")
    runtime.provision(spec)
    runtime.snapshot(spec_for("broken", "gpu-small", requestid="req-fail"), "snap-fail")
    names = workspace_names(spec.team, spec.workspace_id)
    custom(cluster).patch_namespaced_custom_object_status(
        GROUP, VERSION, names.namespace, "podsnapshotmanualtriggers",
        snapshot_object_name("snap-fail"),
        {"status": {"conditions": [{"type": "Triggered", "status": "False", "reason": "Failed",
                                    "message": "checkpoint failed: out of memory",
                                    "lastTransitionTime": "2026-01-01T00:00:04Z"}]}})
    monitor.sync()
    finished = bus.wait_for("snapshot.finished", timeout=1, snapshot_id="snap-fail")
    assert finished.payload.succeeded is False
    assert "out of memory" in (finished.payload.error or "")
    runtime.destroy(spec.workspace_id, keep_home=False)


# -- any cluster: the kernel agent ------------------------------------------------------


def test_kernel_snapshot_pause_and_resume(cluster: EmulatedCluster, runtime: KubernetesRuntime,
                                          monitor: Monitor, bus: RecordingPublisher,
                                          sidecars: FakeSidecars, clock: Clock) -> None:
    spec = spec_for("cpu-nb", "cpu-small", requestid="req-provision")
    runtime.provision(spec)
    pod = pod_of(cluster, spec)
    assert pod["metadata"]["labels"][LABEL_METHOD] == "kernel"
    assert "runtimeClassName" not in pod["spec"]
    kubelet_ready(cluster, spec)
    monitor.sync()
    bus.wait_for("workspace.ready", timeout=1, workspace_id=spec.workspace_id)

    runtime.snapshot(spec_for("cpu-nb", "cpu-small", requestid="req-pause"), "snap-k",
                     base="snap-j", base_manifest_sha256="ab" * 32)
    request = json_annotation(pod_of(cluster, spec), ANN_SNAPSHOT_REQUEST)
    assert request["snapshot_id"] == "snap-k"
    assert request["prefix"] == f"snapshots/ml-a/{spec.workspace_id}/snap-k"
    assert monitor.sync() is True  # the agent is still capturing
    base = {"snapshot_id": "snap-j", "prefix": f"snapshots/ml-a/{spec.workspace_id}/snap-j",
            "manifest_sha256": "ab" * 32}
    assert sidecars.posts[-1][1:] == ("/snapshots", {
        "snapshot_id": "snap-k", "bucket": "stasis-snapshots",
        "prefix": f"snapshots/ml-a/{spec.workspace_id}/snap-k", "base": base})
    part = f"snapshots/ml-a/{spec.workspace_id}/_parts/{'cd' * 32}"
    sidecars.snapshot_job = {"state": "succeeded", "uri": "gs://stasis-snapshots/x",
                             "bytes": 268435456, "duration_ms": 3100, "captured": ["big"],
                             "skipped": [{"name": "sock", "reason": "socket"}],
                             "manifest_sha256": "ef" * 32, "parts": {part: 268435456},
                             "uploaded_bytes": 1024}
    monitor.sync()
    finished = bus.wait_for("snapshot.finished", timeout=1, snapshot_id="snap-k")
    assert finished.requestid == "req-pause"
    assert (finished.payload.method, finished.payload.bytes, finished.payload.captured) == (
        "kernel", 268435456, ["big"])
    assert (finished.payload.manifest_sha256, finished.payload.parts,
            finished.payload.uploaded_bytes) == ("ef" * 32, {part: 268435456}, 1024)
    assert len([p for p in sidecars.posts if p[1] == "/snapshots"]) == 1

    runtime.release(spec.workspace_id)
    runtime.restore(spec_for("cpu-nb", "cpu-small", requestid="req-resume"), "snap-k",
                    manifest_sha256="ef" * 32)
    restored = pod_of(cluster, spec)
    assert PS_NAME_ANNOTATION not in restored["metadata"]["annotations"]
    assert json_annotation(restored, ANN_RESTORE_REQUEST)["snapshot_id"] == "snap-k"
    clock.now += 2
    kubelet_ready(cluster, spec)
    assert monitor.sync() is True  # Ready, but the kernels are not restored yet
    assert sidecars.posts[-1][1:] == ("/restore", {
        "snapshot_id": "snap-k", "bucket": "stasis-snapshots",
        "prefix": f"snapshots/ml-a/{spec.workspace_id}/snap-k",
        "manifest_sha256": "ef" * 32, "device_arrays_to_cpu": False})
    assert "req-resume" not in [e.requestid for e in bus.events if e.name == "workspace.ready"]
    sidecars.restore_job = {"state": "succeeded", "kernels_restored": 3}
    monitor.sync()
    resumed = bus.wait_for("workspace.ready", timeout=1, workspace_id=spec.workspace_id,
                           kernels_restored=3)
    assert resumed.requestid == "req-resume" and resumed.payload.restore_ms == 2000

    assert monitor.report_activity() >= 1
    idle = bus.wait_for("workspace.idle_detected", timeout=1, workspace_id=spec.workspace_id)
    assert idle.payload.last_activity == "2026-01-01T00:00:01+00:00"
    runtime.destroy(spec.workspace_id, keep_home=True)
    assert workspace_objects(cluster, spec) == {
        "PersistentVolumeClaim": [workspace_names("ml-a", spec.workspace_id).pvc]}
    runtime.destroy(spec.workspace_id, keep_home=False)


def test_kernel_snapshot_of_a_pod_that_vanished_fails(cluster: EmulatedCluster,
                                                     runtime: KubernetesRuntime,
                                                     monitor: Monitor,
                                                     bus: RecordingPublisher) -> None:
    spec = spec_for("vanish", "cpu-small")
    runtime.provision(spec)
    runtime.snapshot(spec, "snap-v")
    monitor.sync()
    runtime.release(spec.workspace_id)
    monitor.sync()
    finished = bus.wait_for("snapshot.finished", timeout=1, snapshot_id="snap-v")
    assert finished.payload.succeeded is False
    runtime.destroy(spec.workspace_id, keep_home=False)


def test_snapshot_needs_a_running_pod(runtime: KubernetesRuntime) -> None:
    with pytest.raises(RuntimeRefused, match="no running pod"):
        runtime.snapshot(spec_for("never", "cpu-small"), "s")


# -- API semantics -------------------------------------------------------------------------


def test_each_workspace_gets_its_own_service_account_until_destroyed(
        cluster: EmulatedCluster, clock: Clock) -> None:
    runtime = KubernetesRuntime(cluster.api_client, catalog=lambda: CATALOG, clock=clock,
                                token_factory=lambda: "t0k3n", workspace_gsa="ws@p.iam")
    first = replace(spec_for("ident", "cpu-small"), extra={"incarnation": "inc-1"})
    other = replace(spec_for("other", "cpu-small"), extra={"incarnation": "inc-1"})
    runtime.provision(first)
    runtime.provision(other)
    ns = workspace_names("ml-a", first.workspace_id).namespace
    account = service_account_name(first.workspace_id, "inc-1")
    made = read(core(cluster).read_namespaced_service_account, account, ns)
    assert made is not None and made["automountServiceAccountToken"] is False
    assert made["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == "ws@p.iam"
    assert runs_as(cluster, first) == account
    assert runs_as(cluster, other) == service_account_name(other.workspace_id, "inc-1")

    runtime.destroy(first.workspace_id, keep_home=True)
    assert read(core(cluster).read_namespaced_service_account, account, ns) is None
    assert read(core(cluster).read_namespaced_service_account,
                service_account_name(other.workspace_id, "inc-1"), ns) is not None
    # a later workspace of the same id: another incarnation, another KSA
    again = replace(first, extra={"incarnation": "inc-2"})
    runtime.provision(again)
    assert runs_as(cluster, again) == service_account_name(first.workspace_id, "inc-2")
    assert runs_as(cluster, again) != account
    runtime.destroy(first.workspace_id, keep_home=False)
    runtime.destroy(other.workspace_id, keep_home=False)


def test_provision_is_idempotent_and_keeps_the_token(cluster: EmulatedCluster,
                                                     clock: Clock) -> None:
    tokens = iter(["first-token", "second-token"])
    runtime = KubernetesRuntime(cluster.api_client, catalog=lambda: CATALOG,
                                token_factory=lambda: next(tokens), clock=clock)
    spec = spec_for("twice", "cpu-small")
    runtime.provision(spec)
    runtime.provision(spec)  # 409 on every object: success
    status = runtime.status(spec.workspace_id)
    assert status is not None and status.token == "first-token"
    assert status.running is False and status.operation == "provision"
    assert spec.workspace_id in [s.workspace_id for s in runtime.list()]
    runtime.destroy(spec.workspace_id, keep_home=False)


def test_changed_quotas_are_applied_to_the_existing_quota(cluster: EmulatedCluster,
                                                          runtime: KubernetesRuntime) -> None:
    runtime.provision(spec_for("q1", "cpu-small", team="ml-b"))
    ns = team_namespace_name("ml-b")
    assert read(core(cluster).read_namespaced_resource_quota, QUOTA_NAME,
                ns)["spec"]["hard"]["pods"] == "4"
    config = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
    config["teams"][1]["quotas"]["workspaces"] = 6
    bigger = Catalog.from_config(config)
    KubernetesRuntime(cluster.api_client, catalog=lambda: bigger).provision(
        spec_for("q2", "cpu-small", team="ml-b"))
    assert read(core(cluster).read_namespaced_resource_quota, QUOTA_NAME,
                ns)["spec"]["hard"]["pods"] == "6"
    for name in ("q1", "q2"):
        runtime.destroy(f"ml-b--{name}", keep_home=False)


def test_an_object_that_is_not_ours_is_refused(cluster: EmulatedCluster,
                                               runtime: KubernetesRuntime) -> None:
    spec = spec_for("squatted", "cpu-small")
    runtime.provision(spec_for("other", "cpu-small"))  # makes the namespace
    names = workspace_names(spec.team, spec.workspace_id)
    core(cluster).create_namespaced_persistent_volume_claim(names.namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": names.pvc, "namespace": names.namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        _preload_content=False)
    with pytest.raises(RuntimeRefused, match="not managed by Stasis"):
        runtime.provision(spec)
    core(cluster).delete_namespaced_persistent_volume_claim(names.pvc, names.namespace,
                                                            _preload_content=False)
    runtime.destroy("ml-a--other", keep_home=False)


def test_an_unreachable_api_is_temporary() -> None:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    runtime = KubernetesRuntime(client.ApiClient(configuration))
    with pytest.raises(RuntimeUnavailable, match="unreachable"):
        runtime.provision(spec_for("offline", "cpu-small"))
    assert runtime.capabilities()["runtime"] == "kubernetes"
    assert "accelerators" not in runtime.capabilities()


def test_a_pod_that_cannot_start_is_reported(cluster: EmulatedCluster,
                                             runtime: KubernetesRuntime, monitor: Monitor,
                                             bus: RecordingPublisher) -> None:
    spec = spec_for("badimage", "cpu-small", requestid="req-bad")
    runtime.provision(spec)
    names = workspace_names(spec.team, spec.workspace_id)
    core(cluster).patch_namespaced_pod_status(names.pod, names.namespace, {"status": {
        "containerStatuses": [{"name": "workspace", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "manifest unknown"}}}]}},
        _preload_content=False)
    monitor.sync()
    failed = bus.wait_for("workspace.runtime_failed", timeout=1, workspace_id=spec.workspace_id)
    assert failed.payload == WorkspaceRuntimeFailed(
        spec.workspace_id, "provision",
        "container workspace cannot start: ImagePullBackOff: manifest unknown")
    runtime.destroy(spec.workspace_id, keep_home=False)


# -- the monitor's watches -----------------------------------------------------------------


def test_watch_events_wake_the_monitor(cluster: EmulatedCluster, runtime: KubernetesRuntime,
                                       bus: RecordingPublisher, sidecars: FakeSidecars) -> None:
    kube = KubeCluster(cluster.api_client)
    monitor = Monitor(kube, bus, sidecars, idle_interval=3600)
    stop = threading.Event()
    pods_watch = kube.watches(monitor.wake)[0]
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True,
                              kwargs={"watches": [pods_watch], "busy_interval": 60,
                                      "resync_interval": 60})
    spec = spec_for("watched", "cpu-small", requestid="req-watched")
    thread.start()
    try:
        runtime.provision(spec)
        time.sleep(0.5)  # the first pass sees the pod, not Ready: it would sleep 60 s
        began = time.monotonic()
        kubelet_ready(cluster, spec)
        ready = bus.wait_for("workspace.ready", timeout=20, workspace_id=spec.workspace_id)
        assert time.monotonic() - began < 20  # woken by the watch, not the 60 s timer
        assert isinstance(ready.payload, WorkspaceReady)
    finally:
        stop.set()
        monitor.wake.set()
        # One more pod event lets the watch loop see the stop and close its stream.
        runtime.destroy(spec.workspace_id, keep_home=False)
        thread.join(5)
