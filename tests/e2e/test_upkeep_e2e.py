"""Idle auto-pause, the janitor and the cost rollup on the local stack (null runtime),
driven through the `stasis` CLI and the events the node agent or cluster monitor publish.

The module's stack gets a catalog with one extra profile, ``cpu-quick`` (pause after 1 s
idle, keep the last snapshot only), so that idleness and retention can be shown in seconds
rather than hours. It is applied seconds after the stack started: a function host worker
may hold a cached catalog without it, and reads the catalog again when an event names the
new profile (``functions.ports.catalog_knowing``; before that, such a worker ignored the
idle report and this module failed once in CI).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from events import WorkspacePauseRequested, WorkspaceResumeRequested, new_event
from functions.adapters.pubsub_bus import PubSubBus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(null_stack, tmp_path_factory):
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    quick = copy.deepcopy(next(p for p in config["profiles"] if p["id"] == "cpu-small"))
    quick.update(id="cpu-quick", title="Pauses after 1 s idle (tests)",
                 idle_policy={"rules": [{"idle_seconds": 1, "effect": "pause"}]})
    quick["snapshot"]["retention"] = {"max_age_days": 30, "keep_last": 1}
    config["profiles"].append(quick)
    next(t for t in config["teams"] if t["id"] == "ml-a")["profiles"].append("cpu-quick")
    path = tmp_path_factory.mktemp("config") / "stasis.yaml"
    path.write_text(yaml.safe_dump(config))
    null_stack.cli("admin", "apply", str(path))
    return null_stack


def _state(stack, ws_id: str, state: str) -> dict:
    return stack.wait_for(lambda: (d := stack.workspace(ws_id)) and d["state"] == state and d,
                          timeout=60, what=f"{ws_id} {state}")


def test_an_idle_signal_pauses_through_the_stack_and_the_owner_reads_why(stack):
    stack.cli("ws", "create", "quiet", "--team", "ml-a", "--profile", "cpu-quick", "--wait")
    now = datetime.now(UTC)
    changes = stack.subscribe("stasis-workspace-state-changed")
    busy = {"workspace_id": "ml-a--quiet", "last_activity": (now - timedelta(hours=1)).isoformat(),
            "observed_at": (now + timedelta(seconds=2)).isoformat(), "busy_kernels": 1}
    # as cluster monitoring would: the CLI itself may send requests only
    stack.cli("events", "publish", "workspace.idle_detected", "--origin", "monitor",
              "--data", json.dumps(busy))
    idle = {**busy, "busy_kernels": 0, "observed_at": (now + timedelta(seconds=3)).isoformat()}
    stack.cli("events", "publish", "workspace.idle_detected", "--origin", "monitor",
              "--data", json.dumps(idle))
    doc = _state(stack, "ml-a--quiet", "PAUSED")
    assert doc["pause_cause"] == "idle"
    status = json.loads(stack.cli("ws", "status", "quiet", "--team", "ml-a", "--json").stdout)
    assert status["state_message"].startswith("idle policy: no activity for")
    assert "resume with `stasis ws resume quiet --team ml-a`" in status["state_message"]
    messages = [json.loads(m.data) for m in stack.pull(changes, want=2)]
    assert [(m["to_state"], m["message"].startswith("idle policy")) for m in messages
            if m["workspace_id"] == "ml-a--quiet"] == [("PAUSING", True), ("PAUSED", True)]


def test_the_cli_runs_the_sweep_the_janitor_and_the_cost_rollup(stack):
    stack.cli("ws", "create", "snappy", "--team", "ml-a", "--profile", "cpu-quick", "--wait")
    sweep = json.loads(stack.cli("idle", "sweep", "--dry-run", "--json").stdout)
    assert sweep["checked"] >= 1 and sweep["dry_run"] and "errors" in sweep
    # Two pauses: cpu-quick keeps the last snapshot only, so the first one expires.
    bus = PubSubBus(stack.settings.project, origin="operator")
    for _ in range(2):
        bus.publish(new_event(WorkspacePauseRequested("ml-a--snappy", actor="dev")))
        doc = _state(stack, "ml-a--snappy", "PAUSED")
        bus.publish(new_event(WorkspaceResumeRequested("ml-a--snappy", actor="dev")))
        _state(stack, "ml-a--snappy", "RUNNING")
    first = "ml-a--snappy-v3"
    assert doc["current_snapshot"] != first
    report = json.loads(stack.cli("janitor", "--json").stdout)
    assert {(r["snapshot_id"], r["reason"]) for r in report["expire"]} >= {(first, "keep_last")}
    out = stack.cli("janitor").stdout
    assert f"{first} (0 B): keep_last" in out and "stasis janitor --fix" in out
    fixed = json.loads(stack.cli("janitor", "--fix", "--json").stdout)
    assert fixed["done"]["expiry_events"] >= 1
    stack.wait_for(lambda: (stack.db.collection("snapshots").document(first).get().to_dict()
                            or {}).get("status") == "expired", what=f"{first} expired")
    assert json.loads(stack.cli("janitor", "--json").stdout)["expire"] == []

    rollup = json.loads(stack.cli("cost", "--team", "ml-a", "--json").stdout)
    assert rollup["team"] == "ml-a" and rollup["compute"]["running_now"] >= 1
    assert rollup["compute"]["hours"] > 0
    stored = stack.db.collection("costs").document("ml-a").get().to_dict()
    assert stored["month"] == rollup["month"]
    text = stack.cli("cost", "--team", "ml-a").stdout
    assert "team ml-a" in text and "auto-pause saved" in text
    unknown = stack.cli("cost", "--team", "nope", check=False)
    assert unknown.returncode == 1 and "there is no team nope" in unknown.stderr
