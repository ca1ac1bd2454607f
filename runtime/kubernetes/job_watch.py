"""The job watcher: JobSets that ended, turned into job.finished.

One of the cluster monitor's watchers (``runtime.kubernetes.monitor``: ``sync()`` every
pass, woken early by a watch on JobSets). For every Stasis JobSet
(``functions.kubernetes.objects.jobset``):

- still running, but a host's pod will never start (an image that cannot be pulled, a
  bad config): the job failed to start;
- gone while this watcher saw it running (deleted by hand): the job is lost
  (``runtime_lost``; a JobSet that went away while the monitor was down is not noticed);
- ``Completed`` or ``Failed`` (``status.terminalState`` or its conditions, as the JobSet
  controller sets them): which host failed first comes from the hosts' exit records in the
  bucket (millisecond times, written by ``runtime.kubernetes.job_host``), else from the
  pods' terminated containers; the error ends with that host's traceback, or the last
  lines of its log (the bucket's chunks, else the pod's log).

It publishes job.finished (succeeded, termination, failed host, exit status, error, the
logs' URI, the duration since the runtime started the JobSet). The JobSet and its Service
are deleted by the control plane as it records the end (the job handler's outbox:
``runtime.cancel``), whoever reported it, so the slice is released at once, not after the
JobSet's TTL. The monitor itself stays read-only (its ClusterRole only gets, lists and
watches; ``objects.monitor``): what it sees becomes events, never changes.

Level-triggered like the monitor: each pass looks at every JobSet; the event's id is
derived from the job and its request, and its requestid is the job's (``finish-<id>``),
so a pass repeated after a crash or a restart (the JobSet not deleted yet) publishes the
same event again, which the control plane's ledger absorbs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from events import new_event
from events.payloads import JobFinished
from functions.kubernetes.objects import jobset as js
from functions.kubernetes.objects.meta import (
    ANN_JOB_URI,
    ANN_REQUESTID,
    ANN_SUBMITTED_AT,
    LABEL_JOB,
    MANAGED_SELECTOR,
    is_managed,
)
from functions.kubernetes.objects.reports import SOURCE, event_id
from runtime.kubernetes.cluster import Logs

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
MAX_ERROR = 4000


class Kube(Logs, Protocol):
    """What the watcher needs of the cluster (``cluster.KubeCluster``)."""

    def list(self, kind: str, namespace: str | None,
             selector: str | None = None) -> list[dict[str, Any]]: ...


class Objects(Protocol):
    """What the watcher needs of ``runtime.snapshot.storage.ObjectStore``."""

    def get_bytes(self, bucket: str, name: str) -> bytes: ...

    def list_objects(self, bucket: str, prefix: str) -> dict[str, int]: ...


class Publisher(Protocol):
    def publish(self, event: Any) -> str: ...


class JobWatch:
    def __init__(self, kube: Kube, bus: Publisher, objects: Objects, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube, self.bus, self.objects, self.clock = kube, bus, objects, clock
        self._reported: set[str] = set()
        #: JobSets seen running, by report key: (job id, the job's URI).
        self._running: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_environment(cls, cluster: Kube, bus: Publisher) -> JobWatch:
        """Over the monitor's ``cluster`` (a ``cluster.KubeCluster``) and the bucket."""
        from runtime.snapshot.storage import get_store

        return cls(cluster, bus, get_store())

    def sync(self) -> bool:
        """One pass over every JobSet; True while a job is still running."""
        busy = False
        present = set()
        for obj in self.kube.list("JobSet", None, MANAGED_SELECTOR):
            meta = obj.get("metadata") or {}
            if not is_managed(obj):
                continue
            present.add(_key(obj))
            if meta.get("deletionTimestamp"):
                continue
            busy |= self.observe(obj)
        self._vanished(present)
        return busy

    def _vanished(self, present: set[str]) -> None:
        """A JobSet seen running that is gone without having ended (deleted by hand, or by
        its TTL while the monitor was down): its job is lost. Same requestid as any other
        report of its end: if the control plane already recorded one (a cancel deletes the
        JobSet), the ledger absorbs this."""
        for key, (job_id, uri) in list(self._running.items()):
            if key in present:
                continue
            del self._running[key]
            if key in self._reported:
                continue
            payload = JobFinished(job_id, False, termination="runtime_lost",
                                  error=f"job {job_id}: its JobSet went away before it "
                                        "ended (deleted outside Stasis?)",
                                  log_uri=f"{uri}/logs/" if uri else None)
            self.bus.publish(new_event(payload, source=SOURCE, requestid=f"finish-{job_id}",
                                       id=event_id("k8s-jobs", f"{key}-vanished")))
            self._reported.add(key)

    def observe(self, obj: Mapping[str, Any]) -> bool:
        """Report one JobSet's end (once); True while it runs."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), str(meta.get("name"))
        job_id = str((meta.get("labels") or {}).get(LABEL_JOB) or name)
        annotations = meta.get("annotations") or {}
        key = _key(obj)
        if key in self._reported:
            return False  # published; the control plane deletes it as it records the end
        pods = js.pods_of(name, self.kube.list("Pod", namespace,
                                               f"{js.JOBSET_NAME_LABEL}={name}"))
        uri = str(annotations.get(ANN_JOB_URI) or "")
        now_ms = int(self.clock() * 1000)
        # the bucket is read only once the JobSet has ended
        ending = (None if js.outcome(obj) == "running"
                  else js.ending(obj, self._records(uri), pods, now_ms))
        if ending is None:
            failure = js.start_failure(pods)
            if failure is None:
                self._running[key] = (job_id, uri)
                return True
            host, why = failure
            started = int(annotations.get(ANN_SUBMITTED_AT) or 0)
            ending = js.Ending(False, "failed_to_start", None, host,
                               f"host {host} cannot start: {why}",
                               max(0, now_ms - started) if started else 0)
        error = None
        if not ending.succeeded:
            tail = self._tail(uri, namespace, pods, ending.failed_host)
            error = f"{ending.message}; its log:\n{tail}" if tail else ending.message
            if len(error) > MAX_ERROR:  # the end of a log is what explains it
                error = error[:200] + "\n...\n" + error[-(MAX_ERROR - 210):]
        payload = JobFinished(job_id, ending.succeeded, termination=ending.termination,
                              exit_status=ending.exit_status, failed_host=ending.failed_host,
                              error=error, log_uri=f"{uri}/logs/" if uri else None,
                              duration_ms=ending.duration_ms)
        self.bus.publish(new_event(payload, source=SOURCE, requestid=f"finish-{job_id}",
                                   id=event_id("k8s-jobs", key)))
        self._reported.add(key)
        log.info("job %s ended: %s", job_id, ending.message)
        return False

    # -- what the hosts left ---------------------------------------------------------------

    def _records(self, uri: str) -> list[js.HostExit]:
        if not uri:
            return []
        bucket, prefix = _split(uri)
        found = []
        for name in self.objects.list_objects(bucket, f"{prefix}/hosts/"):
            if not name.endswith("/exit.json"):
                continue
            try:
                record = json.loads(self.objects.get_bytes(bucket, name))
                found.append(js.HostExit(int(record["host"]), int(record["exit_status"]),
                                         int(record.get("finished_ms") or 0)))
            except (ValueError, KeyError, TypeError):
                continue  # a record cut short: the pod's status still counts
        return found

    def _tail(self, uri: str, namespace: Any, pods: list[Mapping[str, Any]],
              host: int | None) -> str:
        """The failed host's traceback, else the end of its log (bucket, else pod)."""
        if host is None:
            return ""
        if uri:
            bucket, prefix = _split(uri)
            names = self.objects.list_objects(bucket, f"{prefix}/hosts/host-{host}/")
            name = f"{prefix}/{js.traceback_object(host)}"
            if name in names:
                return self.objects.get_bytes(bucket, name).decode("utf-8", "replace")
            chunks = sorted(self.objects.list_objects(bucket, f"{prefix}/logs/host-{host}/"))
            lines: list[str] = []
            for chunk in chunks[-LOG_TAIL_LINES:]:
                lines += self.objects.get_bytes(bucket, chunk).decode(
                    "utf-8", "replace").splitlines()
            if lines:
                return "\n".join(lines[-LOG_TAIL_LINES:])
        for pod in pods:
            if js.host_of(pod) == host:
                text = self.kube.pod_log(str(namespace), str(pod["metadata"]["name"]),
                                         "worker", limit_bytes=64 * 1024)
                return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
        return ""


def _key(obj: Mapping[str, Any]) -> str:
    """One job's report key: its id and the request that started it."""
    meta = obj.get("metadata") or {}
    job_id = (meta.get("labels") or {}).get(LABEL_JOB) or meta.get("name")
    return f"{job_id}-finished-{(meta.get('annotations') or {}).get(ANN_REQUESTID) or ''}"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return bucket, prefix.rstrip("/")
