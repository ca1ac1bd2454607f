"""The cluster monitor's objects (``runtime.kubernetes.monitor``): its namespace, identity,
read-only rights and Deployment, applied once per cluster by an admin or Terraform."""

from __future__ import annotations

from typing import Any

from functions.kubernetes.objects.kinds import (
    JOBSET_GROUP,
    KUEUE_GROUP,
    METRICS_GROUP,
    PODSNAPSHOT_GROUP,
)
from functions.kubernetes.objects.meta import (
    APP_NAME,
    GKE_SERVICE_ACCOUNT,
    MANAGED_BY,
    POD_SECURITY_ENFORCE,
    STASIS,
    meta,
)
from functions.kubernetes.objects.rbac import RBAC_API, rule
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.settings import ClusterSettings

MONITOR = "stasis-monitor"
#: The Secret (system namespace, key ``key``) holding STASIS_SIDECAR_KEY for the monitor.
SIDECAR_KEY_SECRET = "stasis-sidecar-key"
#: What the monitor's pods are labelled with: workspaces admit its agent requests.
MONITOR_LABELS = {APP_NAME: MONITOR}


def monitor_manifests(*, project: str, image: str | None = None,
                      settings: ClusterSettings = ClusterSettings(),
                      gcp_service_account: str | None = None,
                      idle_interval_s: int = 60) -> list[dict[str, Any]]:
    """The cluster monitor: namespace, ServiceAccount, read-only ClusterRole (a watch across
    team namespaces needs a cluster-wide list/watch), its binding, and the Deployment.

    One replica (``Recreate``): events it publishes carry the request's id, so a
    duplicate after a restart is absorbed by the control plane's ledger anyway. Its
    Workload Identity may publish to Pub/Sub; workspaces cannot.
    """
    ns = settings.system_namespace
    labels = dict(MONITOR_LABELS)
    sa_annotations = ({GKE_SERVICE_ACCOUNT: gcp_service_account}
                      if gcp_service_account else None)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": meta(ns, labels={POD_SECURITY_ENFORCE: "restricted"})}
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": meta(MONITOR, ns, labels=labels, annotations=sa_annotations)}
    role = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
            "metadata": meta(MONITOR, labels=labels),
            "rules": [rule("", ["pods"], ["get", "list", "watch"]),
                      rule(PODSNAPSHOT_GROUP, ["podsnapshotmanualtriggers", "podsnapshots"],
                           ["get", "list", "watch"]),
                      # the job watcher: JobSets' ends, a failed host's log
                      rule(JOBSET_GROUP, ["jobsets"], ["get", "list", "watch"]),
                      rule("", ["pods/log"], ["get"]),
                      # the sandbox watch: a sandbox task's CPU, to see it idle
                      rule(METRICS_GROUP, ["pods"], ["get", "list"]),
                      # the Kueue watch: workspace pods' Workloads admitted or evicted
                      rule(KUEUE_GROUP, ["workloads"], ["get", "list", "watch"])]}
    binding = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
               "metadata": meta(MONITOR, labels=labels),
               "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": MONITOR},
               "subjects": [{"kind": "ServiceAccount", "name": MONITOR, "namespace": ns}]}
    env = [{"name": "STASIS_PROJECT", "value": project},
           {"name": "STASIS_MONITOR_IDLE_INTERVAL", "value": str(idle_interval_s)},
           {"name": "STASIS_POD_SNAPSHOTS", "value": "1" if settings.pod_snapshots else "0"},
           {"name": "PYTHONPATH", "value": settings.agent_source_root},
           # the workspaces' sidecars answer only a caller that derives their tokens from it
           {"name": "STASIS_SIDECAR_KEY", "valueFrom": {"secretKeyRef": {
               "name": SIDECAR_KEY_SECRET, "key": "key"}}}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(MONITOR, ns, labels=labels),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, MANAGED_BY: STASIS}},
                "spec": {
                    "serviceAccountName": MONITOR,
                    "securityContext": restricted_pod(settings.uid, settings.gid),
                    "containers": [{
                        "name": "monitor", "image": image or settings.agent_image,
                        "command": ["python", "-m", "runtime.kubernetes.monitor"],
                        "env": env,
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"cpu": "500m", "memory": "256Mi"}},
                        "securityContext": restricted_container(),
                    }],
                },
            },
        },
    }
    return [namespace, account, role, binding, deployment]
