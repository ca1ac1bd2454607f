"""Where each kind Stasis makes lives in the Kubernetes API, and which method of the official
client reaches it.

Both clients, the control plane's (``functions.kubernetes.api``) and the cluster monitor's
read-only one (``runtime.kubernetes.cluster``), route through :func:`call`, so a new kind (a
Kueue ClusterQueue, a Gateway) is one line here: a custom resource in :data:`CUSTOM_KINDS`,
a built-in kind in :data:`TYPED_KINDS`. Pure data: nothing here imports the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PODSNAPSHOT_GROUP = "podsnapshot.gke.io"
PODSNAPSHOT_VERSION = "v1"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
RBAC_GROUP = "rbac.authorization.k8s.io"
METRICS_GROUP, METRICS_VERSION = "metrics.k8s.io", "v1beta1"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"

#: Custom resources: kind -> (group, version, plural). Namespaced or not is the caller's
#: ``namespace`` (None: cluster-scoped, or every namespace for a list).
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "PodSnapshotStorageConfig": (PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION,
                                 "podsnapshotstorageconfigs"),
    "PodSnapshotPolicy": (PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION, "podsnapshotpolicies"),
    "PodSnapshotManualTrigger": (PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION,
                                 "podsnapshotmanualtriggers"),
    "PodSnapshot": (PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION, "podsnapshots"),
    "JobSet": (JOBSET_GROUP, JOBSET_VERSION, "jobsets"),
    "FQDNNetworkPolicy": ("networking.gke.io", "v1alpha1", "fqdnnetworkpolicies"),
    #: metrics-server's PodMetrics (read only)
    "PodMetrics": (METRICS_GROUP, METRICS_VERSION, "pods"),
    # Kueue (objects.kueue): the runtime applies LocalQueues; Terraform the cluster-scoped
    # ones; the monitor reads Workloads
    **{kind: (KUEUE_GROUP, KUEUE_VERSION, plural) for kind, plural in (
        ("ResourceFlavor", "resourceflavors"), ("ClusterQueue", "clusterqueues"),
        ("LocalQueue", "localqueues"), ("WorkloadPriorityClass", "workloadpriorityclasses"),
        ("AdmissionCheck", "admissionchecks"),
        ("ProvisioningRequestConfig", "provisioningrequestconfigs"),
        ("Workload", "workloads"))},
}

#: Built-in kinds: kind -> (the client's API class, the suffix of its methods). A suffix
#: ``namespaced_*`` is a namespaced kind (listed across namespaces with
#: ``list_*_for_all_namespaces``); any other is cluster-scoped.
TYPED_KINDS: dict[str, tuple[str, str]] = {
    "Namespace": ("CoreV1Api", "namespace"),
    "Pod": ("CoreV1Api", "namespaced_pod"),
    "Service": ("CoreV1Api", "namespaced_service"),
    "Secret": ("CoreV1Api", "namespaced_secret"),
    "ConfigMap": ("CoreV1Api", "namespaced_config_map"),
    "PersistentVolumeClaim": ("CoreV1Api", "namespaced_persistent_volume_claim"),
    "ServiceAccount": ("CoreV1Api", "namespaced_service_account"),
    "ResourceQuota": ("CoreV1Api", "namespaced_resource_quota"),
    "NetworkPolicy": ("NetworkingV1Api", "namespaced_network_policy"),
    "RoleBinding": ("RbacAuthorizationV1Api", "namespaced_role_binding"),
    "ClusterRole": ("RbacAuthorizationV1Api", "cluster_role"),
    "ClusterRoleBinding": ("RbacAuthorizationV1Api", "cluster_role_binding"),
    "Deployment": ("AppsV1Api", "namespaced_deployment"),
    "StorageClass": ("StorageV1Api", "storage_class"),
}

VERBS = ("create", "read", "patch", "delete", "list")


@dataclass(frozen=True)
class Call:
    """One method of the official client and its positional arguments."""

    api: str  # the client's API class, e.g. "CoreV1Api"
    method: str
    args: tuple[Any, ...]


def call(verb: str, kind: str, namespace: str | None, name: str | None = None,
         body: Any = None) -> Call:
    """The client call that does ``verb`` (:data:`VERBS`) on ``kind``: ``name`` for read,
    patch and delete, ``body`` (the object, or a merge patch) for create and patch."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r} (expected one of {', '.join(VERBS)})")
    named = (name,) if verb in ("read", "patch", "delete") else ()
    sent = (body,) if verb in ("create", "patch") else ()
    if kind in CUSTOM_KINDS:
        group, version, plural = CUSTOM_KINDS[kind]
        scope = "cluster" if namespace is None else "namespaced"
        where = (group, version) + (() if namespace is None else (namespace,)) + (plural,)
        custom_verb = "get" if verb == "read" else verb
        return Call("CustomObjectsApi", f"{custom_verb}_{scope}_custom_object",
                    where + named + sent)
    if kind not in TYPED_KINDS:
        raise ValueError(f"the Kubernetes runtime does not handle {kind}")
    api, suffix = TYPED_KINDS[kind]
    namespaced = suffix.startswith("namespaced_")
    if verb == "list" and namespaced and namespace is None:
        return Call(api, f"list_{suffix.removeprefix('namespaced_')}_for_all_namespaces", ())
    # The typed methods take the name first, then the namespace, then the body.
    where = (namespace,) if namespaced and namespace is not None else ()
    return Call(api, f"{verb}_{suffix}", named + where + sent)
