"""The cost model (pure): spans from the audit history, prices from the example catalog
(gpu-small 0.70/h with one L4 and a 50 GiB disk; cpu-small 0.05/h, 10 GiB; cpu-large
0.10/h, 20 GiB; disk 0.17 and snapshots 0.02 per GiB-month), a month of 744 hours.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.domain.catalog import Catalog
from functions.domain.cost import (
    in_order,
    month_of,
    needs_lookback,
    spans,
    start_state,
    team_rollup,
    transition_from_audit,
)
from functions.domain.lifecycle import State, Workspace
from functions.domain.retention import SnapshotRecord

CATALOG = Catalog.from_config(yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml").read_text()))
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
NOW = datetime(2026, 3, 11, tzinfo=UTC)  # 240 h into a 744 h month
GIB = 2**30


def at(day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


def audit(target: str, when: datetime, reason: str, actor: str = "alice",
          accepted: bool = True) -> dict[str, Any]:
    return {"target": target, "time": when, "actor": actor, "action": "workspace.x",
            "outcome": ("accepted: " if accepted else "refused: ") + reason}


def history(*entries: dict[str, Any]) -> list[Any]:
    transitions = [transition_from_audit(e) for e in entries]
    return in_order(t for t in transitions if t is not None)


def test_audit_entries_become_transitions() -> None:
    tr = transition_from_audit(audit("ml-a--g", at(2), "pause_started", actor="idle-policy"))
    assert tr is not None and tr.state == State.PAUSING and tr.actor == "idle-policy"
    assert transition_from_audit(audit("ml-a--g", at(2), "already_paused", accepted=False)) is None
    assert transition_from_audit({"outcome": "accepted: ready"}) is None  # no time, no target


def test_transitions_of_one_instant_keep_the_lifecycle_order() -> None:
    same = [audit("ml-a--g", at(2), r) for r in ("resumed", "ready", "paused", "created",
                                                  "resume_started", "pause_started")]
    assert [t.reason for t in history(*same)] == [
        "created", "ready", "pause_started", "paused", "resume_started", "resumed"]


def test_month_of() -> None:
    month = month_of(at(31, 23, 59))
    assert (month.start, month.end, month.hours, month.label) == (
        MARCH, datetime(2026, 4, 1, tzinfo=UTC), 744.0, "2026-03")
    assert month_of(datetime(2028, 2, 10, tzinfo=UTC)).hours == 29 * 24


def test_spans_follow_the_state_and_count_auto_pauses() -> None:
    g = history(audit("ml-a--g", at(2), "created"), audit("ml-a--g", at(2, 0, 5), "ready"),
                audit("ml-a--g", at(2, 10, 5), "pause_started", actor="idle-policy"),
                audit("ml-a--g", at(2, 10, 10), "paused", actor="//runtime"),
                audit("ml-a--g", at(3, 10, 10), "resume_started"),
                audit("ml-a--g", at(3, 10, 15), "resumed"))
    assert start_state(Workspace("ml-a--g", "ml-a", "a", "g", "gpu-small"), g) is None
    span = spans(g, None, MARCH, NOW)
    assert span.hardware / 3600 == pytest.approx(192.0)
    assert span.disk / 3600 == pytest.approx(216.0)
    assert span.auto_paused / 3600 == pytest.approx(24.0)
    assert span.auto_pauses == 1
    # A pause the owner asked for saves nothing "by auto-pause".
    manual = [t if t.reason != "pause_started" else t.__class__(
        t.workspace_id, t.time, t.reason, t.state, "alice") for t in g]
    assert spans(manual, None, MARCH, NOW).auto_paused == 0


def test_the_state_at_the_start_of_the_month() -> None:
    paused = Workspace("ml-a--c", "ml-a", "a", "c", "cpu-small", state=State.PAUSED)
    assert start_state(paused, []) == State.PAUSED  # nothing happened: as it is now
    delete = history(audit("ml-a--d", at(5), "delete_started"), audit("ml-a--d", at(5, 0, 1),
                                                                      "deleted"))
    assert needs_lookback(delete)
    [before] = history(audit("ml-a--d", datetime(2026, 2, 20, tzinfo=UTC), "resumed"))
    assert start_state(paused, delete, before) == State.RUNNING
    assert start_state(paused, delete, None) is None


def test_team_rollup() -> None:
    g = Workspace("ml-a--g", "ml-a", "alice", "g", "gpu-small", state=State.RUNNING)
    c = Workspace("ml-a--c", "ml-a", "alice", "c", "cpu-small", state=State.PAUSED,
                  pause_cause="user")
    d = Workspace("ml-a--d", "ml-a", "alice", "d", "cpu-large", state=State.DELETED)
    old = Workspace("ml-a--old", "ml-a", "alice", "old", "cpu-large", state=State.DELETED)
    hist = {
        "ml-a--g": history(
            audit("ml-a--g", at(2), "created"), audit("ml-a--g", at(2, 0, 5), "ready"),
            audit("ml-a--g", at(2, 10, 5), "pause_started", actor="idle-policy"),
            audit("ml-a--g", at(2, 10, 10), "paused"),
            audit("ml-a--g", at(3, 10, 10), "resume_started"),
            audit("ml-a--g", at(3, 10, 15), "resumed")),
        "ml-a--d": history(audit("ml-a--d", at(5), "delete_started"),
                           audit("ml-a--d", at(5, 0, 1), "deleted")),
    }
    initial = {"ml-a--g": None, "ml-a--c": State.PAUSED, "ml-a--d": State.RUNNING,
               "ml-a--old": State.DELETED}
    snaps = [SnapshotRecord("ml-a--c-v4", "ml-a--c", "ml-a", bytes=GIB,
                            created_at=datetime(2026, 2, 1, tzinfo=UTC)),
             SnapshotRecord("ml-a--g-v3", "ml-a--g", "ml-a", bytes=2 * GIB, created_at=at(2),
                            status="expired", ended_at=at(4))]
    doc = team_rollup("ml-a", [g, c, d, old], hist, initial, snaps, CATALOG, NOW)
    compute = doc["compute"]
    d_hours = 96  # RUNNING until the delete; DELETING holds no hardware (it holds the disk)
    assert compute["hours"] == pytest.approx(192 + d_hours, abs=1e-3)
    assert compute["gpu_hours"] == pytest.approx(192)
    assert compute["cost"] == pytest.approx(192 * 0.70 + d_hours * 0.10, abs=1e-3)
    assert (compute["running_now"], compute["cost_per_hour_now"]) == (1, 0.70)
    assert compute["forecast_cost"] == pytest.approx(compute["cost"] + 0.70 * 504, abs=1e-3)
    disk = doc["disk"]
    per_gib_hour = 0.17 / 744
    expected_disk = (50 * 216 + 10 * 240 + 20 * (d_hours + 1 / 60)) * per_gib_hour
    assert disk["cost"] == pytest.approx(expected_disk, abs=1e-3)
    assert disk["bytes_now"] == 60 * GIB
    assert disk["forecast_cost"] == pytest.approx(expected_disk + 60 * per_gib_hour * 504,
                                                  abs=1e-3)
    snapshots = doc["snapshots"]
    assert snapshots["bytes_now"] == GIB
    assert snapshots["cost"] == pytest.approx((240 + 2 * 48) * 0.02 / 744, abs=1e-4)
    saved = doc["auto_pause"]
    assert (saved["pauses"], saved["paused_now"]) == (1, 0)
    assert saved["hours_saved"] == pytest.approx(24) and saved["gpu_hours_saved"] == 24
    assert saved["cost_saved"] == pytest.approx(24 * 0.70)
    assert doc["total"]["cost"] == pytest.approx(
        compute["cost"] + disk["cost"] + snapshots["cost"], abs=1e-3)
    assert [w["id"] for w in doc["workspaces"]] == ["ml-a--g", "ml-a--d", "ml-a--c"]
    assert (doc["month"], doc["hours_elapsed"], doc["hours_in_month"]) == ("2026-03", 240, 744)


def test_a_workspace_paused_by_the_policy_all_month_counts_as_saved() -> None:
    g = Workspace("ml-a--g", "ml-a", "alice", "g", "gpu-small", state=State.PAUSED,
                  pause_cause="idle")
    doc = team_rollup("ml-a", [g], {}, {"ml-a--g": State.PAUSED}, [], CATALOG,
                      MARCH + timedelta(hours=10))
    assert doc["auto_pause"]["hours_saved"] == pytest.approx(10)
    assert doc["auto_pause"]["paused_now"] == 1
    assert doc["compute"]["cost"] == 0


def test_snapshots_sharing_parts_pay_for_them_once() -> None:
    from functions.domain.cost import _snapshot_usage

    parts = {"_parts/a": GIB, "_parts/b": GIB}
    first = SnapshotRecord("ml-a--c-v2", "ml-a--c", "ml-a", bytes=2 * GIB, created_at=at(2),
                           status="expired", ended_at=at(4), parts=parts)
    second = SnapshotRecord("ml-a--c-v4", "ml-a--c", "ml-a", bytes=2 * GIB, created_at=at(3),
                            parts={"_parts/a": GIB, "_parts/c": GIB})
    bytes_now, gib_hours = _snapshot_usage([first, second], at(1), NOW)
    assert bytes_now == 2 * GIB  # a and c; b went with the first
    hours = (NOW - at(2)).total_seconds() / 3600  # a: from the first's start to now
    assert gib_hours == pytest.approx(hours + 48 + (hours - 24))  # + b (2 days) + c
