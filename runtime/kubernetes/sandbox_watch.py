"""The cluster monitor's watch on agent sandboxes: a sandbox Pod's end, turned into
sandbox.finished.

``SandboxWatch.sync()`` runs on every monitor pass (``Monitor(watchers=...)``, woken
early by the monitor's watch on Stasis pods). For each sandbox Pod (labels of
``functions.domain.sandbox_manifests``) that ended (phase Succeeded or Failed,
``DeadlineExceeded``, the task OOM-killed, or a container that can never start), it reads
the collector's ``exit_status`` from Cloud Storage, lets ``sandbox_manifests.pod_outcome``
say what that means, measures the patch object (bytes, files), and publishes
sandbox.finished with an id derived from the sandbox and its request.

It also reports **sandbox.suspended** (method ``pod``) once the PodSnapshot of a
sandbox's PodSnapshotManualTrigger (``KubernetesSandboxRuntime.suspend``) is Ready, with
the requestid of that suspension (``<the sandbox's requestid>.suspend-<n>``).

The monitor only reads, in the cluster and in the bucket (its ClusterRole gets, lists and
watches): the control plane deletes the sandbox's objects and bundle as it records the
end (``KubernetesSandboxRuntime.cancel``), whoever reported it, as for jobs.

Level-triggered like the monitor: each pass looks at every sandbox Pod; a Pod that ended
is reported once per process, and again after a restart while its objects remain, with the
same id and requestid, which the control plane's ledger absorbs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from events import SandboxFinished, SandboxSuspended, new_event
from functions.adapters.kube_api import KubeApi
from functions.adapters.kubernetes_sandbox_runtime import SOURCE, finished_event_id
from functions.domain import manifests as m
from functions.domain import sandbox_manifests as sm
from functions.domain.sandboxes import Termination

log = logging.getLogger(__name__)

#: Largest patch read to list its files (bigger ones are reported by size only).
MAX_PATCH_READ = 64 << 20


class Logs(Protocol):
    def pod_log(self, namespace: str, pod: str, container: str | None = None, *,
                limit_bytes: int | None = None) -> str: ...


class Snapshots(Protocol):
    """Pod Snapshot objects as the monitor reads them (``KubeCluster``)."""

    def triggers(self) -> list[dict[str, Any]]: ...

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class SandboxWatch:
    def __init__(self, pods: Callable[[], list[dict[str, Any]]], logs: Logs, storage: Any,
                 bus: Any, *, snapshots: Snapshots | None = None) -> None:
        """``pods``: every Stasis Pod of the cluster (``KubeCluster.pods``); ``logs``: a
        failed checkout's log (``KubeApi``); ``storage``: a ``google.cloud.storage.Client``;
        ``bus``: where the events go; ``snapshots``: triggers and PodSnapshots (None: a
        cluster without Pod Snapshots)."""
        self.pods = pods
        self.logs = logs
        self.storage = storage
        self.bus = bus
        self.snapshots = snapshots
        self._reported: set[str] = set()

    @classmethod
    def from_environment(cls, pods: Callable[[], list[dict[str, Any]]], api_client: Any,
                         bus: Any, *, snapshots: Snapshots | None = None) -> SandboxWatch:
        from google.cloud import storage

        client = (storage.Client.create_anonymous_client()
                  if os.environ.get("STORAGE_EMULATOR_HOST")
                  else storage.Client(project=os.environ.get("STASIS_PROJECT") or None))
        return cls(pods, KubeApi(api_client), client, bus, snapshots=snapshots)

    def sync(self) -> bool:
        """One pass over every sandbox Pod and suspension; True while one is in flight."""
        busy = False
        for pod in self.pods():
            if sm.is_sandbox(pod):
                busy |= self.observe(pod)
        for trigger in self.snapshots.triggers() if self.snapshots is not None else []:
            if sm.is_sandbox(trigger):
                busy |= self.observe_suspension(trigger)
        return busy

    def observe_suspension(self, trigger: Mapping[str, Any]) -> bool:
        """Report a sandbox's snapshot once it is Ready (once); True while it is taken."""
        assert self.snapshots is not None
        annotations = m.annotations_of(trigger)
        sandbox_id = str(annotations.get(sm.ANN_SANDBOX_ID) or "")
        sequence = _int(annotations.get(sm.ANN_SEQUENCE))
        requestid = sm.suspension_requestid(str(annotations.get(sm.ANN_REQUESTID) or ""),
                                            sequence)
        event_id = finished_event_id(sandbox_id, requestid)
        if not sandbox_id or event_id in self._reported:
            return False
        outcome = m.trigger_outcome(trigger)
        if outcome.state == "pending" or (outcome.state == "succeeded" and not outcome.name):
            return True
        snapshot = None
        if outcome.state == "succeeded" and outcome.name:
            namespace = str((trigger.get("metadata") or {}).get("namespace") or "")
            snapshot = self.snapshots.podsnapshot(namespace, outcome.name)
            if snapshot is None or m.podsnapshot_outcome(snapshot).state == "pending":
                return True
        if snapshot is None or m.podsnapshot_outcome(snapshot).state == "failed":
            # The Pod keeps running (postCheckpoint: resume): nothing was suspended.
            log.warning("snapshot %s of sandbox %s failed: %s", sequence, sandbox_id,
                        outcome.message or m.podsnapshot_outcome(snapshot or {}).message)
            self._reported.add(event_id)
            return False
        uri = m.podsnapshot_outcome(snapshot).uri or "no URI yet"
        payload = SandboxSuspended(
            sandbox_id=sandbox_id, idle_seconds=_int(annotations.get(sm.ANN_IDLE_SECONDS)),
            sequence=sequence, method="pod",
            detail=f"Pod Snapshot {outcome.name} ({uri}); the pod runs until it is released")
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid, id=event_id))
        self._reported.add(event_id)
        log.info("sandbox %s suspended (%d)", sandbox_id, sequence)
        return False

    def observe(self, pod: Mapping[str, Any]) -> bool:
        """Report one Pod's end (once); True while it runs."""
        meta = pod.get("metadata") or {}
        annotations = m.annotations_of(pod)
        sandbox_id = annotations.get(sm.ANN_SANDBOX_ID)
        if meta.get("deletionTimestamp") or not sandbox_id:
            return False
        requestid = str(annotations.get(sm.ANN_REQUESTID) or "")
        event_id = finished_event_id(sandbox_id, requestid)
        if event_id in self._reported:
            return False  # published; the control plane deletes it as it records the end
        bucket = self.storage.bucket(annotations.get(sm.ANN_BUCKET) or "")
        prefix = str(annotations.get(sm.ANN_PREFIX) or "").strip("/")
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
        annotations = m.annotations_of(pod)
        error = outcome.error
        if outcome.termination == Termination.FAILED_TO_START and error and \
                error.startswith("the checkout failed"):
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
            sandbox_id=str(annotations.get(sm.ANN_SANDBOX_ID)),
            succeeded=outcome.termination == Termination.EXITED and outcome.exit_status == 0,
            exit_status=outcome.exit_status,
            patch_uri=f"gs://{bucket.name}/{patch.name}" if patch is not None else None,
            log_uri=f"gs://{bucket.name}/{log_blob.name}" if log_blob is not None else None,
            error=error, termination=str(outcome.termination),
            base_sha=annotations.get(sm.ANN_BASE_SHA) or None,
            patch_bytes=int(patch.size or 0) if patch is not None else 0,
            files_changed=files, duration_ms=sm.task_duration_ms(pod),
            network=str(annotations.get(sm.ANN_NETWORK) or ""))


def _read(bucket: Any, name: str) -> bytes | None:
    blob = bucket.get_blob(name)
    return None if blob is None else bytes(blob.download_as_bytes())


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
