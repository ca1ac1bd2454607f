"""Warm kernels (``runtime.local.prekernel``, claimed by ``runtime.local.kernel_provisioner``)
with the real node agent, jupyter-server, kernels and emulators.

A warm kernel has served nobody before its hand-over; a resume's kernel is the warm one
(its pid) with the variables back and the environment, interpreter and cwd a cold kernel
gets; interrupt and restart work on it; it is taken once (a second kernel, a second
workspace, a restart start cold); a stop ends it. As the workspace's own user, on the
allow-list environment: test_workspace_users (its data dir and interpreter).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import psutil
import requests
from test_node_agent import (  # the agent and emulator fixtures of the node agent's tests
    WS,
    Agent,
    Emulated,
    Workspace,
    _alive,
    agent,
    agent_settings,
    emulated,
    provision,
    spec_for,
)

__all__ = ["agent", "agent_settings", "emulated"]  # fixtures used by name

OTHER = "team--other"
ENV = {"id": "python-3-11", "python": "default"}
PROBE = ("import json, os, sys\nprint(json.dumps({'pid': os.getpid(), 'uid': os.getuid(), "
         "'cwd': os.getcwd(), 'env': dict(os.environ), 'executable': sys.executable, "
         "'prefix': sys.prefix, 'path': sys.path}))")


def _pools(agent: Agent, environment: dict[str, Any], kernels: int, servers: int = 0) -> None:
    answer = requests.put(f"{agent.url}/pools", timeout=10, headers=agent.headers, json={
        "environments": [{**environment, "warm_pool": servers, "warm_kernels": kernels}]})
    assert answer.status_code == 200, answer.text


def _warm_kernels(agent: Agent, timeout: float = 120.0) -> set[int]:
    """The pids of the warm kernels waiting in the pool (once it is full)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = agent.get("/pools").json()["kernels"]["environments"]
        if pools and all(p["waiting"] == p["size"] for p in pools.values()):
            break
        time.sleep(0.2)
    found = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.cwd() == str(agent.settings.data_dir / "logs" / "warm-kernels") and \
                    "runtime.local.prekernel" in proc.cmdline() and _alive(proc.pid):
                found.add(proc.pid)
    return found


def _probe(ws: Workspace, kernel: str) -> dict[str, Any]:
    import json

    seen = ws.run(kernel, PROBE)
    assert seen["status"] == "ok", seen
    found: dict[str, Any] = json.loads(seen["stdout"])
    return found


def _server_pid(agent: Agent, workspace_id: str = WS) -> int:
    return int(agent.get(f"/workspaces/{workspace_id}").json()["pid"])


def test_a_resume_claims_the_warm_kernel_which_interrupts_and_restarts(
    agent: Agent, emulated: Emulated
) -> None:
    _pools(agent, ENV, kernels=1)
    (warm,) = _warm_kernels(agent)
    waiting = psutil.Process(warm)
    assert waiting.net_connections(kind="inet") == []  # bound nothing: served nobody
    assert "STASIS_WORKSPACE_ID" not in waiting.environ()
    assert "PUBSUB_EMULATOR_HOST" not in waiting.environ()  # started on the allow-list
    assert agent.get("/pools").json()["kernels"]["environments"]["python-3-11"] == {
        "size": 1, "waiting": 1}

    provision(agent, emulated, environment=ENV)
    ws = Workspace.of(agent)
    first = ws.open_notebook("analysis.ipynb")
    seen = _probe(ws, first)
    assert seen["pid"] == warm  # the provision's first kernel is the warm one
    assert ws.run(first, "x = 41 + 1\nimport numpy as np\narr = np.arange(1000)")[
        "status"] == "ok"
    cold = ws.open_notebook("second.ipynb")  # a second kernel: the offer is gone, cold
    other = _probe(ws, cold)
    assert other["pid"] != warm
    assert psutil.Process(other["pid"]).ppid() == _server_pid(agent)
    # The claimed kernel is what a cold kernel is: environment, interpreter, path, cwd.
    dropped = {"JPY_PARENT_PID", "JPY_SESSION_NAME"}
    assert {k: v for k, v in seen["env"].items() if k not in dropped} == \
        {k: v for k, v in other["env"].items() if k not in dropped}
    assert (seen["executable"], seen["prefix"], seen["cwd"]) == \
        (other["executable"], other["prefix"], other["cwd"])
    assert seen["path"] == other["path"]

    spec = spec_for(emulated, "req-pause", environment=ENV)
    agent.runtime.snapshot(spec, "snap-1")
    finished = emulated.events.wait_for("snapshot.finished", snapshot_id="snap-1").payload
    assert finished.succeeded, finished.error
    agent.runtime.release(WS)
    assert not _alive(warm)  # a stop ends the claimed kernel too
    (refilled,) = _warm_kernels(agent)
    assert refilled != warm

    agent.runtime.restore(replace(spec, requestid="req-resume"), "snap-1",
                          manifest_sha256=finished.manifest_sha256)
    emulated.events.wait_for("workspace.ready", kernels_restored=2)
    ws = Workspace.of(agent)
    kernels = {s["path"]: s["kernel"]["id"] for s in ws.api("GET", "/api/sessions")}
    restored = kernels["analysis.ipynb"]
    pids = {path: _probe(ws, kid)["pid"] for path, kid in kernels.items()}
    assert refilled in pids.values()  # the resume's first kernel is the warm one
    adopted = next(kid for path, kid in kernels.items() if pids[path] == refilled)
    back = ws.run(restored, "print(x, int(arr.sum()))")
    assert back["stdout"].split() == ["42", str(sum(range(1000)))], back
    phases = agent.get(f"/workspaces/{WS}").json()["phases_ms"]["restore"]
    assert "kernel_start" in phases

    # Interrupt: a cell that sleeps is stopped by jupyter's interrupt.
    interrupted: dict[str, Any] = {}
    sleeper = threading.Thread(target=lambda: interrupted.update(
        ws.run(adopted, "import time\ntime.sleep(60)")))
    sleeper.start()
    time.sleep(2)
    ws.api("POST", f"/api/kernels/{adopted}/interrupt")
    sleeper.join(30)
    assert not sleeper.is_alive() and interrupted.get("ename") == "KeyboardInterrupt", \
        interrupted

    # Restart: the warm kernel ends and a cold one takes the same kernel id.
    ws.api("POST", f"/api/kernels/{adopted}/restart")
    deadline = time.monotonic() + 10
    while _alive(refilled) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(refilled)
    again = _probe(ws, adopted)
    assert again["pid"] != refilled
    assert psutil.Process(again["pid"]).ppid() == _server_pid(agent)


def test_a_warm_kernel_is_handed_to_one_workspace_only(
    agent: Agent, emulated: Emulated
) -> None:
    """Pool of one, two workspaces started before it refills: the first gets it, the
    second starts its kernel cold; with a pool of 0 nothing is handed over."""
    _pools(agent, ENV, kernels=1)
    (warm,) = _warm_kernels(agent)
    provision(agent, emulated, environment=ENV)
    provision(agent, emulated, requestid="req-other", workspace_id=OTHER, name="other",
              environment=ENV, snapshot_prefix=f"snapshots/team/{OTHER}")
    mine, theirs = Workspace.of(agent), Workspace.of(agent, OTHER)
    assert _probe(theirs, theirs.open_notebook("a.ipynb"))["pid"] != warm
    assert _probe(mine, mine.open_notebook("a.ipynb"))["pid"] == warm
    assert not (agent.settings.runtime_dir(OTHER) / "stasis-warm-kernel.json").exists()

    _pools(agent, ENV, kernels=0)
    assert agent.get("/pools").json()["kernels"]["environments"]["python-3-11"] == {
        "size": 0, "waiting": 0}
    agent.runtime.release(WS)
    assert not _alive(warm)
    provision(agent, emulated, requestid="req-again", environment=ENV)
    ws = Workspace.of(agent)
    seen = _probe(ws, ws.open_notebook("b.ipynb"))
    assert psutil.Process(seen["pid"]).ppid() == _server_pid(agent)  # cold, as today


def test_a_handed_kernel_never_claimed_ends_with_its_server(
    agent: Agent, emulated: Emulated
) -> None:
    """Handed over, and the server gone before any notebook opened (killed, as a crash
    would): the kernel ends too, it never waits on for a server that cannot claim it."""
    _pools(agent, ENV, kernels=1)
    (warm,) = _warm_kernels(agent)
    provision(agent, emulated, environment=ENV)
    assert (agent.settings.runtime_dir(WS) / "stasis-warm-kernel.json").exists()  # offered
    assert _alive(warm)
    os.kill(_server_pid(agent), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(warm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(warm)
