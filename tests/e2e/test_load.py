"""Half a minute of sustained load on the whole local stack (``harness.load``; the long run
is ``bench/load.py``): 20 workspaces on the null runtime paused and resumed at 3 requests a
second through Pub/Sub, the function host's two workers and Firestore. Every request must
end, in its state, and be counted in its window; the latencies and the host's memory are
printed, not asserted (speed and memory are the benchmark's to report)."""

from __future__ import annotations

import json

import pytest

from harness.load import LoadPlan, run
from tests.e2e.conftest import start_stack


@pytest.mark.timeout(600)
def test_sustained_requests_all_end_and_are_counted(tmp_path):
    gen = start_stack(tmp_path / "s", "null")
    stack = next(gen)
    try:
        plan = LoadPlan(workspaces=20, rate=3.0, seconds=30.0, window=10.0)
        report = run(stack.settings, plan, say=print)
        print(json.dumps(report, indent=1))
    finally:
        next(gen, None)
    assert report["created"]["running"] == 20
    assert report["requests"] >= 60  # 90 asked; a tick that finds all 20 busy sends none
    assert report["unfinished"] == 0, "a request never reached its state"
    assert report["latency_ms"]["n"] == report["requests"]
    windows = [w for w in report["windows"] if w["from_s"] < plan.seconds]
    assert [w["from_s"] for w in windows] == [0, 10, 20]
    assert sum(w["sent"] for w in report["windows"]) == report["requests"]
    assert all(w["done"] == w["sent"] > 0 for w in windows)  # sustained, all of it done
    # a pause commits its request and its snapshot.finished, a resume its request and its
    # workspace.ready: at least two ledgered deliveries each
    assert report["ledgered_deliveries"]["count"] >= 2 * report["requests"]
    assert report["host_rss_mib"]["end"] > 0
