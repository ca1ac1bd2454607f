"""First start, pause and resume on the whole local stack, with and without the warm pool.

    .venv/bin/python bench/resume.py [--sizes 256M,1G] [--rounds 5] [--pools 0,1,1:1]

A private local stack (free ports, its own data dir, real Jupyter servers and kernels). For
each warm-pool size (applied as the admin file's ``environments[].warm_pool`` of the
example config; ``S:K`` also keeps ``K`` warm kernels, ``environments[].warm_kernels``)
and each state size: a workspace is created (first start: request ->
RUNNING, and the agent's ``first_start_ms``), a kernel builds the state, then ``rounds``
times: the state changes (every byte, so no pause is cheaper for being incremental), pause
(request -> PAUSED), resume (request -> RUNNING **and** the variable checked in the
restored kernel, which is what a user waits for). Prints one JSON object: p50/max per
figure, the targets of issue 20, and the load average before and after (the machine is
shared: read the numbers with it). ``phases_p50_s`` says where the time went, from the node
agent's own breakdown (GET /workspaces/<id> ``phases_ms``): a pause's ``request_to_agent``
(the request through Pub/Sub and the function to the agent's accepting it), capture
phases and ``snapshot_to_paused`` (snapshot.finished through the control plane to PAUSED
seen; the server is released after that); a resume's
manifest read, server start, kernel start and ready, download and unpickle inside the
kernel, sessions, ``control_plane`` (the recorded request -> RUNNING less the agent's
part) and ``after_running`` (RUNNING seen to the variable printed: the bench's notebook
reopened and asked).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary

TEAM, USER, NOTEBOOK = "ml-a", "dev", "bench.ipynb"
TARGETS = {"resume_256M_p50_s": 1.0, "pause_256M_p50_s": 1.5, "resume_1G_s": 2.5,
           "first_start_p50_s": 1.0}


def _size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


def _follow(settings: Any, payload: Any, until: set[str]) -> dict[str, Any]:
    from events import new_event
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import OPERATOR
    from stasis_cli import client

    event = new_event(payload, source="//stasis/bench", requestid=uuid.uuid4().hex)
    PubSubBus(settings.project, origin=OPERATOR).publish(event)
    outcome = client.follow(settings, event, until=until)
    if not outcome.get("ok"):
        raise SystemExit(f"bench: {payload.__class__.__name__} failed: {outcome}")
    return dict(outcome["workspace"])


def _notebook(settings: Any, ws_id: str) -> Any:
    from harness.notebook import Notebook
    from stasis_cli import client

    info = client.workspace_status(settings, ws_id) or {}
    return Notebook(info["direct_url"], info["token"])


def _agent_phases(settings: Any, ws_id: str) -> dict[str, dict[str, int]]:
    """The node agent's breakdown of its last snapshot, release and restore (ms)."""
    import requests

    answer = requests.get(f"{settings.node_agent_url}/workspaces/{ws_id}",
                          headers=settings.node_agent_headers(), timeout=5)
    answer.raise_for_status()
    return dict(answer.json().get("phases_ms") or {})


def _phase_summary(samples: list[dict[str, int]]) -> dict[str, float]:
    """p50 seconds of every phase seen in ``samples``."""
    names = sorted({name for sample in samples for name in sample})
    return {name: summary([s.get(name, 0) / 1000 for s in samples], 3)["p50"]
            for name in names}


def _wait_pool(settings: Any, want: int, timeout: float = 120) -> None:
    """Until the warm servers (at least ``want``) and the warm kernels wait, filled."""
    from stack import local

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = local.warm_pools(settings) or {}
        pools = seen.get("environments", {})
        kernels = (seen.get("kernels") or {}).get("environments", {})
        if all(p["waiting"] >= min(p["size"], want) for p in pools.values()) and \
                all(p["waiting"] >= p["size"] for p in kernels.values()):
            return
        time.sleep(0.2)


def run_one(settings: Any, size: int, rounds: int, pool: int, kernels: int = 0
            ) -> dict[str, Any]:
    from events import (
        WorkspaceDeleteRequested,
        WorkspacePauseRequested,
        WorkspaceRequested,
        WorkspaceResumeRequested,
    )
    from events.payloads import workspace_id

    name = f"b{pool}k{kernels}-{size >> 20}m-{uuid.uuid4().hex[:4]}"
    ws_id = workspace_id(TEAM, name)
    _wait_pool(settings, pool)
    began = time.monotonic()
    ws = _follow(settings, WorkspaceRequested(team=TEAM, owner=USER, name=name,
                                              profile="cpu-large"), {"RUNNING"})
    first = {"wall_s": time.monotonic() - began, "first_start_s": ws["first_start_ms"] / 1000}
    nb = _notebook(settings, ws_id)
    kernel = nb.open(NOTEBOOK)
    nb.run(kernel, f"import numpy as np\nstate = np.zeros({size // 8}, dtype=np.float64)")
    pauses, resumes, restores = [], [], []
    phases: dict[str, list[dict[str, int]]] = {"pause": [], "resume": []}
    for i in range(rounds):
        nb.run(kernel, "state += 1")  # every byte changes: a full pause, not an incremental one
        _wait_pool(settings, pool)
        began, asked_at = time.monotonic(), time.time()
        paused = _follow(settings, WorkspacePauseRequested(ws_id, USER), {"PAUSED"})
        pauses.append(time.monotonic() - began)
        snapshot = dict(_agent_phases(settings, ws_id)["snapshot"])
        to_agent = snapshot.pop("accepted_at_ms") - int(asked_at * 1000)
        phases["pause"].append({**{f"snapshot.{k}": v for k, v in snapshot.items()},
                                "request_to_agent": to_agent, "snapshot_to_paused": int(
                                    pauses[-1] * 1000) - to_agent - snapshot["total"]})
        _wait_pool(settings, pool)
        began = time.monotonic()
        resumed = _follow(settings, WorkspaceResumeRequested(ws_id, USER), {"RUNNING"})
        nb = _notebook(settings, ws_id)
        kernel = nb.open(NOTEBOOK)
        seen = nb.run(kernel, "print(float(state[0]), state.nbytes)").stdout.split()
        resumes.append(time.monotonic() - began)
        restores.append(resumed["last_resume_ms"] / 1000)
        restored = _agent_phases(settings, ws_id)["restore"]
        phases["resume"].append({**restored, "control_plane": int(
            restores[-1] * 1000) - restored["total"], "after_running": int(
            (resumes[-1] - restores[-1]) * 1000)})
        if seen != [f"{i + 1}.0", str(size // 8 * 8)]:
            raise SystemExit(f"bench: the state came back wrong: {seen}")
        del paused
    _follow(settings, WorkspaceDeleteRequested(ws_id, USER), {"DELETED"})
    return {"warm_pool": pool, "warm_kernels": kernels, "bytes": size, "first_start": first,
            "pause_s": summary(pauses, 2), "resume_to_variable_s": summary(resumes, 2),
            "resume_recorded_s": summary(restores, 2),
            "phases_p50_s": {kind: _phase_summary(samples) for kind, samples in phases.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="256M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pools", default="0,1")
    args = parser.parse_args()
    import yaml
    from common import private_stack

    from stack import admin

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" /
                             "stasis.yaml").read_text())
    load_before = os.getloadavg()
    results = []
    with private_stack(runtime="local") as (settings, _report):
        for item in args.pools.split(","):
            head, _, tail = item.partition(":")
            pool, kernels = int(head or 0), int(tail or 0)
            for env in config["environments"]:
                mine = env["id"] == "python-3-11"
                env["warm_pool"] = pool if mine else 0
                env["warm_kernels"] = kernels if mine else 0
            admin.apply(settings, config, actor="bench")
            for size in [_size(s) for s in args.sizes.split(",")]:
                results.append(run_one(settings, size, args.rounds, pool, kernels))
    print(json.dumps({"runs": results, "targets": TARGETS,
                      "load_before": [round(x, 1) for x in load_before],
                      "load_after": [round(x, 1) for x in os.getloadavg()],
                      "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
