"""GPU utilisation of one workspace, for the idle policy: is a GPU busy with its work?

A kernel can be idle while the GPU is not (a training script started from a terminal, a
background thread): the idle rules treat a busy GPU like a busy kernel. ``nvidia-smi``
reports each GPU's utilisation and which processes use which GPU; a workspace's
utilisation is the highest utilisation among the GPUs its processes (the server and
everything under it) use. None when there is no ``nvidia-smi`` or none of its processes
uses a GPU: the signal is then simply not used.

Answers are cached for a few seconds: an idle sweep asks about every workspace of the node
in a burst, and one ``nvidia-smi`` pair serves them all.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

CACHE_SECONDS = 5.0
_QUERY_GPUS = ["--query-gpu=uuid,utilization.gpu", "--format=csv,noheader,nounits"]
_QUERY_APPS = ["--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits"]

Run = Callable[..., subprocess.CompletedProcess[str]]


def parse_gpus(text: str) -> dict[str, float]:
    """{gpu uuid: utilisation %} from ``--query-gpu=uuid,utilization.gpu`` CSV; a GPU that
    reports ``[N/A]`` (MIG, some virtual GPUs) is left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        with contextlib.suppress(ValueError):
            found[parts[0]] = float(parts[1])
    return found


def parse_apps(text: str) -> dict[int, set[str]]:
    """{pid: {gpu uuid}} from ``--query-compute-apps=pid,gpu_uuid`` CSV."""
    found: dict[int, set[str]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            found.setdefault(int(parts[0]), set()).add(parts[1])
    return found


def workspace_utilization(pids: Iterable[int], gpus: dict[str, float],
                          apps: dict[int, set[str]]) -> float | None:
    """The highest utilisation among the GPUs ``pids`` use; None if they use none."""
    used = {uuid for pid in pids for uuid in apps.get(pid, ())}
    values = [gpus[uuid] for uuid in used if uuid in gpus]
    return max(values) if values else None


class GpuProbe:
    """Asks ``nvidia-smi`` (at most every ``CACHE_SECONDS``) on behalf of all workspaces."""

    def __init__(self, *, which: Callable[[str], str | None] = shutil.which,
                 run: Run = subprocess.run, clock: Callable[[], float] = time.monotonic) -> None:
        self._smi = which("nvidia-smi")
        self._run = run
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._gpus: dict[str, float] = {}
        self._apps: dict[int, set[str]] = {}

    @property
    def available(self) -> bool:
        return self._smi is not None

    def utilization(self, pids: Iterable[int]) -> float | None:
        if self._smi is None:
            return None
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at > CACHE_SECONDS:
                self._gpus = parse_gpus(self._query(_QUERY_GPUS))
                self._apps = parse_apps(self._query(_QUERY_APPS)) if self._gpus else {}
                self._read_at = now
            return workspace_utilization(pids, self._gpus, self._apps)

    def _query(self, args: list[str]) -> str:
        assert self._smi is not None
        try:
            result = self._run([self._smi, *args], capture_output=True, text=True, timeout=10,
                               check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return result.stdout if result.returncode == 0 else ""
