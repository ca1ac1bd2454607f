"""Every workspace, sandbox and job object Stasis builds (all of ``tests/data/k8s_objects.json``:
the builders' output for the example catalog under every cluster setting, Kueue's
included) passes GKE Autopilot's documented constraints (``objects.autopilot``), and each
constraint is one the check enforces (a violating object is caught, with why)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.kubernetes.objects import autopilot

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests/data/k8s_objects.json").read_text())


def objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict) and "kind" in value and "apiVersion" in value:
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from objects(item)


PODS = {f"{key}#{i}": obj for key, value in GOLDEN.items()
        for i, obj in enumerate(objects(value)) if list(autopilot.pod_specs(obj))}


def test_the_golden_file_holds_workspace_sandbox_job_and_monitor_pods() -> None:
    kinds = {(obj["kind"], key.split()[0]) for key, obj in PODS.items()}
    assert {("Pod", "workspace"), ("Pod", "sandbox"), ("JobSet", "job"),
            ("Deployment", "monitor")} <= kinds
    assert len(PODS) > 100


#: The golden file's "custom" cluster settings name another RuntimeClass (runsc): a cluster
#: that is not GKE's. Autopilot refuses exactly that, and nothing else of them.
OTHER_CLUSTER = {k for k in PODS if " custom " in k}


@pytest.mark.parametrize("key", sorted(set(PODS) - OTHER_CLUSTER))
def test_autopilot_admits_it(key: str) -> None:
    assert autopilot.problems(PODS[key]) == []


def test_another_clusters_runtime_class_is_all_autopilot_would_refuse() -> None:
    found = {p.split(": ", 1)[1] for k in OTHER_CLUSTER for p in autopilot.problems(PODS[k])}
    assert found <= {"runtimeClassName runsc is not one Autopilot offers (gvisor)"}


GPU_POD = next(obj for key, obj in PODS.items()
               if key.startswith("workspace gpu-small jupyterlab default pod#"))


def spoiled(change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(GPU_POD)
    change(obj["spec"])
    return obj


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: s.update(hostNetwork=True), "hostNetwork is not allowed"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
     "volume h: hostPath is not allowed"),
    (lambda s: s["containers"][0]["securityContext"].update(privileged=True),
     "container workspace: privileged is not allowed"),
    (lambda s: s["containers"][0]["securityContext"].update(
        capabilities={"add": ["NET_RAW"]}), "capabilities ['NET_RAW'] are not allowed"),
    (lambda s: s["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 1}]),
     "hostPort is not allowed"),
    (lambda s: s["nodeSelector"].update({"cloud.google.com/gke-nodepool": "gpu"}),
     "nodeSelector cloud.google.com/gke-nodepool is not a label Autopilot provisions for"),
    (lambda s: s["nodeSelector"].pop("cloud.google.com/gke-accelerator"),
     "a GPU pod must select cloud.google.com/gke-accelerator"),
    (lambda s: s.update(runtimeClassName="kata"), "runtimeClassName kata is not one"),
])
def test_each_constraint_is_enforced(change: Any, says: str) -> None:
    found = autopilot.problems(spoiled(change))
    assert any(says in p for p in found), found
