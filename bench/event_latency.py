"""Publish -> push -> function -> Firestore: how long one event takes to land (prints JSON).

Starts a private local stack (null runtime) on free ports, publishes N workspace.requested
events one after the other and times each from publish until its workspace document
exists in Firestore. Also reports `stasis up`'s own step timings.

    .venv/bin/python bench/event_latency.py [--count 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import private_stack
from google.cloud import firestore

from events import WorkspaceRequested, new_event
from functions.adapters.pubsub_bus import PubSubBus
from functions.domain.publishers import OPERATOR


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    began = time.monotonic()
    with private_stack() as (settings, report):
        up_seconds = time.monotonic() - began
        bus = PubSubBus(settings.project, origin=OPERATOR)
        db = firestore.Client(project=settings.project)
        latencies = []
        for i in range(args.count):
            name = f"lat-{i}"
            ref = db.collection("workspaces").document(f"ml-a--{name}")
            event = new_event(WorkspaceRequested(team="ml-a", owner="dev", name=name,
                                                 profile="cpu-small"), source="//bench")
            start = time.perf_counter()
            bus.publish(event)
            while not ref.get().exists:
                time.sleep(0.002)
            latencies.append((time.perf_counter() - start) * 1000)
        latencies.sort()
        print(json.dumps({
            "stack_up_seconds": round(up_seconds, 2),
            "stack_up_steps": {k: round(v, 2) for k, v in report.seconds.items()},
            "events": args.count,
            "publish_to_firestore_ms": {
                "median": round(statistics.median(latencies), 1),
                "p95": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
                "min": round(latencies[0], 1), "max": round(latencies[-1], 1)},
        }, indent=2))


if __name__ == "__main__":
    main()
