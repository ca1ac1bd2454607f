"""The cluster monitor's watch on agent sandboxes: a sandbox Pod's end, turned into
sandbox.finished.

``SandboxWatch.sync()`` runs on every monitor pass (``Monitor(watchers=...)``, woken
early by the monitor's watch on Stasis pods). For each sandbox Pod (labels of
``functions.kubernetes.objects.sandbox``) that ended (phase Succeeded or Failed,
``DeadlineExceeded``, the task OOM-killed, or a container that can never start), it reads
the collector's ``exit_status`` from Cloud Storage, lets ``sandbox.pod_outcome``
say what that means, measures the patch object (bytes, files), and publishes
sandbox.finished with an id derived from the sandbox and its request.

It also reports **sandbox.suspended** (method ``pod``) once the PodSnapshot of a
sandbox's PodSnapshotManualTrigger (``KubernetesSandboxRuntime.suspend``) is Ready, with
the requestid of that suspension (``<the sandbox's requestid>.suspend-<n>``).

And it reports **sandbox.idle_detected**: a running sandbox Pod whose ``task`` container
used less than ``idle_millicores`` of CPU (metrics.k8s.io PodMetrics, metrics-server's
averages over its window) on every sample for the Pod's ``stasis.dev/idle-seconds``
(its limit). One report per idle period: the event id and requestid
(``<the sandbox's requestid>.idle-<n>``) name the suspension it would be, n being one
more than the sandbox's PodSnapshotManualTriggers. The control plane decides and commands
``KubernetesSandboxRuntime.suspend``. Not measured: a Pod whose suspension is in flight
(its latest trigger pending, or done and the Pod not restored from it), a sandbox that is
never suspended (idle-seconds 0), and every Pod on a cluster without Pod Snapshots (it
could not be suspended) or without the metrics API (logged once: idle suspension needs
metrics-server). A pass without a sample of a Pod, or with one at or above the threshold,
starts its idle period over, so a busy Pod is never reported; a sample is taken at most
every ``metrics_interval`` seconds, and a burst shorter than metrics-server's window may
average below the threshold (a task that waits on nothing uses none).

The monitor only reads, in the cluster and in the bucket (its ClusterRole gets, lists and
watches): the control plane deletes the sandbox's objects and bundle as it records the
end (``KubernetesSandboxRuntime.cancel``), whoever reported it, as for jobs.

Level-triggered like the monitor: each pass looks at every sandbox Pod; a Pod that ended
is reported once per process, and again after a restart while its objects remain, with the
same id and requestid, which the control plane's ledger absorbs. Idle periods live in
memory: after a restart idleness is measured again from scratch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from events import SandboxFinished, SandboxIdleDetected, SandboxSuspended, new_event
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.kinds import METRICS_GROUP
from functions.kubernetes.objects.meta import (
    ANN_BASE_SHA,
    ANN_BUCKET,
    ANN_IDLE_SECONDS,
    ANN_NETWORK,
    ANN_PREFIX,
    ANN_REQUESTID,
    ANN_SANDBOX_ID,
    ANN_SEQUENCE,
    annotations_of,
    as_int,
)
from functions.kubernetes.objects.podsnapshot import (
    PS_NAME_ANNOTATION,
    podsnapshot_outcome,
    trigger_outcome,
)
from functions.kubernetes.objects.reports import SOURCE
from runtime.kubernetes.cluster import Logs

log = logging.getLogger(__name__)

#: Largest patch read to list its files (bigger ones are reported by size only).
MAX_PATCH_READ = 64 << 20
#: CPU of the task container below which a sample counts as no progress (millicores).
IDLE_MILLICORES = 5.0
#: Least time between two reads of the metrics API (metrics-server's resolution).
METRICS_INTERVAL_S = 15.0


class Snapshots(Protocol):
    """Pod Snapshot objects as the monitor reads them (``cluster.KubeCluster``)."""

    def triggers(self) -> list[dict[str, Any]]: ...

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Metrics(Protocol):
    """Pod metrics as the monitor reads them (``cluster.KubeCluster``)."""

    def pod_metrics(self) -> list[dict[str, Any]] | None:
        """Every sandbox PodMetrics (None: the cluster has no metrics API)."""
        ...


@dataclass
class _Idle:
    """One Pod's current idle period."""

    since: datetime
    peak_millicores: float
    samples: int
    last_sample: str


class SandboxWatch:
    def __init__(self, pods: Callable[[], list[dict[str, Any]]], logs: Logs, storage: Any,
                 bus: Any, *, snapshots: Snapshots | None = None,
                 metrics: Metrics | None = None, idle_millicores: float = IDLE_MILLICORES,
                 metrics_interval: float = METRICS_INTERVAL_S,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        """``pods``: every Stasis Pod of the cluster (``KubeCluster.pods``); ``logs``: a
        failed checkout's log (``KubeCluster``); ``storage``: a ``google.cloud.storage.Client``;
        ``bus``: where the events go; ``snapshots``: triggers and PodSnapshots (None: a
        cluster without Pod Snapshots); ``metrics``: PodMetrics (None: idleness is not
        measured); ``idle_millicores``: the task's CPU that counts as no progress."""
        self.pods = pods
        self.logs = logs
        self.storage = storage
        self.bus = bus
        self.snapshots = snapshots
        self.metrics = metrics
        self.idle_millicores = idle_millicores
        self.metrics_interval = metrics_interval
        self.clock = clock
        self._reported: set[str] = set()
        self._idle: dict[tuple[str, str, str, int], _Idle] = {}
        self._measured_at: datetime | None = None
        self._no_metrics_logged = False

    @classmethod
    def from_environment(cls, cluster: Any, bus: Any) -> SandboxWatch:
        """Over the monitor's ``cluster`` (a ``cluster.KubeCluster``: pods, logs, Pod
        Snapshots, metrics) and the bucket; ``STASIS_SANDBOX_IDLE_MILLICORES``: the idle
        threshold (default 5)."""
        from google.cloud import storage

        client = (storage.Client.create_anonymous_client()
                  if os.environ.get("STORAGE_EMULATOR_HOST")
                  else storage.Client(project=os.environ.get("STASIS_PROJECT") or None))
        threshold = float(os.environ.get("STASIS_SANDBOX_IDLE_MILLICORES") or IDLE_MILLICORES)
        return cls(cluster.pods, cluster, client, bus, snapshots=cluster, metrics=cluster,
                   idle_millicores=threshold)

    def sync(self) -> bool:
        """One pass over every sandbox Pod and suspension; True while one is in flight."""
        busy = False
        pods = [p for p in self.pods() if sm.is_sandbox(p)]
        for pod in pods:
            busy |= self.observe(pod)
        triggers = [t for t in (self.snapshots.triggers() if self.snapshots is not None
                                else []) if sm.is_sandbox(t)]
        for trigger in triggers:
            busy |= self.observe_suspension(trigger)
        self.measure_idle(pods, triggers)
        return busy

    # -- idleness --------------------------------------------------------------------------

    def measure_idle(self, pods: list[dict[str, Any]], triggers: list[dict[str, Any]]) -> None:
        """Take one CPU sample of every running sandbox Pod that may be suspended (at most
        every ``metrics_interval``) and report those idle for their limit."""
        if self.metrics is None or self.snapshots is None:
            return
        now = self.clock()
        if self._measured_at is not None and \
                (now - self._measured_at).total_seconds() < self.metrics_interval:
            return
        candidates = {key: (pod, limit) for pod in pods
                      if (key := _idle_key(pod, triggers)) is not None
                      and (limit := as_int(annotations_of(pod).get(ANN_IDLE_SECONDS))) > 0}
        self._idle = {k: v for k, v in self._idle.items() if k in candidates}
        if not candidates:
            return
        self._measured_at = now
        samples = self.metrics.pod_metrics()
        if samples is None:
            if not self._no_metrics_logged:
                log.warning("the cluster has no metrics API (metrics.k8s.io): idle "
                            "sandboxes are not suspended; idle suspension needs "
                            "metrics-server")
                self._no_metrics_logged = True
            self._idle.clear()
            return
        by_pod = {(str((s.get("metadata") or {}).get("namespace")),
                   str((s.get("metadata") or {}).get("name"))): s for s in samples}
        for key, (pod, limit) in candidates.items():
            self._sample(key, pod, limit, by_pod.get(key[:2]), now)

    def _sample(self, key: tuple[str, str, str, int], pod: Mapping[str, Any], limit: int,
                sample: Mapping[str, Any] | None, now: datetime) -> None:
        millicores = _task_millicores(sample)
        if millicores is None or millicores >= self.idle_millicores:
            self._idle.pop(key, None)  # busy, or not seen: the period starts over
            return
        stamp = str((sample or {}).get("timestamp") or "")
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = _Idle(now, millicores, 1, stamp)
        elif stamp != idle.last_sample:
            idle.samples, idle.last_sample = idle.samples + 1, stamp
            idle.peak_millicores = max(idle.peak_millicores, millicores)
        seconds = int((now - idle.since).total_seconds())
        if seconds < limit:
            return
        annotations = annotations_of(pod)
        sandbox_id = str(annotations.get(ANN_SANDBOX_ID) or "")
        sequence = key[3]
        requestid = str(annotations.get(ANN_REQUESTID) or "")
        event_id = sm.idle_event_id(sandbox_id, requestid, sequence)
        if event_id in self._reported:
            return
        payload = SandboxIdleDetected(
            sandbox_id=sandbox_id, idle_seconds=seconds, observed_at=now.isoformat(),
            measured=f"cpu of container {sm.TASK_CONTAINER} ({METRICS_GROUP} PodMetrics)",
            threshold_millicores=self.idle_millicores,
            peak_millicores=round(idle.peak_millicores, 3), samples=idle.samples,
            sequence=sequence)
        self.bus.publish(new_event(payload, source=SOURCE,
                                   requestid=sm.idle_requestid(requestid, sequence), id=event_id))
        self._reported.add(event_id)
        log.info("sandbox %s idle for %d s (suspension %d would be next)", sandbox_id,
                 seconds, sequence)

    def observe_suspension(self, trigger: Mapping[str, Any]) -> bool:
        """Report a sandbox's snapshot once it is Ready (once); True while it is taken."""
        assert self.snapshots is not None
        annotations = annotations_of(trigger)
        sandbox_id = str(annotations.get(ANN_SANDBOX_ID) or "")
        sequence = as_int(annotations.get(ANN_SEQUENCE))
        requestid = sm.suspension_requestid(str(annotations.get(ANN_REQUESTID) or ""),
                                            sequence)
        event_id = sm.finished_event_id(sandbox_id, requestid)
        if not sandbox_id or event_id in self._reported:
            return False
        outcome = trigger_outcome(trigger)
        if outcome.state == "pending" or (outcome.state == "succeeded" and not outcome.name):
            return True
        snapshot = None
        if outcome.state == "succeeded" and outcome.name:
            namespace = str((trigger.get("metadata") or {}).get("namespace") or "")
            snapshot = self.snapshots.podsnapshot(namespace, outcome.name)
            if snapshot is None or podsnapshot_outcome(snapshot).state == "pending":
                return True
        if snapshot is None or podsnapshot_outcome(snapshot).state == "failed":
            # The Pod keeps running (postCheckpoint: resume): nothing was suspended.
            log.warning("snapshot %s of sandbox %s failed: %s", sequence, sandbox_id,
                        outcome.message or podsnapshot_outcome(snapshot or {}).message)
            self._reported.add(event_id)
            return False
        uri = podsnapshot_outcome(snapshot).uri or "no URI yet"
        payload = SandboxSuspended(
            sandbox_id=sandbox_id, idle_seconds=as_int(annotations.get(ANN_IDLE_SECONDS)),
            sequence=sequence, method="pod",
            detail=f"Pod Snapshot {outcome.name} ({uri}); the pod runs until it is released")
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid, id=event_id))
        self._reported.add(event_id)
        log.info("sandbox %s suspended (%d)", sandbox_id, sequence)
        return False

    def observe(self, pod: Mapping[str, Any]) -> bool:
        """Report one Pod's end (once); True while it runs."""
        meta = pod.get("metadata") or {}
        annotations = annotations_of(pod)
        sandbox_id = annotations.get(ANN_SANDBOX_ID)
        if meta.get("deletionTimestamp") or not sandbox_id:
            return False
        requestid = str(annotations.get(ANN_REQUESTID) or "")
        event_id = sm.finished_event_id(sandbox_id, requestid)
        if event_id in self._reported:
            return False  # published; the control plane deletes it as it records the end
        bucket = self.storage.bucket(annotations.get(ANN_BUCKET) or "")
        prefix = str(annotations.get(ANN_PREFIX) or "").strip("/")
        status = _read(bucket, f"{prefix}/{sm.STATUS_OBJECT}") if sm.pod_ended(pod) else None
        outcome = sm.pod_outcome(pod, status.decode(errors="replace")
                                 if status is not None else None)
        if outcome is None:
            return True
        payload = self._payload(pod, outcome, bucket, prefix)
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid or None,
                                   id=event_id))
        self._reported.add(event_id)
        log.info("sandbox %s finished: %s", sandbox_id, payload.termination)
        return False

    def _payload(self, pod: Mapping[str, Any], outcome: sm.PodOutcome, bucket: Any,
                 prefix: str) -> SandboxFinished:
        annotations = annotations_of(pod)
        error = outcome.error
        if outcome.checkout_failed:
            meta = pod.get("metadata") or {}
            tail = [line for line in self.logs.pod_log(
                str(meta.get("namespace")), str(meta.get("name")), sm.CHECKOUT_CONTAINER,
                limit_bytes=4096).splitlines() if line.strip()]
            if tail:
                error = f"{error}: {tail[-1]}"
        patch = bucket.get_blob(f"{prefix}/{sm.PATCH_OBJECT}")
        log_blob = bucket.get_blob(f"{prefix}/{sm.LOG_OBJECT}")
        files: list[str] = []
        if patch is not None and (patch.size or 0) <= MAX_PATCH_READ:
            files = sm.files_in_patch(patch.download_as_bytes().decode(errors="replace"))
        return SandboxFinished(
            sandbox_id=str(annotations.get(ANN_SANDBOX_ID)),
            succeeded=outcome.succeeded,
            exit_status=outcome.exit_status,
            patch_uri=f"gs://{bucket.name}/{patch.name}" if patch is not None else None,
            log_uri=f"gs://{bucket.name}/{log_blob.name}" if log_blob is not None else None,
            error=error, termination=str(outcome.termination),
            base_sha=annotations.get(ANN_BASE_SHA) or None,
            patch_bytes=int(patch.size or 0) if patch is not None else 0,
            files_changed=files, duration_ms=sm.task_duration_ms(pod),
            network=str(annotations.get(ANN_NETWORK) or ""))


def _idle_key(pod: Mapping[str, Any],
              triggers: list[dict[str, Any]]) -> tuple[str, str, str, int] | None:
    """(namespace, name, restored from, next suspension) of a running sandbox Pod whose
    idleness counts; None while it is not running or its suspension is in flight."""
    meta = pod.get("metadata") or {}
    annotations = annotations_of(pod)
    sandbox_id = annotations.get(ANN_SANDBOX_ID)
    if not sandbox_id or meta.get("deletionTimestamp") or \
            (pod.get("status") or {}).get("phase") != "Running" or \
            sm.pod_outcome(pod, None) is not None:
        return None
    namespace = str(meta.get("namespace") or "")
    restored_from = str(annotations.get(PS_NAME_ANNOTATION) or "")
    own = [t for t in triggers
           if (t.get("metadata") or {}).get("namespace") == namespace
           and annotations_of(t).get(ANN_SANDBOX_ID) == sandbox_id]
    latest = max(own, key=lambda t: as_int(annotations_of(t).get(ANN_SEQUENCE)),
                 default=None)
    sequence = 1
    if latest is not None:
        sequence = as_int(annotations_of(latest).get(ANN_SEQUENCE)) + 1
        outcome = trigger_outcome(latest)
        if outcome.state == "pending" or (outcome.state == "succeeded"
                                          and outcome.name != restored_from):
            return None  # being snapshotted, or snapshotted and about to be released
    return namespace, str(meta.get("name") or ""), restored_from, sequence


def _task_millicores(sample: Mapping[str, Any] | None) -> float | None:
    """The task container's CPU in a PodMetrics (None: not in it)."""
    from kubernetes.utils import parse_quantity

    for container in (sample or {}).get("containers") or []:
        if container.get("name") == sm.TASK_CONTAINER:
            try:
                return float(parse_quantity((container.get("usage") or {}).get("cpu")) * 1000)
            except (TypeError, ValueError):
                return None
    return None


def _read(bucket: Any, name: str) -> bytes | None:
    blob = bucket.get_blob(name)
    return None if blob is None else bytes(blob.download_as_bytes())
