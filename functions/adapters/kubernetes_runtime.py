"""The Kubernetes runtime: the Runtime port on a team's cluster (GKE first).

It only *applies* what ``functions.domain.manifests`` builds, with the official
``kubernetes`` client, and reads what the cluster reports. Like every runtime it is
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
refuses a target it cannot restore onto (``manifests.restore_refusal``).

API semantics (``kube_api.KubeApi``): creating an object that exists and is ours is
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

from functions.adapters.kube_api import Exists, KubeApi, Objects
from functions.domain import manifests as m
from functions.ports import RuntimeRefused, RuntimeStatus, RuntimeUnavailable, WorkspaceSpec

log = logging.getLogger(__name__)

class KubernetesRuntime:
    name = "kubernetes"

    def __init__(
        self,
        api_client: Any = None,
        *,
        settings: m.ClusterSettings | None = None,
        catalog: Callable[[], Any] | None = None,
        subject: Mapping[str, str] | None = None,
        workspace_gsa: str | None = None,
        clock: Callable[[], float] = time.time,
        token_factory: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        ides: tuple[str, ...] = ("jupyterlab", "vscode"),
    ) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient`` (None: in-cluster config, else
        the kubeconfig). ``catalog``: the applied catalog, for what a WorkspaceSpec does
        not carry (the profile's disk, the IDE's image, the team's quotas). ``subject``:
        the control plane's RBAC subject, bound in each team namespace it creates."""
        self.settings = settings or m.ClusterSettings()
        self.kube = KubeApi(api_client)
        self._catalog = catalog
        self._subject = dict(subject) if subject else None
        self._workspace_gsa = workspace_gsa
        self._clock = clock
        self._token = token_factory
        self._ides = ides

    @classmethod
    def from_environment(cls, catalog: Callable[[], Any] | None = None) -> KubernetesRuntime:
        """Settings from ``STASIS_K8S_*`` (see the README's Kubernetes section)."""
        env = os.environ.get
        defaults = m.ClusterSettings()
        settings = m.ClusterSettings(
            namespace_prefix=env("STASIS_K8S_NAMESPACE_PREFIX", defaults.namespace_prefix),
            system_namespace=env("STASIS_K8S_SYSTEM_NAMESPACE", defaults.system_namespace),
            storage_class=env("STASIS_K8S_STORAGE_CLASS", defaults.storage_class),
            home_size=env("STASIS_K8S_HOME_SIZE", defaults.home_size),
            agent_image=env("STASIS_K8S_AGENT_IMAGE", defaults.agent_image),
            pod_snapshots=env("STASIS_K8S_POD_SNAPSHOTS", "1").lower() in ("1", "true", "yes"),
            url_template=env("STASIS_K8S_URL_TEMPLATE", defaults.url_template),
            pod_snapshot_retention=env("STASIS_K8S_POD_SNAPSHOT_RETENTION") or None,
            function_cidrs=tuple(c.strip() for c in env("STASIS_K8S_FUNCTION_CIDRS", "")
                                 .split(",") if c.strip()),
            # what a notebook needs to submit scale-out jobs (stasis.jobs)
            workspace_env={k: v for k, v in {
                "STASIS_PROJECT": env("STASIS_PROJECT") or env("GOOGLE_CLOUD_PROJECT") or "",
                "STASIS_SNAPSHOT_BUCKET": env("STASIS_SNAPSHOT_BUCKET") or ""}.items() if v},
        )
        subject = env("STASIS_K8S_SUBJECT")
        return cls(settings=settings, catalog=catalog,
                   subject={"kind": "User", "name": subject, "apiGroup": m.RBAC_API}
                   if subject else None,
                   workspace_gsa=env("STASIS_K8S_WORKSPACE_GSA") or None)

    # -- the port ----------------------------------------------------------------------------

    def capabilities(self) -> Mapping[str, Any]:
        # No "accelerators": a cluster's node pools and autoscaler decide what exists, so
        # admission checks nothing (catalog.check_hardware) and a pod waits for capacity.
        methods = ["kernel", "pod"] if self.settings.pod_snapshots else ["kernel"]
        return {"runtime": "kubernetes", "ides": list(self._ides),
                "snapshot_methods": methods, "pod_snapshots": self.settings.pod_snapshots}

    def provision(self, spec: WorkspaceSpec) -> None:
        shape = self._shape(spec)
        self._ensure_team(spec, shape)
        self._ensure_workspace_objects(shape)
        pod = m.workspace_pod(shape, self.settings, requestid=spec.requestid,
                              requested_at_ms=self._now_ms())
        self._create_pod(pod, shape)

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        shape = self._shape(spec)
        names = m.workspace_names(shape.team, shape.workspace_id, self.settings)
        pod = self.kube.read("Pod", names.namespace, names.pod)
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise RuntimeRefused(f"workspace {shape.workspace_id} has no running pod to "
                                 "snapshot")
        # The pod says how it runs: a profile changed since cannot change a running pod.
        method = ((pod.get("metadata") or {}).get("labels") or {}).get(m.LABEL_METHOD)
        if method in ("pod", "kernel") and method != shape.method:
            shape = _with_method(shape, method)
        now = self._now_ms()
        self.kube.apply(m.snapshot_record(shape, snapshot_id, requested_at_ms=now,
                                      settings=self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(shape.team, spec)
            self.kube.apply(m.manual_trigger(shape, snapshot_id, requestid=spec.requestid,
                                         requested_at_ms=now, settings=self.settings))
            return
        patch = m.snapshot_request_patch(snapshot_id, bucket=spec.snapshot_bucket,
                                         prefix=spec.snapshot_path(snapshot_id),
                                         requestid=spec.requestid, requested_at_ms=now)
        self.kube.patch("Pod", names.namespace, names.pod, patch)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        shape = self._shape(spec)
        names = m.workspace_names(shape.team, shape.workspace_id, self.settings)
        record = self.kube.read("ConfigMap", names.namespace, m.snapshot_object_name(snapshot_id))
        # No record: a kernel snapshot taken elsewhere (another runtime); they are portable.
        taken = (m.hardware_of_record(record.get("data") or {}) if record
                 else m.SnapshotHardware(method="kernel"))
        if taken.method == "kernel" and shape.method == "pod":
            # A kernel snapshot restores through the agent, whatever the profile says now.
            shape = _with_method(shape, "kernel")
        refusal = m.restore_refusal(taken, shape.hardware, shape.method)
        if refusal:
            raise RuntimeRefused(refusal)
        if taken.method == "pod":
            restore = m.Restore(snapshot_id, "pod", ps_name=self._pod_snapshot_name(
                names.namespace, snapshot_id))
        else:
            restore = m.Restore(snapshot_id, "kernel", bucket=spec.snapshot_bucket,
                                prefix=spec.snapshot_path(snapshot_id))
        self._ensure_team(spec, shape)
        self._ensure_workspace_objects(shape)
        pod = m.workspace_pod(shape, self.settings, requestid=spec.requestid,
                              requested_at_ms=self._now_ms(), restore=restore)
        self._create_pod(pod, shape, restoring=snapshot_id)

    def release(self, workspace_id: str) -> None:
        names = self._names(workspace_id)
        self.kube.delete("Pod", names.namespace, names.pod)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        names = self._names(workspace_id)
        self.kube.delete("Pod", names.namespace, names.pod)
        self.kube.delete("Service", names.namespace, names.service)
        self.kube.delete("NetworkPolicy", names.namespace, names.network_policy)
        self.kube.delete("Secret", names.namespace, names.secret)
        for trigger in self._owned("PodSnapshotManualTrigger", names):
            created = m.trigger_outcome(trigger).name
            if created:
                self.kube.delete("PodSnapshot", names.namespace, created)
            self.kube.delete("PodSnapshotManualTrigger", names.namespace,
                         trigger["metadata"]["name"])
        for record in self._owned("ConfigMap", names):
            self.kube.delete("ConfigMap", names.namespace, record["metadata"]["name"])
        if not keep_home:
            self.kube.delete("PersistentVolumeClaim", names.namespace, names.pvc)

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        names = self._names(workspace_id)
        pod = self.kube.read("Pod", names.namespace, names.pod)
        if pod is None:
            return None
        secret = self.kube.read("Secret", names.namespace, names.secret)
        return self._status(pod, secret)

    def list(self) -> list[RuntimeStatus]:
        found = []
        for namespace in self.kube.list("Namespace", None):
            if not m.is_managed(namespace):
                continue
            for pod in self.kube.list("Pod", namespace["metadata"]["name"]):
                if m.is_managed(pod) and m.annotations_of(pod).get(m.ANN_WORKSPACE_ID):
                    found.append(self._status(pod, None))
        return found

    # -- what a workspace consists of -----------------------------------------------------

    def _shape(self, spec: WorkspaceSpec) -> m.WorkspaceShape:
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
            return m.shape_of(workspace_id=spec.workspace_id, team=spec.team, owner=spec.owner,
                              ide=spec.ide, environment=spec.environment, profile=spec.profile,
                              settings=self.settings, ide_kind=ide_kind, ide_image=ide_image,
                              disk=disk)
        except ValueError as exc:
            raise RuntimeRefused(str(exc)) from exc

    def _ensure_team(self, spec: WorkspaceSpec, shape: m.WorkspaceShape) -> None:
        team = spec.team
        self.kube.apply(m.team_namespace(team, self.settings))
        if self._subject is not None:
            self.kube.apply(m.team_role_binding(team, self._subject, self.settings))
        self.kube.apply(m.team_service_account(team, self.settings,
                                           gcp_service_account=self._workspace_gsa))
        catalog = self._catalog() if self._catalog else None
        team_entry = catalog.teams.get(team) if catalog is not None else None
        if team_entry is not None:
            self.kube.apply(m.resource_quota(team, team_entry.quotas, self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(team, spec)

    def _ensure_pod_snapshots(self, team: str, spec: WorkspaceSpec) -> None:
        self.kube.apply(m.snapshot_storage_config(team, spec.snapshot_bucket,
                                              team_prefix=f"snapshots/{team}",
                                              settings=self.settings))
        self.kube.apply(m.snapshot_policy(team, self.settings))

    def _ensure_workspace_objects(self, shape: m.WorkspaceShape) -> None:
        self.kube.apply(m.home_pvc(shape, self.settings))
        # The token is made once: a 409 keeps the existing one, so a resume keeps the URL.
        self.kube.apply(m.token_secret(shape, self._token(), self.settings))
        self.kube.apply(m.workspace_service(shape, self.settings))
        self.kube.apply(m.network_policy(shape, self.settings))

    def _create_pod(self, pod: dict[str, Any], shape: m.WorkspaceShape,
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
        annotations = m.annotations_of(existing)
        if annotations.get(m.ANN_WORKSPACE_ID) != shape.workspace_id:
            raise RuntimeRefused(f"pod {meta['namespace']}/{meta['name']} exists and is not "
                                 f"workspace {shape.workspace_id}'s")
        if restoring is not None and annotations.get(m.ANN_SNAPSHOT_ID) != restoring:
            # The pod of before the pause outlived its release: the restore must wait.
            raise RuntimeUnavailable(f"workspace {shape.workspace_id} still has a pod that "
                                     f"is not restored from {restoring}; retry once released")
        # The same request (or an equivalent one) already made this pod: done.

    def _pod_snapshot_name(self, namespace: str, snapshot_id: str) -> str:
        trigger = self.kube.read("PodSnapshotManualTrigger", namespace,
                             m.snapshot_object_name(snapshot_id))
        if trigger is None:
            raise RuntimeRefused(f"snapshot {snapshot_id} has no PodSnapshotManualTrigger in "
                                 f"{namespace}: it cannot be restored here")
        outcome = m.trigger_outcome(trigger)
        if outcome.state == "failed":
            raise RuntimeRefused(f"Pod Snapshot {snapshot_id} failed: {outcome.message}")
        if outcome.state != "succeeded" or not outcome.name:
            raise RuntimeUnavailable(f"Pod Snapshot {snapshot_id} is not complete yet")
        return outcome.name

    def _names(self, workspace_id: str) -> m.WorkspaceNames:
        try:
            return m.workspace_names(m.team_of(workspace_id), workspace_id, self.settings)
        except ValueError as exc:
            raise RuntimeRefused(str(exc)) from exc

    def _owned(self, kind: str, names: m.WorkspaceNames) -> Objects:
        selector = f"{m.MANAGED_BY}={m.STASIS},{m.LABEL_WORKSPACE}={names.label}"
        return [obj for obj in self.kube.list(kind, names.namespace, selector)
                if ((obj.get("metadata") or {}).get("labels") or {}).get(m.LABEL_WORKSPACE)
                == names.label]

    def _status(self, pod: Mapping[str, Any], secret: Mapping[str, Any] | None) -> RuntimeStatus:
        meta = pod.get("metadata") or {}
        annotations = m.annotations_of(pod)
        ready = m.pod_ready(pod)
        namespace, pod_name = meta.get("namespace"), meta.get("name")
        service = pod_name  # the Service and the Pod share the workspace's name
        token = None
        if secret is not None:
            token = (secret.get("stringData") or {}).get(m.TOKEN_KEY)
            if token is None and (secret.get("data") or {}).get(m.TOKEN_KEY):
                token = base64.b64decode(secret["data"][m.TOKEN_KEY]).decode()
        url = self.settings.url_template.format(
            service=service, namespace=namespace, port=self.settings.jupyter_port,
            workspace=(meta.get("labels") or {}).get(m.LABEL_WORKSPACE, ""))
        failure = m.pod_failure(pod)
        return RuntimeStatus(
            workspace_id=str(annotations.get(m.ANN_WORKSPACE_ID)),
            running=ready,
            operation=None if ready else annotations.get(m.ANN_OPERATION),
            url=url, token=token,
            detail={"namespace": namespace, "pod": pod_name,
                    "phase": (pod.get("status") or {}).get("phase"),
                    "node": (pod.get("spec") or {}).get("nodeName"),
                    "method": (meta.get("labels") or {}).get(m.LABEL_METHOD),
                    "snapshot_id": annotations.get(m.ANN_SNAPSHOT_ID),
                    "failure": failure})

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

def _with_method(shape: m.WorkspaceShape, method: str) -> m.WorkspaceShape:
    from dataclasses import replace

    return replace(shape, method=method)
