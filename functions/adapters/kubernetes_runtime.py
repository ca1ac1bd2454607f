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

API semantics: creating an object that exists and is ours is success (409 -> read it);
objects whose spec may change (quota, policy, storage config) are patched with the
resourceVersion just read as a precondition, retried on conflict with a fresh read; no
ownerReferences (the cluster-scoped storage config cannot have a namespaced owner, and
deletion is explicit anyway). Errors follow the port: the API unreachable, throttling
(429), a conflict that persists, server errors and RBAC denials (403: an operator fixes
them, the event is retried and dead-lettered with the reason) raise ``RuntimeUnavailable``;
a request the API calls invalid (400, 422) or a resume onto the wrong hardware raises
``RuntimeRefused``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from functions.domain import manifests as m
from functions.ports import RuntimeRefused, RuntimeStatus, RuntimeUnavailable, WorkspaceSpec

log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 5
_GROUP, _VERSION = m.PODSNAPSHOT_GROUP, m.PODSNAPSHOT_VERSION
# Kinds whose spec the runtime keeps up to date (others are immutable or ours alone).
_UPDATABLE = frozenset({"ResourceQuota", "PodSnapshotPolicy", "PodSnapshotStorageConfig",
                        "ServiceAccount"})
_PLURALS = {"PodSnapshotStorageConfig": "podsnapshotstorageconfigs",
            "PodSnapshotPolicy": "podsnapshotpolicies",
            "PodSnapshotManualTrigger": "podsnapshotmanualtriggers",
            "PodSnapshot": "podsnapshots"}
_CORE = {"Namespace": "namespace", "Pod": "namespaced_pod", "Service": "namespaced_service",
         "Secret": "namespaced_secret", "ConfigMap": "namespaced_config_map",
         "PersistentVolumeClaim": "namespaced_persistent_volume_claim",
         "ServiceAccount": "namespaced_service_account",
         "ResourceQuota": "namespaced_resource_quota"}


#: Objects as the API returns them (a module-level name: the class defines ``list``).
Objects = list[dict[str, Any]]


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
        self._api_client = api_client
        self._catalog = catalog
        self._subject = dict(subject) if subject else None
        self._workspace_gsa = workspace_gsa
        self._clock = clock
        self._token = token_factory
        self._ides = ides
        self._apis: dict[str, Any] = {}

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
        pod = self._read("Pod", names.namespace, names.pod)
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise RuntimeRefused(f"workspace {shape.workspace_id} has no running pod to "
                                 "snapshot")
        # The pod says how it runs: a profile changed since cannot change a running pod.
        method = ((pod.get("metadata") or {}).get("labels") or {}).get(m.LABEL_METHOD)
        if method in ("pod", "kernel") and method != shape.method:
            shape = _with_method(shape, method)
        now = self._now_ms()
        self._apply(m.snapshot_record(shape, snapshot_id, requested_at_ms=now,
                                      settings=self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(shape.team, spec)
            self._apply(m.manual_trigger(shape, snapshot_id, requestid=spec.requestid,
                                         requested_at_ms=now, settings=self.settings))
            return
        patch = m.snapshot_request_patch(snapshot_id, bucket=spec.snapshot_bucket,
                                         prefix=spec.snapshot_path(snapshot_id),
                                         requestid=spec.requestid, requested_at_ms=now)
        self._patch("Pod", names.namespace, names.pod, patch)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        shape = self._shape(spec)
        names = m.workspace_names(shape.team, shape.workspace_id, self.settings)
        record = self._read("ConfigMap", names.namespace, m.snapshot_object_name(snapshot_id))
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
        self._delete("Pod", names.namespace, names.pod)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        names = self._names(workspace_id)
        self._delete("Pod", names.namespace, names.pod)
        self._delete("Service", names.namespace, names.service)
        self._delete("NetworkPolicy", names.namespace, names.network_policy)
        self._delete("Secret", names.namespace, names.secret)
        for trigger in self._owned("PodSnapshotManualTrigger", names):
            created = m.trigger_outcome(trigger).name
            if created:
                self._delete("PodSnapshot", names.namespace, created)
            self._delete("PodSnapshotManualTrigger", names.namespace,
                         trigger["metadata"]["name"])
        for record in self._owned("ConfigMap", names):
            self._delete("ConfigMap", names.namespace, record["metadata"]["name"])
        if not keep_home:
            self._delete("PersistentVolumeClaim", names.namespace, names.pvc)

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        names = self._names(workspace_id)
        pod = self._read("Pod", names.namespace, names.pod)
        if pod is None:
            return None
        secret = self._read("Secret", names.namespace, names.secret)
        return self._status(pod, secret)

    def list(self) -> list[RuntimeStatus]:
        found = []
        for namespace in self._list("Namespace", None):
            if not m.is_managed(namespace):
                continue
            for pod in self._list("Pod", namespace["metadata"]["name"]):
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
        self._apply(m.team_namespace(team, self.settings))
        if self._subject is not None:
            self._apply(m.team_role_binding(team, self._subject, self.settings))
        self._apply(m.team_service_account(team, self.settings,
                                           gcp_service_account=self._workspace_gsa))
        catalog = self._catalog() if self._catalog else None
        team_entry = catalog.teams.get(team) if catalog is not None else None
        if team_entry is not None:
            self._apply(m.resource_quota(team, team_entry.quotas, self.settings))
        if shape.method == "pod":
            self._ensure_pod_snapshots(team, spec)

    def _ensure_pod_snapshots(self, team: str, spec: WorkspaceSpec) -> None:
        self._apply(m.snapshot_storage_config(team, spec.snapshot_bucket,
                                              team_prefix=f"snapshots/{team}",
                                              settings=self.settings))
        self._apply(m.snapshot_policy(team, self.settings))

    def _ensure_workspace_objects(self, shape: m.WorkspaceShape) -> None:
        self._apply(m.home_pvc(shape, self.settings))
        # The token is made once: a 409 keeps the existing one, so a resume keeps the URL.
        self._apply(m.token_secret(shape, self._token(), self.settings))
        self._apply(m.workspace_service(shape, self.settings))
        self._apply(m.network_policy(shape, self.settings))

    def _create_pod(self, pod: dict[str, Any], shape: m.WorkspaceShape,
                    restoring: str | None = None) -> None:
        meta = pod["metadata"]
        try:
            self._create(pod)
            return
        except _Exists:
            pass
        existing = self._read("Pod", meta["namespace"], meta["name"])
        if existing is None:  # deleted in between: try once more
            self._create(pod)
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
        trigger = self._read("PodSnapshotManualTrigger", namespace,
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
        return [obj for obj in self._list(kind, names.namespace, selector)
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

    # -- applying objects -------------------------------------------------------------------

    def _apply(self, obj: dict[str, Any]) -> None:
        """Create ``obj``; if it exists and is ours, bring an updatable kind's spec up to
        date (precondition: the resourceVersion just read; a conflict re-reads)."""
        kind, meta = obj["kind"], obj["metadata"]
        try:
            self._create(obj)
            return
        except _Exists:
            pass
        for _ in range(_CONFLICT_RETRIES):
            current = self._read(kind, meta.get("namespace"), meta["name"])
            if current is None:
                try:
                    self._create(obj)
                    return
                except _Exists:
                    continue
            if not m.is_managed(current):
                raise RuntimeRefused(f"{kind} {meta['name']} exists and is not managed by "
                                     "Stasis; rename or remove it")
            if kind not in _UPDATABLE or _covers(current, obj):
                return
            patch = {key: obj[key] for key in obj if key not in ("apiVersion", "kind",
                                                                 "metadata")}
            patch["metadata"] = {"labels": meta.get("labels") or {}}
            version = (current.get("metadata") or {}).get("resourceVersion")
            if version:
                patch["metadata"]["resourceVersion"] = version
            try:
                self._patch(kind, meta.get("namespace"), meta["name"], patch)
                return
            except _Conflict:
                continue  # someone else changed it: read again
        raise RuntimeUnavailable(f"{kind} {meta['name']} kept changing under us; retry")

    # -- the API, kind by kind --------------------------------------------------------------

    def _api(self, which: str) -> Any:
        api = self._apis.get(which)
        if api is None:
            from kubernetes import client

            if self._api_client is None:
                self._api_client = _default_api_client()
            api = getattr(client, which)(self._api_client)
            self._apis[which] = api
        return api

    def _create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, namespace = obj["kind"], obj["metadata"].get("namespace")
        if kind in _PLURALS:
            api = self._api("CustomObjectsApi")
            if namespace is None:
                return self._call(api.create_cluster_custom_object, _GROUP, _VERSION,
                                  _PLURALS[kind], obj, creating=True)
            return self._call(api.create_namespaced_custom_object, _GROUP, _VERSION, namespace,
                              _PLURALS[kind], obj, creating=True)
        api, method = self._typed(kind, "create")
        args = (obj,) if namespace is None else (namespace, obj)
        return self._call(getattr(api, method), *args, creating=True)

    def _read(self, kind: str, namespace: str | None, obj_name: str) -> dict[str, Any] | None:
        try:
            if kind in _PLURALS:
                api = self._api("CustomObjectsApi")
                if namespace is None:
                    return self._call(api.get_cluster_custom_object, _GROUP, _VERSION,
                                      _PLURALS[kind], obj_name)
                return self._call(api.get_namespaced_custom_object, _GROUP, _VERSION, namespace,
                                  _PLURALS[kind], obj_name)
            api, method = self._typed(kind, "read")
            args = (obj_name,) if namespace is None else (obj_name, namespace)
            return self._call(getattr(api, method), *args)
        except _Missing:
            return None

    def _patch(self, kind: str, namespace: str | None, obj_name: str,
               patch: dict[str, Any]) -> dict[str, Any]:
        if kind in _PLURALS:
            api = self._api("CustomObjectsApi")
            if namespace is None:
                return self._call(api.patch_cluster_custom_object, _GROUP, _VERSION,
                                  _PLURALS[kind], obj_name, patch)
            return self._call(api.patch_namespaced_custom_object, _GROUP, _VERSION, namespace,
                              _PLURALS[kind], obj_name, patch)
        api, method = self._typed(kind, "patch")
        args = (obj_name, patch) if namespace is None else (obj_name, namespace, patch)
        return self._call(getattr(api, method), *args)

    def _delete(self, kind: str, namespace: str | None, obj_name: str) -> None:
        """Delete if present; a missing object is already the wanted outcome."""
        try:
            if kind in _PLURALS:
                api = self._api("CustomObjectsApi")
                self._call(api.delete_namespaced_custom_object, _GROUP, _VERSION, namespace,
                           _PLURALS[kind], obj_name)
                return
            api, method = self._typed(kind, "delete")
            args = (obj_name,) if namespace is None else (obj_name, namespace)
            self._call(getattr(api, method), *args)
        except _Missing:
            return

    def _list(self, kind: str, namespace: str | None,
              selector: str | None = None) -> Objects:
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        try:
            if kind in _PLURALS:
                api = self._api("CustomObjectsApi")
                data = self._call(api.list_namespaced_custom_object, _GROUP, _VERSION,
                                  namespace, _PLURALS[kind], **kwargs)
            else:
                api, method = self._typed(kind, "list")
                args = () if namespace is None else (namespace,)
                data = self._call(getattr(api, method), *args, **kwargs)
        except _Missing:
            return []
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def _typed(self, kind: str, verb: str) -> tuple[Any, str]:
        if kind in _CORE:
            return self._api("CoreV1Api"), f"{verb}_{_CORE[kind]}"
        if kind == "NetworkPolicy":
            return self._api("NetworkingV1Api"), f"{verb}_namespaced_network_policy"
        if kind == "RoleBinding":
            return self._api("RbacAuthorizationV1Api"), f"{verb}_namespaced_role_binding"
        raise ValueError(f"the Kubernetes runtime does not handle {kind}")

    def _call(self, fn: Callable[..., Any], *args: Any, creating: bool = False,
              **kwargs: Any) -> dict[str, Any]:
        """Call the API and return the JSON body as a dict (not the client's models, which
        drop what they do not know); map errors onto the port's."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _translate(exc, creating=creating) from exc
        except (OSError, HTTPError) as exc:  # connection refused, timeouts, TLS
            raise RuntimeUnavailable(f"Kubernetes API unreachable: {exc}") from exc
        raw = getattr(response, "data", b"") or b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}


class _ApiError(Exception):
    pass


class _Exists(_ApiError):
    pass


class _Missing(_ApiError):
    pass


class _Conflict(_ApiError):
    pass


def _translate(exc: Any, *, creating: bool) -> Exception:
    status = getattr(exc, "status", None) or 0
    message = _api_message(exc)
    if status == 409:
        return _Exists(message) if creating else _Conflict(message)
    if status == 404:
        return _Missing(message)
    if status in (400, 422):
        return RuntimeRefused(f"Kubernetes refused the request: {message}")
    return RuntimeUnavailable(f"Kubernetes API answered {status}: {message}")


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    try:
        data = json.loads(body) if body else {}
    except (TypeError, ValueError):
        data = {}
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return str(getattr(exc, "reason", None) or exc)


def _covers(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``current`` already has every field ``wanted`` sets (besides metadata)."""

    def sub(have: Any, want: Any) -> bool:
        if isinstance(want, Mapping):
            return isinstance(have, Mapping) and all(sub(have.get(k), v)
                                                     for k, v in want.items())
        return bool(have == want)

    return all(sub(current.get(key), value) for key, value in wanted.items()
               if key not in ("apiVersion", "kind", "metadata"))


def _with_method(shape: m.WorkspaceShape, method: str) -> m.WorkspaceShape:
    from dataclasses import replace

    return replace(shape, method=method)


def _default_api_client() -> Any:
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(context=os.environ.get("STASIS_K8S_CONTEXT") or None)
    return client.ApiClient()
