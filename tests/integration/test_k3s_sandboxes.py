"""Agent sandboxes on a real cluster: K3s in Docker (testcontainers' K3s module).

The sandbox runtime adapter bundles a real repository (served over HTTP by this process),
uploads it to a fake-gcs-server that this process runs on the Docker host, and applies the
sandbox's objects; the Pod's checkout, task and collector run for real (images built
here: Alpine with git and curl). K3s enforces NetworkPolicy (its embedded kube-router):
the task fixes a failing test and also tries to reach the git server, which the
default-deny policy must stop; only the storage endpoint is open. The sandbox watch runs
in this process and reports sandbox.finished; the patch is applied to a fresh clone and
the test passes; ``cancel`` (the control plane's part) removes the Pod. K3s has no
gVisor: the Pod runs with the node's default runtime (``runtime_class=None``).

These tests need a Docker daemon (and network access to pull ``rancher/k3s`` and
``alpine``); where there is none they are reported as skipped with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k3s_support import import_image, until

from functions.domain.sandboxes import DEFAULT_LIMITS, RunSpec, result_prefix
from functions.kubernetes.objects import sandbox as sm
from functions.kubernetes.objects.settings import SandboxClusterSettings
from functions.kubernetes.sandboxes import GcsUrlSigner, KubernetesSandboxRuntime
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.sandbox_watch import SandboxWatch
from runtime.local.publisher import RecordingPublisher

TOOLS_IMAGE = "stasis-sandbox-tools:k3s-test"
TOOLS_DOCKERFILE = "FROM alpine:3.20\nRUN apk add --no-cache git curl\n"
BUCKET = "stasis-sandboxes"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]


def _docker_or_skip() -> Any:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no daemon, no socket, no permission
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        pytest.skip(f"no Docker daemon reachable at {where} ({type(exc).__name__}: {exc}); "
                    "the K3s sandbox tests need one to run a real cluster")
    return client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def k3s() -> Iterator[dict[str, Any]]:
    """K3s, a fake-gcs-server on the Docker host's bridge, and their addresses."""
    client = _docker_or_skip()
    from kubernetes import client as kube
    from kubernetes import config
    from testcontainers.community.k3s import K3SContainer

    from stack.processes import gcs_binary

    client.images.build(fileobj=io.BytesIO(TOOLS_DOCKERFILE.encode()), tag=TOOLS_IMAGE, rm=True)
    gcs_port = _free_port()
    with K3SContainer() as container:
        import_image(client, container, TOOLS_IMAGE)
        gateway = container.get_docker_client().gateway_ip(container.get_wrapped_container().id)
        gcs_url = f"http://{gateway}:{gcs_port}"
        gcs = subprocess.Popen([str(gcs_binary()), "-scheme", "http", "-host", "0.0.0.0",
                                "-port", str(gcs_port), "-backend", "memory",
                                "-public-host", f"{gateway}:{gcs_port}",
                                "-external-url", gcs_url, "-log-level", "warn"])
        try:
            configuration = kube.Configuration()
            config.load_kube_config_from_dict(yaml.safe_load(container.config_yaml()),
                                              client_configuration=configuration)
            api = kube.ApiClient(configuration)
            yield {"api": api, "gateway": gateway, "gcs_url": gcs_url, "gcs_port": gcs_port}
            api.close()
        finally:
            gcs.terminate()
            gcs.wait(10)


def test_a_sandbox_on_k3s_returns_a_patch_and_reaches_nothing_else(
        k3s: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{k3s['gcs_port']}")
    gcs = storage.Client.create_anonymous_client()
    bucket = until(lambda: _create_bucket(gcs), 30, "fake-gcs-server")

    work = tmp_path / "src"
    work.mkdir()
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=work, check=True)
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (work / "test_calc.py").write_text("from calc import add\nassert add(2, 3) == 5\n")
    subprocess.run([*GIT, "add", "."], cwd=work, check=True)
    subprocess.run([*GIT, "commit", "-qm", "bug"], cwd=work, check=True)
    served = tmp_path / "served"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / "calc.git")],
                   check=True)
    subprocess.run(["git", "update-server-info"], cwd=served / "calc.git", check=True)
    server = http.server.ThreadingHTTPServer(
        ("0.0.0.0", 0), functools.partial(_Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    git_port = server.server_address[1]

    settings = SandboxClusterSettings(
        runtime_class=None, task_image=TOOLS_IMAGE, tools_image=TOOLS_IMAGE,
        transfer_cidrs=(f"{k3s['gateway']}/32",), transfer_port=k3s["gcs_port"],
        transfer_host_aliases=())
    runtime = KubernetesSandboxRuntime(k3s["api"], storage=gcs, settings=settings,
                                       signer=GcsUrlSigner.for_emulator(k3s["gcs_url"]))
    bus = RecordingPublisher()
    cluster = KubeCluster(k3s["api"])
    watch = SandboxWatch(cluster.pods, cluster, gcs, bus)
    reach = f"http://{k3s['gateway']}:{git_port}/calc.git/HEAD"
    command = (f"if wget -q -T 5 -O /dev/null {reach}; then echo reached > REACHED; fi; "
               "sed -i 's/a - b/a + b/' calc.py")
    spec = RunSpec("sbx-k3s", "ml-a", f"http://127.0.0.1:{git_port}/calc.git", "main", command,
                   DEFAULT_LIMITS, (), "req-k3s", BUCKET, result_prefix("ml-a", "sbx-k3s"))
    try:
        runtime.start(spec)

        def reported() -> Any:
            watch.sync()
            return next((e for e in bus.events if e.name == "sandbox.finished"), None)

        event = until(reported, 300, "sandbox.finished")
    finally:
        server.shutdown()
        server.server_close()
    payload = event.payload
    assert (payload.termination, payload.exit_status) == ("exited", 0), payload.error
    assert payload.files_changed == ["calc.py"], "the task reached the git server"
    patch = bucket.blob(f"{spec.prefix}/{sm.PATCH_OBJECT}").download_as_bytes()
    (tmp_path / "fix.diff").write_bytes(patch)
    subprocess.run(["git", "apply", str(tmp_path / "fix.diff")], cwd=work, check=True)
    assert subprocess.run(["python3", "test_calc.py"], cwd=work).returncode == 0
    # The control plane removes the objects as it records the end (the monitor only reads).
    runtime.cancel(spec.sandbox_id, team="ml-a")
    until(lambda: runtime.status(spec.sandbox_id) is None, 60, "the Pod to go")
    assert [e.payload.termination for e in bus.events] == ["exited"]


def _create_bucket(gcs: Any) -> Any:
    with contextlib.suppress(Exception):
        return gcs.create_bucket(BUCKET)
    return None
