"""The monitor's Kueue watch: what Kueue decided about a workspace pod, as Stasis events.

On a cluster where Kueue admits workspaces (``STASIS_K8S_KUEUE``), a workspace waits QUEUED
with its pod gated (``functions.kubernetes.objects.kueue``). Every pass reads the Workloads
of every namespace and the workspace pods they belong to (their ownerReference), and:

- a Workload **admitted** (``Admitted`` True) is a workspace.scheduled ``admit`` for the
  version its pod was made at (the pod's ``stasis.dev/workspace-version``): the lifecycle
  starts the QUEUED workspace (its pod runs as soon as Kueue removes the gate, and the
  pod's own readiness, reported by the monitor, would start it too);
- a Workload **evicted** (``Evicted`` True: preempted by a higher priority or a lender
  reclaiming its quota), or a pod Kueue marked ``TerminationTarget``, is a
  workspace.pause_requested ``preempted``: the pod's preStop keeps it up for
  ``preemption_grace_seconds``, the control plane pauses it with its state in that time,
  and its resume waits in Kueue's queue again.

Level-triggered like the rest of the monitor: each verdict is published once per pod
version (deterministic ids; the control plane's ledger absorbs a repeat after a restart).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from events import WorkspacePauseRequested, new_event
from events.payloads import WorkspaceScheduled
from functions.kubernetes.objects import kueue
from functions.kubernetes.objects.meta import (
    ANN_VERSION,
    ANN_WORKSPACE_ID,
    annotations_of,
    as_int,
    is_managed,
)
from functions.kubernetes.objects.reports import SOURCE, event_id
from functions.kubernetes.objects.status import condition

log = logging.getLogger(__name__)
ACTOR = "kueue"


class Kube(Protocol):
    def list(self, kind: str, namespace: str | None,
             selector: str | None = None) -> list[dict[str, Any]]: ...


class Publisher(Protocol):
    def publish(self, event: Any) -> str: ...


class KueueWatch:
    def __init__(self, kube: Kube, bus: Publisher) -> None:
        self.kube, self.bus = kube, bus
        self._reported: set[str] = set()

    def sync(self) -> bool:
        """One pass; True while a workspace pod waits for Kueue."""
        pods = {(p["metadata"].get("namespace"), p["metadata"].get("name")): p
                for p in self.kube.list("Pod", None) if is_managed(p)
                and annotations_of(p).get(ANN_WORKSPACE_ID)}
        waiting = False
        seen: set[tuple[Any, Any]] = set()
        for workload in self.kube.list("Workload", None):
            owner = kueue.owner_pod(workload)
            key = ((workload.get("metadata") or {}).get("namespace"), owner)
            pod = pods.get(key)
            if pod is not None and kueue.owner_pod(workload, pod) is None:
                continue  # the Workload of an earlier pod of the same name
            if pod is None or ((pod.get("metadata") or {}).get("deletionTimestamp") and \
                    kueue.workload_verdict(workload).state != "evicted"):
                continue
            seen.add(key)
            waiting |= self.observe(pod, kueue.workload_verdict(workload))
        for key, pod in pods.items():
            target = condition(pod, kueue.TERMINATION_TARGET)
            if key not in seen and target is not None and target.get("status") == "True":
                self.observe(pod, kueue.Verdict("evicted", str(target.get("reason") or ""),
                                                str(target.get("message") or "")))
        return waiting

    def observe(self, pod: Mapping[str, Any], verdict: kueue.Verdict) -> bool:
        """Publish what ``verdict`` on ``pod``'s Workload means; True while it waits."""
        annotations = annotations_of(pod)
        ws = str(annotations.get(ANN_WORKSPACE_ID))
        version = as_int(annotations.get(ANN_VERSION))
        if verdict.state == "pending":
            return True
        if verdict.state == "admitted" and version is not None:
            flavors = f" on {', '.join(verdict.flavors)}" if verdict.flavors else ""
            self._publish(f"{ws}-kueue-admit-v{version}", WorkspaceScheduled(
                ws, version, "admit", message=f"Kueue admitted it{flavors}"))
        elif verdict.state == "evicted":
            why = verdict.message or verdict.reason or "evicted"
            detail = (f"paused with its state: Kueue preempted it ({why}); its resume "
                      "waits in Kueue's queue")
            self._publish(f"{ws}-kueue-evicted-v{version}", WorkspacePauseRequested(
                ws, ACTOR, cause="preempted", detail=detail[:1000]))
        return False

    def _publish(self, key: str, payload: Any) -> None:
        if key in self._reported:
            return
        ident = event_id("k8s-kueue", key)
        self.bus.publish(new_event(payload, source=SOURCE, id=ident, requestid=ident))
        self._reported.add(key)
        log.info("published %s for %s", type(payload).__name__, key)
