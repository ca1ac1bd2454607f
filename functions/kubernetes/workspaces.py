"""The Kubernetes runtime: the Runtime port on a team's cluster (GKE first).

It only *applies* what ``functions.kubernetes.objects`` builds, with ``api.KubeApi`` (the
official ``kubernetes`` client), and reads what the cluster reports. Like every runtime it is
asynchronous: ``provision``, ``snapshot`` and ``restore`` return once the cluster accepted
the objects, and the cluster monitor (``runtime.kubernetes.monitor``) reports the outcome
as events (workspace.ready, snapshot.finished, workspace.runtime_failed).

Pause, by snapshot method:

- ``pod`` (GKE Pod Snapshots): a PodSnapshotManualTrigger for the workspace's pod, under
  the team's PodSnapshotPolicy and PodSnapshotStorageConfig (created on first use). The
  monitor reports snapshot.finished once the PodSnapshot is Ready; the lifecycle then asks
  ``release``, which deletes the pod (hardware released). ``restore`` re-creates the
  identical pod with ``podsnapshot.gke.io/ps-name`` naming the PodSnapshot.
- ``kernel`` (any cluster): the pod is annotated with the snapshot request; the monitor
  has the pod's snapshot agent sidecar capture every live kernel to Cloud Storage (the
  same agent as the local runtime) and reports. ``restore`` re-creates the pod with the
  snapshot to restore, which the monitor hands to the agent once Jupyter runs.

Either way a ConfigMap records the snapshot's method and accelerator, and ``restore``
refuses a target it cannot restore onto (``objects.snapshot.restore_refusal``).

API semantics (``api.KubeApi``): creating an object that exists and is ours is
success; updatable specs are patched under a resourceVersion precondition; no
ownerReferences (the cluster-scoped storage config cannot have a namespaced owner, and
deletion is explicit anyway). Errors follow the port; a resume onto the wrong hardware
raises ``RuntimeRefused``.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from functions.kubernetes.api import Exists, KubeApi, Objects
from functions.kubernetes.objects.kueue import local_queue
from functions.kubernetes.objects.meta import (
    ANN_IDE_KIND,
    ANN_OPERATION,
    ANN_SNAPSHOT_ID,
    ANN_WORKSPACE_ID,
    LABEL_METHOD,
    LABEL_WORKSPACE,
    MANAGED_SELECTOR,
    annotations_of,
    is_managed,
    labels_of,
)
from functions.kubernetes.objects.names import team_of
from functions.kubernetes.objects.podsnapshot import team_pod_snapshots, trigger_outcome
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.snapshot import (
    SnapshotHardware,
    hardware_of_record,
    manual_trigger,
    restore_refusal,
    snapshot_object_name,
    snapshot_record,
    snapshot_request_patch,
)
from functions.kubernetes.objects.status import pod_failure, pod_ready
from functions.kubernetes.objects.team import resource_quota, team_namespace, team_service_account
from functions.kubernetes.objects.workspace import (
    TOKEN_KEY,
    Restore,
    WorkspaceNames,
    WorkspaceShape,
    home_pvc,
    network_policy,
    shape_of,
    sidecar_token,
    token_secret,
    url_of_pod,
    workspace_names,
    workspace_pod,
    workspace_service,
    workspace_service_account,
)
from functions.ports import RuntimeRefused, RuntimeStatus, RuntimeUnavailable, WorkspaceSpec

log = logging.getLogger(__name__)


class KubernetesRuntime:
    name = "kubernetes"

    def __init__(
        self,
        api_client: Any = None,
        *,
        settings: ClusterSettings | None = None,
        catalog: Callable[[], Any] | None = None,
        workspace_gsa: str | None = None,
        clock: Callable[[], float] = time.time,
        token_factory: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        ides: tuple[str, ...] = ("jupyterlab", "vscode"),
        sidecar_key: str = "",
    ) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient`` (None: in-cluster config, else
        the kubeconfig). ``catalog``: the applied catalog, for what a WorkspaceSpec does
        not carry (the profile's disk, the IDE's image, the team's quotas). Its rights in a
        team namespace come from the install step (``deploy/cluster.py``): it binds nothing."""
        self.settings = settings or ClusterSettings()
        self.kube = KubeApi(api_client)
        self._catalog = catalog
        self._workspace_gsa = workspace_gsa
        self._clock = clock
        self._token = token_factory
        self._ides = ides
        #: STASIS_SIDECAR_KEY: the sidecars' credentials derive from it (the monitor's too).
        self._sidecar_key = sidecar_key

    @classmethod
    def from_environment(cls, catalog: Callable[[], Any] | None = None) -> KubernetesRuntime:
        """Settings from ``STASIS_K8S_*`` (see the README's Kubernetes section)."""
        return cls(settings=ClusterSettings.from_env(os.environ), catalog=catalog,
                   workspace_gsa=os.environ.get("STASIS_K8S_WORKSPACE_GSA") or None,
                   sidecar_key=os.environ.get("STASIS_SIDECAR_KEY", ""))

    # -- the port ----------------------------------------------------------------------------

    def capabilities(self) -> Mapping[str, Any]:
        # No "accelerators": a cluster's node pools and autoscaler decide what exists, so
        # admission checks nothing (catalog.check_hardware) and a pod waits for capacity.
        # With Kueue, "admission": the cluster admits accelerator workspaces (QUEUED, their
        # pods gated, until Kueue's Workload is admitted: functions.handlers.lifecycle).
        methods = ["kernel", "pod"] if self.settings.pod_snapshots else ["kernel"]
        return {"runtime": "kubernetes", "ides": list(self._ides),
                "snapshot_methods": methods, "pod_snapshots": self.settings.pod_snapshots,
                **({"admission": "kueue"} if self.settings.kueue else {})}

    def provision(self, spec: WorkspaceSpec) -> None:
        shape = self._shape(spec)
        self._ensure_team(spec, shape)
        self._ensure_workspace_objects(shape)
        pod = workspace_pod(shape, self.settings, requestid=spec.requestid,
                            requested_at_ms=self._now_ms(), version=spec.extra.get("version"))
        self._create_pod(pod, shape)

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        shape = self._shape(spec)
        names = workspace_names(shape.team, shape.workspace_id, self.settings)
        pod = self.kube.read("Pod", names.namespace, names.pod)
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise RuntimeRefused(f"workspace {shape.workspace_id} has no running pod to "
                                 "snapshot")
        # The pod says how it runs: a profile changed since cannot change a running pod.
        method = labels_of(pod).get(LABEL_METHOD)
        if method in ("pod", "kernel") and method != shape.method:
            shape = _with_method(shape, method)
        now = self._now_ms()
        self.kube.apply(snapshot_record(shape, snapshot_id, requested_at_ms=now,
                                        settings=self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(shape.team, spec)
            self.kube.apply(manual_trigger(shape, snapshot_id, requestid=spec.requestid,
                                           requested_at_ms=now, settings=self.settings))
            return
        based = ({"snapshot_id": base, "prefix": spec.snapshot_path(base),
                  "manifest_sha256": base_manifest_sha256} if base else None)
        patch = snapshot_request_patch(snapshot_id, bucket=spec.snapshot_bucket,
                                       prefix=spec.snapshot_path(snapshot_id),
                                       requestid=spec.requestid, requested_at_ms=now,
                                       base=based)
        self.kube.patch("Pod", names.namespace, names.pod, patch)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None,
                device_arrays_to_cpu: bool = False) -> None:
        shape = self._shape(spec)
        names = workspace_names(shape.team, shape.workspace_id, self.settings)
        record = self.kube.read("ConfigMap", names.namespace, snapshot_object_name(snapshot_id))
        # No record: a kernel snapshot taken elsewhere (another runtime); they are portable.
        taken = (hardware_of_record(record.get("data") or {}) if record
                 else SnapshotHardware(method="kernel"))
        if taken.method == "kernel" and shape.method == "pod":
            # A kernel snapshot restores through the agent, whatever the profile says now.
            shape = _with_method(shape, "kernel")
        refusal = restore_refusal(taken, shape.hardware, shape.method)
        if refusal:
            raise RuntimeRefused(refusal)
        if taken.method == "pod":
            restore = Restore(snapshot_id, "pod", ps_name=self._pod_snapshot_name(
                names.namespace, snapshot_id))
        else:
            restore = Restore(snapshot_id, "kernel", bucket=spec.snapshot_bucket,
                              prefix=spec.snapshot_path(snapshot_id),
                              manifest_sha256=manifest_sha256,
                              device_arrays_to_cpu=device_arrays_to_cpu)
        self._ensure_team(spec, shape)
        self._ensure_workspace_objects(shape)
        pod = workspace_pod(shape, self.settings, requestid=spec.requestid,
                            requested_at_ms=self._now_ms(), restore=restore,
                            version=spec.extra.get("version"))
        self._create_pod(pod, shape, restoring=snapshot_id)

    def release(self, workspace_id: str) -> None:
        names = self._names(workspace_id)
        self._delete_pod(names)

    def _delete_pod(self, names: WorkspaceNames) -> None:
        """With Kueue the pod's preStop holds it (for a pause before a preemption takes
        it); when Stasis itself releases it, nothing more is to be kept."""
        self.kube.delete("Pod", names.namespace, names.pod,
                         grace_seconds=0 if self.settings.kueue else None)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        names = self._names(workspace_id)
        self._delete_pod(names)
        self.kube.delete("Service", names.namespace, names.service)
        self.kube.delete("NetworkPolicy", names.namespace, names.network_policy)
        self.kube.delete("Secret", names.namespace, names.secret)
        for trigger in self._owned("PodSnapshotManualTrigger", names):
            created = trigger_outcome(trigger).name
            if created:
                self.kube.delete("PodSnapshot", names.namespace, created)
            self.kube.delete("PodSnapshotManualTrigger", names.namespace,
                             trigger["metadata"]["name"])
        for record in self._owned("ConfigMap", names):
            self.kube.delete("ConfigMap", names.namespace, record["metadata"]["name"])
        # Its identity (by label: the name hashes the incarnation, which destroy is not
        # told); a token of it is refused from now on, even before it expires.
        for account in self._owned("ServiceAccount", names):
            self.kube.delete("ServiceAccount", names.namespace, account["metadata"]["name"])
        if not keep_home:
            self.kube.delete("PersistentVolumeClaim", names.namespace, names.pvc)

    def forget_snapshot(self, workspace_id: str, snapshot_id: str) -> None:
        """A Pod Snapshot retention expired (the janitor deleted its objects): its
        PodSnapshot, the trigger that made it and the snapshot's record go too, through the
        API, so GKE neither lists nor restores what is gone. Idempotent."""
        names = self._names(workspace_id)
        name = snapshot_object_name(snapshot_id)
        trigger = self.kube.read("PodSnapshotManualTrigger", names.namespace, name)
        created = trigger_outcome(trigger).name if trigger is not None else None
        if created:
            self.kube.delete("PodSnapshot", names.namespace, created)
        self.kube.delete("PodSnapshotManualTrigger", names.namespace, name)
        self.kube.delete("ConfigMap", names.namespace, name)

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        names = self._names(workspace_id)
        pod = self.kube.read("Pod", names.namespace, names.pod)
        if pod is None:
            return None
        secret = self.kube.read("Secret", names.namespace, names.secret)
        return self._status(pod, secret)

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        """Not reported on Kubernetes yet. A Pod Snapshot says only that it is in progress
        (its PodSnapshot object has no byte count); the kernel-state sidecar has the same
        byte callbacks as the local node agent and would answer the same report on its
        port, which this method would then read through the API server's pod proxy. Until
        then the portal and the CLI show the phase and the elapsed time alone."""
        return None

    def list(self) -> list[RuntimeStatus]:
        found = []
        for namespace in self.kube.list("Namespace", None):
            if not is_managed(namespace):
                continue
            for pod in self.kube.list("Pod", namespace["metadata"]["name"]):
                if is_managed(pod) and annotations_of(pod).get(ANN_WORKSPACE_ID):
                    found.append(self._status(pod, None))
        return found

    # -- what a workspace consists of -----------------------------------------------------

    def _shape(self, spec: WorkspaceSpec) -> WorkspaceShape:
        ide_kind = ide_image = None
        disk: Mapping[str, Any] | None = None
        catalog = self._catalog() if self._catalog else None
        if catalog is not None:
            ide = catalog.ides.get(spec.ide)
            if ide is not None:
                ide_kind, ide_image = str(ide.kind), ide.image
            profile = catalog.profiles.get(spec.profile.get("id"))
            if profile is not None:
                disk = {"size": profile.disk.size, "storage_class": profile.disk.storage_class}
        try:
            return shape_of(workspace_id=spec.workspace_id, team=spec.team, owner=spec.owner,
                            ide=spec.ide, environment=spec.environment, profile=spec.profile,
                            settings=self.settings, ide_kind=ide_kind, ide_image=ide_image,
                            disk=disk, priority_class=spec.extra.get("priority_class"),
                            incarnation=spec.extra.get("incarnation"))
        except ValueError as exc:
            raise RuntimeRefused(str(exc)) from exc

    def _ensure_team(self, spec: WorkspaceSpec, shape: WorkspaceShape) -> None:
        team = spec.team
        self.kube.ensure_namespace(team_namespace(team, self.settings), team)
        self.kube.apply(team_service_account(team, self.settings,
                                             gcp_service_account=self._workspace_gsa))
        catalog = self._catalog() if self._catalog else None
        team_entry = catalog.teams.get(team) if catalog is not None else None
        if team_entry is not None:
            self.kube.apply(resource_quota(team, team_entry.quotas, self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(team, spec)
        if self.settings.kueue:
            self.kube.apply(local_queue(team, self.settings))

    def _ensure_pod_snapshots(self, team: str, spec: WorkspaceSpec) -> None:
        for obj in team_pod_snapshots(team, spec.snapshot_bucket, self.settings):
            self.kube.apply(obj)

    def _ensure_workspace_objects(self, shape: WorkspaceShape) -> None:
        # Its own identity, before the pod that runs as it (the pod is refused without it).
        self.kube.apply(workspace_service_account(shape, self.settings,
                                                  gcp_service_account=self._workspace_gsa))
        self.kube.apply(home_pvc(shape, self.settings))
        # The token is made once: a 409 keeps the existing one, so a resume keeps the URL.
        self.kube.apply(token_secret(shape, self._token(), self.settings,
                                     agent_token=sidecar_token(self._sidecar_key,
                                                               shape.workspace_id)))
        self.kube.apply(workspace_service(shape, self.settings))
        self.kube.apply(network_policy(shape, self.settings))

    def _create_pod(self, pod: dict[str, Any], shape: WorkspaceShape,
                    restoring: str | None = None) -> None:
        meta = pod["metadata"]
        try:
            self.kube.create(pod)
            return
        except Exists:
            pass
        existing = self.kube.read("Pod", meta["namespace"], meta["name"])
        if existing is None:  # deleted in between: try once more
            self.kube.create(pod)
            return
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise RuntimeUnavailable(f"the previous pod of {shape.workspace_id} is still "
                                     "terminating; retry")
        annotations = annotations_of(existing)
        if annotations.get(ANN_WORKSPACE_ID) != shape.workspace_id:
            raise RuntimeRefused(f"pod {meta['namespace']}/{meta['name']} exists and is not "
                                 f"workspace {shape.workspace_id}'s")
        if restoring is not None and annotations.get(ANN_SNAPSHOT_ID) != restoring:
            # The pod of before the pause outlived its release: the restore must wait.
            raise RuntimeUnavailable(f"workspace {shape.workspace_id} still has a pod that "
                                     f"is not restored from {restoring}; retry once released")
        # The same request (or an equivalent one) already made this pod: done.

    def _pod_snapshot_name(self, namespace: str, snapshot_id: str) -> str:
        trigger = self.kube.read("PodSnapshotManualTrigger", namespace,
                                 snapshot_object_name(snapshot_id))
        if trigger is None:
            raise RuntimeRefused(f"snapshot {snapshot_id} has no PodSnapshotManualTrigger in "
                                 f"{namespace}: it cannot be restored here")
        outcome = trigger_outcome(trigger)
        if outcome.state == "failed":
            raise RuntimeRefused(f"Pod Snapshot {snapshot_id} failed: {outcome.message}")
        if outcome.state != "succeeded" or not outcome.name:
            raise RuntimeUnavailable(f"Pod Snapshot {snapshot_id} is not complete yet")
        return outcome.name

    def _names(self, workspace_id: str) -> WorkspaceNames:
        try:
            return workspace_names(team_of(workspace_id), workspace_id, self.settings)
        except ValueError as exc:
            raise RuntimeRefused(str(exc)) from exc

    def _owned(self, kind: str, names: WorkspaceNames) -> Objects:
        selector = f"{MANAGED_SELECTOR},{LABEL_WORKSPACE}={names.label}"
        return [obj for obj in self.kube.list(kind, names.namespace, selector)
                if labels_of(obj).get(LABEL_WORKSPACE) == names.label]

    def _status(self, pod: Mapping[str, Any], secret: Mapping[str, Any] | None) -> RuntimeStatus:
        meta = pod.get("metadata") or {}
        annotations = annotations_of(pod)
        ready = pod_ready(pod)
        namespace, pod_name = meta.get("namespace"), meta.get("name")
        token = None
        if secret is not None:
            token = (secret.get("stringData") or {}).get(TOKEN_KEY)
            if token is None and (secret.get("data") or {}).get(TOKEN_KEY):
                token = base64.b64decode(secret["data"][TOKEN_KEY]).decode()
        failure = pod_failure(pod)
        return RuntimeStatus(
            workspace_id=str(annotations.get(ANN_WORKSPACE_ID)),
            running=ready,
            operation=None if ready else annotations.get(ANN_OPERATION),
            url=url_of_pod(pod, self.settings), token=token,
            detail={"namespace": namespace, "pod": pod_name,
                    "phase": (pod.get("status") or {}).get("phase"),
                    "node": (pod.get("spec") or {}).get("nodeName"),
                    "method": labels_of(pod).get(LABEL_METHOD),
                    "ide_kind": annotations.get(ANN_IDE_KIND) or "jupyterlab",
                    "snapshot_id": annotations.get(ANN_SNAPSHOT_ID),
                    "failure": failure})

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _with_method(shape: WorkspaceShape, method: str) -> WorkspaceShape:
    from dataclasses import replace

    return replace(shape, method=method)
