"""Kueue (``kueue.x-k8s.io/v1beta2``, Kueue v0.19) for the cluster side of admission: the
same quotas, borrowing, priorities and preemption the control plane decides
(``functions.domain.scheduling``), given to an engine that sees the cluster's capacity.

From the admin file:

- a **ResourceFlavor** per accelerator type (TPU: with its topology) and provisioning
  (Spot or on-demand) the profiles use, plus ``stasis-default`` for CPU and memory; a
  flavor's ``nodeLabels`` are GKE's (``cloud.google.com/gke-accelerator``,
  ``cloud.google.com/gke-tpu-accelerator``/``-topology``, ``cloud.google.com/gke-spot``);
- a **ClusterQueue** per team (named like its namespace, admitting only from it): CPU and
  memory up to what its workspace quota times its largest profile needs, every GPU flavor
  with the team's GPU quota as ``nominalQuota`` (and TPU likewise), its ``cohort`` as
  ``cohortName`` with the team's ``borrowing_limit``; preemption ``withinClusterQueue:
  LowerPriority``, ``reclaimWithinCohort: Any`` (a lender takes its quota back from any
  borrower), ``borrowWithinCohort: LowerPriority``; ``BestEffortFIFO``. Kueue counts quota
  per flavor: a team quota of 4 GPUs over two GPU types lets each type reach 4, and the
  control plane's own count (in Firestore, across types) is the one that holds the total;
- one **LocalQueue** (``stasis``) in each team namespace;
- a **WorkloadPriorityClass** per priority class, same name and value;
- optionally (``STASIS_K8S_KUEUE_PROVISIONING``) an **AdmissionCheck** with its
  **ProvisioningRequestConfig** (``queued-provisioning.gke.io``: GKE's Dynamic Workload
  Scheduler) on the accelerator flavors: a large GPU/TPU request is admitted only once GKE
  has provisioned its nodes.

Workspace pods and JobSets carry :func:`queue_labels` (``kueue.x-k8s.io/queue-name``,
``kueue.x-k8s.io/priority-class``); a workspace pod is created with Kueue's own scheduling
gate (``kueue.x-k8s.io/admission``, which Kueue's webhook would add) so it waits, Pending,
until its Workload is admitted. :func:`workload_verdict` reads a Workload's conditions
(``QuotaReserved``, ``Admitted``, ``Evicted``) the way the monitor turns them into events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.domain.catalog import (
    AcceleratorKind,
    Catalog,
    Profile,
    Provisioning,
    Team,
)
from functions.kubernetes.objects.hardware import GPU_RESOURCE, TPU_RESOURCE
from functions.kubernetes.objects.kinds import KUEUE_GROUP, KUEUE_VERSION
from functions.kubernetes.objects.meta import meta, team_labels
from functions.kubernetes.objects.names import name
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.status import condition
from functions.kubernetes.objects.team import team_namespace_name

KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The gate Kueue removes from a plain Pod once its Workload is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: Kueue's condition on a Pod it is about to delete (preemption, eviction).
TERMINATION_TARGET = "TerminationTarget"
LOCAL_QUEUE = "stasis"
DEFAULT_FLAVOR = "stasis-default"
PROVISIONING_CHECK = "stasis-dws"
PROVISIONING_CLASS = "queued-provisioning.gke.io"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
_GKE_GPU = "cloud.google.com/gke-accelerator"
_GKE_TPU = "cloud.google.com/gke-tpu-accelerator"
_GKE_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
_GKE_SPOT = "cloud.google.com/gke-spot"


def queue_labels(priority_class: str | None) -> dict[str, str]:
    """What a workspace pod or a JobSet carries to be admitted by its team's LocalQueue."""
    labels = {QUEUE_LABEL: LOCAL_QUEUE}
    if priority_class:
        labels[PRIORITY_LABEL] = priority_class
    return labels


def flavor_name(profile: Profile) -> str:
    """The ResourceFlavor a profile's accelerators (or CPU, on Spot) come from."""
    acc = profile.accelerator
    spot = profile.provisioning == Provisioning.SPOT
    if acc is None:
        return "stasis-cpu-spot" if spot else DEFAULT_FLAVOR
    parts = [acc.type] + ([acc.topology] if acc.topology else []) + (["spot"] if spot else [])
    return name("stasis-", "-".join(parts))


def resource_flavors(catalog: Catalog) -> list[dict[str, Any]]:
    """One ResourceFlavor per accelerator type (and topology) and provisioning the
    profiles use, and the default one for CPU and memory."""
    flavors: dict[str, dict[str, Any]] = {DEFAULT_FLAVOR: _flavor(DEFAULT_FLAVOR, {})}
    for profile in catalog.profiles.values():
        acc = profile.accelerator
        labels: dict[str, str] = {}
        if acc is not None and acc.kind == AcceleratorKind.GPU:
            labels[_GKE_GPU] = acc.type
        elif acc is not None:
            labels[_GKE_TPU] = acc.type
            if acc.topology:
                labels[_GKE_TOPOLOGY] = acc.topology
        if profile.provisioning == Provisioning.SPOT:
            labels[_GKE_SPOT] = "true"
        flavors.setdefault(flavor_name(profile), _flavor(flavor_name(profile), labels))
    return list(flavors.values())


def _flavor(flavor: str, node_labels: Mapping[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": dict(node_labels)} if node_labels else {}
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor",
            "metadata": meta(flavor), "spec": spec}


def cluster_queue(team: Team, catalog: Catalog,
                  settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team's ClusterQueue: its quotas, its cohort and how it may preempt."""
    namespace = team_namespace_name(team.id, settings)
    profiles = [catalog.profiles[p] for p in team.profiles if p in catalog.profiles]
    slots = max(1, team.quotas.workspaces)
    cpu = slots * max((p.cpu_millis for p in profiles), default=1000)
    memory = slots * max((p.memory_bytes for p in profiles), default=2**30)
    groups: list[dict[str, Any]] = [{
        "coveredResources": ["cpu", "memory"],
        "flavors": [{"name": DEFAULT_FLAVOR, "resources": [
            {"name": "cpu", "nominalQuota": f"{cpu}m"},
            {"name": "memory", "nominalQuota": str(memory)}]}]}]
    for resource, kind, quota, limit in (
            (GPU_RESOURCE, AcceleratorKind.GPU, team.quotas.gpus,
             team.borrowing_limit.get("gpus")),
            (TPU_RESOURCE, AcceleratorKind.TPU, team.quotas.tpus,
             team.borrowing_limit.get("tpus"))):
        flavors = sorted({flavor_name(p) for p in profiles
                          if p.accelerator is not None and p.accelerator.kind == kind})
        if not flavors:
            continue
        per_flavor: dict[str, Any] = {"name": resource, "nominalQuota": quota}
        if team.cohort and limit is not None:
            per_flavor["borrowingLimit"] = limit
        groups.append({"coveredResources": [resource],
                       "flavors": [{"name": f, "resources": [dict(per_flavor)]}
                                   for f in flavors]})
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": groups,
        "preemption": {"withinClusterQueue": "LowerPriority",
                       "reclaimWithinCohort": "Any",
                       "borrowWithinCohort": {"policy": "LowerPriority"}},
    }
    if team.cohort:
        spec["cohortName"] = team.cohort
    accelerated = sorted({flavor_name(p) for p in profiles if p.accelerator is not None})
    if settings.kueue_provisioning and accelerated:
        spec["admissionChecksStrategy"] = {"admissionChecks": [
            {"name": PROVISIONING_CHECK, "onFlavors": accelerated}]}
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue",
            "metadata": meta(namespace, labels=team_labels(team.id)), "spec": spec}


def local_queue(team: str, settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """The team namespace's one LocalQueue, pointing at the team's ClusterQueue."""
    namespace = team_namespace_name(team, settings)
    return {"apiVersion": KUEUE_API, "kind": "LocalQueue",
            "metadata": meta(LOCAL_QUEUE, namespace, labels=team_labels(team)),
            "spec": {"clusterQueue": namespace}}


def priority_classes(catalog: Catalog) -> list[dict[str, Any]]:
    """A WorkloadPriorityClass per priority class of the admin file."""
    return [{"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass",
             "metadata": meta(c.id), "value": c.value,
             **({"description": c.description} if c.description else {})}
            for c in catalog.scheduling.priority_classes.values()]


def provisioning_check() -> list[dict[str, Any]]:
    """The AdmissionCheck that asks GKE's Dynamic Workload Scheduler for the nodes first."""
    return [
        {"apiVersion": KUEUE_API, "kind": "ProvisioningRequestConfig",
         "metadata": meta(PROVISIONING_CHECK),
         "spec": {"provisioningClassName": PROVISIONING_CLASS,
                  "managedResources": [GPU_RESOURCE, TPU_RESOURCE]}},
        {"apiVersion": KUEUE_API, "kind": "AdmissionCheck",
         "metadata": meta(PROVISIONING_CHECK),
         "spec": {"controllerName": PROVISIONING_CONTROLLER,
                  "parameters": {"apiGroup": KUEUE_GROUP, "kind": "ProvisioningRequestConfig",
                                 "name": PROVISIONING_CHECK}}},
    ]


def cluster_objects(catalog: Catalog,
                    settings: ClusterSettings = ClusterSettings()) -> list[dict[str, Any]]:
    """Everything cluster-scoped Kueue needs for the admin file (Terraform applies it):
    flavors, priority classes, every team's ClusterQueue, and the DWS check if wanted."""
    objects = [*resource_flavors(catalog), *priority_classes(catalog)]
    if settings.kueue_provisioning:
        objects += provisioning_check()
    objects += [cluster_queue(t, catalog, settings) for t in catalog.teams.values()]
    return objects


# -- reading a Workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Where a Workload stands: ``pending``, ``admitted`` or ``evicted`` (with Kueue's
    reason and message)."""

    state: str
    reason: str = ""
    message: str = ""
    flavors: tuple[str, ...] = ()


def workload_verdict(workload: Mapping[str, Any]) -> Verdict:
    """``Evicted`` True (preempted, or the queue stopped) wins; then ``Admitted`` True
    (quota reserved and every admission check ready); anything else is pending, with
    ``QuotaReserved``'s reason (``WaitingForQuota``, ``NoMatchingFlavor``, ...)."""
    evicted = condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        return Verdict("evicted", str(evicted.get("reason") or ""),
                       str(evicted.get("message") or ""))
    admitted = condition(workload, "Admitted")
    if admitted is not None and admitted.get("status") == "True":
        assignments = (((workload.get("status") or {}).get("admission") or {})
                       .get("podSetAssignments") or [])
        flavors = sorted({str(f) for a in assignments for f in (a.get("flavors") or {})
                          .values()})
        return Verdict("admitted", str(admitted.get("reason") or ""),
                       str(admitted.get("message") or ""), tuple(flavors))
    reserved = condition(workload, "QuotaReserved")
    why = reserved or admitted or {}
    return Verdict("pending", str(why.get("reason") or ""), str(why.get("message") or ""))


def owner_pod(workload: Mapping[str, Any], pod: Mapping[str, Any] | None = None) -> str | None:
    """The Pod a plain pod's Workload belongs to (its ownerReference); with ``pod``, None
    unless it is that very pod (a pod re-created under the same name has another uid)."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            uid = ((pod or {}).get("metadata") or {}).get("uid")
            if pod is not None and uid and ref.get("uid") and ref["uid"] != uid:
                return None
            return str(ref.get("name"))
    return None
