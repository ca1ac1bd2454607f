"""A workspace's objects: its own service account (its identity: the pod runs as it, the
IDE container holds a projected token of it for ``workspace_api``), its home, its IDE
token, its pod (IDE + snapshot agent), the Service and NetworkPolicy in front of it, all
named from the workspace id (the service account from its incarnation too).

The Kubernetes runtime (``functions.kubernetes.workspaces``) only *applies* what this
module builds, the way kubespawner's ``make_pod``/``make_pvc`` feed its spawner. The pod's
spec depends on the shape and settings only (:func:`pod_spec`), so provisioning and every
resume build the identical spec, which GKE requires to restore a Pod Snapshot into it.

Snapshot methods (``profile.snapshot.method``):

- ``pod`` (GKE Pod Snapshots, ``podsnapshot``): the pod runs under gVisor
  (``runtimeClassName: gvisor``); a PodSnapshotManualTrigger checkpoints the whole pod,
  GPU memory included; resume re-creates the *identical* pod (same builder, same inputs)
  with the ``podsnapshot.gke.io/ps-name`` annotation. Pod Snapshots do not include
  persistent volumes, which is why home is a PVC of its own.
- ``kernel`` (any cluster): the snapshot agent sidecar captures each live kernel's
  namespace to Cloud Storage, exactly as the local node agent does (``runtime.snapshot``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from events.identity import TOKEN_FILE_VAR, URL_VAR
from events.payloads import ide_path
from events.payloads import ide_server_path as server_path
from functions.domain.catalog import parse_quantity
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects.hardware import (
    Hardware,
    container_resources,
    guaranteed,
    placement,
)
from functions.kubernetes.objects.ide_proxy import IDE_PROXY_LABELS
from functions.kubernetes.objects.meta import (
    ANN_ACCELERATOR,
    ANN_ACCELERATOR_COUNT,
    ANN_IDE,
    ANN_IDE_KIND,
    ANN_OPERATION,
    ANN_OWNER,
    ANN_PROFILE,
    ANN_REQUESTED_AT,
    ANN_REQUESTID,
    ANN_RESTORE_REQUEST,
    ANN_SNAPSHOT_ID,
    ANN_TEAM_ID,
    ANN_VERSION,
    ANN_WORKSPACE_ID,
    COMPONENT,
    GKE_SERVICE_ACCOUNT,
    LABEL_METHOD,
    LABEL_WORKSPACE,
    MANAGED_BY,
    NAMESPACE_NAME,
    STASIS,
    meta,
    team_labels,
)
from functions.kubernetes.objects.monitor import MONITOR_LABELS
from functions.kubernetes.objects.names import name, slug
from functions.kubernetes.objects.podsnapshot import PS_NAME_ANNOTATION
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.team import team_namespace_name

WORKSPACE_CONTAINER = "workspace"
AGENT_CONTAINER = "snapshot-agent"
HOME = "/home/stasis"
RUNTIME_DIR = "/run/jupyter"
TOKEN_KEY = "token"
#: The snapshot sidecar's credential, in the same Secret; only the sidecar's container
#: references it, so the IDE's kernels (same pod, same network) cannot call the sidecar.
AGENT_TOKEN_KEY = "agent-token"
#: Where the IDE container finds its workspace identity: a projected token of the
#: workspace's own KSA, which the kubelet refreshes before it expires.
IDENTITY_DIR = "/var/run/secrets/stasis/workspace"
IDENTITY_TOKEN_SECONDS = 3600


def service_account_name(workspace_id: str, incarnation: str | None) -> str:
    """The workspace's own Kubernetes service account in its team's namespace.

    The incarnation is part of what the name hashes: a later workspace of the same id gets
    another KSA, so a token of the earlier one names a KSA that no document claims.
    ``workspace_api`` derives the same name from the workspace's document to check a token's
    ``kubernetes.io`` claims."""
    return name("ksa-", f"{workspace_id}\n{incarnation or ''}")


def sidecar_token(key: str, workspace_id: str) -> str:
    """The credential a workspace's sidecar accepts: HMAC-SHA256 of its workspace id under
    the deployment's sidecar key (STASIS_SIDECAR_KEY), which the control plane (writing the
    Secret) and the monitor (calling the sidecar) hold, and no workspace does."""
    return hmac.new(key.encode(), workspace_id.encode(), hashlib.sha256).hexdigest()


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
    #: Its priority class (Kueue's WorkloadPriorityClass of the same name), if any.
    priority_class: str | None = None
    #: ``Workspace.incarnation``: part of its KSA's name (:func:`service_account_name`).
    incarnation: str | None = None

    @property
    def accelerated(self) -> bool:
        return self.hardware.accelerator is not None


def shape_of(*, workspace_id: str, team: str, owner: str, ide: str,
             environment: Mapping[str, Any], profile: Mapping[str, Any],
             settings: ClusterSettings = ClusterSettings(),
             ide_kind: str | None = None, ide_image: str | None = None,
             disk: Mapping[str, Any] | None = None,
             priority_class: str | None = None,
             incarnation: str | None = None) -> WorkspaceShape:
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
        priority_class=priority_class, incarnation=incarnation,
    )


def workspace_labels(shape: WorkspaceShape) -> dict[str, str]:
    return {COMPONENT: "workspace", **team_labels(shape.team),
            LABEL_WORKSPACE: slug(shape.workspace_id), LABEL_METHOD: shape.method}


def workspace_annotations(shape: WorkspaceShape) -> dict[str, str]:
    annotations = {ANN_WORKSPACE_ID: shape.workspace_id, ANN_TEAM_ID: shape.team,
                   ANN_OWNER: shape.owner, ANN_PROFILE: shape.profile, ANN_IDE: shape.ide,
                   ANN_IDE_KIND: shape.ide_kind}
    if shape.hardware.accelerator:
        annotations[ANN_ACCELERATOR] = shape.hardware.accelerator
        annotations[ANN_ACCELERATOR_COUNT] = str(shape.hardware.accelerator_count)
    return annotations


def workspace_service_account(shape: WorkspaceShape,
                              settings: ClusterSettings = ClusterSettings(), *,
                              gcp_service_account: str | None = None) -> dict[str, Any]:
    """The workspace's own identity: its pod runs as it, and its IDE container holds a
    projected token of it (:func:`pod_spec`), which ``workspace_api`` accepts as this
    workspace and no other. No token is mounted by default.

    With Workload Identity (``gcp_service_account``) it maps to the team's Google service
    account, as the team's KSA did. Its Google identity holds no role on the workspaces'
    snapshot folders: the sidecar and the kernel write kernel snapshots only with the token
    the monitor mints for each one (``functions.domain.snapshot_access``); GKE writes Pod
    Snapshots as it (``tokenSource: podKSA``), under the team's ``pod/`` folder only."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    annotations = workspace_annotations(shape)
    if gcp_service_account:
        annotations[GKE_SERVICE_ACCOUNT] = gcp_service_account
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta(service_account_name(shape.workspace_id, shape.incarnation),
                             names.namespace, labels=workspace_labels(shape),
                             annotations=annotations),
            "automountServiceAccountToken": False}


def home_pvc(shape: WorkspaceShape,
             settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The workspace's home: files, notebooks, user-installed packages and the pip cache.
    Outlives every pause (Pod Snapshots exclude volumes) and, with ``keep_home``, the
    workspace."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": meta(names.pvc, names.namespace, labels=workspace_labels(shape),
                             annotations=workspace_annotations(shape)),
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "storageClassName": shape.storage_class,
                     "resources": {"requests": {"storage": shape.home_size}}}}


def token_secret(shape: WorkspaceShape, token: str,
                 settings: ClusterSettings = ClusterSettings(), *,
                 agent_token: str = "") -> dict[str, Any]:
    """The IDE's token and the sidecar's (:func:`sidecar_token`). Pods reference them
    (``secretKeyRef``), so they are in no pod spec and a re-created pod is identical to the
    snapshotted one."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": meta(names.secret, names.namespace, labels=workspace_labels(shape),
                             annotations={ANN_WORKSPACE_ID: shape.workspace_id}),
            "stringData": {TOKEN_KEY: token, AGENT_TOKEN_KEY: agent_token}}


@dataclass(frozen=True)
class Restore:
    """What a re-created pod restores: a Pod Snapshot (``ps_name``) or kernel snapshot."""

    snapshot_id: str
    method: str
    ps_name: str | None = None
    bucket: str | None = None
    prefix: str | None = None
    #: Kernel method: what the manifest must hash to (the snapshot agent refuses any
    #: other), and whether device arrays go to CPU.
    manifest_sha256: str | None = None
    device_arrays_to_cpu: bool = False


def workspace_pod(shape: WorkspaceShape, settings: ClusterSettings = ClusterSettings(), *,
                  requestid: str, requested_at_ms: int,
                  restore: Restore | None = None, version: int | None = None) -> dict[str, Any]:
    """The workspace pod.

    The spec depends on the shape and settings only: provisioning and every resume build
    the same spec, which GKE requires to restore a Pod Snapshot into it. What differs is
    metadata: the request's id and time, and on resume the ``ps-name`` annotation (method
    ``pod``) or the kernel snapshot to restore (method ``kernel``, read by the monitor);
    with Kueue, its queue labels and the workspace's ``version`` (the monitor names it in
    the start it reports once Kueue admitted the pod).
    """
    names = workspace_names(shape.team, shape.workspace_id, settings)
    annotations = {**workspace_annotations(shape), ANN_REQUESTID: requestid,
                   ANN_REQUESTED_AT: str(requested_at_ms),
                   ANN_OPERATION: "restore" if restore else "provision"}
    if version is not None:
        annotations[ANN_VERSION] = str(version)
    labels = workspace_labels(shape)
    if settings.kueue:
        labels.update(kueue.queue_labels(shape.priority_class))
    if restore is not None:
        annotations[ANN_SNAPSHOT_ID] = restore.snapshot_id
        if restore.method == "pod":
            if not restore.ps_name:
                raise ValueError("a Pod Snapshot restore needs the PodSnapshot's name")
            annotations[PS_NAME_ANNOTATION] = restore.ps_name
        else:
            annotations[ANN_RESTORE_REQUEST] = json.dumps(
                {"snapshot_id": restore.snapshot_id, "bucket": restore.bucket,
                 "prefix": restore.prefix, "requestid": requestid,
                 "manifest_sha256": restore.manifest_sha256,
                 "device_arrays_to_cpu": restore.device_arrays_to_cpu}, sort_keys=True)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": meta(names.pod, names.namespace, labels=labels,
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
    # The workspace identity, for the IDE container only (the sidecar does not mount it).
    volumes.append({"name": "workspace-identity", "projected": {"sources": [
        {"serviceAccountToken": {"audience": settings.workspace_audience,
                                 "expirationSeconds": IDENTITY_TOKEN_SECONDS,
                                 "path": "token"}}]}})
    mounts.append({"name": "workspace-identity", "mountPath": IDENTITY_DIR,
                   "readOnly": True})
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
        "serviceAccountName": service_account_name(shape.workspace_id, shape.incarnation),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "securityContext": restricted_pod(settings.uid, settings.gid, fs_group=settings.gid,
                                          fs_group_change_policy="OnRootMismatch"),
        "containers": [_workspace_container(shape, settings, names, mounts),
                       _agent_container(shape, settings, names)],
        "volumes": volumes,
    }
    if kernel:
        spec["initContainers"] = [_agent_install_container(settings)]
    if shape.method == "pod":
        spec["runtimeClassName"] = settings.runtime_class
    if settings.kueue:
        # Pending until Kueue admits its Workload (Kueue's webhook would add the same gate);
        # when Kueue preempts it, the containers' preStop keep it up for the pause.
        spec["schedulingGates"] = [{"name": kueue.ADMISSION_GATE}]
        spec["terminationGracePeriodSeconds"] = settings.preemption_grace_seconds
        hold = {"preStop": {"exec": {"command": [
            "sleep", str(max(1, settings.preemption_grace_seconds - 5))]}}}
        for container in spec["containers"]:
            container["lifecycle"] = hold
    selector, tolerations, affinity = placement(shape.hardware)
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if affinity:
        spec["affinity"] = affinity
    return spec


def encrypted_storage_class(class_name: str, kms_key: str, *,
                            disk_type: str = "pd-balanced") -> dict[str, Any]:
    """A GKE PD CSI StorageClass whose disks are encrypted with a customer-managed key
    (``disk-encryption-kms-key``), the default class for homes."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": meta(class_name),
            "provisioner": "pd.csi.storage.gke.io",
            "parameters": {"type": disk_type, "disk-encryption-kms-key": kms_key},
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True}


def _token_env(names: WorkspaceNames, env_name: str, key: str = TOKEN_KEY) -> dict[str, Any]:
    return {"name": env_name,
            "valueFrom": {"secretKeyRef": {"name": names.secret, "key": key}}}


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
           # its identity towards the control plane (workspace_api), re-read per call
           {"name": TOKEN_FILE_VAR, "value": f"{IDENTITY_DIR}/token"},
           *([{"name": URL_VAR, "value": settings.workspace_api_url}]
             if settings.workspace_api_url else []),
           *({"name": k, "value": v} for k, v in sorted(settings.workspace_env.items()))]
    # Served for the IDE proxy's /w/<id>/: JupyterLab under it, code-server at its root
    # (it works relatively behind a prefix; only its /absproxy needs to know it).
    path = server_path(shape.ide_kind, shape.workspace_id)
    if shape.ide_kind == "vscode":
        command = ["code-server"]
        args = ["--bind-addr", f"0.0.0.0:{port}", "--auth", "password",
                "--disable-telemetry", "--abs-proxy-base-path",
                ide_path(shape.workspace_id).rstrip("/"), HOME]
        env.append(_token_env(names, "PASSWORD"))
        probe_path = "/healthz"
    else:
        command = ["jupyter", "lab"]
        args = ["--ServerApp.ip=0.0.0.0", f"--ServerApp.port={port}",
                "--ServerApp.open_browser=False", f"--ServerApp.root_dir={HOME}",
                f"--ServerApp.base_url={path}", "--ServerApp.allow_remote_access=True"]
        if shape.method == "pod":
            # Kernels on IPC sockets rather than loopback TCP: the transport the GKE
            # PodSnapshot addon for Kubeflow notebooks uses for checkpointed kernels.
            args.append("--KernelManager.transport=ipc")
        env.append(_token_env(names, "JUPYTER_TOKEN"))
        probe_path = f"{path}api"
        if shape.method == "kernel":
            env.append({"name": "JUPYTER_RUNTIME_DIR", "value": RUNTIME_DIR})
    hardware = shape.hardware
    resources = container_resources(hardware.cpu_millis, hardware.memory,
                                    hardware.accelerator_kind, hardware.accelerator_count)
    return {
        "name": WORKSPACE_CONTAINER, "image": shape.image, "command": command, "args": args,
        "workingDir": HOME, "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": probe_path, "port": port},
                           "periodSeconds": 2, "failureThreshold": 3},
        "securityContext": restricted_container(),
        "volumeMounts": mounts,
    }


def _agent_container(shape: WorkspaceShape, settings: ClusterSettings,
                     names: WorkspaceNames) -> dict[str, Any]:
    """The snapshot agent sidecar: activity for the idle policy (both methods) and, with
    method ``kernel``, kernel snapshots and restores. It holds no cloud credentials of its
    own and publishes nothing: the monitor drives it and reports."""
    env = [{"name": "STASIS_WORKSPACE_ID", "value": shape.workspace_id},
           {"name": "STASIS_IDE_KIND", "value": shape.ide_kind},
           {"name": "STASIS_AGENT_PORT", "value": str(settings.agent_port)},
           {"name": "JUPYTER_URL", "value": f"http://127.0.0.1:{settings.jupyter_port}"
                                             + server_path(shape.ide_kind,
                                                           shape.workspace_id).rstrip("/")},
           {"name": "JUPYTER_RUNTIME_DIR", "value": RUNTIME_DIR},
           {"name": "PYTHONPATH", "value": settings.agent_source_root},
           _token_env(names, "JUPYTER_TOKEN"),
           _token_env(names, "STASIS_SIDECAR_TOKEN", AGENT_TOKEN_KEY),
           *({"name": k, "value": v} for k, v in sorted(settings.agent_env.items()))]
    mounts = ([{"name": "jupyter-runtime", "mountPath": RUNTIME_DIR}]
              if shape.method == "kernel" else [])
    container: dict[str, Any] = {
        "name": AGENT_CONTAINER, "image": settings.agent_image,
        "command": ["python", "-m", "runtime.kubernetes.sidecar"],
        "env": env,
        "ports": [{"name": "agent", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "resources": guaranteed("100m", "128Mi"),
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": settings.agent_port},
                           "periodSeconds": 5},
        "securityContext": restricted_container(),
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
        "resources": guaranteed("100m", "64Mi"),
        "securityContext": restricted_container(),
        "volumeMounts": [{"name": "stasis-lib", "mountPath": "/stasis-lib"}],
    }


def workspace_service(shape: WorkspaceShape,
                      settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """A ClusterIP Service for the IDE (the access proxy and ingress talk to it)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": meta(names.service, names.namespace, labels=workspace_labels(shape),
                             annotations={ANN_WORKSPACE_ID: shape.workspace_id}),
            "spec": {"type": "ClusterIP",
                     "selector": {MANAGED_BY: STASIS, LABEL_WORKSPACE: names.label},
                     "ports": [{"name": "http", "port": settings.jupyter_port,
                                "targetPort": "http", "protocol": "TCP"}]}}


def network_policy(shape: WorkspaceShape,
                   settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Who may open connections to the workspace: the IDE port only from the IDE access
    proxy's pods (``objects.ide_proxy``) and the functions' egress ranges
    (``function_cidrs``: the links proxy), the agent port only from the monitor. Other
    workspaces, even of the same team, and anything else in the system namespace cannot
    reach it. Egress stays open (pip, datasets, Cloud Storage)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    system = {"namespaceSelector": {"matchLabels": {
        NAMESPACE_NAME: settings.system_namespace}}}
    monitor = {**system, "podSelector": {"matchLabels": dict(MONITOR_LABELS)}}
    proxy = {**system, "podSelector": {"matchLabels": dict(IDE_PROXY_LABELS)}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(names.network_policy, names.namespace,
                             labels=workspace_labels(shape)),
            "spec": {"podSelector": {"matchLabels": {MANAGED_BY: STASIS,
                                                     LABEL_WORKSPACE: names.label}},
                     "policyTypes": ["Ingress"],
                     "ingress": [
                         {"from": [proxy, *({"ipBlock": {"cidr": cidr}}
                                            for cidr in settings.function_cidrs)],
                          "ports": [{"protocol": "TCP", "port": settings.jupyter_port}]},
                         {"from": [monitor], "ports": [{"protocol": "TCP",
                                                        "port": settings.agent_port}]}]}}


def workspace_url(shape: WorkspaceShape, settings: ClusterSettings = ClusterSettings()) -> str:
    names = workspace_names(shape.team, shape.workspace_id, settings)
    return settings.url_template.format(
        service=names.service, namespace=names.namespace, port=settings.jupyter_port,
        workspace=names.label, path=server_path(shape.ide_kind, shape.workspace_id))


def url_of_pod(pod: Mapping[str, Any], settings: ClusterSettings = ClusterSettings()) -> str:
    """:func:`workspace_url` from a workspace pod as the cluster returns it (its Service
    shares its name)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    kind = annotations.get(ANN_IDE_KIND)
    path = server_path(kind, str(annotations.get(ANN_WORKSPACE_ID))) if kind else "/"
    return settings.url_template.format(
        service=metadata.get("name"), namespace=metadata.get("namespace"),
        port=settings.jupyter_port,
        workspace=(metadata.get("labels") or {}).get(LABEL_WORKSPACE, ""), path=path)
