"""The node agent against real JupyterLab servers and kernels, the Pub/Sub emulator and
fake-gcs-server.

The control plane's side is driven through ``LocalRuntime`` (the adapter), events are
pulled from subscriptions on the emulator, snapshots land in fake-gcs-server. Every test
ends with no workspace process left (checked with psutil: server, kernels, and anything
carrying the workspace's environment marker).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import pubsub_v1, storage
from jupyter_client.blocking.client import BlockingKernelClient
from werkzeug.serving import BaseWSGIServer, make_server

import events
from events import crashpoints
from functions.adapters.local_runtime import LocalRuntime
from functions.domain.lifecycle import Reason, State, decide
from functions.domain.lifecycle import Workspace as Resuming
from functions.ports import RuntimeRefused, WorkspaceSpec
from runtime.local.agent import create_app
from runtime.local.jupyter import wait_kernel_ready
from runtime.local.node import RESTARTED_DURING_SNAPSHOT, NodeAgent
from runtime.local.publisher import PubSubPublisher
from runtime.local.settings import HOST, AgentSettings, control_token
from runtime.supervisor import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
WS = "team--ws"
TOPICS = ("workspace.ready", "workspace.runtime_failed", "snapshot.finished")
EVENT_TIMEOUT = 120.0
CPU_SMALL = {
    "id": "cpu-small",
    "cpu": 1,
    "memory": "2Gi",
    "memory_bytes": 2 * 2**30,
    "accelerator": None,
}


# -- the emulators, seen from this test ---------------------------------------------------


class EventLog:
    """The agent's events, received by streaming pull on one subscription per topic."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        self.seen: list[events.Event[Any]] = []
        self._cond = threading.Condition()
        self._streams = []
        for name in TOPICS:
            topic = self.publisher.topic_path(project, events.spec_for(name).topic)
            self.publisher.create_topic(request={"name": topic})
            sub = self.subscriber.subscription_path(project, f"test-{name.replace('.', '-')}")
            self.subscriber.create_subscription(request={"name": sub, "topic": topic})
            self._streams.append(self.subscriber.subscribe(sub, self._received))

    def _received(self, message: Any) -> None:
        event = events.from_pubsub(message.data, dict(message.attributes))
        with self._cond:
            self.seen.append(event)
            self._cond.notify_all()
        message.ack()

    def wait_for(
        self, name: str, *, timeout: float = EVENT_TIMEOUT, **fields: Any
    ) -> events.Event[Any]:
        """The first event of that name (not yet returned) whose payload has ``fields``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.seen:
                    if event.name == name and all(
                        getattr(event.payload, k) == v for k, v in fields.items()
                    ):
                        self.seen.remove(event)
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no {name} {fields} within {timeout:g}s; "
                        f"got {[(e.name, e.payload) for e in self.seen]}"
                    )
                self._cond.wait(remaining)

    def close(self) -> None:
        for stream in self._streams:
            stream.cancel()
            with contextlib.suppress(Exception):
                stream.result(timeout=10)
        self.subscriber.close()


@dataclass
class Emulated:
    env: dict[str, str]
    project: str
    bucket: str
    gcs: storage.Client
    events: EventLog

    def objects(self, prefix: str) -> list[str]:
        return [b.name for b in self.gcs.list_blobs(self.bucket, prefix=prefix.strip("/") + "/")]


@pytest.fixture
def emulated(
    pubsub_emulator: Any, gcs_emulator: Any, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Emulated]:
    env = {
        "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
        "STORAGE_EMULATOR_HOST": gcs_emulator.url,
        "GOOGLE_CLOUD_PROJECT": project_id,
        "STASIS_PROJECT": project_id,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gcs = storage.Client(
        project=project_id,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_emulator.url},
    )
    bucket = f"{project_id}-snapshots"
    gcs.create_bucket(bucket)
    log = EventLog(project_id)
    try:
        yield Emulated(env=env, project=project_id, bucket=bucket, gcs=gcs, events=log)
    finally:
        log.close()


# -- the agent -----------------------------------------------------------------------------


@dataclass
class Agent:
    settings: AgentSettings
    runtime: LocalRuntime

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def headers(self) -> dict[str, str]:
        """The control plane's credential."""
        return {"Authorization": f"Bearer {self.settings.control_token()}"}

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.url}{path}", headers=self.headers, timeout=30)


def workspace_processes(data_dir: Path) -> list[psutil.Process]:
    """Live processes started for a workspace of this data dir (server, kernels, their
    children): they all carry the workspace's JUPYTER_RUNTIME_DIR."""
    found = []
    root = str(data_dir)
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if (
                env.get("STASIS_WORKSPACE_ID")
                and env.get("JUPYTER_RUNTIME_DIR", "").startswith(root)
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_no_processes(data_dir: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := workspace_processes(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"workspace processes left: {[(p.pid, p.cmdline()) for p in left]}"


@pytest.fixture
def agent_settings(tmp_path: Path, emulated: Emulated) -> AgentSettings:
    return AgentSettings(
        data_dir=tmp_path / "stasis",
        project=emulated.project,
        port=free_port(),
        stop_grace=5,
        start_timeout=90,
        kernel_timeout=120,
    )


@pytest.fixture
def agent(agent_settings: AgentSettings) -> Iterator[Agent]:
    """The agent in this process: a werkzeug server on a thread."""
    node = NodeAgent(agent_settings, PubSubPublisher(agent_settings.project, origin="node_agent"))
    node.start()
    server: BaseWSGIServer = make_server(
        HOST, agent_settings.port, create_app(agent_settings, agent=node), threaded=True
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Agent(agent_settings, LocalRuntime(agent_settings.url,
                                                 token=agent_settings.control_token()))
    finally:
        node.wait_idle(60)
        for item in node.list():
            node.destroy(item["workspace_id"], keep_home=False)
        server.shutdown()
        server.server_close()
        node.close()
        wait_no_processes(agent_settings.data_dir)


def spec_for(emulated: Emulated, requestid: str, **overrides: Any) -> WorkspaceSpec:
    values: dict[str, Any] = {
        "workspace_id": WS,
        "team": "team",
        "owner": "ana",
        "name": "ws",
        "ide": "jupyterlab",
        "environment": {"id": "python-3-11", "python": "default"},
        "profile": CPU_SMALL,
        "snapshot_bucket": emulated.bucket,
        "snapshot_prefix": f"snapshots/team/{WS}",
        "requestid": requestid,
    }
    values.update(overrides)
    return WorkspaceSpec(**values)


# -- talking to the workspace's server and kernels ------------------------------------------


@dataclass
class Workspace:
    base: str
    token: str
    runtime_dir: Path

    @classmethod
    def of(cls, agent: Agent, workspace_id: str = WS) -> Workspace:
        status = agent.get(f"/workspaces/{workspace_id}").json()
        assert status["running"], status
        return cls(
            status["url"].removesuffix("/lab"),
            status["token"],
            agent.settings.runtime_dir(workspace_id),
        )

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = requests.request(
            method,
            f"{self.base}{path}",
            timeout=60,
            headers={"Authorization": f"token {self.token}"},
            **kwargs,
        )
        response.raise_for_status()
        return response.json() if response.content else None

    def open_notebook(self, path: str) -> str:
        """A session for a notebook, as the browser creates it; the kernel id."""
        session = self.api(
            "POST",
            "/api/sessions",
            json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}},
        )
        return str(session["kernel"]["id"])

    def run(self, kernel_id: str, code: str, timeout: float = 120) -> dict[str, Any]:
        """Execute code in a kernel over its connection file; status, stdout, error."""
        connection = self.runtime_dir / f"kernel-{kernel_id}.json"
        # A kernel still importing misses the heartbeat check of ``wait_for_ready``.
        wait_kernel_ready(connection, timeout=60)
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        client.start_channels()
        out: list[str] = []
        error: dict[str, Any] = {}

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                error.update(ename=content["ename"], evalue=content["evalue"])

        try:
            reply = client.execute_interactive(code, timeout=timeout, output_hook=hook)
        finally:
            client.stop_channels()
        return {"status": reply["content"]["status"], "stdout": "".join(out), **error}


def provision(
    agent: Agent, emulated: Emulated, requestid: str = "req-provision", **overrides: Any
) -> events.Event[Any]:
    began = time.monotonic()
    agent.runtime.provision(spec_for(emulated, requestid, **overrides))
    ready = emulated.events.wait_for("workspace.ready")
    print(f"server start: {time.monotonic() - began:.2f}s")
    return ready


# -- the tests ----------------------------------------------------------------------------


def test_provision_ready_url_answers_with_the_token_only(agent: Agent, emulated: Emulated) -> None:
    ready = provision(agent, emulated, requestid="req-1")
    assert ready.requestid == "req-1"
    assert ready.source == "//stasis/runtime/local"
    status = agent.runtime.status(WS)
    assert status is not None and status.running and status.token
    assert ready.payload.url == status.url
    assert ready.payload.runtime_handle == f"local:{status.detail['pid']}"
    base = ready.payload.url.removesuffix("/lab")
    with_token = requests.get(
        f"{base}/api/status", timeout=10, headers={"Authorization": f"token {status.token}"}
    )
    assert with_token.status_code == 200
    assert requests.get(f"{base}/api/status", timeout=10).status_code == 403
    wrong = requests.get(
        f"{base}/api/status", timeout=10, headers={"Authorization": "token " + "0" * 64}
    )
    assert wrong.status_code == 403
    lab = requests.get(f"{ready.payload.url}?token={status.token}", timeout=30)
    assert lab.status_code == 200 and "JupyterLab" in lab.text
    assert requests.get(ready.payload.url, timeout=30, allow_redirects=False).status_code == 302

    activity = agent.runtime.activity(WS)
    assert activity is not None and activity["busy_kernels"] == 0 and activity["last_activity"]
    # Provision again (a redelivered event): ready again, same server.
    agent.runtime.provision(spec_for(emulated, "req-1"))
    again = emulated.events.wait_for("workspace.ready")
    assert again.payload.runtime_handle == ready.payload.runtime_handle
    caps = agent.runtime.capabilities()
    assert caps["runtime"] == "local" and "jupyterlab" in caps["ides"]


def test_the_agents_own_probes_are_not_activity(agent: Agent, emulated: Emulated) -> None:
    """jupyter-server counts API requests as activity; the agent's reads opt out, or every
    idle sweep would make an idle workspace look active again."""
    provision(agent, emulated, requestid="req-probe")
    first = agent.runtime.activity(WS)
    second = agent.runtime.activity(WS)  # would see the first probe's time as activity
    assert first is not None and second is not None
    assert second["last_activity"] == first["last_activity"]


def test_kernel_state_survives_snapshot_release_restore(agent: Agent, emulated: Emulated) -> None:
    provision(agent, emulated)
    ws = Workspace.of(agent)
    kernel = ws.open_notebook("analysis.ipynb")
    result = ws.run(
        kernel,
        "import numpy as np\nx = 41 + 1\narr = np.arange(2_000_000)\n"
        "import threading\nlock = threading.Lock()",
    )
    assert result["status"] == "ok", result
    old_pids = [p.pid for p in workspace_processes(agent.settings.data_dir)]
    assert len(old_pids) >= 2  # the server and the kernel

    spec = spec_for(emulated, "req-pause")
    began = time.monotonic()
    agent.runtime.snapshot(spec, "snap-1")
    finished = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-1")
    print(f"snapshot ({finished.payload.bytes} bytes): {time.monotonic() - began:.2f}s")
    payload = finished.payload
    assert payload.succeeded is True, payload.error
    assert finished.requestid == "req-pause"
    assert payload.uri == f"gs://{emulated.bucket}/snapshots/team/{WS}/snap-1"
    assert {"x", "arr"} <= set(payload.captured)
    assert [s["name"] for s in payload.skipped] == ["lock"]
    assert payload.bytes >= arr_bytes(2_000_000) and payload.method == "kernel"
    names = emulated.objects(f"snapshots/team/{WS}/snap-1")
    assert names == [f"snapshots/team/{WS}/snap-1/manifest.json"]
    pool = set(emulated.objects(f"snapshots/team/{WS}/_parts/"))
    assert set(payload.parts) == pool and payload.uploaded_bytes == payload.bytes
    assert payload.manifest_sha256 is not None and len(payload.manifest_sha256) == 64
    assert agent.runtime.status(WS).running  # type: ignore[union-attr]

    agent.runtime.release(WS)
    assert not any(psutil.pid_exists(pid) and _alive(pid) for pid in old_pids)
    wait_no_processes(agent.settings.data_dir, timeout=1)
    status = agent.runtime.status(WS)
    assert status is not None and not status.running
    assert agent.settings.home(WS).is_dir()

    began = time.monotonic()
    anchor = payload.manifest_sha256
    agent.runtime.restore(replace(spec, requestid="req-resume"), "snap-1", manifest_sha256=anchor)
    ready = emulated.events.wait_for("workspace.ready", kernels_restored=1)
    print(
        f"restore (server start + kernel + state): {time.monotonic() - began:.2f}s, "
        f"restore_ms={ready.payload.restore_ms}"
    )
    assert ready.requestid == "req-resume"
    assert ready.payload.restore_ms is not None and ready.payload.restore_ms > 0

    ws = Workspace.of(agent)
    sessions = ws.api("GET", "/api/sessions")
    assert [s["path"] for s in sessions] == ["analysis.ipynb"]
    new_kernel = sessions[0]["kernel"]["id"]
    assert new_kernel != kernel
    result = ws.run(new_kernel, "print(x, int(arr.sum()), 'lock' in globals())")
    assert result["stdout"].split() == ["42", str(sum(range(2_000_000))), "False"], result
    # A retried restore of the same snapshot re-reports, without a second server.
    agent.runtime.restore(replace(spec, requestid="req-resume"), "snap-1")
    again = emulated.events.wait_for("workspace.ready", kernels_restored=1)
    assert again.payload.url == ready.payload.url

    # Paused again with snap-1 as its base: only what changed is sent.
    ws.run(new_kernel, "x = 43")
    agent.runtime.snapshot(replace(spec, requestid="req-pause-2"), "snap-2", base="snap-1",
                           base_manifest_sha256=anchor)
    second = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-2").payload
    assert second.succeeded, second.error
    assert second.uploaded_bytes < 64 * 1024 < second.bytes  # the pickle stream, not arr
    assert len(set(second.parts) - pool) == 1


def test_restore_of_a_missing_snapshot_fails_and_leaves_nothing(
    agent: Agent, emulated: Emulated
) -> None:
    agent.runtime.restore(spec_for(emulated, "req-r"), "snap-missing")
    failed = emulated.events.wait_for("workspace.runtime_failed")
    assert failed.payload.operation == "resume"
    assert "snap-missing" in failed.payload.reason and "no manifest" in failed.payload.reason
    wait_no_processes(agent.settings.data_dir, timeout=1)


def test_snapshot_of_a_workspace_without_kernels_is_empty(agent: Agent, emulated: Emulated) -> None:
    provision(agent, emulated)
    agent.runtime.snapshot(spec_for(emulated, "req-e"), "snap-empty")
    finished = emulated.events.wait_for("snapshot.finished")
    assert finished.payload.succeeded is True
    assert (finished.payload.bytes, finished.payload.captured) == (0, [])
    assert emulated.objects(f"snapshots/team/{WS}/snap-empty") == [
        f"snapshots/team/{WS}/snap-empty/manifest.json"
    ]


def test_memory_limit_is_enforced_in_the_kernel(agent: Agent, emulated: Emulated) -> None:
    profile = {"id": "cpu-tiny", "cpu": 1, "memory": "1Gi"}
    provision(agent, emulated, profile=profile)
    ws = Workspace.of(agent)
    kernel = ws.open_notebook("big.ipynb")
    normal = ws.run(
        kernel,
        "import numpy as np\na = np.ones(50_000_000)\n"  # 400 MB
        "print(int(a.sum()))",
    )
    assert normal["status"] == "ok" and normal["stdout"].strip() == "50000000", normal
    too_big = ws.run(kernel, "b = np.ones(200_000_000)")  # 1.6 GB
    assert too_big.get("ename") == "MemoryError", too_big
    too_big = ws.run(kernel, "c = bytearray(2 * 2**30)")
    assert too_big.get("ename") == "MemoryError", too_big
    after = ws.run(kernel, "print(int(a.sum()) + 1)")
    assert after["stdout"].strip() == "50000001", after  # the kernel survived
    for proc in workspace_processes(agent.settings.data_dir):
        assert proc.rlimit(psutil.RLIMIT_DATA) == (2**30, 2**30)
        assert len(proc.cpu_affinity()) == 1


def test_gpu_profile_and_vscode_refused(agent: Agent, emulated: Emulated) -> None:
    gpu = {
        "id": "gpu-small",
        "cpu": 4,
        "memory": "16Gi",
        "accelerator": {"type": "nvidia-l4", "count": 1},
    }
    caps = agent.runtime.capabilities()
    if any("l4" in kind for kind in caps["accelerators"]):
        pytest.skip("this host has an L4")
    with pytest.raises(RuntimeRefused) as refused:
        agent.runtime.provision(spec_for(emulated, "req-gpu", profile=gpu))
    assert str(refused.value).startswith("profile gpu-small needs 1 x nvidia-l4; this host has ")
    response = requests.put(
        f"{agent.url}/workspaces/{WS}", timeout=10, headers=agent.headers,
        json={**_spec_json(emulated), "profile": gpu}
    )
    assert response.status_code == 409
    if "vscode" not in caps["ides"]:
        with pytest.raises(
            RuntimeRefused,
            match=r"vscode is not available on this runtime "
            r"\(code-server not installed\)",
        ):
            agent.runtime.provision(spec_for(emulated, "req-vs", ide="vscode"))
    assert not agent.settings.home(WS).exists()
    assert agent.runtime.status(WS) is None


def test_destroy_with_and_without_keep_home(agent: Agent, emulated: Emulated) -> None:
    provision(agent, emulated)
    ws = Workspace.of(agent)
    ws.api(
        "PUT",
        "/api/contents/notes.txt",
        json={"type": "file", "format": "text", "content": "results"},
    )
    kernel = ws.open_notebook("pkg.ipynb")
    # The kernel sees the workspace's home and user site.
    result = ws.run(kernel, "import os, site\nprint(os.environ['HOME'], site.USER_BASE)")
    home = agent.settings.home(WS)
    assert result["stdout"].split() == [str(home), str(home / ".local")], result

    agent.runtime.destroy(WS, keep_home=True)
    wait_no_processes(agent.settings.data_dir, timeout=1)
    assert agent.runtime.status(WS) is None
    assert (home / "notes.txt").read_text() == "results"

    provision(agent, emulated, requestid="req-again")
    ws = Workspace.of(agent)
    assert ws.api("GET", "/api/contents/notes.txt")["content"] == "results"

    agent.runtime.destroy(WS, keep_home=False)
    wait_no_processes(agent.settings.data_dir, timeout=1)
    assert not home.exists()
    agent.runtime.destroy(WS, keep_home=False)  # idempotent


def _wheel(directory: Path, name: str = "stasis_probe_pkg") -> Path:
    """A one-module wheel, built here (no index, no network)."""
    import zipfile

    dist = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 'installed by the researcher'\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


IMPORT_PROBE = "import stasis_probe_pkg as p\nprint(p.VALUE, p.__file__)"


def test_pip_install_lands_in_the_home_and_stays(
    agent: Agent, emulated: Emulated, tmp_path: Path
) -> None:
    """``%pip install`` in a notebook installs into the workspace's home venv: importable
    after pause/resume and after a resume on another profile, invisible to another
    workspace and to the agent's own interpreter."""
    wheel = _wheel(tmp_path)
    provision(agent, emulated)
    ws = Workspace.of(agent)
    kernel = ws.open_notebook("install.ipynb")
    installed = ws.run(kernel, f"%pip install --no-index --no-deps {wheel}\n", timeout=180)
    assert installed["status"] == "ok", installed
    home = agent.settings.home(WS)
    seen = ws.run(kernel, IMPORT_PROBE)
    assert seen["stdout"].split()[-1].startswith(str(home / ".venv")), seen
    # The agent's own interpreter (shared with every workspace) did not change.
    assert subprocess.run([sys.executable, "-c", "import stasis_probe_pkg"],
                          capture_output=True).returncode != 0

    # Pause and resume: a fresh kernel imports it.
    spec = spec_for(emulated, "req-pause-pkg")
    agent.runtime.snapshot(spec, "snap-pkg")
    anchor = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-pkg").payload
    assert anchor.succeeded, anchor.error
    agent.runtime.release(WS)
    agent.runtime.restore(replace(spec, requestid="req-resume-pkg"), "snap-pkg",
                          manifest_sha256=anchor.manifest_sha256)
    emulated.events.wait_for("workspace.ready", kernels_restored=1)
    ws = Workspace.of(agent)
    after = ws.run(ws.open_notebook("after-resume.ipynb"), IMPORT_PROBE)
    assert after["stdout"].startswith("installed by the researcher"), after

    # Resume on another hardware profile (same home, another server).
    agent.runtime.release(WS)
    other = {**CPU_SMALL, "id": "cpu-other", "memory": "3Gi", "memory_bytes": 3 * 2**30}
    agent.runtime.restore(replace(spec, requestid="req-resume-other", profile=other),
                          "snap-pkg", manifest_sha256=anchor.manifest_sha256)
    emulated.events.wait_for("workspace.ready", kernels_restored=1)
    ws = Workspace.of(agent)
    moved = ws.run(ws.open_notebook("after-move.ipynb"), IMPORT_PROBE)
    assert moved["stdout"].startswith("installed by the researcher"), moved

    # Another workspace of the same team does not see it.
    neighbour = "team--other"
    provision(agent, emulated, requestid="req-neighbour", workspace_id=neighbour, name="other",
              snapshot_prefix=f"snapshots/team/{neighbour}")
    theirs = Workspace.of(agent, neighbour)
    unseen = theirs.run(theirs.open_notebook("probe.ipynb"), IMPORT_PROBE)
    assert unseen.get("ename") == "ModuleNotFoundError", unseen
    agent.runtime.destroy(neighbour, keep_home=False)


def test_a_kernel_cannot_drive_the_node_agent(
    agent: Agent, emulated: Emulated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a workspace's kernel: the agent's credential is not in its environment, and
    every call the kernel makes without it (list, restore, delete) is refused."""
    monkeypatch.setenv("STASIS_NODE_AGENT_TOKEN", agent.settings.control_token())
    provision(agent, emulated)
    ws = Workspace.of(agent)
    kernel = ws.open_notebook("probe.ipynb")
    probe = f"""
import json, os, urllib.request, urllib.error
print("token-in-env", any(agent_token in v for v in os.environ.values()))
def call(method, path, body=None):
    request = urllib.request.Request("{agent.url}" + path, method=method,
        data=json.dumps(body).encode() if body else None,
        headers={{"Content-Type": "application/json"}})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
for method, path, body in [("GET", "/workspaces", None), ("GET", "/workspaces/{WS}", None),
        ("POST", "/workspaces/{WS}/restore", {{"snapshot_id": "s1", "bucket": "b",
                                              "prefix": "p", "spec": {{}}}}),
        ("DELETE", "/workspaces/{WS}", None)]:
    status, text = call(method, path, body)
    print(method, status, "{ws.token}" in text)
"""
    result = ws.run(kernel, f"agent_token = {agent.settings.control_token()!r}\n" + probe)
    assert result["status"] == "ok", result
    lines = result["stdout"].splitlines()
    assert lines[0] == "token-in-env False", result
    assert lines[1:] == ["GET 401 False", "GET 401 False", "POST 401 False",
                         "DELETE 401 False"], result
    assert agent.runtime.status(WS).running  # type: ignore[union-attr]
    assert agent.settings.home(WS).is_dir()


FAKE_CODE_SERVER = """#!{python}
# A stand-in for code-server: checks how the agent starts it, serves /healthz.
import http.server, json, os, sys, time
args = sys.argv[1:]
host, port = args[args.index("--bind-addr") + 1].rsplit(":", 1)
assert args[args.index("--auth") + 1] == "password" and os.environ["PASSWORD"]
assert args[-1] == os.environ["HOME"], (args, os.environ["HOME"])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"status": "alive",
                           "lastHeartbeat": int(time.time() * 1000)}}).encode()
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer((host, int(port)), Handler).serve_forever()
"""


@pytest.fixture
def fake_code_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "code-server"
    script.write_text(FAKE_CODE_SERVER.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return script


def test_vscode_workspace_where_code_server_is_installed(
    fake_code_server: Path, agent: Agent, emulated: Emulated
) -> None:
    assert "vscode" in agent.runtime.capabilities()["ides"]
    ready = provision(agent, emulated, ide="vscode")
    url = ready.payload.url
    assert url.startswith(f"http://{HOST}:") and url.endswith("/")
    assert requests.get(f"{url}healthz", timeout=10).status_code == 200
    activity = agent.runtime.activity(WS)
    assert activity is not None and activity["last_activity"] and activity["busy_kernels"] == 0
    # No Jupyter kernels to capture: the snapshot is empty, the home is what persists.
    agent.runtime.snapshot(spec_for(emulated, "req-v", ide="vscode"), "snap-v")
    finished = emulated.events.wait_for("snapshot.finished")
    assert finished.payload.succeeded is True and finished.payload.bytes == 0
    agent.runtime.release(WS)
    wait_no_processes(agent.settings.data_dir, timeout=1)
    agent.runtime.restore(spec_for(emulated, "req-v2", ide="vscode"), "snap-v")
    again = emulated.events.wait_for("workspace.ready")
    assert again.payload.kernels_restored == 0 and again.payload.url != url


def test_agent_killed_mid_snapshot(tmp_path: Path, emulated: Emulated) -> None:
    """kill -9 the agent while a kernel is capturing; a restarted agent adopts the server,
    reports the snapshot failed and removes its objects (also those the kernel wrote after
    the agent died), and the kernel's state is untouched."""
    data_dir = tmp_path / "stasis"
    port = free_port()
    url = f"http://{HOST}:{port}"
    runtime = LocalRuntime(url, token=control_token(data_dir))
    first = start_agent_process(data_dir, port, emulated, tmp_path / "agent-1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        status, ws = provisioned(runtime, emulated, data_dir)
        server_pid = status.detail["pid"]
        kernel = ws.open_notebook("slow.ipynb")
        # Pickling `slow` takes 4 s, so the capture is still running when the agent dies,
        # and its parts are uploaded only after that.
        setup = ws.run(
            kernel,
            "import numpy as np, time\nx = 7\narr = np.ones(4_000_000)\n"
            "class Slow:\n"
            "    def __reduce__(self):\n"
            "        time.sleep(4)\n"
            "        return (Slow, ())\n"
            "slow = Slow()",
        )
        assert setup["status"] == "ok", setup

        runtime.snapshot(spec_for(emulated, "req-s"), "snap-k")
        wait_until(lambda: _kernel_busy(ws), 30, "the capture to start in the kernel")
        state = json.loads((data_dir / "agent" / "state.json").read_text())
        assert state["workspaces"][WS]["operation"]["kind"] == "snapshot"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert _alive(server_pid), "the server must survive the agent"

        second = start_agent_process(data_dir, port, emulated, tmp_path / "agent-2.log")
        finished = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-k")
        assert finished.payload.succeeded is False
        assert finished.payload.error == RESTARTED_DURING_SNAPSHOT
        assert finished.requestid == "req-s"
        assert emulated.objects(f"snapshots/team/{WS}/snap-k") == []
        status = runtime.status(WS)
        assert status is not None and status.running and status.operation is None
        assert status.detail["pid"] == server_pid
        result = ws.run(kernel, "print(x, int(arr.sum()))")
        assert result["stdout"].split() == ["7", "4000000"], result
        runtime.destroy(WS, keep_home=False)
        wait_no_processes(data_dir, timeout=1)
    finally:
        stop_agents(data_dir, first, second)


def test_a_report_the_agent_died_before_sending_is_sent_by_its_next_start(
        tmp_path: Path, emulated: Emulated) -> None:
    """Found by the chaos harness: the agent saved a provision's end, then died before it
    published workspace.ready; the restarted agent adopted the live server with no
    operation and said nothing, so the workspace waited in PROVISIONING for the
    reconciler. The report is now saved with the end and sent by the next start."""
    data_dir = tmp_path / "stasis"
    port = free_port()
    runtime = LocalRuntime(f"http://{HOST}:{port}", token=control_token(data_dir))
    crash_dir = tmp_path / "crash"
    crashpoints.arm(crash_dir, "agent.operation_ended")
    emulated.env[crashpoints.ENV] = str(crash_dir)
    first = start_agent_process(data_dir, port, emulated, tmp_path / "agent-1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        runtime.provision(spec_for(emulated, "req-crash"))
        assert first.wait(120) == -signal.SIGKILL  # it died at the crash point
        assert crashpoints.fired(crash_dir) == ["agent.operation_ended"]
        state = json.loads((data_dir / "agent" / "state.json").read_text())
        assert state["workspaces"][WS]["operation"] is None
        assert len(state["workspaces"][WS]["unsent"]) == 1
        with pytest.raises(AssertionError, match=r"no workspace\.ready"):
            emulated.events.wait_for("workspace.ready", timeout=1)

        second = start_agent_process(data_dir, port, emulated, tmp_path / "agent-2.log")
        ready = emulated.events.wait_for("workspace.ready")
        assert ready.requestid == "req-crash" and ready.subject == WS
        wait_until(lambda: not json.loads((data_dir / "agent" / "state.json").read_text())
                   ["workspaces"][WS]["unsent"], 30, "the report to be marked sent")
        runtime.destroy(WS, keep_home=False)
    finally:
        emulated.env.pop(crashpoints.ENV, None)
        stop_agents(data_dir, first, second)


def test_a_server_the_agent_died_before_recording_is_stopped_by_its_next_start(
        tmp_path: Path, emulated: Emulated) -> None:
    """Found after the long chaos run: a JupyterLab outlived `stasis down`. The agent was
    killed between spawning a restore's server and recording it in its state file; the
    restarted agent knew no server, started another, and the first ran on, unowned, for
    good. The start's marker is now saved with the operation before the process exists,
    and the next start stops whatever carries it."""
    data_dir = tmp_path / "stasis"
    port = free_port()
    runtime = LocalRuntime(f"http://{HOST}:{port}", token=control_token(data_dir))
    crash_dir = tmp_path / "crash"
    crashpoints.arm(crash_dir, "server.spawned")
    emulated.env[crashpoints.ENV] = str(crash_dir)
    first = start_agent_process(data_dir, port, emulated, tmp_path / "agent-1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        runtime.provision(spec_for(emulated, "req-orphan"))
        assert first.wait(120) == -signal.SIGKILL  # died with the server spawned
        assert crashpoints.fired(crash_dir) == ["server.spawned"]
        state = json.loads((data_dir / "agent" / "state.json").read_text())
        assert state["workspaces"][WS]["server"] is None  # never recorded
        marker = state["workspaces"][WS]["operation"]["marker"]
        orphans = [p for p in workspace_processes(data_dir)
                   if p.environ().get("STASIS_SERVER_INSTANCE") == marker]
        assert orphans, "the spawned server should have outlived the agent"

        second = start_agent_process(data_dir, port, emulated, tmp_path / "agent-2.log")
        failed = emulated.events.wait_for("workspace.runtime_failed")
        assert (failed.requestid, failed.payload.operation, failed.payload.cause) == (
            "req-orphan", "provision", "interrupted")
        wait_no_processes(data_dir)  # the orphan stopped (a zombie at most), nothing left
    finally:
        emulated.env.pop(crashpoints.ENV, None)
        stop_agents(data_dir, first, second)


def test_a_resume_the_agent_restart_cut_short_leaves_the_workspace_paused(
        tmp_path: Path, emulated: Emulated) -> None:
    """Found by the chaos harness: the agent died in a restore (its server up, the kernels
    not yet restored); the restarted agent reported a plain resume failure and the
    workspace went FAILED. It now says the resume was interrupted, which the lifecycle
    decides as PAUSED with the snapshot kept, and a retried restore brings the state back.
    Found with it: the restarted agent cleared the operation before it published, so when
    it was killed again in between, nothing was ever reported and the workspace waited in
    RESUMING for the reconciler; the report is now saved with the operation's end."""
    data_dir = tmp_path / "stasis"
    port = free_port()
    runtime = LocalRuntime(f"http://{HOST}:{port}", token=control_token(data_dir))
    crash_dir = tmp_path / "crash"
    emulated.env[crashpoints.ENV] = str(crash_dir)
    first = start_agent_process(data_dir, port, emulated, tmp_path / "agent-1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        _, ws = provisioned(runtime, emulated, data_dir)
        assert ws.run(ws.open_notebook("a.ipynb"), "x = 41 + 1")["status"] == "ok"
        runtime.snapshot(spec_for(emulated, "req-s"), "snap-r")
        finished = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-r")
        assert finished.payload.succeeded, finished.payload.error
        runtime.release(WS)

        crashpoints.arm(crash_dir, "restore.server_started")
        runtime.restore(spec_for(emulated, "req-r"), "snap-r",
                        manifest_sha256=finished.payload.manifest_sha256)
        assert first.wait(120) == -signal.SIGKILL  # it died in the restore
        crashpoints.arm(crash_dir, "agent.operation_ended")
        second = start_agent_process(data_dir, port, emulated, tmp_path / "agent-2.log")
        assert second.wait(120) == -signal.SIGKILL  # killed again, its report saved unsent
        with pytest.raises(AssertionError, match=r"no workspace\.runtime_failed"):
            emulated.events.wait_for("workspace.runtime_failed", timeout=1)
        second = start_agent_process(data_dir, port, emulated, tmp_path / "agent-3.log")
        failed = emulated.events.wait_for("workspace.runtime_failed")
        assert (failed.requestid, failed.payload.operation, failed.payload.cause) == (
            "req-r", "resume", "interrupted")
        resuming = Resuming(id=WS, team="team", owner="dev", name=WS.split("--")[1],
                            profile="cpu-small", state=State.RESUMING, current_snapshot="snap-r")
        decision = decide(resuming, failed.payload, datetime.now(UTC))
        assert decision.workspace is not None
        assert (decision.workspace.state, decision.reason) == (
            State.PAUSED, Reason.RESUME_INTERRUPTED)
        assert decision.workspace.current_snapshot == "snap-r"
        wait_until(lambda: not getattr(runtime.status(WS), "running", False), 60,
                   "the half-restored server to be stopped")
        assert emulated.objects(f"snapshots/team/{WS}/snap-r")  # the snapshot is kept

        runtime.restore(spec_for(emulated, "req-r2"), "snap-r",
                        manifest_sha256=finished.payload.manifest_sha256)
        emulated.events.wait_for("workspace.ready", kernels_restored=1)
        status = runtime.status(WS)
        assert status is not None
        ws = Workspace(status.url.removesuffix("/lab"), status.token,  # type: ignore[arg-type]
                       data_dir / "run" / WS)
        kernel = ws.api("GET", "/api/sessions")[0]["kernel"]["id"]
        assert ws.run(kernel, "print(x)")["stdout"].strip() == "42"
        runtime.destroy(WS, keep_home=False)
    finally:
        emulated.env.pop(crashpoints.ENV, None)
        stop_agents(data_dir, first, second)


# -- helpers -------------------------------------------------------------------------------


def provisioned(runtime: LocalRuntime, emulated: Emulated,
                data_dir: Path) -> tuple[Any, Workspace]:
    """Provision WS through ``runtime`` (an agent process), wait for workspace.ready: its
    status and the workspace's Jupyter server."""
    runtime.provision(spec_for(emulated, "req-p"))
    emulated.events.wait_for("workspace.ready")
    status = runtime.status(WS)
    assert status is not None
    return status, Workspace(status.url.removesuffix("/lab"),
                             status.token,  # type: ignore[arg-type]
                             data_dir / "run" / WS)


def stop_agents(data_dir: Path, *agents: subprocess.Popen[bytes] | None) -> None:
    """Stop the agents still running, then every workspace process they left behind."""
    for proc in agents:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    for proc in workspace_processes(data_dir):
        os.killpg(proc.pid, signal.SIGKILL)
    wait_no_processes(data_dir)


def start_agent_process(
    data_dir: Path, port: int, emulated: Emulated, log: Path
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.local.agent",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                "--project",
                emulated.project,
            ],
            cwd=REPO_ROOT,
            env={**os.environ, **emulated.env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited: {log.read_text()[-2000:]}")
        try:
            return requests.get(f"http://{HOST}:{port}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    wait_until(healthy, 60, "the agent to answer /healthz")
    return proc


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _kernel_busy(ws: Workspace) -> bool:
    return any(k["execution_state"] == "busy" for k in ws.api("GET", "/api/kernels"))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _spec_json(emulated: Emulated) -> dict[str, Any]:
    from functions.adapters.local_runtime import spec_to_json

    return spec_to_json(spec_for(emulated, "req-raw"))


def arr_bytes(n: int) -> int:
    return n * 8


# -- the warm pool --------------------------------------------------------------------------


def _warm_pids(agent: Agent, timeout: float = 120.0) -> set[int]:
    """The warm servers waiting (their pids), once the pool has filled."""
    marker = "STASIS_WARM_INSTANCE"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = agent.get("/pools").json()["environments"]
        if pools and all(p["waiting"] == p["size"] for p in pools.values()):
            break
        time.sleep(0.2)
    found = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            # Waiting ones sit in the pool's log dir; an adopted one moved to its home.
            if proc.cwd() == str(agent.settings.data_dir / "logs" / "warm") and \
                    marker in proc.environ() and _alive(proc.pid):
                found.add(proc.pid)
    return found


def test_a_warm_server_is_adopted_with_the_workspaces_home_token_and_limits(
    agent: Agent, emulated: Emulated
) -> None:
    """The pool's process has served nobody (no port, no workspace in its environment);
    adopted, it is the workspace's server as a cold start would be (base path, token only,
    home, runtime dir, limits of the profile), and the pool fills again with a new one."""
    bad = requests.put(f"{agent.url}/pools", timeout=10, headers=agent.headers,
                       json={"environments": [{"id": "python-3-11", "warm_pool": -1}]})
    assert bad.status_code == 400 and "warm_pool" in bad.json()["error"]
    answer = requests.put(f"{agent.url}/pools", timeout=10, headers=agent.headers,
                          json={"environments": [
        {"id": "python-3-11", "python": "default", "warm_pool": 1}]})
    assert answer.status_code == 200, answer.text
    (warm,) = _warm_pids(agent)
    proc = psutil.Process(warm)
    assert proc.net_connections(kind="inet") == []  # listens nowhere: served nobody
    assert "STASIS_WORKSPACE_ID" not in proc.environ() and "JUPYTER_TOKEN" not in proc.environ()

    profile = {"id": "cpu-tiny", "cpu": 1, "memory": "1Gi"}
    ready = provision(agent, emulated, profile=profile,
                      environment={"id": "python-3-11", "python": "default", "warm_pool": 1})
    assert ready.payload.runtime_handle == f"local:{warm}"  # adopted, not started cold
    assert agent.get("/pools").json()["adopted"] == 1
    status = agent.runtime.status(WS)
    assert status is not None and status.token
    base = ready.payload.url.removesuffix("/lab")
    assert base.endswith(f"/w/{WS}")
    assert requests.get(f"{base}/api/status", timeout=10).status_code == 403
    ws = Workspace.of(agent)
    kernel = ws.open_notebook("warm.ipynb")
    seen = ws.run(kernel, "import os, resource\nprint(os.getcwd(), os.environ['HOME'], "
                          "os.environ['JUPYTER_RUNTIME_DIR'], "
                          "resource.getrlimit(resource.RLIMIT_DATA)[0], "
                          "len(os.sched_getaffinity(0)))")
    home = agent.settings.home(WS)
    assert seen["stdout"].split() == [str(home), str(home), str(ws.runtime_dir), str(2**30), "1"]
    assert proc.rlimit(psutil.RLIMIT_DATA) == (2**30, 2**30) and len(proc.cpu_affinity()) == 1

    (refilled,) = _warm_pids(agent)
    assert refilled != warm
    agent.runtime.release(WS)
    assert not _alive(warm)
    assert _alive(refilled)  # a release stops the workspace's server, not the pool
