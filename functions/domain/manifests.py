"""Kubernetes objects for Stasis workspaces, as pure builders: plain values in, dicts out.

The Kubernetes runtime (``functions.adapters.kubernetes_runtime``) only *applies* what this
module builds, the way kubespawner's ``make_pod``/``make_pvc`` feed its spawner. Nothing
here talks to a cluster; every builder is a function of its arguments (time and tokens
are passed in), so the tests compare whole objects and validate each one against the
Kubernetes OpenAPI schema (``kubernetes-validate``) and the transcribed Pod Snapshot CRDs.

What exists in a cluster, and who makes it:

======================== ============ =====================================================
object                   scope        built by
======================== ============ =====================================================
Namespace                per team     :func:`team_namespace` (Pod Security ``restricted``)
ServiceAccount           per team     :func:`team_service_account` (Workload Identity)
ResourceQuota            per team     :func:`resource_quota` (catalog ``Quotas``)
RoleBinding              per team     :func:`team_role_binding` (control plane's rights)
PodSnapshotStorageConfig per team     :func:`snapshot_storage_config` (cluster-scoped)
PodSnapshotPolicy        per team     :func:`snapshot_policy` (manual trigger)
PersistentVolumeClaim    per ws       :func:`home_pvc` (home survives every pause)
Secret                   per ws       :func:`token_secret` (the IDE token, never in a spec)
Pod                      per ws       :func:`workspace_pod` (IDE + snapshot agent sidecar)
Service, NetworkPolicy   per ws       :func:`workspace_service`, :func:`network_policy`
PodSnapshotManualTrigger per snapshot :func:`manual_trigger` (method ``pod``)
ConfigMap                per snapshot :func:`snapshot_record` (hardware of the snapshot)
======================== ============ =====================================================

plus the cluster-wide RBAC and the monitor's Deployment (:func:`control_plane_rbac`,
:func:`monitor_manifests`), applied once by an admin or Terraform.

Snapshot methods (``profile.snapshot.method``):

- ``pod`` (GKE Pod Snapshots): the pod runs under gVisor (``runtimeClassName: gvisor``); a
  PodSnapshotManualTrigger checkpoints the whole pod, GPU memory included, to the team's
  bucket prefix; resume re-creates the *identical* pod (same builder, same inputs) with the
  ``podsnapshot.gke.io/ps-name`` annotation. Pod Snapshots do not include persistent
  volumes, which is why home is a PVC of its own.
- ``kernel`` (any cluster): the snapshot agent sidecar captures each live kernel's
  namespace to Cloud Storage, exactly as the local node agent does (``runtime.snapshot``).

The Pod Snapshot fields below come from the ``podsnapshot.gke.io/v1`` CRDs: the GKE
reference (https://cloud.google.com/kubernetes-engine/docs/reference/crds/podsnapshot:
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

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from functions.domain.catalog import (
    AcceleratorKind,
    Quotas,
    accelerator_kind,
    parse_quantity,
)
from functions.domain.slugs import name, slug

# --------------------------------------------------------------------------------------------
# Labels, annotations, names
# --------------------------------------------------------------------------------------------

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
STASIS = "stasis"
LABEL_TEAM = "stasis.dev/team"
LABEL_WORKSPACE = "stasis.dev/workspace"
LABEL_METHOD = "stasis.dev/snapshot-method"
LABEL_SNAPSHOT = "stasis.dev/snapshot"

#: Annotations keep the raw ids (labels only hold slugs).
ANN_WORKSPACE_ID = "stasis.dev/workspace-id"
ANN_TEAM_ID = "stasis.dev/team-id"
ANN_OWNER = "stasis.dev/owner"
ANN_PROFILE = "stasis.dev/profile"
ANN_IDE = "stasis.dev/ide"
ANN_SNAPSHOT_ID = "stasis.dev/snapshot-id"
ANN_REQUESTID = "stasis.dev/requestid"
ANN_REQUESTED_AT = "stasis.dev/requested-at-ms"
ANN_ACCELERATOR = "stasis.dev/accelerator"
ANN_ACCELERATOR_COUNT = "stasis.dev/accelerator-count"
ANN_OPERATION = "stasis.dev/operation"
#: Kernel method: the adapter asks for a snapshot by annotating the pod; the monitor acts.
ANN_SNAPSHOT_REQUEST = "stasis.dev/snapshot-request"
#: Kernel method: a re-created pod carries what to restore; the monitor acts once it runs.
ANN_RESTORE_REQUEST = "stasis.dev/restore-request"

#: GKE restores a pod from the PodSnapshot named here ("Restore from a Pod snapshot").
PS_NAME_ANNOTATION = "podsnapshot.gke.io/ps-name"
PODSNAPSHOT_GROUP = "podsnapshot.gke.io"
PODSNAPSHOT_VERSION = "v1"
PODSNAPSHOT_API = f"{PODSNAPSHOT_GROUP}/{PODSNAPSHOT_VERSION}"

GKE_SPOT = "cloud.google.com/gke-spot"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_TPU = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
GKE_RESERVATION = "cloud.google.com/reservation-name"
GKE_RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
GPU_RESOURCE = "nvidia.com/gpu"
TPU_RESOURCE = "google.com/tpu"

WORKSPACE_CONTAINER = "workspace"
AGENT_CONTAINER = "snapshot-agent"
HOME = "/home/stasis"
RUNTIME_DIR = "/run/jupyter"
TOKEN_KEY = "token"
POLICY_NAME = "stasis-pod-snapshots"
QUOTA_NAME = "stasis-quota"
WORKSPACE_SA = "stasis-workspace"
SYSTEM_NAMESPACE = "stasis-system"
MONITOR = "stasis-monitor"
WORKSPACE_MANAGER_ROLE = "stasis-workspace-manager"
CONTROL_PLANE_ROLE = "stasis-control-plane"
RBAC_API = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class ClusterSettings:
    """How Stasis uses one cluster; set by the deployment, not by the catalog."""

    #: Team namespaces are ``<prefix><team slug>``; also names the storage configs.
    namespace_prefix: str = "stasis-"
    #: Where the monitor (and the access proxy) run; workspaces accept traffic from it.
    system_namespace: str = SYSTEM_NAMESPACE
    #: A profile without ``disk.storage_class`` gets this one: CMEK-encrypted by default
    #: (see :func:`encrypted_storage_class`).
    storage_class: str = "standard-rwo-cmek"
    home_size: str = "10Gi"
    #: The snapshot agent's image: Stasis under ``agent_source_root`` (sidecar + monitor).
    agent_image: str = "us-docker.pkg.dev/example-project/stasis/agent:latest"
    agent_source_root: str = "/opt/stasis"
    #: Whether the cluster has GKE Pod Snapshots; without them method ``pod`` falls back to
    #: ``kernel`` (the same agent as on the local runtime).
    pod_snapshots: bool = True
    runtime_class: str = "gvisor"
    jupyter_port: int = 8888
    agent_port: int = 8890
    uid: int = 1000
    gid: int = 100
    #: Where users reach a workspace: ``{service}``, ``{namespace}``, ``{port}``,
    #: ``{workspace}`` (the slug) are filled in.
    url_template: str = "http://{service}.{namespace}.svc.cluster.local:{port}/"
    #: Optional: Pod Snapshots GKE deletes when not restored for this long ("30d").
    pod_snapshot_retention: str | None = None
    #: Extra environment of the snapshot agent (e.g. ``STORAGE_EMULATOR_HOST`` on a test
    #: cluster; the agent hands it to the kernels it snapshots).
    agent_env: Mapping[str, str] = field(default_factory=dict)
    #: Extra environment of the IDE container and so of its kernels: ``STASIS_PROJECT`` and
    #: ``STASIS_SNAPSHOT_BUCKET``, which ``stasis.jobs`` needs to submit a job from a notebook.
    workspace_env: Mapping[str, str] = field(default_factory=dict)
    #: Where deployed functions' Direct VPC egress comes from (the subnet's primary
    #: range): the links proxy reaches the IDE port from there.
    function_cidrs: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkspaceNames:
    """Every name one workspace uses in its team's namespace."""

    namespace: str
    pod: str
    service: str
    pvc: str
    secret: str
    network_policy: str
    label: str  # the workspace slug, as a label value


def team_namespace_name(team: str, settings: ClusterSettings = ClusterSettings()) -> str:
    return name(settings.namespace_prefix, team)


def workspace_names(team: str, workspace_id: str,
                    settings: ClusterSettings = ClusterSettings()) -> WorkspaceNames:
    """Names of a workspace's objects; the prefixes are distinct per kind, and no prefix
    is the start of another, so no two objects of one workspace or of two workspaces share
    a name."""
    return WorkspaceNames(
        namespace=team_namespace_name(team, settings),
        pod=name("ws-", workspace_id),
        service=name("ws-", workspace_id),
        pvc=name("home-", workspace_id),
        secret=name("token-", workspace_id),
        network_policy=name("ws-", workspace_id),
        label=slug(workspace_id),
    )


def snapshot_object_name(snapshot_id: str) -> str:
    """The PodSnapshotManualTrigger and the snapshot record (ConfigMap) of a snapshot."""
    return name("snap-", snapshot_id)


def storage_config_name(team: str, settings: ClusterSettings = ClusterSettings()) -> str:
    """PodSnapshotStorageConfig is cluster-scoped: one per team, named like its namespace."""
    return team_namespace_name(team, settings)


def team_of(workspace_id: str) -> str:
    """The team of a workspace id (``<team>--<name>``; slugs never contain ``--``)."""
    team, separator, _ = workspace_id.partition("--")
    if not separator or not team:
        raise ValueError(f"{workspace_id!r} is not a workspace id (<team>--<name>)")
    return team


# --------------------------------------------------------------------------------------------
# What a workspace needs, from the catalog's entries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """A profile's hardware, as a pod needs it."""

    cpu_millis: int
    memory: str
    accelerator: str | None = None
    accelerator_count: int = 0
    topology: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    spot: bool = False
    reservation: str | None = None

    @property
    def accelerator_kind(self) -> AcceleratorKind | None:
        return accelerator_kind(self.accelerator) if self.accelerator else None

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any]) -> Hardware:
        """From the profile mapping a WorkspaceSpec carries (``admission.profile_of``)."""
        acc = profile.get("accelerator") or {}
        cpu = profile.get("cpu", 1)
        return cls(
            cpu_millis=max(1, math.ceil(float(cpu) * 1000)),
            memory=str(profile.get("memory") or "2Gi"),
            accelerator=acc.get("type"),
            accelerator_count=int(acc.get("count") or 0) if acc.get("type") else 0,
            topology=acc.get("topology"),
            node_selector={str(k): str(v) for k, v in (profile.get("node_selector") or {}).items()},
            tolerations=tuple(dict(t) for t in profile.get("tolerations") or ()),
            spot=profile.get("provisioning") == "spot",
            reservation=profile.get("reservation"),
        )


@dataclass(frozen=True)
class WorkspaceShape:
    """Everything the builders need about one workspace: ids, image, hardware, method."""

    workspace_id: str
    team: str
    owner: str
    profile: str
    ide: str
    ide_kind: str  # "jupyterlab" or "vscode"
    image: str
    hardware: Hardware
    method: str  # "pod" or "kernel", after the cluster's capabilities
    home_size: str
    storage_class: str

    @property
    def accelerated(self) -> bool:
        return self.hardware.accelerator is not None


def shape_of(*, workspace_id: str, team: str, owner: str, ide: str,
             environment: Mapping[str, Any], profile: Mapping[str, Any],
             settings: ClusterSettings = ClusterSettings(),
             ide_kind: str | None = None, ide_image: str | None = None,
             disk: Mapping[str, Any] | None = None) -> WorkspaceShape:
    """The shape of a workspace from a WorkspaceSpec's fields.

    The IDE's own image wins (VS Code ships as code-server); otherwise JupyterLab comes
    with the environment's image. ``disk`` (the profile's ``{size, storage_class}``) falls
    back to ``profile["disk"]`` and then to the cluster's defaults. Method ``pod`` needs
    Pod Snapshots; a cluster without them runs the kernel agent instead.
    """
    kind = ide_kind or ("vscode" if ide == "vscode" else "jupyterlab")
    image = ide_image or environment.get("image")
    if not image:
        raise ValueError(f"environment {environment.get('id')!r} has no image to run")
    disk = disk or profile.get("disk") or {}
    method = str(profile.get("snapshot_method") or "kernel")
    if method == "pod" and not settings.pod_snapshots:
        method = "kernel"
    size = str(disk.get("size") or settings.home_size)
    parse_quantity(size)  # raises on a malformed size, before anything is created
    return WorkspaceShape(
        workspace_id=workspace_id, team=team, owner=owner,
        profile=str(profile.get("id") or ""), ide=ide, ide_kind=kind, image=str(image),
        hardware=Hardware.from_profile(profile), method=method, home_size=size,
        storage_class=str(disk.get("storage_class") or settings.storage_class),
    )


# --------------------------------------------------------------------------------------------
# Per team
# --------------------------------------------------------------------------------------------


def _meta(obj_name: str, namespace: str | None = None, *, labels: Mapping[str, str] | None = None,
          annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": obj_name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {MANAGED_BY: STASIS, **(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def team_labels(team: str) -> dict[str, str]:
    return {LABEL_TEAM: slug(team)}


def team_namespace(team: str, settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team's namespace. Pod Security ``restricted`` is enforced: every workspace pod
    already runs non-root, without privilege escalation or capabilities."""
    labels = {**team_labels(team), "pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": _meta(team_namespace_name(team, settings), labels=labels,
                              annotations={ANN_TEAM_ID: team})}


def team_service_account(team: str, settings: ClusterSettings = ClusterSettings(), *,
                         gcp_service_account: str | None = None) -> dict[str, Any]:
    """The identity of the team's workspaces. With Workload Identity it maps to a Google
    service account that may write the team's snapshot prefix (the kernel agent uploads
    from inside the kernel; Pod Snapshots use the pod's KSA, ``tokenSource: podKSA``). No
    token is mounted: GKE's metadata server serves Workload Identity without one."""
    annotations = {ANN_TEAM_ID: team}
    if gcp_service_account:
        annotations["iam.gke.io/gcp-service-account"] = gcp_service_account
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(WORKSPACE_SA, team_namespace_name(team, settings),
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
            "metadata": _meta(QUOTA_NAME, team_namespace_name(team, settings),
                              labels=team_labels(team)),
            "spec": {"hard": hard}}


def team_role_binding(team: str, subject: Mapping[str, str],
                      settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Grants the control plane the workspace manager's rights in this namespace only (a
    RoleBinding to a ClusterRole is namespaced)."""
    return {"apiVersion": f"{RBAC_API}/v1", "kind": "RoleBinding",
            "metadata": _meta(CONTROL_PLANE_ROLE, team_namespace_name(team, settings),
                              labels=team_labels(team)),
            "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole",
                        "name": WORKSPACE_MANAGER_ROLE},
            "subjects": [dict(subject)]}


def snapshot_storage_config(team: str, bucket: str, *, team_prefix: str,
                            settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Where GKE writes the team's Pod Snapshots: ``gs://<bucket>/<team_prefix>/pod``.

    Cluster-scoped (the CRD's ``scope: Cluster``), so it carries no namespace and no
    ownerReference (a namespaced owner would be ignored); it is named after the team.
    """
    gcs = {"bucket": bucket, "path": f"{team_prefix.strip('/')}/pod"}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotStorageConfig",
            "metadata": _meta(storage_config_name(team, settings), labels=team_labels(team),
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
            "metadata": _meta(POLICY_NAME, team_namespace_name(team, settings),
                              labels=team_labels(team)),
            "spec": spec}


def encrypted_storage_class(class_name: str, kms_key: str, *,
                            disk_type: str = "pd-balanced") -> dict[str, Any]:
    """A GKE PD CSI StorageClass whose disks are encrypted with a customer-managed key
    (``disk-encryption-kms-key``), the default class for homes."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": _meta(class_name),
            "provisioner": "pd.csi.storage.gke.io",
            "parameters": {"type": disk_type, "disk-encryption-kms-key": kms_key},
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True}


# --------------------------------------------------------------------------------------------
# Per workspace
# --------------------------------------------------------------------------------------------


def workspace_labels(shape: WorkspaceShape) -> dict[str, str]:
    return {COMPONENT: "workspace", **team_labels(shape.team),
            LABEL_WORKSPACE: slug(shape.workspace_id), LABEL_METHOD: shape.method}


def _workspace_annotations(shape: WorkspaceShape) -> dict[str, str]:
    annotations = {ANN_WORKSPACE_ID: shape.workspace_id, ANN_TEAM_ID: shape.team,
                   ANN_OWNER: shape.owner, ANN_PROFILE: shape.profile, ANN_IDE: shape.ide}
    if shape.hardware.accelerator:
        annotations[ANN_ACCELERATOR] = shape.hardware.accelerator
        annotations[ANN_ACCELERATOR_COUNT] = str(shape.hardware.accelerator_count)
    return annotations


def home_pvc(shape: WorkspaceShape,
             settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The workspace's home: files, notebooks, user-installed packages and the pip cache.
    Outlives every pause (Pod Snapshots exclude volumes) and, with ``keep_home``, the
    workspace."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(names.pvc, names.namespace, labels=workspace_labels(shape),
                              annotations=_workspace_annotations(shape)),
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "storageClassName": shape.storage_class,
                     "resources": {"requests": {"storage": shape.home_size}}}}


def token_secret(shape: WorkspaceShape, token: str,
                 settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The IDE's token. Pods reference it (``secretKeyRef``), so it is in no pod spec and a
    re-created pod is identical to the snapshotted one."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(names.secret, names.namespace, labels=workspace_labels(shape),
                              annotations={ANN_WORKSPACE_ID: shape.workspace_id}),
            "stringData": {TOKEN_KEY: token}}


@dataclass(frozen=True)
class Restore:
    """What a re-created pod restores: a Pod Snapshot (``ps_name``) or kernel snapshot."""

    snapshot_id: str
    method: str
    ps_name: str | None = None
    bucket: str | None = None
    prefix: str | None = None


def workspace_pod(shape: WorkspaceShape, settings: ClusterSettings = ClusterSettings(), *,
                  requestid: str, requested_at_ms: int,
                  restore: Restore | None = None) -> dict[str, Any]:
    """The workspace pod.

    The spec depends on the shape and settings only: provisioning and every resume build
    the same spec, which GKE requires to restore a Pod Snapshot into it. What differs is
    metadata: the request's id and time, and on resume the ``ps-name`` annotation (method
    ``pod``) or the kernel snapshot to restore (method ``kernel``, read by the monitor).
    """
    names = workspace_names(shape.team, shape.workspace_id, settings)
    annotations = {**_workspace_annotations(shape), ANN_REQUESTID: requestid,
                   ANN_REQUESTED_AT: str(requested_at_ms),
                   ANN_OPERATION: "restore" if restore else "provision"}
    if restore is not None:
        annotations[ANN_SNAPSHOT_ID] = restore.snapshot_id
        if restore.method == "pod":
            if not restore.ps_name:
                raise ValueError("a Pod Snapshot restore needs the PodSnapshot's name")
            annotations[PS_NAME_ANNOTATION] = restore.ps_name
        else:
            annotations[ANN_RESTORE_REQUEST] = json.dumps(
                {"snapshot_id": restore.snapshot_id, "bucket": restore.bucket,
                 "prefix": restore.prefix, "requestid": requestid}, sort_keys=True)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(names.pod, names.namespace, labels=workspace_labels(shape),
                              annotations=annotations),
            "spec": pod_spec(shape, settings)}


def pod_spec(shape: WorkspaceShape,
             settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The pod spec alone (what a Pod Snapshot restore compares)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    kernel = shape.method == "kernel"
    volumes: list[dict[str, Any]] = [
        {"name": "home", "persistentVolumeClaim": {"claimName": names.pvc}}]
    mounts: list[dict[str, Any]] = [{"name": "home", "mountPath": HOME}]
    if kernel:
        # The agent reads the kernels' connection files, and the kernels import the
        # in-kernel half of the agent from the sidecar's copy of Stasis.
        volumes += [{"name": "jupyter-runtime", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "16Mi"}},
                    {"name": "stasis-lib", "emptyDir": {"sizeLimit": "256Mi"}}]
        mounts += [{"name": "jupyter-runtime", "mountPath": RUNTIME_DIR},
                   {"name": "stasis-lib", "mountPath": settings.agent_source_root,
                    "readOnly": True}]
    spec: dict[str, Any] = {
        "serviceAccountName": WORKSPACE_SA,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "runAsUser": settings.uid,
                            "runAsGroup": settings.gid, "fsGroup": settings.gid,
                            "fsGroupChangePolicy": "OnRootMismatch",
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_workspace_container(shape, settings, names, mounts),
                       _agent_container(shape, settings, names)],
        "volumes": volumes,
    }
    if kernel:
        spec["initContainers"] = [_agent_install_container(settings)]
    if shape.method == "pod":
        spec["runtimeClassName"] = settings.runtime_class
    selector, tolerations, affinity = placement(shape.hardware)
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if affinity:
        spec["affinity"] = affinity
    return spec


def placement(hardware: Hardware) -> tuple[dict[str, str], list[dict[str, Any]],
                                             dict[str, Any]]:
    """Node selector, tolerations and affinity for a profile's hardware on GKE.

    - accelerators: the GKE node labels for the type (and TPU topology), with the
      profile's own selector taking precedence (the catalog checks they agree);
    - Spot: ``cloud.google.com/gke-spot: "true"`` and its taint tolerated; on-demand:
      required node affinity *away* from Spot nodes, so preemption never pauses a
      workspace nobody asked to put at risk;
    - a reservation: ``reservation-name`` with ``reservation-affinity: specific``.
    """
    selector: dict[str, str] = {}
    if hardware.accelerator:
        if hardware.accelerator_kind == AcceleratorKind.TPU:
            selector[GKE_TPU] = hardware.accelerator
            if hardware.topology:
                selector[GKE_TPU_TOPOLOGY] = hardware.topology
        else:
            selector[GKE_ACCELERATOR] = hardware.accelerator
    selector.update(hardware.node_selector)
    tolerations = [dict(t) for t in hardware.tolerations]
    affinity: dict[str, Any] = {}
    if hardware.spot:
        selector[GKE_SPOT] = "true"
        spot_toleration = {"key": GKE_SPOT, "operator": "Equal", "value": "true",
                           "effect": "NoSchedule"}
        if spot_toleration not in tolerations:
            tolerations.append(spot_toleration)
    else:
        selector.pop(GKE_SPOT, None)
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": GKE_SPOT, "operator": "DoesNotExist"}]}]}}}
    if hardware.reservation:
        selector[GKE_RESERVATION] = hardware.reservation
        selector[GKE_RESERVATION_AFFINITY] = "specific"
    return dict(sorted(selector.items())), tolerations, affinity


def _restricted() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True}


def _token_env(names: WorkspaceNames, env_name: str) -> dict[str, Any]:
    return {"name": env_name,
            "valueFrom": {"secretKeyRef": {"name": names.secret, "key": TOKEN_KEY}}}


def _workspace_container(shape: WorkspaceShape, settings: ClusterSettings,
                         names: WorkspaceNames, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    port = settings.jupyter_port
    env = [{"name": "HOME", "value": HOME},
           # User-installed packages and the pip cache live in home: they survive pause,
           # resume and a change of profile.
           {"name": "PYTHONUSERBASE", "value": f"{HOME}/.local"},
           {"name": "PIP_USER", "value": "1"},
           {"name": "PIP_CACHE_DIR", "value": f"{HOME}/.cache/pip"},
           {"name": "STASIS_WORKSPACE_ID", "value": shape.workspace_id},
           # stasis.jobs in a kernel: a job here is a JobSet the control plane starts
           {"name": "STASIS_RUNTIME", "value": "kubernetes"},
           *({"name": k, "value": v} for k, v in sorted(settings.workspace_env.items()))]
    if shape.ide_kind == "vscode":
        command = ["code-server"]
        args = ["--bind-addr", f"0.0.0.0:{port}", "--auth", "password",
                "--disable-telemetry", HOME]
        env.append(_token_env(names, "PASSWORD"))
        probe_path = "/healthz"
    else:
        command = ["jupyter", "lab"]
        args = ["--ServerApp.ip=0.0.0.0", f"--ServerApp.port={port}",
                "--ServerApp.open_browser=False", f"--ServerApp.root_dir={HOME}",
                "--ServerApp.allow_remote_access=True"]
        if shape.method == "pod":
            # Kernels on IPC sockets rather than loopback TCP: the transport the GKE
            # PodSnapshot addon for Kubeflow notebooks uses for checkpointed kernels.
            args.append("--KernelManager.transport=ipc")
        env.append(_token_env(names, "JUPYTER_TOKEN"))
        probe_path = "/api"
        if shape.method == "kernel":
            env.append({"name": "JUPYTER_RUNTIME_DIR", "value": RUNTIME_DIR})
    resources = _resources(shape.hardware)
    return {
        "name": WORKSPACE_CONTAINER, "image": shape.image, "command": command, "args": args,
        "workingDir": HOME, "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": probe_path, "port": port},
                           "periodSeconds": 2, "failureThreshold": 3},
        "securityContext": _restricted(),
        "volumeMounts": mounts,
    }


def _resources(hardware: Hardware) -> dict[str, Any]:
    """Requests equal limits (Guaranteed QoS: a workspace is never the first evicted).
    GPUs go in limits (Kubernetes copies them to requests); TPU chips in both."""
    cpu = f"{hardware.cpu_millis}m"
    requests: dict[str, Any] = {"cpu": cpu, "memory": hardware.memory}
    limits: dict[str, Any] = {"cpu": cpu, "memory": hardware.memory}
    if hardware.accelerator and hardware.accelerator_count:
        count = str(hardware.accelerator_count)
        if hardware.accelerator_kind == AcceleratorKind.TPU:
            requests[TPU_RESOURCE] = count
            limits[TPU_RESOURCE] = count
        else:
            limits[GPU_RESOURCE] = count
    return {"requests": requests, "limits": limits}


def _agent_container(shape: WorkspaceShape, settings: ClusterSettings,
                     names: WorkspaceNames) -> dict[str, Any]:
    """The snapshot agent sidecar: activity for the idle policy (both methods) and, with
    method ``kernel``, kernel snapshots and restores. It holds no cloud credentials of its
    own and publishes nothing: the monitor drives it and reports."""
    env = [{"name": "STASIS_WORKSPACE_ID", "value": shape.workspace_id},
           {"name": "STASIS_IDE_KIND", "value": shape.ide_kind},
           {"name": "STASIS_AGENT_PORT", "value": str(settings.agent_port)},
           {"name": "JUPYTER_URL", "value": f"http://127.0.0.1:{settings.jupyter_port}"},
           {"name": "JUPYTER_RUNTIME_DIR", "value": RUNTIME_DIR},
           {"name": "PYTHONPATH", "value": settings.agent_source_root},
           _token_env(names, "JUPYTER_TOKEN"),
           *({"name": k, "value": v} for k, v in sorted(settings.agent_env.items()))]
    mounts = ([{"name": "jupyter-runtime", "mountPath": RUNTIME_DIR}]
              if shape.method == "kernel" else [])
    container: dict[str, Any] = {
        "name": AGENT_CONTAINER, "image": settings.agent_image,
        "command": ["python", "-m", "runtime.kubernetes.sidecar"],
        "env": env,
        "ports": [{"name": "agent", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": settings.agent_port},
                           "periodSeconds": 5},
        "securityContext": _restricted(),
    }
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _agent_install_container(settings: ClusterSettings) -> dict[str, Any]:
    """Copies the in-kernel half of the agent where the kernels import it from."""
    return {
        "name": "install-agent", "image": settings.agent_image,
        "command": ["python", "-m", "runtime.kubernetes.sidecar", "install", "/stasis-lib"],
        "env": [{"name": "PYTHONPATH", "value": settings.agent_source_root}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                      "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "stasis-lib", "mountPath": "/stasis-lib"}],
    }


def workspace_service(shape: WorkspaceShape,
                      settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """A ClusterIP Service for the IDE (the access proxy and ingress talk to it)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(names.service, names.namespace, labels=workspace_labels(shape),
                              annotations={ANN_WORKSPACE_ID: shape.workspace_id}),
            "spec": {"type": "ClusterIP",
                     "selector": {MANAGED_BY: STASIS, LABEL_WORKSPACE: names.label},
                     "ports": [{"name": "http", "port": settings.jupyter_port,
                                "targetPort": "http", "protocol": "TCP"}]}}


def network_policy(shape: WorkspaceShape,
                   settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Who may open connections to the workspace: the IDE port only from the Stasis
    system namespace (access proxy, ingress) and the functions' egress ranges
    (``function_cidrs``: the links proxy), the agent port only from the monitor. Other
    workspaces, even of the same team, cannot reach it. Egress stays open (pip, datasets,
    Cloud Storage)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    system = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": settings.system_namespace}}}
    monitor = {**system, "podSelector": {"matchLabels": {"app.kubernetes.io/name": MONITOR}}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(names.network_policy, names.namespace,
                              labels=workspace_labels(shape)),
            "spec": {"podSelector": {"matchLabels": {MANAGED_BY: STASIS,
                                                     LABEL_WORKSPACE: names.label}},
                     "policyTypes": ["Ingress"],
                     "ingress": [
                         {"from": [system, *({"ipBlock": {"cidr": cidr}}
                                             for cidr in settings.function_cidrs)],
                          "ports": [{"protocol": "TCP", "port": settings.jupyter_port}]},
                         {"from": [monitor], "ports": [{"protocol": "TCP",
                                                        "port": settings.agent_port}]}]}}


def workspace_url(shape: WorkspaceShape, settings: ClusterSettings = ClusterSettings()) -> str:
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return settings.url_template.format(service=names.service, namespace=names.namespace,
                                        port=settings.jupyter_port, workspace=names.label)


# --------------------------------------------------------------------------------------------
# Per snapshot
# --------------------------------------------------------------------------------------------


def manual_trigger(shape: WorkspaceShape, snapshot_id: str, *, requestid: str,
                   requested_at_ms: int,
                   settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Checkpoint the workspace's pod now (``spec.targetPod``). GKE answers on the
    trigger's status (condition ``Triggered``, ``snapshotCreated.name``); the annotations
    tell the monitor which Stasis snapshot and request it belongs to."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    annotations = {**_workspace_annotations(shape), ANN_SNAPSHOT_ID: snapshot_id,
                   ANN_REQUESTID: requestid, ANN_REQUESTED_AT: str(requested_at_ms)}
    labels = {**workspace_labels(shape), LABEL_SNAPSHOT: slug(snapshot_id)}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotManualTrigger",
            "metadata": _meta(snapshot_object_name(snapshot_id), names.namespace,
                              labels=labels, annotations=annotations),
            "spec": {"targetPod": names.pod}}


@dataclass(frozen=True)
class SnapshotHardware:
    """What a snapshot was taken on, and how: the resume check's input."""

    method: str
    accelerator: str | None = None
    accelerator_count: int = 0

    @property
    def kind(self) -> AcceleratorKind | None:
        return accelerator_kind(self.accelerator) if self.accelerator else None

    def describe(self) -> str:
        return (f"{self.accelerator_count} x {self.accelerator}" if self.accelerator
                else "no accelerator")


def snapshot_record(shape: WorkspaceShape, snapshot_id: str, *, requested_at_ms: int,
                    settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """A ConfigMap that remembers how and on what hardware a snapshot was taken, so a
    resume can refuse a target it cannot restore onto (:func:`restore_refusal`)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    data = {"workspace_id": shape.workspace_id, "snapshot_id": snapshot_id,
            "method": shape.method, "accelerator": shape.hardware.accelerator or "",
            "accelerator_count": str(shape.hardware.accelerator_count),
            "profile": shape.profile, "requested_at_ms": str(requested_at_ms)}
    labels = {**workspace_labels(shape), LABEL_SNAPSHOT: slug(snapshot_id)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(snapshot_object_name(snapshot_id), names.namespace,
                              labels=labels,
                              annotations={ANN_WORKSPACE_ID: shape.workspace_id,
                                           ANN_SNAPSHOT_ID: snapshot_id}),
            "data": data}


def hardware_of_record(data: Mapping[str, Any]) -> SnapshotHardware:
    """The :class:`SnapshotHardware` a snapshot record's ``data`` describes."""
    count = str(data.get("accelerator_count") or "0")
    return SnapshotHardware(method=str(data.get("method") or "kernel"),
                            accelerator=str(data.get("accelerator") or "") or None,
                            accelerator_count=int(count) if count.isdigit() else 0)


def snapshot_request_patch(snapshot_id: str, *, bucket: str, prefix: str, requestid: str,
                           requested_at_ms: int) -> dict[str, Any]:
    """Kernel method: the merge patch that asks the monitor to snapshot a pod's kernels."""
    request = json.dumps({"snapshot_id": snapshot_id, "bucket": bucket, "prefix": prefix,
                          "requestid": requestid, "requested_at_ms": requested_at_ms},
                         sort_keys=True)
    return {"metadata": {"annotations": {ANN_SNAPSHOT_REQUEST: request}}}


def restore_refusal(snapshot: SnapshotHardware, target: Hardware, target_method: str) -> str | None:
    """None if a snapshot can be restored onto ``target``, else why not (a user message).

    A Pod Snapshot holds the whole pod, accelerator memory included: it restores only
    into the identical pod, so the accelerator type and count must match exactly, and
    only through Pod Snapshots. A kernel snapshot is portable across machines, but a
    namespace that held accelerator arrays needs the same kind (GPU or TPU) to load them;
    a CPU snapshot restores anywhere.
    """
    have = target.accelerator
    got = f"{target.accelerator_count} x {have}" if have else "no accelerator"
    if snapshot.method == "pod":
        same = have == snapshot.accelerator and (
            not snapshot.accelerator or target.accelerator_count == snapshot.accelerator_count)
        if same and target_method == "pod":
            return None
        why = (f"the target profile has {got}" if not same else
               "the target profile does not use Pod Snapshots")
        return (f"this workspace was paused with a Pod Snapshot on {snapshot.describe()}, "
                "which restores only into the same pod: same hardware, through Pod "
                f"Snapshots; {why}. Resume it on its original profile")
    if snapshot.kind is None:
        return None
    target_kind = accelerator_kind(have) if have else None
    if target_kind != snapshot.kind:
        return (f"this workspace was paused on {snapshot.describe()} and its kernels may hold "
                f"{snapshot.kind.upper()} arrays, but the target profile has {got}; resume "
                f"it on a profile with a {snapshot.kind.upper()}")
    return None


# --------------------------------------------------------------------------------------------
# Reading what the cluster reports
# --------------------------------------------------------------------------------------------


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status") or {}
    return [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    ready = condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True") and not (
        (pod.get("metadata") or {}).get("deletionTimestamp"))


_FATAL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                            "CreateContainerConfigError", "CreateContainerError",
                            "RunContainerError"})


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod will not come up on its own (a permanent failure), or None."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"the workspace pod failed: {status.get('reason') or status.get('message')}"
    statuses = [*(status.get("initContainerStatuses") or []),
                *(status.get("containerStatuses") or [])]
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _FATAL_WAITING:
            return (f"container {container.get('name')} cannot start: {waiting['reason']}"
                    f"{': ' + waiting['message'] if waiting.get('message') else ''}")
    return None


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
    for cond in _conditions(snapshot):
        if (cond.get("type") in ("Ready", "Checkpoint", "StorageReplicated")
                and cond.get("status") == "False" and cond.get("reason") in ("Failed", "Error")):
            return Outcome("failed", f"{cond.get('type')}: {cond.get('message') or ''}".strip(),
                           name_, uri)
    ready = condition(snapshot, "Ready")
    if ready is not None and ready.get("status") == "True":
        return Outcome("succeeded", name=name_, uri=uri,
                       finished_at=ready.get("lastTransitionTime"))
    return Outcome("pending", name=name_, uri=uri)


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def is_managed(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == STASIS


def json_annotation(obj: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A JSON-valued annotation as a dict; None if absent or not a JSON object."""
    raw = annotations_of(obj).get(key)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------------------------
# Cluster-wide: RBAC and the monitor (applied once by an admin or Terraform)
# --------------------------------------------------------------------------------------------


def _rule(group: str, resources: Sequence[str], verbs: Sequence[str],
          resource_names: Sequence[str] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": list(resources),
                            "verbs": list(verbs)}
    if resource_names:
        rule["resourceNames"] = list(resource_names)
    return rule


def workspace_manager_rules() -> list[dict[str, Any]]:
    """What the control plane does inside a team namespace, verb by verb (no wildcards)."""
    return [
        _rule("", ["pods"], ["get", "list", "create", "delete", "patch"]),
        _rule("", ["services", "secrets", "persistentvolumeclaims"],
              ["get", "list", "create", "delete"]),
        _rule("", ["configmaps"], ["get", "list", "create", "delete"]),
        _rule("", ["serviceaccounts"], ["get", "create", "patch"]),
        _rule("", ["resourcequotas"], ["get", "create", "patch"]),
        _rule("networking.k8s.io", ["networkpolicies"], ["get", "list", "create", "delete"]),
        _rule(PODSNAPSHOT_GROUP, ["podsnapshotpolicies"], ["get", "create", "patch"]),
        _rule(PODSNAPSHOT_GROUP, ["podsnapshotmanualtriggers"],
              ["get", "list", "create", "delete"]),
        _rule(PODSNAPSHOT_GROUP, ["podsnapshots"], ["get", "list", "delete"]),
        # scale-out jobs: a JobSet and its headless Service per job (kubernetes_job_runtime)
        _rule("jobset.x-k8s.io", ["jobsets"], ["get", "create", "delete"]),
        # agent sandboxes: host names a sandbox may reach (kubernetes_sandbox_runtime)
        _rule("networking.gke.io", ["fqdnnetworkpolicies"], ["get", "list", "create", "delete"]),
    ]


def control_plane_rbac(subject: Mapping[str, str]) -> list[dict[str, Any]]:
    """The control plane's rights, as narrow as creating team namespaces allows.

    Inside team namespaces it gets :func:`workspace_manager_rules` through a RoleBinding
    per namespace (:func:`team_role_binding`), never cluster-wide. Cluster-wide it may only
    create and read namespaces and PodSnapshotStorageConfigs (cluster-scoped objects),
    create those RoleBindings, and bind that one ClusterRole (``bind`` with
    ``resourceNames``, so it cannot grant anything else). ``subject`` is the Functions'
    identity, e.g. ``{"kind": "User", "name": "fn@PROJECT.iam.gserviceaccount.com",
    "apiGroup": "rbac.authorization.k8s.io"}`` on GKE.
    """
    manager = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
               "metadata": _meta(WORKSPACE_MANAGER_ROLE), "rules": workspace_manager_rules()}
    cluster = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
               "metadata": _meta(CONTROL_PLANE_ROLE),
               "rules": [
                   _rule("", ["namespaces"], ["get", "list", "create", "patch"]),
                   _rule(PODSNAPSHOT_GROUP, ["podsnapshotstorageconfigs"],
                         ["get", "create", "patch"]),
                   _rule(RBAC_API, ["rolebindings"], ["get", "create"]),
                   _rule(RBAC_API, ["clusterroles"], ["bind"], [WORKSPACE_MANAGER_ROLE]),
               ]}
    binding = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
               "metadata": _meta(CONTROL_PLANE_ROLE),
               "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole",
                           "name": CONTROL_PLANE_ROLE},
               "subjects": [dict(subject)]}
    return [manager, cluster, binding]


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
    labels = {"app.kubernetes.io/name": MONITOR}
    sa_annotations = ({"iam.gke.io/gcp-service-account": gcp_service_account}
                      if gcp_service_account else None)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": _meta(ns, labels={
                     "pod-security.kubernetes.io/enforce": "restricted"})}
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": _meta(MONITOR, ns, labels=labels, annotations=sa_annotations)}
    role = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
            "metadata": _meta(MONITOR, labels=labels),
            "rules": [_rule("", ["pods"], ["get", "list", "watch"]),
                      _rule(PODSNAPSHOT_GROUP, ["podsnapshotmanualtriggers", "podsnapshots"],
                            ["get", "list", "watch"]),
                      # the job watcher: JobSets' ends, a failed host's log
                      _rule("jobset.x-k8s.io", ["jobsets"], ["get", "list", "watch"]),
                      _rule("", ["pods/log"], ["get"]),
                      # the sandbox watch: a sandbox task's CPU, to see it idle
                      _rule("metrics.k8s.io", ["pods"], ["get", "list"])]}
    binding = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
               "metadata": _meta(MONITOR, labels=labels),
               "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": MONITOR},
               "subjects": [{"kind": "ServiceAccount", "name": MONITOR, "namespace": ns}]}
    env = [{"name": "STASIS_PROJECT", "value": project},
           {"name": "STASIS_MONITOR_IDLE_INTERVAL", "value": str(idle_interval_s)},
           {"name": "STASIS_POD_SNAPSHOTS", "value": "1" if settings.pod_snapshots else "0"},
           {"name": "PYTHONPATH", "value": settings.agent_source_root}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(MONITOR, ns, labels=labels),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, MANAGED_BY: STASIS}},
                "spec": {
                    "serviceAccountName": MONITOR,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": settings.uid,
                                        "runAsGroup": settings.gid,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "monitor", "image": image or settings.agent_image,
                        "command": ["python", "-m", "runtime.kubernetes.monitor"],
                        "env": env,
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"cpu": "500m", "memory": "256Mi"}},
                        "securityContext": _restricted(),
                    }],
                },
            },
        },
    }
    return [namespace, account, role, binding, deployment]

