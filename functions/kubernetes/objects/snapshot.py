"""A workspace's snapshots in the cluster: how a pause is asked for, what is remembered of
it, and whether it restores onto a target.

- method ``pod``: a PodSnapshotManualTrigger for the workspace's pod (:func:`manual_trigger`;
  GKE Pod Snapshots, see ``podsnapshot``);
- method ``kernel``: a merge patch that annotates the pod with the request
  (:func:`snapshot_request_patch`), which the monitor hands to the pod's snapshot agent;
- either way a ConfigMap (:func:`snapshot_record`) remembers the method and the hardware,
  so a resume can refuse a target it cannot restore onto (:func:`restore_refusal`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.domain.catalog import AcceleratorKind, accelerator_kind
from functions.kubernetes.objects.hardware import Hardware
from functions.kubernetes.objects.meta import (
    ANN_REQUESTED_AT,
    ANN_REQUESTID,
    ANN_SNAPSHOT_ID,
    ANN_SNAPSHOT_REQUEST,
    ANN_WORKSPACE_ID,
    LABEL_SNAPSHOT,
    meta,
)
from functions.kubernetes.objects.names import name, slug
from functions.kubernetes.objects.podsnapshot import PODSNAPSHOT_API
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.workspace import (
    WorkspaceShape,
    workspace_annotations,
    workspace_labels,
    workspace_names,
)


def snapshot_object_name(snapshot_id: str) -> str:
    """The PodSnapshotManualTrigger and the snapshot record (ConfigMap) of a snapshot."""
    return name("snap-", snapshot_id)


def _snapshot_labels(shape: WorkspaceShape, snapshot_id: str) -> dict[str, str]:
    return {**workspace_labels(shape), LABEL_SNAPSHOT: slug(snapshot_id)}


def manual_trigger(shape: WorkspaceShape, snapshot_id: str, *, requestid: str,
                   requested_at_ms: int,
                   settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """Checkpoint the workspace's pod now (``spec.targetPod``). GKE answers on the
    trigger's status (condition ``Triggered``, ``snapshotCreated.name``); the annotations
    tell the monitor which Stasis snapshot and request it belongs to."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    annotations = {**workspace_annotations(shape), ANN_SNAPSHOT_ID: snapshot_id,
                   ANN_REQUESTID: requestid, ANN_REQUESTED_AT: str(requested_at_ms)}
    return {"apiVersion": PODSNAPSHOT_API, "kind": "PodSnapshotManualTrigger",
            "metadata": meta(snapshot_object_name(snapshot_id), names.namespace,
                             labels=_snapshot_labels(shape, snapshot_id),
                             annotations=annotations),
            "spec": {"targetPod": names.pod}}


def snapshot_request_patch(snapshot_id: str, *, bucket: str, prefix: str, requestid: str,
                           requested_at_ms: int,
                           base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Kernel method: the merge patch that asks the monitor to snapshot a pod's kernels
    (``base``: the snapshot whose stored parts the capture need not send again)."""
    request = json.dumps({"snapshot_id": snapshot_id, "bucket": bucket, "prefix": prefix,
                          "requestid": requestid, "requested_at_ms": requested_at_ms,
                          "base": dict(base) if base else None}, sort_keys=True)
    return {"metadata": {"annotations": {ANN_SNAPSHOT_REQUEST: request}}}


@dataclass(frozen=True)
class SnapshotHardware:
    """What a snapshot was taken on, and how: the resume check's input."""

    method: str
    accelerator: str | None = None
    accelerator_count: int = 0

    @property
    def kind(self) -> AcceleratorKind | None:
        return accelerator_kind(self.accelerator) if self.accelerator else None

    def describe(self) -> str:
        return (f"{self.accelerator_count} x {self.accelerator}" if self.accelerator
                else "no accelerator")


def snapshot_record(shape: WorkspaceShape, snapshot_id: str, *, requested_at_ms: int,
                    settings: ClusterSettings = ClusterSettings()) -> dict[str, Any]:
    """A ConfigMap that remembers how and on what hardware a snapshot was taken, so a
    resume can refuse a target it cannot restore onto (:func:`restore_refusal`)."""
    names = workspace_names(shape.team, shape.workspace_id, settings)
    data = {"workspace_id": shape.workspace_id, "snapshot_id": snapshot_id,
            "method": shape.method, "accelerator": shape.hardware.accelerator or "",
            "accelerator_count": str(shape.hardware.accelerator_count),
            "profile": shape.profile, "requested_at_ms": str(requested_at_ms)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(snapshot_object_name(snapshot_id), names.namespace,
                             labels=_snapshot_labels(shape, snapshot_id),
                             annotations={ANN_WORKSPACE_ID: shape.workspace_id,
                                          ANN_SNAPSHOT_ID: snapshot_id}),
            "data": data}


def hardware_of_record(data: Mapping[str, Any]) -> SnapshotHardware:
    """The :class:`SnapshotHardware` a snapshot record's ``data`` describes."""
    count = str(data.get("accelerator_count") or "0")
    return SnapshotHardware(method=str(data.get("method") or "kernel"),
                            accelerator=str(data.get("accelerator") or "") or None,
                            accelerator_count=int(count) if count.isdigit() else 0)


def restore_refusal(snapshot: SnapshotHardware, target: Hardware, target_method: str) -> str | None:
    """None if a snapshot can be restored onto ``target``, else why not (a user message).

    A Pod Snapshot holds the whole pod, accelerator memory included: it restores only
    into the identical pod, so the accelerator type and count must match exactly, and
    only through Pod Snapshots. A kernel snapshot is portable across machines, but a
    namespace that held accelerator arrays needs the same kind (GPU or TPU) to load them;
    a CPU snapshot restores anywhere.
    """
    have = target.accelerator
    got = f"{target.accelerator_count} x {have}" if have else "no accelerator"
    if snapshot.method == "pod":
        same = have == snapshot.accelerator and (
            not snapshot.accelerator or target.accelerator_count == snapshot.accelerator_count)
        if same and target_method == "pod":
            return None
        why = (f"the target profile has {got}" if not same else
               "the target profile does not use Pod Snapshots")
        return (f"this workspace was paused with a Pod Snapshot on {snapshot.describe()}, "
                "which restores only into the same pod: same hardware, through Pod "
                f"Snapshots; {why}. Resume it on its original profile")
    if snapshot.kind is None:
        return None
    target_kind = accelerator_kind(have) if have else None
    if target_kind != snapshot.kind:
        return (f"this workspace was paused on {snapshot.describe()} and its kernels may hold "
                f"{snapshot.kind.upper()} arrays, but the target profile has {got}; resume "
                f"it on a profile with a {snapshot.kind.upper()}")
    return None
