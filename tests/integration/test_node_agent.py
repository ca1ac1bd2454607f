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
from functions.adapters.local_runtime import LocalRuntime
from functions.ports import RuntimeRefused, WorkspaceSpec
from runtime.local.agent import create_app
from runtime.local.node import RESTARTED_DURING_SNAPSHOT, NodeAgent
from runtime.local.publisher import PubSubPublisher
from runtime.local.servers import free_port
from runtime.local.settings import HOST, AgentSettings

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

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=30)


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
    node = NodeAgent(agent_settings, PubSubPublisher(agent_settings.project))
    node.start()
    server: BaseWSGIServer = make_server(
        HOST, agent_settings.port, create_app(agent_settings, agent=node), threaded=True
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Agent(agent_settings, LocalRuntime(agent_settings.url))
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
        client = BlockingKernelClient(
            connection_file=str(self.runtime_dir / f"kernel-{kernel_id}.json")
        )
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
            client.wait_for_ready(timeout=60)
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
    assert f"snapshots/team/{WS}/snap-1/manifest.json" in names
    assert any(n.startswith(f"snapshots/team/{WS}/snap-1/{kernel}/") for n in names)
    assert agent.runtime.status(WS).running  # type: ignore[union-attr]

    agent.runtime.release(WS)
    assert not any(psutil.pid_exists(pid) and _alive(pid) for pid in old_pids)
    wait_no_processes(agent.settings.data_dir, timeout=1)
    status = agent.runtime.status(WS)
    assert status is not None and not status.running
    assert agent.settings.home(WS).is_dir()

    began = time.monotonic()
    agent.runtime.restore(replace(spec, requestid="req-resume"), "snap-1")
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
        f"{agent.url}/workspaces/{WS}", timeout=10, json={**_spec_json(emulated), "profile": gpu}
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
    runtime = LocalRuntime(url)
    first = start_agent_process(data_dir, port, emulated, tmp_path / "agent-1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        runtime.provision(spec_for(emulated, "req-p"))
        emulated.events.wait_for("workspace.ready")
        status = runtime.status(WS)
        assert status is not None
        server_pid = status.detail["pid"]
        ws = Workspace(
            status.url.removesuffix("/lab"),
            status.token,  # type: ignore[union-attr]
            data_dir / "run" / WS,
        )
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
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
        for proc in workspace_processes(data_dir):
            os.killpg(proc.pid, signal.SIGKILL)
        wait_no_processes(data_dir)


# -- helpers -------------------------------------------------------------------------------


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
