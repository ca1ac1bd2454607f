"""The Kubernetes builders (``functions/kubernetes/objects/``): every object they produce is
valid for the Kubernetes API (the OpenAPI schema of a recent release, strict: an unknown
field fails) or for the transcribed Pod Snapshot CRDs, and says what Stasis means."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from crd_schemas import strict

from functions.domain import admission
from functions.domain.catalog import Catalog, Quotas
from functions.kubernetes.objects.hardware import Hardware
from functions.kubernetes.objects.meta import (
    ANN_ACCELERATOR,
    ANN_ACCELERATOR_COUNT,
    ANN_RESTORE_REQUEST,
    LABEL_METHOD,
    MANAGED_BY,
    STASIS,
    json_annotation,
)
from functions.kubernetes.objects.monitor import monitor_manifests
from functions.kubernetes.objects.names import is_dns1035, is_label, team_of
from functions.kubernetes.objects.podsnapshot import (
    PODSNAPSHOT_API,
    POLICY_NAME,
    PS_NAME_ANNOTATION,
    Outcome,
    podsnapshot_outcome,
    snapshot_policy,
    snapshot_storage_config,
    trigger_outcome,
)
from functions.kubernetes.objects.rbac import (
    WORKSPACE_MANAGER_ROLE,
    control_plane_rbac,
    team_role_binding,
)
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.snapshot import (
    SnapshotHardware,
    hardware_of_record,
    manual_trigger,
    restore_refusal,
    snapshot_record,
)
from functions.kubernetes.objects.status import pod_failure, pod_ready
from functions.kubernetes.objects.team import (
    resource_quota,
    team_namespace,
    team_service_account,
)
from functions.kubernetes.objects.workspace import (
    HOME,
    IDENTITY_DIR,
    RUNTIME_DIR,
    Restore,
    WorkspaceShape,
    encrypted_storage_class,
    home_pvc,
    network_policy,
    service_account_name,
    shape_of,
    token_secret,
    workspace_names,
    workspace_pod,
    workspace_service,
    workspace_service_account,
)

K8S_VERSION = "1.35"  # GKE's regular channel as of this writing; shipped by kubernetes-validate
ROOT = Path(__file__).resolve().parents[2]
CRDS = json.loads((ROOT / "tests/data/crds/podsnapshot.gke.io.json").read_text())
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples/stasis.yaml").read_text()))
SUBJECT = {"kind": "User", "name": "fn@example-project.iam.gserviceaccount.com",
           "apiGroup": "rbac.authorization.k8s.io"}


DEFAULTS = ClusterSettings()


def shape(profile: str = "cpu-small", *, ide: str = "jupyterlab", workspace: str = "ml-a--nb",
          settings: ClusterSettings = DEFAULTS) -> WorkspaceShape:
    """The shape the adapter builds: the spec's mappings plus the catalog's disk and IDE."""
    entry, disk = CATALOG.ides[ide], CATALOG.profiles[profile].disk
    return shape_of(workspace_id=workspace, team=team_of(workspace), owner="alice", ide=ide,
                    environment=admission.environment_of(CATALOG, "python-3-11"),
                    profile=admission.profile_of(CATALOG, profile), settings=settings,
                    ide_kind=str(entry.kind), ide_image=entry.image,
                    disk={"size": disk.size, "storage_class": disk.storage_class})


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once() -> Iterator[None]:
    """kubernetes-validate parses its (large) schema files on every call; read them once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(
            kubernetes_validate.utils.schema_contents))
        yield


def validate(obj: dict[str, Any]) -> None:
    """Kubernetes objects against the OpenAPI schema, CRD objects against their CRD."""
    if obj["apiVersion"] == PODSNAPSHOT_API:
        crd = CRDS["kinds"][obj["kind"]]
        jsonschema.validate(obj, strict(crd["openAPIV3Schema"], any_metadata=True),
                            format_checker=jsonschema.FormatChecker())
        namespaced = "namespace" in obj["metadata"]
        assert namespaced == (crd["scope"] == "Namespaced"), obj["kind"]
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    meta = obj["metadata"]
    assert is_label(meta["name"]) if obj["kind"] != "Service" else is_dns1035(meta["name"])
    for key, value in (meta.get("labels") or {}).items():
        assert len(value) <= 63 and (not value or value[0].isalnum()), (key, value)


def every_object() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every builder, for every profile of the example catalog, IDE and method."""
    kernel_only = ClusterSettings(pod_snapshots=False)
    yield "namespace", team_namespace("ml-a")
    yield "service account", team_service_account(
        "ml-a", gcp_service_account="ws@example-project.iam.gserviceaccount.com")
    yield "quota", resource_quota("ml-a", CATALOG.teams["ml-a"].quotas)
    yield "role binding", team_role_binding("ml-a", SUBJECT)
    yield "storage config", snapshot_storage_config("ml-a", "stasis-snapshots",
                                                    team_prefix="snapshots/ml-a")
    yield "policy", snapshot_policy("ml-a", ClusterSettings(pod_snapshot_retention="30d"))
    yield "storage class", encrypted_storage_class(
        "standard-rwo-cmek", "projects/p/locations/us/keyRings/stasis/cryptoKeys/homes")
    for i, obj in enumerate([*control_plane_rbac(SUBJECT),
                             *monitor_manifests(project="example-project",
                                                gcp_service_account="mon@p.iam")]):
        yield f"cluster {i} {obj['kind']}", obj
    for profile in CATALOG.profiles:
        for ide in CATALOG.ides:
            for settings in (ClusterSettings(), kernel_only):
                s = shape(profile, ide=ide, settings=settings)
                label = f"{profile}/{ide}/{s.method}"
                yield f"{label} pvc", home_pvc(s, settings)
                yield f"{label} service account", workspace_service_account(
                    s, settings, gcp_service_account="ws@p.iam.gserviceaccount.com")
                yield f"{label} secret", token_secret(s, "t0k3n", settings)
                yield f"{label} pod", workspace_pod(s, settings, requestid="r1",
                                                    requested_at_ms=1)
                restore = Restore("snap-1", s.method, ps_name="ps-123", bucket="b",
                                  prefix="snapshots/ml-a/ml-a--nb/snap-1")
                yield f"{label} restored pod", workspace_pod(
                    s, settings, requestid="r2", requested_at_ms=2, restore=restore)
                yield f"{label} service", workspace_service(s, settings)
                yield f"{label} network policy", network_policy(s, settings)
                yield f"{label} network policy with function ranges", network_policy(
                    s, replace(settings, function_cidrs=("10.10.0.0/20",)))
                yield f"{label} trigger", manual_trigger(s, "snap-1", requestid="r3",
                                                         requested_at_ms=3,
                                                         settings=settings)
                yield f"{label} record", snapshot_record(s, "snap-1", requested_at_ms=3,
                                                         settings=settings)


OBJECTS = list(every_object())


@pytest.mark.parametrize(("what", "obj"), OBJECTS, ids=[what for what, _ in OBJECTS])
def test_every_object_is_valid(what: str, obj: dict[str, Any]) -> None:
    validate(obj)


def test_validation_is_strict_an_unknown_field_fails() -> None:
    pod = workspace_pod(shape(), requestid="r", requested_at_ms=1)
    pod["spec"]["containers"][0]["resource"] = {}  # a typo of "resources"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)
    trigger = manual_trigger(shape("gpu-small"), "s", requestid="r", requested_at_ms=1)
    trigger["spec"]["target_pod"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        validate(trigger)


def test_the_crd_transcription_accepts_what_gke_reports() -> None:
    """Status written by GKE's controller (as the monitor reads it) fits the schema."""
    status = {"conditions": [{"type": "Triggered", "status": "True", "reason": "Complete",
                              "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
              "snapshotCreated": {"name": "0f9c"}}
    trigger = {**manual_trigger(shape("gpu-small"), "s", requestid="r", requested_at_ms=1),
               "status": status}
    validate(trigger)
    snapshot = {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshot",
                "metadata": {"name": "0f9c", "namespace": "stasis-ml-a"},
                "spec": {"policyName": POLICY_NAME},
                "status": {"conditions": [{"type": "Ready", "status": "True",
                                           "reason": "AllSnapshotsAvailable", "message": "",
                                           "lastTransitionTime": "2026-01-01T00:00:09Z"}],
                           "storageStatus": {"gcs": {"observedGCSPath":
                                                     "gs://b/snapshots/ml-a/pod/0f9c"}}}}
    validate(snapshot)


# -- what the objects say --------------------------------------------------------------------


def test_gpu_pod_on_gke_with_pod_snapshots() -> None:
    s = shape("gpu-small")
    pod = workspace_pod(s, requestid="req-1", requested_at_ms=1700)
    spec = pod["spec"]
    assert s.method == "pod"
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    workspace = spec["containers"][0]
    assert workspace["image"] == "us-docker.pkg.dev/example-project/stasis/python:3.11"
    assert workspace["resources"] == {
        "requests": {"cpu": "4000m", "memory": "16Gi"},
        "limits": {"cpu": "4000m", "memory": "16Gi", "nvidia.com/gpu": "1"}}
    assert workspace["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]},
                                            "runAsNonRoot": True}
    assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4",
                                    "cloud.google.com/gke-spot": "true"}
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in spec["tolerations"]
    assert "affinity" not in spec  # Spot: no anti-Spot affinity
    assert "initContainers" not in spec  # no kernel agent install: GKE snapshots the pod
    assert [c["name"] for c in spec["containers"]] == ["workspace", "snapshot-agent"]
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANN_ACCELERATOR] == "nvidia-l4"
    assert annotations[ANN_ACCELERATOR_COUNT] == "1"
    assert pod["metadata"]["labels"][LABEL_METHOD] == "pod"
    # The token is never in the spec, only referenced.
    assert "t0k3n" not in json.dumps(pod)
    env = {e["name"]: e for e in workspace["env"]}
    assert env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert env["PYTHONUSERBASE"]["value"].startswith(HOME)


def test_each_workspace_runs_as_its_own_service_account_with_a_projected_identity() -> None:
    s = replace(shape("cpu-small"), incarnation="inc-1")
    settings = replace(DEFAULTS, workspace_api_url="https://fn.example/workspace_api")
    account = workspace_service_account(s, settings, gcp_service_account="ws@p.iam")
    spec = workspace_pod(s, settings, requestid="r", requested_at_ms=1)["spec"]
    name = account["metadata"]["name"]
    assert spec["serviceAccountName"] == name == service_account_name("ml-a--nb", "inc-1")
    assert account["metadata"]["namespace"] == "stasis-ml-a"
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False
    # the team's Google identity, for the sidecar's snapshot uploads
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == "ws@p.iam"
    # another incarnation of the same id, or another workspace: another KSA
    assert service_account_name("ml-a--nb", "inc-2") != name
    assert service_account_name("ml-a--nb2", "inc-1") != name
    volume = next(v for v in spec["volumes"] if v["name"] == "workspace-identity")
    assert volume["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": "stasis-workspace", "expirationSeconds": 3600, "path": "token"}}]
    ide, agent = spec["containers"]
    assert {"name": "workspace-identity", "mountPath": IDENTITY_DIR,
            "readOnly": True} in ide["volumeMounts"]
    assert all(m["name"] != "workspace-identity" for m in agent.get("volumeMounts", []))
    env = {e["name"]: e.get("value") for e in ide["env"]}
    assert env["STASIS_WORKSPACE_TOKEN_FILE"] == f"{IDENTITY_DIR}/token"
    assert env["STASIS_WORKSPACE_URL"] == "https://fn.example/workspace_api"
    assert "STASIS_WORKSPACE_URL" not in {
        e["name"] for e in workspace_pod(s, requestid="r", requested_at_ms=1)[
            "spec"]["containers"][0]["env"]}


def test_tpu_on_demand_with_a_reservation() -> None:
    spec = workspace_pod(shape("tpu-v5e-8"), requestid="r", requested_at_ms=1)["spec"]
    assert spec["containers"][0]["resources"]["requests"]["google.com/tpu"] == "8"
    assert spec["containers"][0]["resources"]["limits"]["google.com/tpu"] == "8"
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
        "cloud.google.com/reservation-affinity": "specific",
        "cloud.google.com/reservation-name": "tpu-v5e-research"}
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"}]}]}
    assert "runtimeClassName" not in spec  # method kernel


def test_kernel_method_runs_the_agent_with_the_kernels_connection_files() -> None:
    s = shape("cpu-small")
    spec = workspace_pod(s, requestid="r", requested_at_ms=1)["spec"]
    assert s.method == "kernel" and "runtimeClassName" not in spec
    workspace, agent = spec["containers"]
    assert agent["image"] == ClusterSettings().agent_image
    assert agent["command"] == ["python", "-m", "runtime.kubernetes.sidecar"]
    assert {"name": "jupyter-runtime", "mountPath": RUNTIME_DIR} in agent["volumeMounts"]
    assert {"name": "jupyter-runtime", "mountPath": RUNTIME_DIR} in workspace["volumeMounts"]
    assert {"name": "stasis-lib", "mountPath": "/opt/stasis", "readOnly": True} \
        in workspace["volumeMounts"]
    assert spec["initContainers"][0]["command"][-2:] == ["install", "/stasis-lib"]


def test_a_pod_profile_falls_back_to_the_kernel_agent_without_pod_snapshots() -> None:
    s = shape("gpu-small", settings=ClusterSettings(pod_snapshots=False))
    assert s.method == "kernel"
    spec = workspace_pod(s, ClusterSettings(pod_snapshots=False), requestid="r",
                         requested_at_ms=1)["spec"]
    assert "runtimeClassName" not in spec


def test_vscode_runs_code_server_from_the_ides_image() -> None:
    workspace = workspace_pod(shape(ide="vscode"), requestid="r",
                              requested_at_ms=1)["spec"]["containers"][0]
    assert workspace["image"] == "us-docker.pkg.dev/example-project/stasis/code-server:4.96.2"
    assert workspace["command"] == ["code-server"]
    assert any(e["name"] == "PASSWORD" for e in workspace["env"])


def test_restore_recreates_the_identical_pod_pinned_to_the_snapshot() -> None:
    s = shape("gpu-small")
    first = workspace_pod(s, requestid="r1", requested_at_ms=1)
    again = workspace_pod(s, requestid="r2", requested_at_ms=2,
                          restore=Restore("snap-1", "pod", ps_name="0f9c"))
    assert again["spec"] == first["spec"]
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert again["metadata"]["annotations"][PS_NAME_ANNOTATION] == "0f9c"
    assert PS_NAME_ANNOTATION not in first["metadata"]["annotations"]
    with pytest.raises(ValueError):
        workspace_pod(s, requestid="r", requested_at_ms=1, restore=Restore("s", "pod"))


def test_kernel_restore_is_asked_for_on_the_pod() -> None:
    pod = workspace_pod(shape(), requestid="r2", requested_at_ms=2,
                        restore=Restore("snap-1", "kernel", bucket="b", prefix="p/snap-1",
                                        manifest_sha256="ab" * 32))
    assert json_annotation(pod, ANN_RESTORE_REQUEST) == {
        "snapshot_id": "snap-1", "bucket": "b", "prefix": "p/snap-1", "requestid": "r2",
        "manifest_sha256": "ab" * 32, "device_arrays_to_cpu": False}


def test_home_pvc_uses_the_profiles_storage_class_or_the_encrypted_default() -> None:
    assert home_pvc(shape("gpu-small"))["spec"] == {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "premium-rwo-cmek",
        "resources": {"requests": {"storage": "50Gi"}}}
    bare = shape_of(workspace_id="ml-a--x", team="ml-a", owner="a", ide="jupyterlab",
                    environment={"id": "e", "image": "img"}, profile={"id": "p", "cpu": 1})
    assert bare.storage_class == "standard-rwo-cmek" and bare.home_size == "10Gi"
    storage_class = encrypted_storage_class("standard-rwo-cmek", "projects/p/k")
    assert storage_class["parameters"]["disk-encryption-kms-key"] == "projects/p/k"


def test_quota_comes_from_the_teams_catalog_quota() -> None:
    quota = resource_quota("ml-b", Quotas(workspaces=4, gpus=1, tpus=0, snapshot_bytes=1))
    assert quota["metadata"]["namespace"] == "stasis-ml-b"
    assert quota["spec"]["hard"] == {"pods": "4", "persistentvolumeclaims": "4",
                                     "requests.nvidia.com/gpu": "1",
                                     "requests.google.com/tpu": "0"}


def test_pod_snapshot_objects_point_at_the_teams_bucket_prefix() -> None:
    config = snapshot_storage_config("ml-a", "stasis-snapshots", team_prefix="snapshots/ml-a")
    assert "namespace" not in config["metadata"]  # cluster-scoped
    assert config["spec"] == {"snapshotStorageConfig": {"gcs": {
        "bucket": "stasis-snapshots", "path": "snapshots/ml-a/pod"}}}
    policy = snapshot_policy("ml-a")
    assert policy["spec"] == {"storageConfigName": config["metadata"]["name"],
                              "selector": {"matchLabels": {MANAGED_BY: STASIS,
                                                           LABEL_METHOD: "pod"}},
                              "triggerConfig": {"type": "manual", "postCheckpoint": "resume"}}
    s = shape("gpu-small")
    trigger = manual_trigger(s, "snap-1", requestid="r", requested_at_ms=5)
    assert trigger["spec"] == {"targetPod": workspace_names("ml-a", "ml-a--nb").pod}
    # The policy selects the pods it must snapshot.
    labels = workspace_pod(s, requestid="r", requested_at_ms=1)["metadata"]["labels"]
    assert policy["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_network_policy_lets_only_the_system_namespace_in() -> None:
    spec = network_policy(shape())["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    ide, agent = spec["ingress"]
    assert ide["ports"] == [{"protocol": "TCP", "port": 8888}]
    assert agent["from"][0]["podSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "stasis-monitor"}}


def test_the_functions_egress_range_reaches_the_ide_port_only() -> None:
    settings = ClusterSettings(function_cidrs=("10.10.0.0/20",))
    ide, agent = network_policy(shape(settings=settings), settings)["spec"]["ingress"]
    assert {"ipBlock": {"cidr": "10.10.0.0/20"}} in ide["from"]
    assert ide["ports"] == [{"protocol": "TCP", "port": 8888}]
    assert all("ipBlock" not in peer for peer in agent["from"])


def test_rbac_is_verb_minimal_and_has_no_wildcards() -> None:
    objects = [*control_plane_rbac(SUBJECT), *monitor_manifests(project="p")]
    rules = [r for o in objects for r in o.get("rules", [])]
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
    monitor_role = next(o for o in objects if o["kind"] == "ClusterRole"
                        and o["metadata"]["name"] == "stasis-monitor")
    assert {v for r in monitor_role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    # nothing that grants rights: no RoleBinding, no bind (tests/unit/test_k8s_rbac.py)
    assert not any("bind" in r["verbs"] or "rolebindings" in r["resources"] for r in rules)
    assert any(o["metadata"]["name"] == WORKSPACE_MANAGER_ROLE for o in objects)
    binding = team_role_binding("ml-a", SUBJECT)
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == "stasis-ml-a"


def test_monitor_deployment() -> None:
    deployment = monitor_manifests(project="example-project")[-1]
    assert deployment["kind"] == "Deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "runtime.kubernetes.monitor"]
    assert {"name": "STASIS_PROJECT", "value": "example-project"} in container["env"]


def test_namespaces_enforce_restricted_pod_security() -> None:
    labels = team_namespace("ml-a")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


# -- resume only onto the same kind ------------------------------------------------------


L4 = Hardware(cpu_millis=4000, memory="16Gi", accelerator="nvidia-l4", accelerator_count=1)
L4x2 = Hardware(cpu_millis=4000, memory="16Gi", accelerator="nvidia-l4", accelerator_count=2)
A100 = Hardware(cpu_millis=4000, memory="16Gi", accelerator="nvidia-tesla-a100",
                accelerator_count=1)
TPU = Hardware(cpu_millis=4000, memory="16Gi", accelerator="tpu-v5-lite-podslice",
               accelerator_count=8, topology="2x4")
CPU = Hardware(cpu_millis=1000, memory="2Gi")
POD_L4 = SnapshotHardware("pod", "nvidia-l4", 1)
KERNEL_L4 = SnapshotHardware("kernel", "nvidia-l4", 1)
KERNEL_TPU = SnapshotHardware("kernel", "tpu-v5-lite-podslice", 8)
KERNEL_CPU = SnapshotHardware("kernel")


@pytest.mark.parametrize(("snapshot", "target", "method", "refused"), [
    (POD_L4, L4, "pod", None),
    (POD_L4, L4x2, "pod", "1 x nvidia-l4"),  # a Pod Snapshot holds exactly this memory
    (POD_L4, A100, "pod", "has 1 x nvidia-tesla-a100"),
    (POD_L4, CPU, "pod", "has no accelerator"),
    (POD_L4, L4, "kernel", "does not use Pod Snapshots"),
    (SnapshotHardware("pod"), CPU, "pod", None),
    (SnapshotHardware("pod"), L4, "pod", "has 1 x nvidia-l4"),
    (KERNEL_L4, L4, "kernel", None),
    (KERNEL_L4, A100, "kernel", None),  # another GPU type: the same kind
    (KERNEL_L4, L4x2, "pod", None),
    (KERNEL_L4, CPU, "kernel", "GPU"),
    (KERNEL_L4, TPU, "kernel", "GPU"),
    (KERNEL_TPU, L4, "kernel", "TPU"),
    (KERNEL_TPU, TPU, "kernel", None),
    (KERNEL_CPU, L4, "kernel", None),
    (KERNEL_CPU, CPU, "kernel", None),
])
def test_resume_only_targets_the_same_kind(snapshot: SnapshotHardware, target: Hardware,
                                           method: str, refused: str | None) -> None:
    refusal = restore_refusal(snapshot, target, method)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refused in refusal


def test_a_gpu_snapshot_records_accelerator_type_and_count() -> None:
    record = snapshot_record(shape("gpu-small"), "snap-1", requested_at_ms=9)
    assert record["data"]["accelerator"] == "nvidia-l4"
    assert record["data"]["accelerator_count"] == "1"
    assert hardware_of_record(record["data"]) == POD_L4
    assert hardware_of_record(snapshot_record(shape(), "s", requested_at_ms=1)["data"]) \
        == KERNEL_CPU


# -- reading what the cluster reports ------------------------------------------------------


def _cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:05Z"}


def test_trigger_outcomes() -> None:
    assert trigger_outcome({}).state == "pending"
    done = {"status": {"conditions": [_cond("Triggered", "True", "Complete")],
                       "snapshotCreated": {"name": "ps-1"}}}
    assert trigger_outcome(done) == Outcome("succeeded", name="ps-1",
                                            finished_at="2026-01-01T00:00:05Z")
    failed = {"status": {"conditions": [_cond("Triggered", "False", "Failed", "no gVisor")]}}
    assert trigger_outcome(failed).state == "failed"
    assert trigger_outcome(failed).message == "no gVisor"


def test_podsnapshot_outcomes() -> None:
    ready = {"metadata": {"name": "ps-1"}, "status": {
        "conditions": [_cond("Ready", "True", "AllSnapshotsAvailable")],
        "storageStatus": {"gcs": {"observedGCSPath": "gs://b/p/ps-1"}}}}
    assert podsnapshot_outcome(ready).state == "succeeded"
    assert podsnapshot_outcome(ready).uri == "gs://b/p/ps-1"
    broken = {"status": {"conditions": [_cond("StorageReplicated", "False", "Failed", "403")]}}
    assert podsnapshot_outcome(broken).state == "failed"
    assert podsnapshot_outcome({"status": {}}).state == "pending"


def test_pod_failures_and_readiness() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_ready(ready)
    assert not pod_ready({**ready, "metadata": {"deletionTimestamp": "x"}})
    pulling = {"status": {"containerStatuses": [
        {"name": "workspace", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                    "message": "not found"}}}]}}
    assert pod_failure(pulling) == "container workspace cannot start: ImagePullBackOff: " \
                                     "not found"
    creating = {"status": {"containerStatuses": [
        {"name": "workspace", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert pod_failure(creating) is None
