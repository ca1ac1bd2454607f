"""The idle sweep at fleet size: seconds, Firestore reads and writes per sweep (prints JSON).

Starts a private Firestore emulator, seeds N RUNNING workspaces (default 10,000) and as many
PAUSED ones (which the sweep must not read: candidates come from a query on ``state``), in
batched writes, then times ``functions.handlers.idle.sweep``:

- ``noop``: every workspace active; the sweep must write nothing (and publish nothing);
- ``one_percent_idle``: 1% idle; the sweep still writes nothing itself and publishes one
  workspace.idle_detected each; the idle handler then costs one read and no write each
  (the pauses themselves are the lifecycle's, one transition each, not measured here);
- ``too_young``: every workspace started 10 minutes ago; no pause rule can apply, so the
  runtime is not even asked for signals.

Reads and writes are counted at the RPC level of the one Firestore client everything uses
(``harness.metering``). Signals come from an in-memory table: this measures the control
plane's side; on the local stack each asked workspace costs one HTTP call to the node agent
(8 in parallel).

    .venv/bin/python bench/idle_sweep.py [--workspaces 10000] [--sweeps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from google.cloud import firestore

from events import Event
from functions.adapters.firestore_store import FirestoreStore, workspace_to_doc
from functions.adapters.fleet_store import FleetStore
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from functions.handlers import idle
from functions.handlers.deps import Deps
from harness.metering import FirestoreMeter
from stack import processes
from stack.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))
NOW = datetime(2026, 6, 10, 12, 0, tzinfo=UTC)
PROFILES = ("cpu-small", "cpu-large", "gpu-small")


class _Bus:
    def __init__(self) -> None:
        self.events: list[Event[Any]] = []

    def publish(self, event: Event[Any]) -> str:
        self.events.append(event)
        return event.id

    def dead_letter(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("no dead letters here")


def _seed(db: firestore.Client, count: int, state: State, prefix: str,
          started: datetime) -> list[str]:
    def workspace(i: int) -> Workspace:
        team, name = ("ml-a", "ml-b")[i % 2], f"{prefix}{i}"
        return Workspace(id=f"{team}--{name}", team=team, owner="bench", name=name,
                         profile=PROFILES[i % len(PROFILES)], state=state, state_reason="ready",
                         version=2, created_at=started, updated_at=started,
                         last_activity=started)

    def write(chunk: range) -> list[str]:
        batch = db.batch()
        ids = []
        for i in chunk:
            ws = workspace(i)
            batch.set(db.collection("workspaces").document(ws.id), workspace_to_doc(ws))
            ids.append(ws.id)
        batch.commit()
        return ids

    chunks = [range(i, min(i + 500, count)) for i in range(0, count, 500)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return [ws_id for ids in pool.map(write, chunks) for ws_id in ids]


def _sweep(deps: Deps, meter: FirestoreMeter, bus: _Bus,
           activity: dict[str, dict[str, Any]]) -> dict[str, Any]:
    meter.reset()
    bus.events.clear()
    started = time.perf_counter()
    report = idle.sweep(deps, activity=activity.get)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "reads": meter.reads, "writes": meter.writes,
            "events": len(bus.events), "checked": report["checked"],
            "asked_runtime": report["asked_runtime"], "verdicts": report["verdicts"]}


def _signals(ids: list[str], now: datetime, idle_ids: set[str]) -> dict[str, dict[str, Any]]:
    return {ws_id: {"workspace_id": ws_id, "busy_kernels": 0, "connections": 1,
                    "observed_at": now.isoformat(),
                    "last_activity": (now - timedelta(hours=3 if ws_id in idle_ids
                                                      else 0, minutes=2)).isoformat()}
            for ws_id in ids}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = runs[0]
    return {"seconds_median": round(statistics.median(r["seconds"] for r in runs), 3),
            "seconds_each": [round(r["seconds"], 3) for r in runs],
            "reads": first["reads"], "writes": max(r["writes"] for r in runs),
            "events_published": first["events"], "checked": first["checked"],
            "asked_runtime": first["asked_runtime"], "verdicts": first["verdicts"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspaces", type=int, default=10_000)
    parser.add_argument("--sweeps", type=int, default=3)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    settings = processes.on_free_ports(Settings(project="bench-idle", data_dir=data_dir))
    service = processes.start(processes.firestore_spec(settings), timeout=120)
    try:
        os.environ["FIRESTORE_EMULATOR_HOST"] = settings.firestore_host
        db = firestore.Client(project=settings.project)
        began = time.perf_counter()
        running = _seed(db, args.workspaces, State.RUNNING, "r", NOW - timedelta(hours=6))
        _seed(db, args.workspaces, State.PAUSED, "p", NOW - timedelta(hours=6))
        seed_seconds = time.perf_counter() - began
        meter = FirestoreMeter.install(db)
        bus = _Bus()
        clock = {"now": NOW}
        deps = Deps(store=FirestoreStore(db), bus=bus, runtime=None,  # type: ignore[arg-type]
                    snapshots=None, catalog=lambda: CATALOG,  # type: ignore[arg-type]
                    clock=lambda: clock["now"], snapshot_bucket="bench", dead_letters=bus,
                    fleet=FleetStore(db))
        active = _signals(running, NOW, set())
        noop = [_sweep(deps, meter, bus, active) for _ in range(args.sweeps)]
        idle_ids = set(running[:: 100])
        some_idle = [_sweep(deps, meter, bus, _signals(running, NOW, idle_ids))
                     for _ in range(args.sweeps)]
        # The idle handler on what the last sweep published: one read, no write each.
        meter.reset()
        started = time.perf_counter()
        paused = sum(1 for event in list(bus.events)
                     if (v := idle.handle(event, deps, "on_idle_detected")) and v.pause)
        handler_seconds = time.perf_counter() - started
        handler = {"events": len(idle_ids), "pause_requests": paused, "reads": meter.reads,
                   "writes": meter.writes, "seconds": round(handler_seconds, 3)}
        clock["now"] = NOW - timedelta(hours=6) + timedelta(minutes=10)
        young = [_sweep(deps, meter, bus, active) for _ in range(args.sweeps)]
        print(json.dumps({
            "workspaces_running": len(running), "workspaces_paused": args.workspaces,
            "seed_seconds": round(seed_seconds, 1), "cpus": os.cpu_count(),
            "noop": _summary(noop), "one_percent_idle": _summary(some_idle),
            "idle_handler": handler, "too_young": _summary(young),
        }, indent=2))
    finally:
        processes.stop(service)


if __name__ == "__main__":
    main()
