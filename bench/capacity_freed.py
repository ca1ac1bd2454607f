"""From capacity freed to the queued workspace RUNNING, on the local stack (prints JSON).

Starts a local stack on free ports (real jupyter-servers), declares one L4 for this node in
the admin file, runs a workspace of ml-a on it and queues one of ml-b behind it (the same
priority: it waits), then pauses the first and times, from the moment its PAUSED was
committed (the accelerator given back):

- ``to_admitted_ms``: until the queued one's start was committed (PROVISIONING): the
  pause's outbox runs a scheduler pass, whose workspace.scheduled goes through Pub/Sub to
  the lifecycle, which checks the quota and the node again;
- ``to_running_ms``: until it is RUNNING (its JupyterLab started and reported ready).

The roles swap each round (the paused one is queued again behind the other).
Timestamps are the documents' own (``updated_at``, the functions' clock on this host).

    .venv/bin/python bench/capacity_freed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests
import yaml
from common import summary
from google.cloud import firestore

from events import (
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.publishers import OPERATOR
from stack import admin, local, processes
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def wait(db: firestore.Client, ws_id: str, state: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = db.collection("workspaces").document(ws_id).get().to_dict() or {}
        if doc.get("state") == state:
            return doc
        if doc.get("state") == "FAILED":
            raise RuntimeError(f"{ws_id} FAILED: {doc.get('state_message')}")
        time.sleep(0.02)
    raise TimeoutError(f"{ws_id} not {state} after {timeout}s")


def transition_at(db: firestore.Client, ws_id: str, reason: str, after: Any) -> Any:
    """When the audit log says ``ws_id`` took ``reason`` (the first after ``after``)."""
    for _ in range(500):
        rows = [d.to_dict() for d in db.collection("audit").where(
            filter=firestore.FieldFilter("target", "==", ws_id)).stream()]
        times = sorted(r["time"] for r in rows if r.get("outcome") == f"accepted: {reason}"
                       and r["time"] > after)
        if times:
            return times[0]
        time.sleep(0.02)
    raise TimeoutError(f"no {reason} of {ws_id}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = processes.on_free_ports(Settings(project=f"bench-{uuid.uuid4().hex[:8]}",
                                                data_dir=Path(tempfile.mkdtemp()) / "stack"))
    os.environ.update(settings.emulator_env())
    os.environ.update({f"STASIS_{n.upper()}_PORT": str(p) for n, p in settings.ports().items()})
    local.up(settings, runtime="local")
    try:
        node = requests.get(f"{settings.node_agent_url}/capabilities",
                            headers=settings.node_agent_headers(), timeout=10).json()
        config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
        config["scheduling"] = {"nodes": [{"id": node["node"],
                                           "accelerators": {"nvidia-l4": 1}}]}
        admin.apply(settings, copy.deepcopy(config), actor="bench")
        bus = PubSubBus(settings.project, origin=OPERATOR)
        db = firestore.Client(project=settings.project)
        a, b = ("ml-a", "alice", "ml-a--one"), ("ml-b", "carol", "ml-b--two")
        bus.publish(new_event(WorkspaceRequested("ml-a", "alice", "one", "gpu-small"),
                              source="//bench"))
        wait(db, a[2], "RUNNING")
        bus.publish(new_event(WorkspaceRequested("ml-b", "carol", "two", "gpu-small"),
                              source="//bench"))
        wait(db, b[2], "QUEUED")
        admitted, running = [], []
        holder, queued = a, b
        for _ in range(args.rounds):
            bus.publish(new_event(WorkspacePauseRequested(holder[2], holder[1]),
                                  source="//bench"))
            paused = wait(db, holder[2], "PAUSED")["updated_at"]
            start = transition_at(db, queued[2], "created" if not running else
                                  "resume_started", paused)
            up = wait(db, queued[2], "RUNNING")["updated_at"]
            admitted.append((start - paused).total_seconds() * 1000)
            running.append((up - paused).total_seconds() * 1000)
            bus.publish(new_event(WorkspaceResumeRequested(holder[2], holder[1]),
                                  source="//bench"))
            wait(db, holder[2], "QUEUED")
            holder, queued = queued, holder
        print(json.dumps({"rounds": args.rounds, "to_admitted_ms": summary(admitted),
                          "to_running_ms": summary(running)}, indent=2))
    finally:
        local.down(settings, pause=False)


if __name__ == "__main__":
    main()
