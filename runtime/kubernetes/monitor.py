"""The cluster monitor: pod and snapshot state in the cluster, turned into Stasis events.

    python -m runtime.kubernetes.monitor         # in-cluster (Deployment from
                                                 # objects.monitor.monitor_manifests), or with a
                                                 # kubeconfig (STASIS_K8S_CONTEXT)

The Kubernetes runtime is asynchronous: it creates objects and returns. This process
watches what the cluster does with them and publishes the outcome, the cluster's
counterpart of the local node agent's reports:

- **workspace.ready**: a workspace pod became Ready. A pod re-created from a Pod Snapshot
  (``podsnapshot.gke.io/ps-name``) must also carry GKE's ``PodRestored`` condition, else
  GKE started it fresh and the resume failed (workspace.runtime_failed says so). A pod
  re-created with a kernel snapshot to restore (method ``kernel``) is reported once its
  snapshot agent restored the kernels.
- **snapshot.finished**: method ``pod``: a PodSnapshotManualTrigger completed and its
  PodSnapshot is Ready (or either failed), with the bytes of the objects GKE wrote under its
  ``observedGCSPath``; method ``kernel``: the pod carries a snapshot
  request, the monitor hands it to the pod's agent and reports its result. Accelerator
  type and count come from the pod's annotations, so a GPU snapshot records them.
- **workspace.idle_detected**: every ``idle_interval`` seconds, the activity of each running
  workspace (the Jupyter server's ``/api/status`` and kernels, through the agent).
- **workspace.runtime_failed**: a pod that cannot start (image pull, config errors).
- **job.finished**: a scale-out job's JobSet completed or failed, or a host cannot start
  (``runtime.kubernetes.job_watch``, one of the ``watchers``).
- **workspace.scheduled** ``admit`` / **workspace.pause_requested** ``preempted``: Kueue
  admitted a workspace pod's Workload, or evicted it (``runtime.kubernetes.kueue_watch``;
  without Kueue there are no Workloads to read).

Kernel snapshots and restores on GKE: the workspace pod's own identity may not touch the
snapshot bucket, so every request the monitor hands a pod's agent carries a token it minted
for that one operation from its own credential, downscoped to the workspace's own snapshot
folder (``functions.domain.snapshot_access``, ``runtime.kubernetes.snapshot_tokens``); a
request whose prefix or base lies outside that folder is failed without asking the agent.

It is level-triggered: watches on pods, triggers and PodSnapshots only wake it early;
every pass looks at the whole state, so a missed watch event or a restart loses nothing.
Events carry the request's id from the objects' annotations and deterministic ids, so
a duplicate after a restart is absorbed by the control plane's ledger.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from events import (
    SnapshotFinished,
    WorkspaceIdleDetected,
    WorkspaceReady,
    WorkspaceRuntimeFailed,
    new_event,
)
from functions.domain import snapshot_access
from functions.kubernetes.objects.meta import (
    ANN_ACCELERATOR,
    ANN_ACCELERATOR_COUNT,
    ANN_OPERATION,
    ANN_REQUESTED_AT,
    ANN_REQUESTID,
    ANN_RESTORE_REQUEST,
    ANN_SNAPSHOT_ID,
    ANN_SNAPSHOT_REQUEST,
    ANN_WORKSPACE_ID,
    annotations_of,
    as_int,
    is_managed,
    json_annotation,
)
from functions.kubernetes.objects.podsnapshot import (
    PS_NAME_ANNOTATION,
    podsnapshot_outcome,
    trigger_outcome,
)
from functions.kubernetes.objects.reports import SOURCE, event_id
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.status import (
    condition,
    pod_failure,
    pod_ready,
    timestamp_ms,
)
from functions.kubernetes.objects.workspace import sidecar_token, url_of_pod
from runtime.kubernetes.snapshot_tokens import SnapshotTokens

log = logging.getLogger(__name__)

#: How long a Ready pod that should have been restored may lack ``PodRestored``.
RESTORE_CONDITION_GRACE_S = 15.0
#: Triggers older than this are history (kept for restores and clean-up), not news: a
#: restarted monitor does not report them again.
MAX_REPORT_AGE_S = 6 * 3600


class Cluster(Protocol):
    """What the monitor reads from the API server."""

    def pods(self) -> list[dict[str, Any]]: ...

    def triggers(self) -> list[dict[str, Any]]: ...

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Sidecars(Protocol):
    """HTTP to a workspace pod's snapshot agent; None when it does not answer (yet)."""

    def get(self, pod: Mapping[str, Any], path: str) -> dict[str, Any] | None: ...

    def post(self, pod: Mapping[str, Any], path: str,
             body: Mapping[str, Any]) -> dict[str, Any] | None: ...


class Publisher(Protocol):
    def publish(self, event: Any) -> str: ...


class Watcher(Protocol):
    """Another kind of object the monitor looks after (sandbox pods, JobSets): one
    level-triggered pass per loop, True while something is in flight."""

    def sync(self) -> bool: ...


class Monitor:
    def __init__(self, cluster: Cluster, bus: Publisher, sidecars: Sidecars, *,
                 settings: ClusterSettings | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 idle_interval: float = 60.0, watchers: Iterable[Watcher] = (),
                 objects: Any = None, tokens: SnapshotTokens | None = None) -> None:
        """``objects``: the snapshot bucket's reader (``list_objects(bucket, prefix)``), to
        measure a Pod Snapshot's bytes from what GKE wrote (None: not measured).
        ``tokens``: mints each kernel snapshot's and restore's downscoped credential
        (``snapshot_tokens.DownscopedTokens`` on GKE, ``EmulatorTokens`` on fake-gcs-server;
        None: requests carry none and no boundary is checked)."""
        self.cluster = cluster
        self.objects = objects
        self.tokens = tokens
        self.watchers = list(watchers)
        self.bus = bus
        self.sidecars = sidecars
        self.settings = settings or ClusterSettings()
        self.clock = clock
        self.idle_interval = idle_interval
        self._lock = threading.RLock()
        self._reported: set[str] = set()  # deterministic event ids already published
        self._asked: set[str] = set()  # agent jobs started (snapshot or restore keys)
        self._ready_seen: dict[str, float] = {}
        self._running: dict[str, dict[str, Any]] = {}  # workspace id -> its Ready pod
        self._pending_requests: dict[str, dict[str, Any]] = {}
        self._last_idle = 0.0
        self.wake = threading.Event()

    # -- one pass -------------------------------------------------------------------------

    def sync(self) -> bool:
        """Look at every workspace pod and snapshot trigger once; True while something is
        in flight (the caller then comes back soon)."""
        with self._lock:
            pods = [p for p in self.cluster.pods() if _workspace_id(p)]
            running: dict[str, dict[str, Any]] = {}
            busy = False
            live_requests: set[str] = set()
            for pod in pods:
                busy |= self.observe_pod(pod)
                if pod_ready(pod):
                    running[_workspace_id(pod)] = pod
                request = json_annotation(pod, ANN_SNAPSHOT_REQUEST)
                if request:
                    live_requests.add(_snapshot_key(_workspace_id(pod), request))
            self._running = running
            busy |= self._lost_requests(live_requests)
            for trigger in self.cluster.triggers():
                busy |= self.observe_trigger(trigger)
            return busy

    def observe_pod(self, pod: Mapping[str, Any]) -> bool:
        """Report what one workspace pod's state means; True while waiting on it."""
        if not is_managed(pod) or not _workspace_id(pod):
            return False
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return False
        busy = self._observe_snapshot_request(pod)
        annotations = annotations_of(pod)
        ws = _workspace_id(pod)
        requestid = annotations.get(ANN_REQUESTID) or ""
        restoring = annotations.get(ANN_OPERATION) == "restore"
        failure = pod_failure(pod)
        if failure:
            operation = "resume" if restoring else "provision"
            self._publish(f"{ws}-failed-{requestid}",
                          WorkspaceRuntimeFailed(ws, operation, failure), requestid)
            return busy
        if not pod_ready(pod):
            return True
        key = f"{ws}-ready-{requestid}"
        if key in self._reported:
            return busy
        restore_request = json_annotation(pod, ANN_RESTORE_REQUEST)
        if restore_request:
            return self._observe_kernel_restore(pod, restore_request, key, requestid) or busy
        if annotations.get(PS_NAME_ANNOTATION):
            return self._observe_pod_restore(pod, key, requestid) or busy
        self._publish(key, WorkspaceReady(ws, self._url(pod), _handle(pod),
                                          restore_ms=self._restore_ms(pod)), requestid)
        return busy

    def observe_trigger(self, trigger: Mapping[str, Any]) -> bool:
        """Method ``pod``: report a trigger's PodSnapshot once it is Ready or failed."""
        annotations = annotations_of(trigger)
        ws, snapshot_id = annotations.get(ANN_WORKSPACE_ID), annotations.get(ANN_SNAPSHOT_ID)
        if not is_managed(trigger) or not ws or not snapshot_id:
            return False
        key = f"{ws}-snapshot-{snapshot_id}"
        if key in self._reported:
            return False
        requestid = annotations.get(ANN_REQUESTID) or ""
        requested = as_int(annotations.get(ANN_REQUESTED_AT))
        if requested and self.clock().timestamp() * 1000 - requested > MAX_REPORT_AGE_S * 1000:
            self._reported.add(key)
            return False
        outcome = trigger_outcome(trigger)
        if outcome.state == "failed":
            self._finished(key, trigger, snapshot_id, requestid, error=outcome.message)
            return False
        if outcome.state != "succeeded" or not outcome.name:
            return True
        namespace = (trigger.get("metadata") or {}).get("namespace") or ""
        snapshot = self.cluster.podsnapshot(namespace, outcome.name)
        if snapshot is None:
            return True
        result = podsnapshot_outcome(snapshot)
        if result.state == "failed":
            self._finished(key, trigger, snapshot_id, requestid,
                           error=f"Pod Snapshot {outcome.name}: {result.message}")
        elif result.state == "succeeded":
            self._finished(key, trigger, snapshot_id, requestid, uri=result.uri,
                           finished_at=result.finished_at or outcome.finished_at,
                           size=self._measure(result.uri))
        return result.state == "pending"

    def report_activity(self) -> int:
        """Publish workspace.idle_detected for every running workspace whose agent
        answers; returns how many were published."""
        with self._lock:
            running = list(self._running.items())
        published = 0
        observed_at = self.clock().isoformat()
        for ws, pod in running:
            activity = self.sidecars.get(pod, "/activity")
            if not activity or not activity.get("last_activity"):
                continue
            payload = WorkspaceIdleDetected(
                workspace_id=ws, last_activity=str(activity["last_activity"]),
                observed_at=observed_at, busy_kernels=int(activity.get("busy_kernels") or 0),
                connections=int(activity.get("connections") or 0))
            self.bus.publish(new_event(payload, source=SOURCE))
            published += 1
        return published

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, watches: Iterable[Callable[[threading.Event], None]]
            = (), busy_interval: float = 2.0, resync_interval: float = 30.0) -> None:
        """Sync on every watch wake-up, every ``busy_interval`` while something is in
        flight, else every ``resync_interval``; report activity every ``idle_interval``."""
        for watch in watches:
            threading.Thread(target=watch, args=(stop,), daemon=True,
                             name=getattr(watch, "__name__", "watch")).start()
        while not stop.is_set():
            self.wake.clear()
            try:
                busy = self.sync()
                for watcher in self.watchers:
                    busy |= watcher.sync()
                if time.monotonic() - self._last_idle >= self.idle_interval:
                    self._last_idle = time.monotonic()
                    self.report_activity()
            except Exception:  # the API server or Pub/Sub hiccuped: try again next pass
                log.exception("monitor pass failed")
                busy = True
            self.wake.wait(busy_interval if busy else resync_interval)

    # -- kernel snapshots and restores through the agent -----------------------------------

    def _observe_snapshot_request(self, pod: Mapping[str, Any]) -> bool:
        request = json_annotation(pod, ANN_SNAPSHOT_REQUEST)
        if not request or not request.get("snapshot_id"):
            return False
        ws = _workspace_id(pod)
        snapshot_id = str(request["snapshot_id"])
        key = _snapshot_key(ws, request)
        if key in self._reported:
            return False
        self._pending_requests[key] = {"pod": pod, "request": request}
        requestid = str(request.get("requestid") or "")
        if key not in self._asked:
            body: dict[str, Any] = {
                "snapshot_id": snapshot_id, "bucket": request.get("bucket"),
                "prefix": request.get("prefix"), "base": request.get("base")}
            try:
                credential = self._credential(ws, request, "snapshot")
            except snapshot_access.OutsideWorkspace as exc:
                self._finished(key, pod, snapshot_id, requestid, method="kernel",
                               error=f"refused: {exc}")
                self._pending_requests.pop(key, None)
                return False
            except Exception:  # the token exchange failed: ask again next pass
                log.exception("no snapshot credential for %s yet", key)
                return True
            if credential is not None:
                body["credential"] = credential
            answer = self.sidecars.post(pod, "/snapshots", body)
            if answer is None:
                return True  # the agent is not reachable yet: ask again next pass
            self._asked.add(key)
        job = self.sidecars.get(pod, f"/snapshots/{snapshot_id}")
        if job is None or job.get("state") == "running":
            return True
        if job.get("state") == "succeeded":
            self._finished(key, pod, snapshot_id, requestid, method="kernel", job=job)
        else:
            self._finished(key, pod, snapshot_id, requestid, method="kernel",
                           error=str(job.get("error") or "the snapshot agent failed"))
        self._pending_requests.pop(key, None)
        return False

    def _lost_requests(self, live: set[str]) -> bool:
        """A kernel snapshot whose pod went away before it finished failed."""
        for key, pending in list(self._pending_requests.items()):
            if key in live or key in self._reported:
                continue
            request = pending["request"]
            self._finished(key, pending["pod"], str(request["snapshot_id"]),
                           str(request.get("requestid") or ""), method="kernel",
                           error="the workspace pod went away during the snapshot")
            self._pending_requests.pop(key, None)
        return False

    def _observe_kernel_restore(self, pod: Mapping[str, Any], request: Mapping[str, Any],
                                key: str, requestid: str) -> bool:
        ws = _workspace_id(pod)
        ask_key = f"{key}-restore"
        if ask_key not in self._asked:
            body: dict[str, Any] = {
                "snapshot_id": request.get("snapshot_id"), "bucket": request.get("bucket"),
                "prefix": request.get("prefix"),
                "manifest_sha256": request.get("manifest_sha256"),
                "device_arrays_to_cpu": bool(request.get("device_arrays_to_cpu"))}
            try:
                credential = self._credential(ws, request, "restore")
            except snapshot_access.OutsideWorkspace as exc:
                self._publish(f"{ws}-failed-{requestid}", WorkspaceRuntimeFailed(
                    ws, "resume", f"restoring the kernels was refused: {exc}",
                    cause="restore_refused"), requestid)
                self._reported.add(key)
                return False
            except Exception:
                log.exception("no restore credential for %s yet", key)
                return True
            if credential is not None:
                body["credential"] = credential
            answer = self.sidecars.post(pod, "/restore", body)
            if answer is None:
                return True
            self._asked.add(ask_key)
        job = self.sidecars.get(pod, "/restore")
        if job is None or job.get("state") in ("running", "none"):
            return True
        if job.get("state") == "succeeded":
            self._publish(key, WorkspaceReady(
                ws, self._url(pod), _handle(pod),
                kernels_restored=int(job.get("kernels_restored") or 0),
                restore_ms=self._restore_ms(pod)), requestid)
        else:
            self._publish(f"{ws}-failed-{requestid}", WorkspaceRuntimeFailed(
                ws, "resume", f"restoring the kernels failed: {job.get('error')}",
                cause=job.get("cause")), requestid)
            self._reported.add(key)
        return False

    def _credential(self, ws: str, request: Mapping[str, Any],
                    operation: snapshot_access.Operation) -> dict[str, Any] | None:
        """The downscoped credential of one snapshot or restore of workspace ``ws``
        (:class:`snapshot_access.OutsideWorkspace` for a prefix or base not its own)."""
        if self.tokens is None:
            return None
        base = request.get("base") if operation == "snapshot" else None
        rules = snapshot_access.boundary(
            str(request.get("bucket") or ""), ws, str(request.get("prefix") or ""), operation,
            base_prefix=str(base.get("prefix") or "") if isinstance(base, Mapping) else None)
        return self.tokens.mint(rules)

    def _observe_pod_restore(self, pod: Mapping[str, Any], key: str, requestid: str) -> bool:
        ws = _workspace_id(pod)
        ps_name = annotations_of(pod).get(PS_NAME_ANNOTATION)
        restored = condition(pod, "PodRestored")
        if restored is not None and restored.get("status") == "True":
            activity = self.sidecars.get(pod, "/activity") or {}
            self._publish(key, WorkspaceReady(
                ws, self._url(pod), _handle(pod),
                kernels_restored=int(activity.get("kernels") or 0),
                restore_ms=self._restore_ms(pod)), requestid)
            return False
        first = self._ready_seen.setdefault(key, time.monotonic())
        if restored is None and time.monotonic() - first < RESTORE_CONDITION_GRACE_S:
            return True
        why = (f"PodRestored is {restored.get('status')}: {restored.get('message') or ''}"
               if restored is not None else "the pod has no PodRestored condition")
        self._publish(f"{ws}-failed-{requestid}", WorkspaceRuntimeFailed(
            ws, "resume", f"GKE did not restore Pod Snapshot {ps_name} ({why.strip()}); the "
                          "pod started fresh"), requestid)
        self._reported.add(key)
        return False

    # -- reporting ----------------------------------------------------------------------------

    def _finished(self, key: str, obj: Mapping[str, Any], snapshot_id: str, requestid: str, *,
                  method: str = "pod", uri: str | None = None, finished_at: str | None = None,
                  job: Mapping[str, Any] | None = None, error: str | None = None,
                  size: int = 0) -> None:
        annotations = annotations_of(obj)
        accelerator = annotations.get(ANN_ACCELERATOR) or None
        count = annotations.get(ANN_ACCELERATOR_COUNT) or "0"
        ws = str(annotations.get(ANN_WORKSPACE_ID))
        job = job or {}
        started = as_int(annotations.get(ANN_REQUESTED_AT))
        if method == "kernel":
            request = json_annotation(obj, ANN_SNAPSHOT_REQUEST) or {}
            started = as_int(request.get("requested_at_ms")) or started
        duration = int(job.get("duration_ms") or 0)
        if not duration and started:
            end = timestamp_ms(finished_at) or int(self.clock().timestamp() * 1000)
            duration = max(0, end - started)
        payload = SnapshotFinished(
            workspace_id=ws, snapshot_id=snapshot_id, succeeded=error is None, method=method,
            uri=str(job.get("uri") or uri) if (job.get("uri") or uri) else None,
            bytes=int(job.get("bytes") or size), duration_ms=duration,
            accelerator=accelerator, accelerator_count=int(count) if count.isdigit() else 0,
            captured=[str(c) for c in job.get("captured") or []],
            skipped=[dict(s) for s in job.get("skipped") or [] if isinstance(s, Mapping)],
            error=error, manifest_sha256=job.get("manifest_sha256"),
            parts={str(k): int(v) for k, v in (job.get("parts") or {}).items()},
            uploaded_bytes=int(job.get("uploaded_bytes") or 0))
        self._publish(key, payload, requestid)

    def _publish(self, key: str, payload: Any, requestid: str) -> None:
        if key in self._reported:
            return
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid or None,
                                   id=event_id("k8s-monitor", key)))
        self._reported.add(key)
        log.info("published %s for %s", type(payload).__name__, key)

    def _measure(self, uri: str | None) -> int:
        """The bytes GKE wrote for a Pod Snapshot: every object under its
        ``observedGCSPath`` (the record's ``uri``), as the team's bytes count them."""
        if self.objects is None or not uri or not uri.startswith("gs://"):
            return 0
        bucket, _, path = uri.removeprefix("gs://").partition("/")
        return sum(int(size) for size in
                   self.objects.list_objects(bucket, path.strip("/") + "/").values())

    def _url(self, pod: Mapping[str, Any]) -> str:
        return url_of_pod(pod, self.settings)

    def _restore_ms(self, pod: Mapping[str, Any]) -> int | None:
        annotations = annotations_of(pod)
        if annotations.get(ANN_OPERATION) != "restore":
            return None
        started = as_int(annotations.get(ANN_REQUESTED_AT))
        if not started:
            return None
        return max(0, int(self.clock().timestamp() * 1000) - started)


def _workspace_id(obj: Mapping[str, Any]) -> str:
    return str(annotations_of(obj).get(ANN_WORKSPACE_ID) or "")


def _snapshot_key(ws: str, request: Mapping[str, Any]) -> str:
    return f"{ws}-snapshot-{request.get('snapshot_id')}"


def _handle(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"k8s:{meta.get('namespace')}/{meta.get('name')}"


# --------------------------------------------------------------------------------------------
# Reaching the agents
# --------------------------------------------------------------------------------------------


class HttpSidecars:
    """:class:`Sidecars` over the pod network (the monitor runs in the cluster): the pod's
    IP and the agent port. Any failure is None: the monitor asks again next pass."""

    def __init__(self, port: int = 8890, timeout: float = 5.0, *, key: str = "") -> None:
        import requests

        self.port = port
        self.timeout = timeout
        self._key = key  # STASIS_SIDECAR_KEY: each sidecar's token derives from it
        self._session = requests.Session()
        self._session.trust_env = False

    def _headers(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The pod's sidecar token (``runtime.kubernetes.sidecar``)."""
        return {"X-Stasis-Sidecar-Token": sidecar_token(self._key, _workspace_id(pod))}

    def _url(self, pod: Mapping[str, Any], path: str) -> str | None:
        ip = (pod.get("status") or {}).get("podIP")
        return f"http://{ip}:{self.port}{path}" if ip else None

    def get(self, pod: Mapping[str, Any], path: str) -> dict[str, Any] | None:
        return self._request("GET", pod, path)

    def post(self, pod: Mapping[str, Any], path: str,
             body: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._request("POST", pod, path, json=dict(body))

    def _request(self, method: str, pod: Mapping[str, Any], path: str,
                 **kwargs: Any) -> dict[str, Any] | None:
        import requests

        url = self._url(pod, path)
        if url is None:
            return None
        try:
            response = self._session.request(method, url, timeout=self.timeout,
                                             headers=self._headers(pod), **kwargs)
        except requests.RequestException:
            return None
        if response.status_code >= 500 or response.status_code == 404:
            return None
        try:
            body = response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None


class ProxySidecars(HttpSidecars):
    """:class:`Sidecars` through the API server's pod proxy, for a monitor outside the
    cluster (development, the K3s tests): ``/api/v1/namespaces/NS/pods/POD:PORT/proxy``."""

    def __init__(self, api_client: Any, port: int = 8890, timeout: float = 10.0, *,
                 key: str = "") -> None:
        super().__init__(port, timeout, key=key)
        self.api_client = api_client

    def _request(self, method: str, pod: Mapping[str, Any], path: str,
                 **kwargs: Any) -> dict[str, Any] | None:
        meta = pod.get("metadata") or {}
        resource = (f"/api/v1/namespaces/{meta.get('namespace')}/pods/"
                    f"{meta.get('name')}:{self.port}/proxy{path}")
        headers = {"Accept": "application/json", **self._headers(pod)}
        body = kwargs.get("json")
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            params = self.api_client.param_serialize(method, resource, header_params=headers,
                                                     body=body, auth_settings=["BearerToken"])
            response = self.api_client.call_api(*params, _request_timeout=self.timeout)
            response.read()
        except Exception:
            return None
        if response.status >= 400:
            return None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None


def main() -> None:
    from kubernetes import client, config

    from runtime.kubernetes.cluster import KubeCluster
    from runtime.kubernetes.job_watch import JobWatch
    from runtime.kubernetes.kueue_watch import KueueWatch
    from runtime.kubernetes.sandbox_watch import SandboxWatch
    from runtime.local.publisher import MONITOR, PubSubPublisher

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config.load_incluster_config()
        in_cluster = True
    except config.ConfigException:
        config.load_kube_config(context=os.environ.get("STASIS_K8S_CONTEXT") or None)
        in_cluster = False
    api_client = client.ApiClient()
    # the monitor's Deployment says whether the cluster has Pod Snapshots
    settings = replace(ClusterSettings.from_env(os.environ), pod_snapshots=os.environ.get(
        "STASIS_POD_SNAPSHOTS", "1") in ("1", "true"))
    cluster = KubeCluster(api_client, pod_snapshots=settings.pod_snapshots)
    key = os.environ.get("STASIS_SIDECAR_KEY", "")
    sidecars: Sidecars = (HttpSidecars(settings.agent_port, key=key) if in_cluster
                          else ProxySidecars(api_client, settings.agent_port, key=key))
    project = os.environ.get("STASIS_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT") or ""
    bus = PubSubPublisher(project, origin=MONITOR)
    sandboxes = SandboxWatch.from_environment(cluster, bus)
    jobs = JobWatch.from_environment(cluster, bus)
    from runtime.kubernetes.snapshot_tokens import DownscopedTokens, EmulatorTokens
    from runtime.snapshot.storage import get_store

    store = get_store()
    # fake-gcs-server ignores authentication: the boundary is still built, no token is sent
    tokens: SnapshotTokens = EmulatorTokens() if store.emulator_host else DownscopedTokens()
    monitor = Monitor(cluster, bus, sidecars, settings=settings,
                      idle_interval=float(os.environ.get("STASIS_MONITOR_IDLE_INTERVAL", "60")),
                      watchers=[sandboxes, jobs, KueueWatch(cluster, bus)], objects=store,
                      tokens=tokens)
    stop = threading.Event()
    monitor.run(stop, watches=cluster.watches(monitor.wake))


if __name__ == "__main__":
    main()
