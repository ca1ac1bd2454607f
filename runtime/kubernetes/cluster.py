"""The cluster as the monitor and its watchers read it: one read-only client over the
official ``kubernetes`` client, cluster-wide.

It lists, gets and watches; it never writes (the monitor's ClusterRole only gets, lists and
watches: ``objects.monitor``). Which client method reaches a kind comes from
``functions.kubernetes.objects.kinds``, as for the control plane's ``KubeApi``. Label
selectors narrow what the API server sends; the readers check the labels again
(``meta.is_managed``), so a server that ignores them changes nothing. Errors are the
client's ``ApiException``: the monitor's loop logs them and tries again on its next pass.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from functions.kubernetes.objects import kinds
from functions.kubernetes.objects.meta import MANAGED_SELECTOR, is_managed
from functions.kubernetes.objects.sandbox import sandbox_labels_selector

log = logging.getLogger(__name__)

#: What a watch loop runs until ``stop`` is set.
WatchLoop = Callable[[threading.Event], None]


class Logs(Protocol):
    """A pod's log, as the watchers read a failed container's (:meth:`KubeCluster.pod_log`)."""

    def pod_log(self, namespace: str, pod: str, container: str | None = None, *,
                limit_bytes: int | None = None) -> str: ...


class KubeCluster:
    """Every reader's view of the cluster (the monitor's ``Cluster``, the sandbox watch's
    ``Snapshots``, ``Logs`` and ``Metrics``, the job watch's ``Kube``)."""

    SELECTOR = MANAGED_SELECTOR

    def __init__(self, api_client: Any, *, pod_snapshots: bool = True) -> None:
        from kubernetes import client

        self._client = client
        self._api_client = api_client
        self._apis: dict[str, Any] = {}
        #: Without Pod Snapshots there are no triggers to read (and no CRD to ask).
        self.pod_snapshots = pod_snapshots

    # -- any kind --------------------------------------------------------------------------

    def list(self, kind: str, namespace: str | None = None,
             selector: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` (None: in every namespace); a kind the server does not serve
        lists as empty."""
        try:
            data = self._call(kinds.call("list", kind, namespace),
                              **({"label_selector": selector} if selector else {}))
        except self._client.exceptions.ApiException as exc:
            if exc.status == 404:
                return []
            raise
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def read(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self._call(kinds.call("read", kind, namespace, name))
        except self._client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pod_log(self, namespace: str, pod: str, container: str | None = None,
                *, limit_bytes: int | None = None) -> str:
        """A pod's (container's) log as text; empty when the pod is gone or not started."""
        kwargs: dict[str, Any] = {}
        if container:
            kwargs["container"] = container
        if limit_bytes:
            kwargs["limit_bytes"] = limit_bytes
        try:
            response = self._api("CoreV1Api").read_namespaced_pod_log(
                pod, namespace, _preload_content=False, **kwargs)
        except self._client.exceptions.ApiException as exc:
            if exc.status in (400, 404):  # gone, or not started yet
                return ""
            raise
        data = getattr(response, "data", b"") or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    # -- what the monitor and the watchers read ----------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        """Every Stasis pod (workspaces and sandboxes)."""
        return [p for p in self.list("Pod", None, self.SELECTOR) if is_managed(p)]

    def triggers(self) -> list[dict[str, Any]]:
        """Every Stasis PodSnapshotManualTrigger (none without Pod Snapshots)."""
        if not self.pod_snapshots:
            return []
        return [t for t in self.list("PodSnapshotManualTrigger", None, self.SELECTOR)
                if is_managed(t)]

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.read("PodSnapshot", namespace, name)

    def pod_metrics(self) -> list[dict[str, Any]] | None:
        """Every sandbox's PodMetrics (metrics-server serves ``metrics.k8s.io`` through the
        API server's aggregation layer); None when the cluster has no metrics API."""
        try:
            data = self._call(kinds.call("list", "PodMetrics", None),
                              label_selector=sandbox_labels_selector())
        except self._client.exceptions.ApiException as exc:
            if exc.status == 404:  # no metrics-server (APIService not registered)
                return None
            raise
        return [i for i in data.get("items") or [] if isinstance(i, dict)]

    def watches(self, wake: threading.Event) -> list[WatchLoop]:
        """Watch loops that set ``wake`` on every change: pods, JobSets, and with Pod
        Snapshots triggers and PodSnapshots."""
        kinds_watched = ["Pod", "JobSet"]
        if self.pod_snapshots:
            kinds_watched += ["PodSnapshotManualTrigger", "PodSnapshot"]
        return [self._watch_loop(kind, wake) for kind in kinds_watched]

    # -- the client --------------------------------------------------------------------------

    def _api(self, which: str) -> Any:
        api = self._apis.get(which)
        if api is None:
            api = self._apis[which] = getattr(self._client, which)(self._api_client)
        return api

    def _call(self, route: kinds.Call, **kwargs: Any) -> dict[str, Any]:
        method = getattr(self._api(route.api), route.method)
        return _json(method(*route.args, _preload_content=False, **kwargs))

    def _watch_loop(self, kind: str, wake: threading.Event) -> WatchLoop:
        route = kinds.call("list", kind, None)
        # Pods and JobSets are narrowed to Stasis's; Pod Snapshot objects are few.
        kwargs = {"label_selector": self.SELECTOR} if kind in ("Pod", "JobSet") else {}

        def loop(stop: threading.Event) -> None:
            watch(stop, wake, getattr(self._api(route.api), route.method), *route.args,
                  **kwargs)

        loop.__name__ = f"watch-{kind.lower()}"
        return loop


def watch(stop: threading.Event, wake: threading.Event, fn: Callable[..., Any],
          *args: Any, **kwargs: Any) -> None:
    """Set ``wake`` on every event of a watch on ``fn``'s list, until ``stop``; a watch
    that drops or expires is started again."""
    from kubernetes import watch as k8s_watch

    while not stop.is_set():
        watcher = k8s_watch.Watch()
        try:
            for _event in watcher.stream(fn, *args, timeout_seconds=60, **kwargs):
                wake.set()
                if stop.is_set():
                    break
        except Exception as exc:  # a dropped or expired watch: start a new one
            log.info("watch on %s ended: %s", getattr(fn, "__name__", fn), exc)
            stop.wait(2.0)
        finally:
            watcher.stop()


def _json(response: Any) -> dict[str, Any]:
    data = json.loads(getattr(response, "data", b"") or b"{}")
    return data if isinstance(data, dict) else {}
