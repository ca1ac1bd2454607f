"""The Kubernetes API as the runtimes use it: apply, read, patch, delete and list objects
given as plain dicts, with the official ``kubernetes`` client and the Runtime port's errors.

Shared by the workspace runtime (``workspaces``), the sandbox runtime (``sandboxes``) and
the job runtime (``jobs``), so each of them only says *what* to apply; which client method
reaches a kind comes from ``objects.kinds``. The client is imported on the first call, not
with this module (a deployed function that never reaches a cluster never loads it).

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

from functions.kubernetes.objects import kinds
from functions.kubernetes.objects.meta import is_managed
from functions.ports import RuntimeRefused, RuntimeUnavailable

#: Objects as the API returns them.
Objects = list[dict[str, Any]]

_CONFLICT_RETRIES = 5

#: Kinds whose spec is kept up to date by ``apply`` (others are immutable or ours alone).
UPDATABLE = frozenset({"ResourceQuota", "PodSnapshotPolicy", "PodSnapshotStorageConfig",
                       "ServiceAccount"})


class Exists(Exception):
    """409 on create."""


class Missing(Exception):
    """404."""


class Conflict(Exception):
    """409 on anything but create (a resourceVersion precondition failed)."""


class Forbidden(RuntimeUnavailable):
    """403: this identity may not (retried like any unavailability, unless a caller knows
    that it is for good)."""


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
            if not is_managed(current):
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

    def ensure_namespace(self, obj: dict[str, Any], team: str) -> None:
        """The team's Namespace ``obj``, which the install step creates (Terraform,
        ``deploy/cluster.py``) with the team's bindings. Read first, never patched; a missing
        one is created where this identity may (a dev cluster), and refused for good where
        it may not (GKE: no function may create a namespace)."""
        if self.read("Namespace", None, obj["metadata"]["name"]) is not None:
            return
        try:
            self.create(obj)
        except Exists:
            pass
        except Forbidden as exc:
            raise RuntimeRefused(
                f"team {team} is not installed in this cluster (no namespace "
                f"{obj['metadata']['name']}): add it to the admin configuration and run "
                "`stasis bundle` and `terraform apply`") from exc

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        route = kinds.call("create", obj["kind"], obj["metadata"].get("namespace"), body=obj)
        return self._call(route, creating=True)

    def read(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call(kinds.call("read", kind, namespace, name))
        except Missing:
            return None

    def patch(self, kind: str, namespace: str | None, name: str,
              patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(kinds.call("patch", kind, namespace, name, patch))

    def delete(self, kind: str, namespace: str | None, name: str, *,
               grace_seconds: int | None = None) -> None:
        """Delete if present; a missing object is already the wanted outcome.
        ``grace_seconds``: the deletion's grace period (None: the object's own)."""
        kwargs: dict[str, Any] = ({"grace_period_seconds": grace_seconds}
                                  if grace_seconds is not None else {})
        try:
            self._call(kinds.call("delete", kind, namespace, name), **kwargs)
        except Missing:
            return

    def list(self, kind: str, namespace: str | None, selector: str | None = None) -> Objects:
        """Objects of ``kind`` (in ``namespace``; None: every namespace, or cluster-scoped
        objects); a kind the server does not serve lists as empty."""
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        try:
            data = self._call(kinds.call("list", kind, namespace), **kwargs)
        except Missing:
            return []
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

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

    def _call(self, route: kinds.Call, *, creating: bool = False,
              **kwargs: Any) -> dict[str, Any]:
        return self.call(getattr(self.api(route.api), route.method), *route.args,
                         creating=creating, **kwargs)

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
    if status == 403:
        return Forbidden(f"Kubernetes API answered 403: {message}")
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

    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # declared None
    # The client adds the header only when a key is there; the hook fills it per request.
    configuration.api_key["authorization"] = ""
    return client.ApiClient(configuration)
