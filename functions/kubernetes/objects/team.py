"""A team's objects: its namespace (Pod Security ``restricted``), the identity of its
workspaces, and its quotas as the cluster's own backstop.

The control plane's rights in the namespace are ``rbac.team_role_binding``; the team's Pod
Snapshot storage and policy are in ``podsnapshot``.
"""

from __future__ import annotations

from typing import Any

from functions.domain.catalog import Quotas
from functions.kubernetes.objects.hardware import GPU_RESOURCE, TPU_RESOURCE
from functions.kubernetes.objects.meta import (
    ANN_TEAM_ID,
    GKE_SERVICE_ACCOUNT,
    POD_SECURITY_ENFORCE,
    POD_SECURITY_VERSION,
    meta,
    team_labels,
)
from functions.kubernetes.objects.names import name
from functions.kubernetes.objects.settings import ClusterSettings, NamespacePrefix

QUOTA_NAME = "stasis-quota"
WORKSPACE_SA = "stasis-workspace"


def team_namespace_name(team: str, settings: NamespacePrefix = ClusterSettings()) -> str:
    return name(settings.namespace_prefix, team)


def team_namespace(team: str, settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team's namespace. Pod Security ``restricted`` is enforced: every workspace pod
    already runs non-root, without privilege escalation or capabilities."""
    labels = {**team_labels(team), POD_SECURITY_ENFORCE: "restricted",
              POD_SECURITY_VERSION: "latest"}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": meta(team_namespace_name(team, settings), labels=labels,
                             annotations={ANN_TEAM_ID: team})}


def team_service_account(team: str, settings: ClusterSettings = ClusterSettings(), *,
                         gcp_service_account: str | None = None) -> dict[str, Any]:
    """The team's shared identity, which job pods run as (each workspace pod runs as its
    own, ``workspace.workspace_service_account``). With Workload Identity it maps to a Google
    service account; no pod identity may write a workspace's kernel snapshots (those use the
    monitor's downscoped tokens, ``functions.domain.snapshot_access``), only the team's Pod
    Snapshots (``tokenSource: podKSA``, the team's ``pod/`` folder). No token is mounted:
    GKE's metadata server serves Workload Identity without one."""
    annotations = {ANN_TEAM_ID: team}
    if gcp_service_account:
        annotations[GKE_SERVICE_ACCOUNT] = gcp_service_account
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta(WORKSPACE_SA, team_namespace_name(team, settings),
                             labels=team_labels(team), annotations=annotations),
            "automountServiceAccountToken": False}


def resource_quota(team: str, quotas: Quotas,
                   settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team's catalog quotas as a ResourceQuota: the cluster's own backstop behind the
    control plane's admission (which counts in Firestore transactions).

    One pod and one home PVC per workspace; a paused workspace keeps its PVC (its slot,
    as in ``functions.domain.quota``) but not its pod. Extended resources can only be
    limited through ``requests.<name>``.
    """
    hard = {
        "pods": str(quotas.workspaces),
        "persistentvolumeclaims": str(quotas.workspaces),
        f"requests.{GPU_RESOURCE}": str(quotas.gpus),
        f"requests.{TPU_RESOURCE}": str(quotas.tpus),
    }
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": meta(QUOTA_NAME, team_namespace_name(team, settings),
                             labels=team_labels(team)),
            "spec": {"hard": hard}}
