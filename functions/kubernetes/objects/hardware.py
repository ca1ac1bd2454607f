"""A catalog profile's hardware as Kubernetes asks for it: resources, nodes, provisioning.

One copy of each rule: how much CPU, memory and how many accelerators a container requests
and is limited to (:func:`container_resources`, :func:`guaranteed`), and on which GKE nodes
a workspace lands (:func:`placement`: accelerator node labels, Spot or on-demand, a
reservation). Workspaces, job hosts and sandboxes all take them from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from functions.domain.catalog import AcceleratorKind, accelerator_kind

GKE_SPOT = "cloud.google.com/gke-spot"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_TPU = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
GKE_RESERVATION = "cloud.google.com/reservation-name"
GKE_RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
GKE_NODEPOOL = "cloud.google.com/gke-nodepool"
GPU_RESOURCE = "nvidia.com/gpu"
TPU_RESOURCE = "google.com/tpu"


@dataclass(frozen=True)
class Hardware:
    """A profile's hardware, as a pod needs it."""

    cpu_millis: int
    memory: str
    accelerator: str | None = None
    accelerator_count: int = 0
    topology: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    spot: bool = False
    reservation: str | None = None

    @property
    def accelerator_kind(self) -> AcceleratorKind | None:
        return accelerator_kind(self.accelerator) if self.accelerator else None

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any]) -> Hardware:
        """From the profile mapping a WorkspaceSpec carries (``admission.profile_of``)."""
        acc = profile.get("accelerator") or {}
        cpu = profile.get("cpu", 1)
        return cls(
            cpu_millis=max(1, math.ceil(float(cpu) * 1000)),
            memory=str(profile.get("memory") or "2Gi"),
            accelerator=acc.get("type"),
            accelerator_count=int(acc.get("count") or 0) if acc.get("type") else 0,
            topology=acc.get("topology"),
            node_selector={str(k): str(v) for k, v in (profile.get("node_selector") or {}).items()},
            tolerations=tuple(dict(t) for t in profile.get("tolerations") or ()),
            spot=profile.get("provisioning") == "spot",
            reservation=profile.get("reservation"),
        )


def guaranteed(cpu: str, memory: str) -> dict[str, Any]:
    """Requests equal to limits: Guaranteed QoS, never the first evicted."""
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def container_resources(cpu_millis: int, memory: str, accelerator: AcceleratorKind | None = None,
                        count: int = 0, *, chips_only: bool = False) -> dict[str, Any]:
    """Requests equal limits (Guaranteed QoS: a workspace is never the first evicted).
    GPUs go in limits (Kubernetes copies them to requests); TPU chips in both.
    ``chips_only``: a TPU host that has its node to itself asks for its chips alone."""
    if chips_only and accelerator == AcceleratorKind.TPU:
        chips = str(count)
        return {"requests": {TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}}
    resources = guaranteed(f"{cpu_millis}m", memory)
    if accelerator is not None and count:
        if accelerator == AcceleratorKind.TPU:
            resources["requests"][TPU_RESOURCE] = str(count)
            resources["limits"][TPU_RESOURCE] = str(count)
        else:
            resources["limits"][GPU_RESOURCE] = str(count)
    return resources


def placement(hardware: Hardware) -> tuple[dict[str, str], list[dict[str, Any]],
                                             dict[str, Any]]:
    """Node selector, tolerations and affinity for a profile's hardware on GKE.

    - accelerators: the GKE node labels for the type (and TPU topology), with the
      profile's own selector taking precedence (the catalog checks they agree);
    - Spot: ``cloud.google.com/gke-spot: "true"`` and its taint tolerated; on-demand:
      required node affinity *away* from Spot nodes, so preemption never pauses a
      workspace nobody asked to put at risk;
    - a reservation: ``reservation-name`` with ``reservation-affinity: specific``.
    """
    selector: dict[str, str] = {}
    if hardware.accelerator:
        if hardware.accelerator_kind == AcceleratorKind.TPU:
            selector[GKE_TPU] = hardware.accelerator
            if hardware.topology:
                selector[GKE_TPU_TOPOLOGY] = hardware.topology
        else:
            selector[GKE_ACCELERATOR] = hardware.accelerator
    selector.update(hardware.node_selector)
    tolerations = [dict(t) for t in hardware.tolerations]
    affinity: dict[str, Any] = {}
    if hardware.spot:
        selector[GKE_SPOT] = "true"
        spot_toleration = {"key": GKE_SPOT, "operator": "Equal", "value": "true",
                           "effect": "NoSchedule"}
        if spot_toleration not in tolerations:
            tolerations.append(spot_toleration)
    else:
        selector.pop(GKE_SPOT, None)
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": GKE_SPOT, "operator": "DoesNotExist"}]}]}}}
    if hardware.reservation:
        selector[GKE_RESERVATION] = hardware.reservation
        selector[GKE_RESERVATION_AFFINITY] = "specific"
    return dict(sorted(selector.items())), tolerations, affinity
