"""`make demo`: the main job on the local stack, start to finish, printing what happened.

Brings the stack up (or uses the running one), creates a workspace, builds a ~256 MiB state
in a real kernel with a cell as slow as a model load (30 s; ``STASIS_DEMO_CELL_SECONDS``),
pauses (the server process is gone afterwards), resumes, proves by checksum that the
variable came back without re-running the cell, and prints resume beside re-running that
cell. Leaves the stack and the workspace running, with the JupyterLab URL printed.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

import psutil

from events import (
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import workspace_id
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.publishers import OPERATOR
from harness.notebook import Notebook
from stack import local
from stack.settings import Settings
from stasis_cli import client

TEAM, USER, NAME, NOTEBOOK = "ml-a", "dev", "demo", "demo.ipynb"

#: How long the slow cell takes: about what loading a real model does (reading a few GiB
#: of weights, moving them to the device). STASIS_DEMO_CELL_SECONDS overrides it.
CELL_SECONDS = float(os.environ.get("STASIS_DEMO_CELL_SECONDS") or 30)

BUILD_STATE = f"cell_seconds = {CELL_SECONDS}" + """
import hashlib, time
import numpy as np
started = time.time()
rng = np.random.default_rng(42)
state = np.empty(32 * 1024 * 1024, dtype=np.float64)   # 256 MiB
for i in range(32):                                      # the computed part of the state
    chunk = np.sort(rng.standard_normal(1024 * 1024))
    state[i * 1024 * 1024:(i + 1) * 1024 * 1024] = np.cumsum(np.sin(chunk) ** 2)
model = {"weights": state[:1000].copy(), "epoch": 7, "note": "trained before lunch"}
def predict(x):
    return float(model["weights"][:3] @ np.asarray(x))
# The rest of a real model load (weights from disk or a hub, to the device), as a wait.
time.sleep(max(0.0, cell_seconds - (time.time() - started)))
digest = hashlib.sha256(state).hexdigest()
print(digest, round(time.time() - started, 2))
"""

CHECK_STATE = """
import hashlib
print(hashlib.sha256(state).hexdigest(), model["epoch"], round(predict([1, 2, 3]), 6))
"""


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _follow(settings: Settings, bus: PubSubBus, payload: Any, until: set[str]) -> dict[str, Any]:
    event = new_event(payload, source="//stasis/demo", requestid=uuid.uuid4().hex)
    bus.publish(event)
    outcome = client.follow(settings, event, until=until, progress=lambda m: say("  " + m))
    if not outcome.get("ok"):
        say(f"failed: {outcome}")
        sys.exit(1)
    return dict(outcome["workspace"])


def _wait_warm_pool(settings: Settings, timeout: float = 120) -> None:
    """Wait until the node agent's warm pools (the admin file's ``warm_pool`` and
    ``warm_kernels``) are full, as they are on a stack that has been up a while, and say
    what they hold."""
    deadline = time.monotonic() + timeout
    pools: dict[str, Any] = {}
    kernels: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = local.warm_pools(settings) or {}
        pools = seen.get("environments", {})
        kernels = (seen.get("kernels") or {}).get("environments", {})
        if all(p["waiting"] >= p["size"] for p in (*pools.values(), *kernels.values())):
            break
        time.sleep(0.5)
    say("warm pool: " + (", ".join(
        [f"{env} {p['waiting']}/{p['size']} JupyterLab imported ahead"
         for env, p in pools.items() if p["size"]]
        + [f"{env} {p['waiting']}/{p['size']} kernel imported ahead"
           for env, p in kernels.items() if p["size"]]) or "none"))


def main() -> None:
    settings = Settings.from_env()
    os.environ.update(settings.emulator_env())
    if not any(row["healthy"] for row in local.status(settings) if row["name"] == "functions"):
        say("starting the local stack")
        report = local.up(settings)
        say(f"stack up in {report.total:.1f}s")
    bus = PubSubBus(settings.project, origin=OPERATOR)
    ws_id = workspace_id(TEAM, NAME)
    existing = client.workspace(ws_id)
    if existing and existing["state"] not in ("DELETED", "FAILED"):
        say(f"deleting the previous {NAME}")
        _follow(settings, bus, WorkspaceDeleteRequested(ws_id, USER), {"DELETED"})

    _wait_warm_pool(settings)
    say(f"creating workspace {NAME} (team {TEAM}, profile cpu-large)")
    ws = _follow(settings, bus, WorkspaceRequested(team=TEAM, owner=USER, name=NAME,
                                                   profile="cpu-large"), {"RUNNING"})
    info = client.workspace_status(settings, ws_id) or {}
    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open(NOTEBOOK)
    say(f"running the slow cell that builds ~256 MiB of state (~{CELL_SECONDS:g} s, a model load)")
    built = nb.run(kernel, BUILD_STATE)
    digest, build_seconds = built.stdout.split()
    say(f"  state built in {float(build_seconds):.1f}s, sha256 {digest[:16]}…")

    server_pid = int(str(ws["runtime_handle"]).split(":")[-1])
    say("pausing")
    paused = _follow(settings, bus, WorkspacePauseRequested(ws_id, USER), {"PAUSED"})
    gone = not psutil.pid_exists(server_pid) or \
        psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    say(f"  jupyter-server pid {server_pid} {'is gone' if gone else 'IS STILL RUNNING'}")
    snapshot = next((s for s in client.snapshots(ws_id) if s["id"] ==
                     paused["current_snapshot"]), {})

    say("resuming")
    started = time.monotonic()
    resumed = _follow(settings, bus, WorkspaceResumeRequested(ws_id, USER), {"RUNNING"})
    info = client.workspace_status(settings, ws_id) or {}
    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open(NOTEBOOK)  # the notebook re-attaches to its restored kernel
    check = nb.run(kernel, CHECK_STATE).stdout.split()
    resume_seconds = time.monotonic() - started
    intact = check[0] == digest
    say(f"  after resume: sha256 {check[0][:16]}… {'== before: intact' if intact else 'DIFFERS'}"
        f" (epoch {check[1]}, predict -> {check[2]}), no cell re-run")

    size = int(snapshot.get("bytes") or 0)
    print()
    print(f"  first start   {ws['first_start_ms'] / 1000:.2f} s")
    print(f"  pause         {paused['last_pause_ms'] / 1000:.2f} s "
          f"({size / 2**20:.0f} MiB snapshot, "
          f"{size / 2**20 / max(paused['last_pause_ms'] / 1000, 1e-3):.0f} MiB/s)")
    print(f"  resume        {resumed['last_resume_ms'] / 1000:.2f} s "
          f"(request to a checked variable: {resume_seconds:.2f} s)")
    print(f"  re-running    {float(build_seconds):.2f} s: the slow cell, as long as a model "
          f"load (STASIS_DEMO_CELL_SECONDS)")
    print(f"  so resume is  {float(build_seconds) / max(resume_seconds, 1e-3):.0f}x faster "
          f"than starting over (request to a checked variable against the cell alone)")
    print(f"  snapshot      {snapshot.get('uri')}")
    print()
    print(f"JupyterLab: {resumed['url']} (sign in first: `.venv/bin/stasis portal --as {USER}`)")
    print("The stack keeps running; stop it with `.venv/bin/stasis down`.")
    sys.exit(0 if intact and gone else 1)


if __name__ == "__main__":
    main()
