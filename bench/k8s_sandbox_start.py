"""Agent sandboxes on the Kubernetes runtime: what ``start`` costs the function (prints JSON).

Starts fake-gcs-server on a free port and kmock's Kubernetes emulator (the tests' one),
serves git repositories over HTTP from this process, and times:

- ``start`` of a small repository (bare clone, bundle, upload, sign 4 URLs, 6 objects
  applied), one sandbox after the other;
- a redelivered ``start`` (objects exist: one bucket read and one Pod read);
- ``start`` of this repository's own history (a bigger bundle);
- one watch pass that reports a finished sandbox (Pod list, three object reads, publish
  to memory).

    .venv/bin/python bench/k8s_sandbox_start.py [--count 5]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from google.cloud import storage

from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec, result_prefix
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.sandboxes import GcsUrlSigner, KubernetesSandboxRuntime
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.sandbox_watch import SandboxWatch
from runtime.local.publisher import RecordingPublisher
from stack import processes
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from k8s_emulator import emulated_cluster  # noqa: E402


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def _serve(served: Path) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _bare(source: Path, served: Path, name: str) -> None:
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(served / name)], check=True)
    subprocess.run(["git", "update-server-info"], cwd=served / name, check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stasis-bench-k8s-sandboxes-"))
    settings = processes.on_free_ports(Settings(project=f"bench-{uuid.uuid4().hex[:8]}",
                                                data_dir=work / "stack"))
    processes.start_many([processes.gcs_spec(settings, memory=True)], timeout=60)
    os.environ["STORAGE_EMULATOR_HOST"] = settings.gcs_url
    try:
        gcs = storage.Client.create_anonymous_client()
        bucket = gcs.create_bucket("bench")
        small = work / "small"
        small.mkdir()
        git = ["git", "-C", str(small), "-c", "user.name=b", "-c", "user.email=b@b"]
        subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
        (small / "a.py").write_text("print('a')\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "a"], check=True)
        served = work / "served"
        served.mkdir()
        _bare(small, served, "small.git")
        _bare(ROOT, served, "stasis.git")
        server = _serve(served)
        base = f"http://127.0.0.1:{server.server_address[1]}"

        def spec(sandbox_id: str, repo: str) -> RunSpec:
            return RunSpec(sandbox_id, "bench", f"{base}/{repo}", "HEAD", "true",
                           DEFAULT_LIMITS, (), f"req-{sandbox_id}", bucket.name,
                           result_prefix("bench", sandbox_id))

        with emulated_cluster() as cluster:
            runtime = KubernetesSandboxRuntime(cluster.api_client, storage=gcs,
                                               signer=GcsUrlSigner.for_emulator(settings.gcs_url))
            starts = []
            for i in range(args.count):
                began = time.perf_counter()
                runtime.start(spec(f"small-{i}", "small.git"))
                starts.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            runtime.start(spec("small-0", "small.git"))
            redelivered_ms = (time.perf_counter() - began) * 1000
            began = time.perf_counter()
            runtime.start(spec("stasis", "stasis.git"))
            big_ms = (time.perf_counter() - began) * 1000
            bundle = bucket.get_blob(f"{result_prefix('bench', 'stasis')}/{sm.BUNDLE_OBJECT}")

            reader = KubeCluster(cluster.api_client)
            watch = SandboxWatch(reader.pods, reader, gcs, RecordingPublisher())
            target = spec("small-0", "small.git")
            bucket.blob(f"{target.prefix}/{sm.STATUS_OBJECT}").upload_from_string("0 exited")
            from kubernetes import client

            client.CoreV1Api(cluster.api_client).patch_namespaced_pod_status(
                sm.object_name("small-0"), "stasis-bench", {"status": {"phase": "Succeeded"}},
                _preload_content=False)
            began = time.perf_counter()
            watch.sync()
            report_ms = (time.perf_counter() - began) * 1000
        server.shutdown()
        print(json.dumps({
            "start_small_ms": {"median": round(statistics.median(starts), 1),
                               "max": round(max(starts), 1), "n": len(starts)},
            "start_redelivered_ms": round(redelivered_ms, 1),
            "start_stasis_repo_ms": round(big_ms, 1),
            "stasis_bundle_bytes": bundle.size if bundle is not None else None,
            "watch_report_pass_ms": round(report_ms, 1),
        }, indent=2))
    finally:
        processes.stop_all(settings.data_dir)


if __name__ == "__main__":
    main()
