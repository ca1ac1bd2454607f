"""GKE Pod Snapshots (``podsnapshot.gke.io/v1``): a team's storage and policy, and reading
a trigger's and a PodSnapshot's progress. Workspaces (method ``pod``) and idle sandboxes use
them alike.

A pod labelled ``stasis.dev/snapshot-method: pod`` is selected by its team's
PodSnapshotPolicy (manual triggers only); a PodSnapshotManualTrigger checkpoints it, whole
(GPU memory included), to the team's bucket prefix; a pod re-created identical but for the
``podsnapshot.gke.io/ps-name`` annotation is restored from that PodSnapshot. Pod Snapshots
do not include persistent volumes, which is why a workspace's home is a PVC of its own.

The fields come from the ``podsnapshot.gke.io/v1`` CRDs: the GKE reference
(https://cloud.google.com/kubernetes-engine/docs/reference/crds/podsnapshot:
PodSnapshotStorageConfig ``spec.snapshotStorageConfig.gcs.{bucket,path}``, cluster-scoped;
PodSnapshotPolicy ``spec.{selector,storageConfigName,triggerConfig.{type,postCheckpoint}}``
and ``retentionConfig.lastAccessTimeout``), the how-to pages "Trigger a Pod snapshot"
(``triggerConfig.type: manual``) and "Restore from a Pod snapshot" (the
``podsnapshot.gke.io/ps-name`` pod annotation), and the CRD manifests GKE installs, as
published in gke-labs/pod-migration ``patches/crds/*.yaml``: PodSnapshotManualTrigger
``spec.targetPod``, ``status.conditions[type=Triggered]`` (reason ``Complete`` or
``Failed``) and ``status.snapshotCreated.name``; PodSnapshot ``spec.policyName``,
``status.conditions[type=Ready]`` and ``status.storageStatus.gcs.observedGCSPath``. The
transcription lives in ``tests/data/crds/podsnapshot.gke.io.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.kubernetes.objects.kinds import PODSNAPSHOT_GROUP, PODSNAPSHOT_VERSION
from functions.kubernetes.objects.meta import (
    ANN_TEAM_ID,
    LABEL_METHOD,
    MANAGED_BY,
    STASIS,
    meta,
    team_labels,
)
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.status import condition, conditions
from functions.kubernetes.objects.team import team_namespace_name

PODSNAPSHOT_API = f"{PODSNAPSHOT_GROUP}/{PODSNAPSHOT_VERSION}"
#: GKE restores a pod from the PodSnapshot named here ("Restore from a Pod snapshot").
PS_NAME_ANNOTATION = "podsnapshot.gke.io/ps-name"
POLICY_NAME = "stasis-pod-snapshots"


def storage_config_name(team: str, settings: ClusterSettings = ClusterSettings()) -> str:
    """PodSnapshotStorageConfig is cluster-scoped: one per team, named like its namespace."""
    return team_namespace_name(team, settings)


def snapshot_storage_config(team: str, bucket: str, *, team_prefix: str,
                            settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Where GKE writes the team's Pod Snapshots: ``gs://<bucket>/<team_prefix>/pod``.

    Cluster-scoped (the CRD's ``scope: Cluster``), so it carries no namespace and no
    ownerReference (a namespaced owner would be ignored); it is named after the team.
    """
    gcs = {"bucket": bucket, "path": f"{team_prefix.strip('/')}/pod"}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotStorageConfig",
            "metadata": meta(storage_config_name(team, settings), labels=team_labels(team),
                             annotations={ANN_TEAM_ID: team}),
            "spec": {"snapshotStorageConfig": {"gcs": gcs}}}


def snapshot_policy(team: str, settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team's PodSnapshotPolicy: manual triggers only, for the team's ``pod``-method
    workspaces; the pod keeps running after the checkpoint (``postCheckpoint: resume``)
    until the control plane releases it, so a failed upload never loses the workspace."""
    spec: dict[str, Any] = {
        "storageConfigName": storage_config_name(team, settings),
        "selector": {"matchLabels": {MANAGED_BY: STASIS, LABEL_METHOD: "pod"}},
        "triggerConfig": {"type": "manual", "postCheckpoint": "resume"},
    }
    if settings.pod_snapshot_retention:
        spec["retentionConfig"] = {"lastAccessTimeout": settings.pod_snapshot_retention}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotPolicy",
            "metadata": meta(POLICY_NAME, team_namespace_name(team, settings),
                             labels=team_labels(team)),
            "spec": spec}


def team_pod_snapshots(team: str, bucket: str,
                       settings: ClusterSettings = ClusterSettings()) -> list[dict[str, Any]]:
    """What a team needs before its first Pod Snapshot: the storage config (under
    ``snapshots/<team>`` of the bucket) and the policy."""
    return [snapshot_storage_config(team, bucket, team_prefix=f"snapshots/{team}",
                                    settings=settings),
            snapshot_policy(team, settings)]


# -- reading their progress --------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """Where a snapshot object stands: ``pending``, ``succeeded`` or ``failed``."""

    state: str
    message: str = ""
    name: str | None = None  # the PodSnapshot's name, once GKE created it
    uri: str | None = None
    finished_at: str | None = None


def trigger_outcome(trigger: Mapping[str, Any]) -> Outcome:
    """A PodSnapshotManualTrigger's progress: ``Triggered`` True with reason ``Complete``
    and ``status.snapshotCreated.name`` set; False with ``Failed``/``Error`` is final."""
    created = ((trigger.get("status") or {}).get("snapshotCreated") or {}).get("name") or None
    triggered = condition(trigger, "Triggered")
    if triggered is None:
        return Outcome("pending", name=created)
    if triggered.get("status") == "False" and triggered.get("reason") in ("Failed", "Error"):
        return Outcome("failed", str(triggered.get("message") or triggered.get("reason")),
                       created)
    if triggered.get("status") == "True" and triggered.get("reason") == "Complete" and created:
        return Outcome("succeeded", name=created,
                       finished_at=triggered.get("lastTransitionTime"))
    return Outcome("pending", name=created)


def podsnapshot_outcome(snapshot: Mapping[str, Any]) -> Outcome:
    """A PodSnapshot's state: ``Ready`` True is available; a ``Failed``/``Error`` reason on
    ``Ready`` (or on the controller's ``Checkpoint``/``StorageReplicated`` steps) is
    final."""
    name_ = (snapshot.get("metadata") or {}).get("name")
    uri = (((snapshot.get("status") or {}).get("storageStatus") or {}).get("gcs")
           or {}).get("observedGCSPath")
    for cond in conditions(snapshot):
        if (cond.get("type") in ("Ready", "Checkpoint", "StorageReplicated")
                and cond.get("status") == "False" and cond.get("reason") in ("Failed", "Error")):
            return Outcome("failed", f"{cond.get('type')}: {cond.get('message') or ''}".strip(),
                           name_, uri)
    ready = condition(snapshot, "Ready")
    if ready is not None and ready.get("status") == "True":
        return Outcome("succeeded", name=name_, uri=uri,
                       finished_at=ready.get("lastTransitionTime"))
    return Outcome("pending", name=name_, uri=uri)
