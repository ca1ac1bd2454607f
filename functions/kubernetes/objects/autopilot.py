"""What GKE Autopilot forbids or requires of a pod, as a check of the objects Stasis builds.

Autopilot admits a pod only within its documented constraints ("GKE Autopilot security
measures", "Resource requests in Autopilot", "Deploy GPU workloads in Autopilot", "Deploy
TPU workloads in Autopilot"): the Pod Security Standards' Baseline policy and more of
Restricted, enforced by Google's admission controller. :func:`problems` checks one object
(a Pod, or the pod templates of a Deployment, Job or JobSet) against the ones Stasis could
break:

- no privileged container, no privilege escalation, no added Linux capability but those
  Baseline allows (Autopilot refuses ``NET_RAW`` and ``SYS_ADMIN`` alike); no host
  namespaces (``hostNetwork``, ``hostPID``, ``hostIPC``) and no ``hostPort``;
- no ``hostPath`` volume (Autopilot allows read-only ``/var/log`` only, which no Stasis pod
  needs);
- node selection only on the labels Autopilot provisions for: accelerators and their
  count, Spot, TPU type and topology, reservations, compute classes, machine family,
  zone and architecture (no node pool, no instance type);
- a GPU is requested in ``limits`` with ``cloud.google.com/gke-accelerator`` selecting its
  type, a TPU with ``cloud.google.com/gke-tpu-accelerator`` and ``-topology``;
- ``runtimeClassName`` only ``gvisor`` (GKE Sandbox, which Pod Snapshots need).

Pure: it reads the object's dict and returns what is wrong, in words.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from functions.kubernetes.objects.hardware import GPU_RESOURCE, TPU_RESOURCE

#: Node labels an Autopilot pod may select on (nodeSelector or node affinity).
SELECTABLE = frozenset({
    "cloud.google.com/gke-accelerator", "cloud.google.com/gke-accelerator-count",
    "cloud.google.com/gke-spot", "cloud.google.com/gke-tpu-accelerator",
    "cloud.google.com/gke-tpu-topology", "cloud.google.com/reservation-name",
    "cloud.google.com/reservation-affinity", "cloud.google.com/compute-class",
    "cloud.google.com/machine-family", "cloud.google.com/gke-ephemeral-storage-local-ssd",
    "topology.kubernetes.io/zone", "topology.kubernetes.io/region", "kubernetes.io/arch",
    "kubernetes.io/os", "cloud.google.com/gke-placement-group",
})
#: Capabilities the Baseline policy lets a container add (Autopilot's own list).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RUNTIME_CLASSES = frozenset({"gvisor"})


def pod_specs(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every pod spec in ``obj``, with where it is."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield "spec", spec
    elif kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        yield "spec.template.spec", (spec.get("template") or {}).get("spec") or {}
    elif kind == "JobSet":
        for i, job in enumerate(spec.get("replicatedJobs") or ()):
            template = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
            yield f"spec.replicatedJobs[{i}]...spec", template.get("spec") or {}


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Why Autopilot would refuse ``obj``'s pods; empty when it admits them."""
    found: list[str] = []
    for where, spec in pod_specs(obj):
        found += [f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')} {where}: "
                  f"{p}" for p in _pod(spec)]
    return found


def _pod(spec: Mapping[str, Any]) -> Iterator[str]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"{field} is not allowed"
    for volume in spec.get("volumes") or ():
        if "hostPath" in volume:
            yield f"volume {volume.get('name')}: hostPath is not allowed"
    runtime = spec.get("runtimeClassName")
    if runtime is not None and runtime not in RUNTIME_CLASSES:
        yield f"runtimeClassName {runtime} is not one Autopilot offers (gvisor)"
    selected = dict(spec.get("nodeSelector") or {})
    for key in selected:
        if key not in SELECTABLE:
            yield f"nodeSelector {key} is not a label Autopilot provisions for"
    for key in _affinity_keys(spec.get("affinity") or {}):
        if key not in SELECTABLE:
            yield f"node affinity on {key} is not a label Autopilot provisions for"
    wants_gpu = wants_tpu = False
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        name = container.get("name")
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            yield f"container {name}: privileged is not allowed"
        if security.get("allowPrivilegeEscalation"):
            yield f"container {name}: allowPrivilegeEscalation is not allowed"
        added = set((security.get("capabilities") or {}).get("add") or ())
        if added - BASELINE_CAPABILITIES:
            yield f"container {name}: capabilities {sorted(added - BASELINE_CAPABILITIES)} " \
                  "are not allowed"
        for port in container.get("ports") or ():
            if port.get("hostPort"):
                yield f"container {name}: hostPort is not allowed"
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        if GPU_RESOURCE in requests and GPU_RESOURCE not in limits:
            yield f"container {name}: GPUs go in limits"
        wants_gpu |= GPU_RESOURCE in limits
        wants_tpu |= TPU_RESOURCE in limits or TPU_RESOURCE in requests
    if wants_gpu and "cloud.google.com/gke-accelerator" not in selected:
        yield "a GPU pod must select cloud.google.com/gke-accelerator"
    if wants_tpu and not {"cloud.google.com/gke-tpu-accelerator",
                          "cloud.google.com/gke-tpu-topology"} <= set(selected):
        yield "a TPU pod must select cloud.google.com/gke-tpu-accelerator and -topology"


def _affinity_keys(affinity: Mapping[str, Any]) -> Iterator[str]:
    node = affinity.get("nodeAffinity") or {}
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = list(required.get("nodeSelectorTerms") or ())
    terms += [t.get("preference") or {} for t in
              node.get("preferredDuringSchedulingIgnoredDuringExecution") or ()]
    for term in terms:
        for expression in term.get("matchExpressions") or ():
            yield str(expression.get("key"))
