"""The helpers every Kubernetes object family shares (``functions/kubernetes/objects``): the
API routing both clients use, the restricted security contexts, resources from a profile,
metadata, the cluster settings read from the environment, readings, and report ids."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from functions.domain.catalog import AcceleratorKind
from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec
from functions.kubernetes.objects import kinds
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.hardware import container_resources, guaranteed
from functions.kubernetes.objects.meta import (
    ANN_TEAM_ID,
    MANAGED_BY,
    STASIS,
    as_int,
    is_managed,
    json_annotation,
    meta,
)
from functions.kubernetes.objects.reports import event_id
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.settings import ClusterSettings, SandboxClusterSettings
from functions.kubernetes.objects.status import terminated, timestamp_ms, waiting_failure

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests/data/k8s_objects.json").read_text())
SANDBOX = RunSpec("sbx-1", "ml-a", "https://example.org/r.git", "main", "true", DEFAULT_LIMITS,
                  (), "req-1", "stasis-snapshots", "sandboxes/ml-a/sbx-1")

# -- the API routing -------------------------------------------------------------------------


@pytest.mark.parametrize(("verb", "kind", "namespace", "expected"), [
    ("create", "Pod", "ns", kinds.Call("CoreV1Api", "create_namespaced_pod", ("ns", "BODY"))),
    ("read", "Pod", "ns", kinds.Call("CoreV1Api", "read_namespaced_pod", ("x", "ns"))),
    ("patch", "Pod", "ns", kinds.Call("CoreV1Api", "patch_namespaced_pod",
                                      ("x", "ns", "BODY"))),
    ("delete", "Secret", "ns", kinds.Call("CoreV1Api", "delete_namespaced_secret",
                                          ("x", "ns"))),
    ("list", "Pod", "ns", kinds.Call("CoreV1Api", "list_namespaced_pod", ("ns",))),
    ("list", "Pod", None, kinds.Call("CoreV1Api", "list_pod_for_all_namespaces", ())),
    ("create", "Namespace", None, kinds.Call("CoreV1Api", "create_namespace", ("BODY",))),
    ("read", "Namespace", None, kinds.Call("CoreV1Api", "read_namespace", ("x",))),
    ("list", "Namespace", None, kinds.Call("CoreV1Api", "list_namespace", ())),
    ("patch", "NetworkPolicy", "ns", kinds.Call(
        "NetworkingV1Api", "patch_namespaced_network_policy", ("x", "ns", "BODY"))),
    ("create", "RoleBinding", "ns", kinds.Call(
        "RbacAuthorizationV1Api", "create_namespaced_role_binding", ("ns", "BODY"))),
    ("create", "PodSnapshotStorageConfig", None, kinds.Call(
        "CustomObjectsApi", "create_cluster_custom_object",
        ("podsnapshot.gke.io", "v1", "podsnapshotstorageconfigs", "BODY"))),
    ("read", "PodSnapshot", "ns", kinds.Call(
        "CustomObjectsApi", "get_namespaced_custom_object",
        ("podsnapshot.gke.io", "v1", "ns", "podsnapshots", "x"))),
    ("patch", "PodSnapshotPolicy", "ns", kinds.Call(
        "CustomObjectsApi", "patch_namespaced_custom_object",
        ("podsnapshot.gke.io", "v1", "ns", "podsnapshotpolicies", "x", "BODY"))),
    ("delete", "JobSet", "ns", kinds.Call(
        "CustomObjectsApi", "delete_namespaced_custom_object",
        ("jobset.x-k8s.io", "v1alpha2", "ns", "jobsets", "x"))),
    ("list", "JobSet", None, kinds.Call(
        "CustomObjectsApi", "list_cluster_custom_object",
        ("jobset.x-k8s.io", "v1alpha2", "jobsets"))),
    ("list", "PodMetrics", None, kinds.Call(
        "CustomObjectsApi", "list_cluster_custom_object", ("metrics.k8s.io", "v1beta1", "pods"))),
])
def test_every_verb_reaches_the_clients_method_with_its_arguments(
        verb: str, kind: str, namespace: str | None, expected: kinds.Call) -> None:
    assert kinds.call(verb, kind, namespace, "x", "BODY") == expected


def _kinds_built() -> set[tuple[str, bool]]:
    """Every (kind, namespaced) among the objects the builders make."""
    found: set[tuple[str, bool]] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "kind" in value and "apiVersion" in value and "metadata" in value:
                found.add((value["kind"], "namespace" in value["metadata"]))
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(GOLDEN)
    return found


@pytest.mark.parametrize("verb", kinds.VERBS)
def test_every_kind_the_builders_make_routes_to_a_real_client_method(verb: str) -> None:
    """The method exists on the official client and takes exactly the arguments given (its
    required positional parameters), for every kind a builder makes."""
    built = _kinds_built()
    assert len(built) >= 15
    for kind, namespaced in sorted(built):
        route = kinds.call(verb, kind, "ns" if namespaced else None, "x", {})
        method = getattr(getattr(kubernetes.client, route.api), route.method)
        required = [p for p in inspect.signature(method).parameters.values()
                    if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
                    and p.default is p.empty]
        assert len(required) == len(route.args), (kind, route)


def test_an_unknown_kind_or_verb_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="Gateway"):
        kinds.call("create", "Gateway", "ns")
    with pytest.raises(ValueError, match="watch"):
        kinds.call("watch", "Pod", "ns")


# -- security contexts, resources, metadata --------------------------------------------------


def test_the_restricted_container_context_and_its_options() -> None:
    base = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True}
    assert restricted_container() == base
    assert restricted_container(read_only_root=True, user=7, group=8, seccomp=True) == {
        **base, "readOnlyRootFilesystem": True, "runAsUser": 7, "runAsGroup": 8,
        "seccompProfile": {"type": "RuntimeDefault"}}
    one, two = restricted_container(), restricted_container()
    one["capabilities"]["drop"].append("NONE")
    assert two["capabilities"] == {"drop": ["ALL"]}, "no two containers share a dict"


def test_the_restricted_pod_context() -> None:
    assert restricted_pod(1000, 100) == {"runAsNonRoot": True, "runAsUser": 1000,
                                         "runAsGroup": 100,
                                         "seccompProfile": {"type": "RuntimeDefault"}}
    assert restricted_pod(1, 2, fs_group=2, fs_group_change_policy="OnRootMismatch") == {
        "runAsNonRoot": True, "runAsUser": 1, "runAsGroup": 2, "fsGroup": 2,
        "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(("args", "chips_only", "requests", "limits"), [
    ((1500, "4Gi"), False, {"cpu": "1500m", "memory": "4Gi"}, {"cpu": "1500m", "memory": "4Gi"}),
    ((4000, "16Gi", AcceleratorKind.GPU, 2), False, {"cpu": "4000m", "memory": "16Gi"},
     {"cpu": "4000m", "memory": "16Gi", "nvidia.com/gpu": "2"}),
    ((4000, "16Gi", AcceleratorKind.GPU, 2), True, {"cpu": "4000m", "memory": "16Gi"},
     {"cpu": "4000m", "memory": "16Gi", "nvidia.com/gpu": "2"}),
    ((24000, "48Gi", AcceleratorKind.TPU, 8), False,
     {"cpu": "24000m", "memory": "48Gi", "google.com/tpu": "8"},
     {"cpu": "24000m", "memory": "48Gi", "google.com/tpu": "8"}),
    ((24000, "48Gi", AcceleratorKind.TPU, 8), True, {"google.com/tpu": "8"},
     {"google.com/tpu": "8"}),
    ((1000, "2Gi", AcceleratorKind.GPU, 0), False, {"cpu": "1000m", "memory": "2Gi"},
     {"cpu": "1000m", "memory": "2Gi"}),
])
def test_resources_from_a_profile(args: tuple[Any, ...], chips_only: bool,
                                  requests: dict[str, str], limits: dict[str, str]) -> None:
    """Requests equal limits but for GPUs (limits only); a whole TPU host asks for chips."""
    assert container_resources(*args, chips_only=chips_only) == {"requests": requests,
                                                                  "limits": limits}


def test_guaranteed_resources_are_two_dicts() -> None:
    resources = guaranteed("100m", "64Mi")
    assert resources == {"requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"cpu": "100m", "memory": "64Mi"}}
    resources["limits"]["cpu"] = "1"
    assert resources["requests"]["cpu"] == "100m"


def test_metadata_is_always_marked_as_stasiss() -> None:
    assert meta("a") == {"name": "a", "labels": {MANAGED_BY: STASIS}}
    made = meta("a", "ns", labels={"x": "1"}, annotations={ANN_TEAM_ID: "t"})
    assert made == {"name": "a", "namespace": "ns", "labels": {MANAGED_BY: STASIS, "x": "1"},
                    "annotations": {ANN_TEAM_ID: "t"}}
    assert is_managed({"metadata": made}) and not is_managed({"metadata": {"name": "a"}})
    assert "annotations" not in meta("a", annotations={})


def test_reading_annotations_back() -> None:
    obj = {"metadata": {"annotations": {"j": '{"a": 1}', "list": "[1]", "bad": "{"}}}
    assert json_annotation(obj, "j") == {"a": 1}
    assert [json_annotation(obj, k) for k in ("list", "bad", "none")] == [None, None, None]
    assert [as_int(v) for v in ("12", None, "x", 3)] == [12, 0, 0, 3]


# -- the cluster's settings from the environment ---------------------------------------------


def test_cluster_settings_from_an_empty_environment_are_the_defaults() -> None:
    assert ClusterSettings.from_env({}) == ClusterSettings()
    assert SandboxClusterSettings.from_env({}) == SandboxClusterSettings()


def test_cluster_settings_from_the_environment() -> None:
    settings = ClusterSettings.from_env({
        "STASIS_K8S_NAMESPACE_PREFIX": "t-", "STASIS_K8S_SYSTEM_NAMESPACE": "ops",
        "STASIS_K8S_STORAGE_CLASS": "fast", "STASIS_K8S_HOME_SIZE": "5Gi",
        "STASIS_K8S_AGENT_IMAGE": "agent:2", "STASIS_K8S_POD_SNAPSHOTS": "no",
        "STASIS_K8S_URL_TEMPLATE": "https://{workspace}/",
        "STASIS_K8S_POD_SNAPSHOT_RETENTION": "30d",
        "STASIS_K8S_FUNCTION_CIDRS": " 10.0.0.0/20, ,10.1.0.0/20",
        "GOOGLE_CLOUD_PROJECT": "p", "STASIS_SNAPSHOT_BUCKET": "b"})
    assert settings == ClusterSettings(
        namespace_prefix="t-", system_namespace="ops", storage_class="fast", home_size="5Gi",
        agent_image="agent:2", pod_snapshots=False, url_template="https://{workspace}/",
        pod_snapshot_retention="30d", function_cidrs=("10.0.0.0/20", "10.1.0.0/20"),
        workspace_env={"STASIS_PROJECT": "p", "STASIS_SNAPSHOT_BUCKET": "b"})
    assert ClusterSettings.from_env({"STASIS_K8S_POD_SNAPSHOTS": "True"}).pod_snapshots


def test_sandbox_settings_from_the_environment() -> None:
    settings = SandboxClusterSettings.from_env({
        "STASIS_K8S_SANDBOX_RUNTIME_CLASS": "", "STASIS_K8S_SANDBOX_TRANSFER_CIDRS": "",
        "STASIS_K8S_SANDBOX_HOST_ALIASES": "10.0.0.9=gcs.test, gcs2.test ; 10.0.0.8=x",
        "STASIS_K8S_SANDBOX_IMAGE": "task:1", "STASIS_K8S_SANDBOX_TOOLS_IMAGE": "tools:1"})
    assert settings.runtime_class == "" and settings.transfer_cidrs == ()
    assert settings.transfer_host_aliases == (("10.0.0.9", ("gcs.test", "gcs2.test")),
                                              ("10.0.0.8", ("x",)))
    assert (settings.task_image, settings.tools_image) == ("task:1", "tools:1")
    # a sandbox Pod without a RuntimeClass: the node's default
    assert "runtimeClassName" not in sm.sandbox_pod(SANDBOX, "a" * 40, settings)["spec"]


# -- readings and report ids -----------------------------------------------------------------


def test_container_states() -> None:
    pod = {"status": {
        "initContainerStatuses": [{"name": "checkout", "state": {"terminated": {
            "exitCode": 0}}}],
        "containerStatuses": [
            {"name": "task", "state": {"waiting": {"reason": "ContainerCreating"}}},
            {"name": "collector", "state": {"waiting": {"reason": "ErrImagePull",
                                                         "message": "not found"}}}]}}
    assert terminated(pod, "checkout") == {"exitCode": 0}
    assert terminated(pod, "task") is None and terminated(pod, "nobody") is None
    assert waiting_failure(pod) == "container collector cannot start: ErrImagePull: not found"
    assert waiting_failure({"status": {}}) is None


def test_timestamps() -> None:
    assert timestamp_ms("2026-01-01T00:00:01Z") == 1_767_225_601_000
    assert [timestamp_ms(t) for t in (None, "", "yesterday")] == [0, 0, 0]


def test_report_ids_are_those_published_before() -> None:
    """A report published again after an upgrade must keep its id, so the control plane's
    ledger absorbs it: the ids are the sha256 of the same strings as before the move."""
    def old(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    assert event_id("k8s-monitor", "ws-ready-r1") == old("k8s-monitor:ws-ready-r1")
    assert sm.finished_event_id("sbx-1", "r") == old("k8s-sandbox:sbx-1:r")
    assert sm.idle_event_id("sbx-1", "r", 2) == old("k8s-sandbox-idle:sbx-1:r:2")
    assert event_id("k8s-jobs", "job-1-finished-r") == old("k8s-jobs:job-1-finished-r")
