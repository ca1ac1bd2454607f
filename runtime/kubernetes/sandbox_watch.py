"""The cluster monitor's watch on agent sandboxes: a sandbox Pod's end, turned into
sandbox.finished, and its objects removed.

``SandboxWatch.sync()`` runs on every monitor pass (``Monitor(watchers=...)``). For each
sandbox Pod (labels of ``functions.domain.sandbox_manifests``) that ended (phase Succeeded
or Failed, ``DeadlineExceeded``, the task OOM-killed, or a container that can never
start), it reads the collector's ``exit_status`` from Cloud Storage, lets
``sandbox_manifests.pod_outcome`` say what that means, measures the patch object (bytes,
files), and then, in this order:

1. writes ``result.json`` (the payload) under the sandbox's prefix,
2. publishes sandbox.finished with an id derived from the sandbox and request,
3. deletes the Pod, Secret and policies, and the bundle object.

Level-triggered like the monitor: a restart between any two steps loses nothing (a Pod
with a ``result.json`` is reported from it again and cleaned up), and a duplicate event
carries the same id and requestid, which the control plane's ledger absorbs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from events import SandboxFinished, new_event
from functions.adapters.kube_api import KubeApi
from functions.adapters.kubernetes_sandbox_runtime import (
    SOURCE,
    delete_objects,
    finished_event_id,
    write_result,
)
from functions.domain import manifests as m
from functions.domain import sandbox_manifests as sm
from functions.domain.sandboxes import Termination

log = logging.getLogger(__name__)

#: Largest patch read to list its files (bigger ones are reported by size only).
MAX_PATCH_READ = 64 << 20
_FIELDS = {f.name for f in dataclasses.fields(SandboxFinished)}


class SandboxWatch:
    def __init__(self, pods: Callable[[], list[dict[str, Any]]], kube: KubeApi, storage: Any,
                 bus: Any) -> None:
        """``pods``: every Stasis Pod of the cluster (``KubeCluster.pods``); ``kube``:
        deletes and logs; ``storage``: a ``google.cloud.storage.Client``; ``bus``: where
        sandbox.finished goes."""
        self.pods = pods
        self.kube = kube
        self.storage = storage
        self.bus = bus

    @classmethod
    def from_environment(cls, pods: Callable[[], list[dict[str, Any]]], api_client: Any,
                         bus: Any) -> SandboxWatch:
        from google.cloud import storage

        client = (storage.Client.create_anonymous_client()
                  if os.environ.get("STORAGE_EMULATOR_HOST")
                  else storage.Client(project=os.environ.get("STASIS_PROJECT") or None))
        return cls(pods, KubeApi(api_client), client, bus)

    def sync(self) -> bool:
        """One pass over every sandbox Pod; True while one of them is still running."""
        busy = False
        for pod in self.pods():
            if sm.is_sandbox(pod):
                busy |= self.observe(pod)
        return busy

    def observe(self, pod: Mapping[str, Any]) -> bool:
        """Report and clean up one Pod if it ended; True while it runs."""
        meta = pod.get("metadata") or {}
        annotations = m.annotations_of(pod)
        sandbox_id = annotations.get(sm.ANN_SANDBOX_ID)
        if meta.get("deletionTimestamp") or not sandbox_id:
            return False
        bucket = self.storage.bucket(annotations.get(sm.ANN_BUCKET) or "")
        prefix = str(annotations.get(sm.ANN_PREFIX) or "").strip("/")
        reported = _json(_read(bucket, f"{prefix}/{sm.RESULT_OBJECT}"))
        if reported is not None:
            payload = SandboxFinished(**{k: v for k, v in reported.items() if k in _FIELDS})
        else:
            ended = sm.pod_ended(pod)
            status = _read(bucket, f"{prefix}/{sm.STATUS_OBJECT}") if ended else None
            outcome = sm.pod_outcome(pod, status.decode(errors="replace")
                                     if status is not None else None)
            if outcome is None:
                return True
            payload = self._payload(pod, outcome, bucket, prefix)
            write_result(bucket, prefix, payload)
        requestid = str(annotations.get(sm.ANN_REQUESTID) or "")
        self.bus.publish(new_event(payload, source=SOURCE, requestid=requestid or None,
                                   id=finished_event_id(sandbox_id, requestid)))
        log.info("sandbox %s finished: %s", sandbox_id, payload.termination)
        delete_objects(self.kube, str(meta.get("namespace")), sandbox_id)
        _delete(bucket, f"{prefix}/{sm.BUNDLE_OBJECT}")
        return False

    def _payload(self, pod: Mapping[str, Any], outcome: sm.PodOutcome, bucket: Any,
                 prefix: str) -> SandboxFinished:
        annotations = m.annotations_of(pod)
        error = outcome.error
        if outcome.termination == Termination.FAILED_TO_START and error and \
                error.startswith("the checkout failed"):
            meta = pod.get("metadata") or {}
            tail = [line for line in self.kube.pod_log(
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


def _json(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _delete(bucket: Any, name: str) -> None:
    from google.api_core.exceptions import NotFound

    with contextlib.suppress(NotFound):
        bucket.blob(name).delete()
