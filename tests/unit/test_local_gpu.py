"""GPU utilisation per workspace from nvidia-smi's CSV (parsers and the cached probe)."""

from __future__ import annotations

import subprocess
from typing import Any

from runtime.local.gpu import GpuProbe, parse_apps, parse_gpus, workspace_utilization

GPUS = """GPU-aaaa, 87
GPU-bbbb, 0
GPU-mig, [N/A]
"""
APPS = """4242, GPU-aaaa
4243, GPU-bbbb
9999, GPU-bbbb
"""


def test_parsers() -> None:
    assert parse_gpus(GPUS) == {"GPU-aaaa": 87.0, "GPU-bbbb": 0.0}
    assert parse_apps(APPS) == {4242: {"GPU-aaaa"}, 4243: {"GPU-bbbb"}, 9999: {"GPU-bbbb"}}
    assert parse_gpus("") == {} and parse_apps("No running processes found\n") == {}


def test_a_workspace_gets_the_busiest_gpu_its_processes_use() -> None:
    gpus, apps = parse_gpus(GPUS), parse_apps(APPS)
    assert workspace_utilization([100, 4242, 4243], gpus, apps) == 87.0
    assert workspace_utilization([100, 9999], gpus, apps) == 0.0
    assert workspace_utilization([100, 101], gpus, apps) is None  # no GPU process: no signal


def test_the_probe_asks_nvidia_smi_at_most_every_few_seconds() -> None:
    calls: list[list[str]] = []
    clock = [0.0]

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        out = GPUS if "--query-gpu=uuid,utilization.gpu" in args else APPS
        return subprocess.CompletedProcess(args, 0, out, "")

    probe = GpuProbe(which=lambda name: "/usr/bin/nvidia-smi", run=run, clock=lambda: clock[0])
    assert probe.utilization([4242]) == 87.0
    assert probe.utilization([4243]) == 0.0
    assert len(calls) == 2
    clock[0] = 10.0
    probe.utilization([4242])
    assert len(calls) == 4


def test_no_nvidia_smi_no_signal() -> None:
    probe = GpuProbe(which=lambda name: None)
    assert not probe.available and probe.utilization([1, 2, 3]) is None
