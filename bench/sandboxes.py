"""Agent sandboxes on the local runtime: what one costs, and five side by side (prints JSON).

Starts fake-gcs-server on a free port (nothing else: the runner runs in this process and
keeps its events), makes a small git repository, and times from ``SandboxRunner.start`` to
the sandbox.finished event: the isolation probe, N trivial sandboxes one after the other
(clone, isolate, run ``true``, collect the patch, upload), and five sandboxes at once, each
sleeping one second. What the mount namespace and the disk quota cost: the same trivial
sandboxes, interleaved, on a runner told the host has no mount namespaces (unisolated
sandboxes allowed: nothing hidden, no quota's tmpfs).

    .venv/bin/python bench/sandboxes.py [--count 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from runtime.local.publisher import RecordingPublisher
from runtime.local.sandboxes import SandboxRunner, detect_isolation
from runtime.local.settings import AgentSettings
from stack import processes
from stack.settings import Settings

LIMITS = {"cpu_seconds": 60, "memory_bytes": 1 << 30, "wall_clock_seconds": 60, "processes": 64}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stasis-bench-"))
    settings = processes.on_free_ports(Settings(project=f"bench-{uuid.uuid4().hex[:8]}",
                                                data_dir=work / "stack"))
    processes.start_many([processes.gcs_spec(settings, memory=True)], timeout=60)
    os.environ["STORAGE_EMULATOR_HOST"] = settings.gcs_url
    root = Path(tempfile.mkdtemp(prefix="stasis-bench-sandboxes-"))
    unhidden_root = Path(tempfile.mkdtemp(prefix="stasis-bench-sandboxes-"))
    try:
        gcs = storage.Client(project=settings.project, credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": settings.gcs_url})
        gcs.create_bucket("bench")
        repo = work / "repo"
        repo.mkdir()
        for argv in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "x"]):
            subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                            *argv], check=True)
        began = time.perf_counter()
        isolation = detect_isolation()
        probe_ms = (time.perf_counter() - began) * 1000
        publisher = RecordingPublisher()
        runner = SandboxRunner(AgentSettings(data_dir=work / "agent"), publisher,
                               isolation=isolation, root=root)

        unhidden = SandboxRunner(AgentSettings(data_dir=work / "agent"), publisher,
                                 isolation=dataclasses.replace(isolation, mounts=False),
                                 root=unhidden_root)

        def start(sandbox_id: str, command: str, on: SandboxRunner = runner) -> None:
            on.start(sandbox_id, {
                "sandbox_id": sandbox_id, "team": "ml-a", "repository": str(repo),
                "base_ref": "main", "command": command, "limits": LIMITS,
                "allowed_network": [], "requestid": sandbox_id, "bucket": "bench",
                "prefix": f"sandboxes/ml-a/{sandbox_id}", "allow_unisolated": True})

        def timed(sandbox_id: str, on: SandboxRunner) -> float:
            began = time.perf_counter()
            start(sandbox_id, "true", on)
            publisher.wait_for("sandbox.finished", sandbox_id=sandbox_id, timeout=120)
            return (time.perf_counter() - began) * 1000

        latencies, without_mounts = [], []
        for i in range(args.count):
            latencies.append(timed(f"sbx-seq-{i}", runner))
            without_mounts.append(timed(f"sbx-unhidden-{i}", unhidden))
        began = time.perf_counter()
        for i in range(5):
            start(f"sbx-par-{i}", f"sleep 1; echo {i} > {i}.txt")
        results = [publisher.wait_for("sandbox.finished", sandbox_id=f"sbx-par-{i}",
                                      timeout=120).payload for i in range(5)]
        parallel_s = time.perf_counter() - began
        runner.wait_idle(60)
        print(json.dumps({
            "isolation": isolation.detail,
            "probe_ms": round(probe_ms, 1),
            "trivial_sandbox_ms": _summary(latencies),
            "trivial_sandbox_without_mount_namespace_or_quota_ms": _summary(without_mounts),
            "mounts": isolation.mounts_detail,
            "five_parallel_1s_tasks": {
                "wall_s": round(parallel_s, 2),
                "all_returned_patches": all(r.succeeded and r.patch_uri for r in results),
                "summed_duration_s": round(sum(r.duration_ms for r in results) / 1000, 2)},
            "load_average": os.getloadavg(),
        }, indent=2))
    finally:
        processes.stop_all(settings.data_dir)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(unhidden_root, ignore_errors=True)


def _summary(latencies: list[float]) -> dict[str, float]:
    return {"count": len(latencies), "median": round(statistics.median(latencies), 1),
            "min": round(min(latencies), 1), "max": round(max(latencies), 1)}


if __name__ == "__main__":
    main()
