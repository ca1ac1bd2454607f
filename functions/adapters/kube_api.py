"""The Kubernetes API as the runtimes use it: apply, read, patch, delete and list objects
given as plain dicts, with the official ``kubernetes`` client and the Runtime port's errors.

Shared by the workspace runtime (``kubernetes_runtime``), the sandbox runtime and the job
runtime, so each of them only says *what* to apply.

Semantics: creating an object that exists and is ours is success (409 -> read it);
objects whose spec may change (``updatable`` kinds: quota, policy, storage config) are
patched with the resourceVersion just read as a precondition, retried on conflict with a
fresh read. Errors follow the port: the API unreachable, throttling (429), a conflict that
persists, server errors and RBAC denials (403: an operator fixes them, the event is
retried and dead-lettered with the reason) raise ``RuntimeUnavailable``; a request the API
calls invalid (400, 422) raises ``RuntimeRefused``. Bodies are returned as the JSON the
server sent (not the client's models, which drop fields they do not know).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from functions.domain import manifests as m
from functions.ports import RuntimeRefused, RuntimeUnavailable

#: Objects as the API returns them.
Objects = list[dict[str, Any]]

_CONFLICT_RETRIES = 5

#: Custom resources: kind -> (group, version, plural).
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "PodSnapshotStorageConfig": (m.PODSNAPSHOT_GROUP, m.PODSNAPSHOT_VERSION,
                                 "podsnapshotstorageconfigs"),
    "PodSnapshotPolicy": (m.PODSNAPSHOT_GROUP, m.PODSNAPSHOT_VERSION, "podsnapshotpolicies"),
    "PodSnapshotManualTrigger": (m.PODSNAPSHOT_GROUP, m.PODSNAPSHOT_VERSION,
                                 "podsnapshotmanualtriggers"),
    "PodSnapshot": (m.PODSNAPSHOT_GROUP, m.PODSNAPSHOT_VERSION, "podsnapshots"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "FQDNNetworkPolicy": ("networking.gke.io", "v1alpha1", "fqdnnetworkpolicies"),
}
_CORE = {"Namespace": "namespace", "Pod": "namespaced_pod", "Service": "namespaced_service",
         "Secret": "namespaced_secret", "ConfigMap": "namespaced_config_map",
         "PersistentVolumeClaim": "namespaced_persistent_volume_claim",
         "ServiceAccount": "namespaced_service_account",
         "ResourceQuota": "namespaced_resource_quota"}
#: Kinds whose spec is kept up to date by ``apply`` (others are immutable or ours alone).
UPDATABLE = frozenset({"ResourceQuota", "PodSnapshotPolicy", "PodSnapshotStorageConfig",
                       "ServiceAccount"})


class Exists(Exception):
    """409 on create."""


class Missing(Exception):
    """404."""


class Conflict(Exception):
    """409 on anything but create (a resourceVersion precondition failed)."""


class KubeApi:
    def __init__(self, api_client: Any = None) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient`` (None: in-cluster config, else
        the kubeconfig, on first use)."""
        self._api_client = api_client
        self._apis: dict[str, Any] = {}

    def apply(self, obj: dict[str, Any]) -> None:
        """Create ``obj``; if it exists and is ours, bring an updatable kind's spec up to
        date (precondition: the resourceVersion just read; a conflict re-reads)."""
        kind, meta = obj["kind"], obj["metadata"]
        try:
            self.create(obj)
            return
        except Exists:
            pass
        for _ in range(_CONFLICT_RETRIES):
            current = self.read(kind, meta.get("namespace"), meta["name"])
            if current is None:
                try:
                    self.create(obj)
                    return
                except Exists:
                    continue
            if not m.is_managed(current):
                raise RuntimeRefused(f"{kind} {meta['name']} exists and is not managed by "
                                     "Stasis; rename or remove it")
            if kind not in UPDATABLE or covers(current, obj):
                return
            patch = {key: obj[key] for key in obj if key not in ("apiVersion", "kind",
                                                                 "metadata")}
            patch["metadata"] = {"labels": meta.get("labels") or {}}
            version = (current.get("metadata") or {}).get("resourceVersion")
            if version:
                patch["metadata"]["resourceVersion"] = version
            try:
                self.patch(kind, meta.get("namespace"), meta["name"], patch)
                return
            except Conflict:
                continue  # someone else changed it: read again
        raise RuntimeUnavailable(f"{kind} {meta['name']} kept changing under us; retry")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, namespace = obj["kind"], obj["metadata"].get("namespace")
        if kind in CUSTOM_KINDS:
            api, (group, version, plural) = self.api("CustomObjectsApi"), CUSTOM_KINDS[kind]
            if namespace is None:
                return self.call(api.create_cluster_custom_object, group, version, plural,
                                 obj, creating=True)
            return self.call(api.create_namespaced_custom_object, group, version, namespace,
                             plural, obj, creating=True)
        api, method = self._typed(kind, "create")
        args = (obj,) if namespace is None else (namespace, obj)
        return self.call(getattr(api, method), *args, creating=True)

    def read(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            if kind in CUSTOM_KINDS:
                api, (group, version, plural) = self.api("CustomObjectsApi"), CUSTOM_KINDS[kind]
                if namespace is None:
                    return self.call(api.get_cluster_custom_object, group, version, plural,
                                     name)
                return self.call(api.get_namespaced_custom_object, group, version, namespace,
                                 plural, name)
            api, method = self._typed(kind, "read")
            args = (name,) if namespace is None else (name, namespace)
            return self.call(getattr(api, method), *args)
        except Missing:
            return None

    def patch(self, kind: str, namespace: str | None, name: str,
              patch: dict[str, Any]) -> dict[str, Any]:
        if kind in CUSTOM_KINDS:
            api, (group, version, plural) = self.api("CustomObjectsApi"), CUSTOM_KINDS[kind]
            if namespace is None:
                return self.call(api.patch_cluster_custom_object, group, version, plural, name,
                                 patch)
            return self.call(api.patch_namespaced_custom_object, group, version, namespace,
                             plural, name, patch)
        api, method = self._typed(kind, "patch")
        args = (name, patch) if namespace is None else (name, namespace, patch)
        return self.call(getattr(api, method), *args)

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        """Delete if present; a missing object is already the wanted outcome."""
        try:
            if kind in CUSTOM_KINDS:
                api, (group, version, plural) = self.api("CustomObjectsApi"), CUSTOM_KINDS[kind]
                if namespace is None:
                    self.call(api.delete_cluster_custom_object, group, version, plural, name)
                else:
                    self.call(api.delete_namespaced_custom_object, group, version, namespace,
                              plural, name)
                return
            api, method = self._typed(kind, "delete")
            args = (name,) if namespace is None else (name, namespace)
            self.call(getattr(api, method), *args)
        except Missing:
            return

    def list(self, kind: str, namespace: str | None, selector: str | None = None) -> Objects:
        """Objects of ``kind`` (in ``namespace``; None: cluster-wide for custom kinds and
        cluster-scoped core kinds); a kind the server does not serve lists as empty."""
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        try:
            if kind in CUSTOM_KINDS:
                api, (group, version, plural) = self.api("CustomObjectsApi"), CUSTOM_KINDS[kind]
                if namespace is None:
                    data = self.call(api.list_cluster_custom_object, group, version, plural,
                                     **kwargs)
                else:
                    data = self.call(api.list_namespaced_custom_object, group, version,
                                     namespace, plural, **kwargs)
            else:
                api, method = self._typed(kind, "list")
                args = () if namespace is None else (namespace,)
                data = self.call(getattr(api, method), *args, **kwargs)
        except Missing:
            return []
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def pod_log(self, namespace: str, pod: str, container: str | None = None,
                *, limit_bytes: int | None = None) -> str:
        """A pod's (container's) log as text; empty when the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        kwargs: dict[str, Any] = {}
        if container:
            kwargs["container"] = container
        if limit_bytes:
            kwargs["limit_bytes"] = limit_bytes
        try:
            response = self.api("CoreV1Api").read_namespaced_pod_log(
                pod, namespace, _preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status in (400, 404):  # gone, or not started yet
                return ""
            raise translate(exc, creating=False) from exc
        except OSError as exc:
            raise RuntimeUnavailable(f"Kubernetes API unreachable: {exc}") from exc
        data = getattr(response, "data", b"") or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    # -- the client --------------------------------------------------------------------------

    def api(self, which: str) -> Any:
        """One of the client's API classes (``CoreV1Api``...), made once."""
        api = self._apis.get(which)
        if api is None:
            from kubernetes import client

            if self._api_client is None:
                self._api_client = default_api_client()
            api = getattr(client, which)(self._api_client)
            self._apis[which] = api
        return api

    def _typed(self, kind: str, verb: str) -> tuple[Any, str]:
        if kind in _CORE:
            return self.api("CoreV1Api"), f"{verb}_{_CORE[kind]}"
        if kind == "NetworkPolicy":
            return self.api("NetworkingV1Api"), f"{verb}_namespaced_network_policy"
        if kind == "RoleBinding":
            return self.api("RbacAuthorizationV1Api"), f"{verb}_namespaced_role_binding"
        raise ValueError(f"the Kubernetes runtime does not handle {kind}")

    def call(self, fn: Callable[..., Any], *args: Any, creating: bool = False,
             **kwargs: Any) -> dict[str, Any]:
        """Call the API and return the JSON body as a dict; map errors onto the port's."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise translate(exc, creating=creating) from exc
        except (OSError, HTTPError) as exc:  # connection refused, timeouts, TLS
            raise RuntimeUnavailable(f"Kubernetes API unreachable: {exc}") from exc
        raw = getattr(response, "data", b"") or b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}


def translate(exc: Any, *, creating: bool) -> Exception:
    status = getattr(exc, "status", None) or 0
    message = api_message(exc)
    if status == 409:
        return Exists(message) if creating else Conflict(message)
    if status == 404:
        return Missing(message)
    if status in (400, 422):
        return RuntimeRefused(f"Kubernetes refused the request: {message}")
    return RuntimeUnavailable(f"Kubernetes API answered {status}: {message}")


def api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    try:
        data = json.loads(body) if body else {}
    except (TypeError, ValueError):
        data = {}
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return str(getattr(exc, "reason", None) or exc)


def covers(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``current`` already has every field ``wanted`` sets (besides metadata)."""

    def sub(have: Any, want: Any) -> bool:
        if isinstance(want, Mapping):
            return isinstance(have, Mapping) and all(sub(have.get(k), v)
                                                     for k, v in want.items())
        return bool(have == want)

    return all(sub(current.get(key), value) for key, value in wanted.items()
               if key not in ("apiVersion", "kind", "metadata"))


def default_api_client() -> Any:
    """The client for where this process runs: ``STASIS_K8S_HOST`` (a Cloud Function:
    GKE's DNS endpoint with the function's Google identity), else in-cluster, else the
    kubeconfig (``STASIS_K8S_CONTEXT``)."""
    from kubernetes import client, config

    host = os.environ.get("STASIS_K8S_HOST")
    if host:
        return google_api_client(host, ca_cert=os.environ.get("STASIS_K8S_CA_CERT") or None)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(context=os.environ.get("STASIS_K8S_CONTEXT") or None)
    return client.ApiClient()


def google_api_client(host: str, *, credentials: Any = None, ca_cert: str | None = None) -> Any:
    """A client for a GKE control plane reached with a Google identity: the OAuth access
    token of ``credentials`` (default: the application default credentials, i.e. the
    Cloud Function's service account) as the bearer token, refreshed before it expires.
    GKE's DNS endpoint serves a publicly trusted certificate; ``ca_cert`` (a PEM file's
    path) is for an IP endpoint with the cluster's own CA."""
    from kubernetes import client

    if credentials is None:
        import google.auth

        credentials, _project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"])
    configuration = client.Configuration()
    configuration.host = host.rstrip("/")
    if ca_cert:
        configuration.ssl_ca_cert = ca_cert
    configuration.api_key_prefix["authorization"] = "Bearer"

    def refresh(conf: Any) -> None:
        # The client asks before every request; only an expired token costs a call.
        if not credentials.valid:
            from google.auth.transport.requests import Request

            credentials.refresh(Request())
        conf.api_key["authorization"] = credentials.token

    configuration.refresh_api_key_hook = refresh
    # The client adds the header only when a key is there; the hook fills it per request.
    configuration.api_key["authorization"] = ""
    return client.ApiClient(configuration)
