"""The idle rules as a table: workspace x signals x policy -> verdict (pure, time passed in).

Policies are the example catalog's (cpu-small: pause after 1 h idle, 10 min grace after a
resume; gpu-small: after 20 min idle once it ran an hour, else after 1 h; 15 min grace;
12 h maximum age) plus small hand-made ones for the corners.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from events import WorkspaceIdleDetected, new_event
from functions.domain import idle
from functions.domain.catalog import Catalog, IdleEffect, IdlePolicy, IdleRule
from functions.domain.idle import IdleReason, Signals, evaluate, needs_signals
from functions.domain.lifecycle import State, Workspace

CATALOG = Catalog.from_config(yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml").read_text()))
CPU = CATALOG.profiles["cpu-small"].idle_policy
GPU = CATALOG.profiles["gpu-small"].idle_policy
NOW = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
H, M = 3600, 60


def ws(*, running_for: int = 10 * H, reason: str = "ready", state: State = State.RUNNING,
       profile: str = "cpu-small", last_activity_ago: int | None = None) -> Workspace:
    since = NOW - timedelta(seconds=running_for)
    last = NOW - timedelta(seconds=last_activity_ago) if last_activity_ago is not None else since
    return Workspace(id="ml-a--nb", team="ml-a", owner="alice", name="nb", profile=profile,
                     state=state, state_reason=reason, version=7, updated_at=since,
                     created_at=since - timedelta(minutes=2), last_activity=last)


def sig(idle_for: int | None, *, busy: int = 0, gpu: float | None = None, connections: int = 0,
        observed_ago: int = 5) -> Signals:
    return Signals(observed_at=NOW - timedelta(seconds=observed_ago),
                   last_activity=None if idle_for is None else NOW - timedelta(seconds=idle_for),
                   busy_kernels=busy, connections=connections, gpu_utilization=gpu)


CASES = [
    # (id, workspace, policy, signals, pause?, reason)
    ("idle past the hour pauses", ws(), CPU, sig(61 * M), True, IdleReason.IDLE),
    ("idle just under the hour stays", ws(), CPU, sig(59 * M), False, IdleReason.ACTIVE),
    ("idle exactly the hour pauses", ws(), CPU, sig(60 * M), True, IdleReason.IDLE),
    ("a busy kernel is never idle", ws(), CPU, sig(5 * H, busy=1), False, IdleReason.BUSY),
    ("a busy GPU is work", ws(profile="gpu-small"), GPU, sig(5 * H, gpu=87.0), False,
     IdleReason.BUSY),
    ("an idle GPU is not", ws(profile="gpu-small"), GPU, sig(2 * H, gpu=0.0), True,
     IdleReason.IDLE),
    ("an open browser alone is not activity", ws(), CPU, sig(2 * H, connections=3), True,
     IdleReason.IDLE),
    ("just resumed, stale timestamp: grace", ws(running_for=5 * M, reason="resumed"), CPU,
     sig(30 * H), False, IdleReason.GRACE),
    ("after a failed pause: grace too", ws(running_for=5 * M, reason="snapshot_failed"), CPU,
     sig(30 * H), False, IdleReason.GRACE),
    ("resumed, grace over, idle again: pauses",
     ws(running_for=70 * M, reason="resumed"), CPU, sig(65 * M), True, IdleReason.IDLE),
    ("resumed 20 min ago: a stale last_activity counts from the resume",
     ws(running_for=20 * M, reason="resumed"), CPU, sig(30 * H), False, IdleReason.TOO_EARLY),
    ("fresh GPU workspace loading a model: rule 1 needs an hour running",
     ws(running_for=40 * M, profile="gpu-small"), GPU, sig(30 * M), False,
     IdleReason.TOO_EARLY),
    ("GPU running 2 h, idle 25 min: rule 1", ws(running_for=2 * H, profile="gpu-small"), GPU,
     sig(25 * M), True, IdleReason.IDLE),
    ("max age pauses an active workspace", ws(running_for=13 * H, profile="gpu-small"), GPU,
     sig(1 * M), True, IdleReason.MAX_AGE),
    ("max age waits for a busy cell", ws(running_for=13 * H, profile="gpu-small"), GPU,
     sig(1 * M, busy=2), False, IdleReason.BUSY),
    ("max age needs no signals", ws(running_for=13 * H, profile="gpu-small"), GPU, None, True,
     IdleReason.MAX_AGE),
    ("no signals, no pause", ws(), CPU, None, False, IdleReason.NO_SIGNALS),
    ("stale signals are not acted on", ws(), CPU, sig(5 * H, observed_ago=20 * M), False,
     IdleReason.STALE_SIGNALS),
    ("not running", ws(state=State.PAUSED), CPU, sig(5 * H), False, IdleReason.NOT_RUNNING),
    ("the document's own last activity is newer than the runtime's",
     ws(last_activity_ago=10 * M), CPU, sig(5 * H), False, IdleReason.ACTIVE),
]


@pytest.mark.parametrize(("workspace", "policy", "signals", "pause", "reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verdict(workspace: Workspace, policy: IdlePolicy, signals: Signals | None, pause: bool,
                 reason: IdleReason) -> None:
    verdict = evaluate(workspace, policy, signals, NOW)
    assert (verdict.pause, verdict.reason) == (pause, reason), verdict.message
    assert verdict.message


def test_first_matching_rule_wins_and_none_shields() -> None:
    policy = IdlePolicy((IdleRule(30 * M, 0, IdleEffect.NONE),
                         IdleRule(10 * M, 0, IdleEffect.PAUSE)))
    shielded = evaluate(ws(), policy, sig(45 * M), NOW)
    assert (shielded.pause, shielded.reason, shielded.rule) == (False, IdleReason.RULE_NONE, 1)
    # Under the first rule's threshold, the second applies.
    paused = evaluate(ws(), policy, sig(15 * M), NOW)
    assert (paused.pause, paused.rule) == (True, 2)


def test_an_empty_rule_list_never_pauses_for_idleness() -> None:
    verdict = evaluate(ws(), IdlePolicy(()), sig(100 * H), NOW)
    assert (verdict.pause, verdict.reason) == (False, IdleReason.TOO_EARLY)


def test_the_pause_says_why_in_words_and_how_to_resume() -> None:
    verdict = evaluate(ws(), CPU, sig(62 * M), NOW)
    assert verdict.cause == "idle" and verdict.idle_seconds == 62 * M
    assert verdict.message == ("idle policy: no activity for 1h 2m; profile cpu-small pauses "
                               "after 1h idle (rule 1); resume with "
                               "`stasis ws resume nb --team ml-a`")
    old = evaluate(ws(running_for=12 * H + 5 * M, profile="gpu-small"), GPU, sig(0), NOW)
    assert old.cause == "schedule"
    assert "running for 12h 5m, the most profile gpu-small allows (12h)" in old.message


def test_needs_signals_skips_what_no_signal_can_change() -> None:
    assert not needs_signals(ws(running_for=20 * M), CPU, NOW)  # too early for 1 h idle
    assert not needs_signals(ws(running_for=5 * M, reason="resumed"), CPU, NOW)  # grace
    assert not needs_signals(ws(state=State.PAUSING), CPU, NOW)
    assert needs_signals(ws(running_for=2 * H), CPU, NOW)
    assert needs_signals(ws(running_for=13 * H, profile="gpu-small"), GPU, NOW)  # busy?


def test_the_pause_request_id_is_per_version() -> None:
    first = ws()
    assert idle.pause_request_id(first) == "idle-ml-a--nb-v7"
    assert idle.pause_request_id(dataclasses.replace(first, version=9)) == "idle-ml-a--nb-v9"


def test_signals_from_the_event_and_from_the_node_agent() -> None:
    payload = WorkspaceIdleDetected(workspace_id="ml-a--nb", last_activity="2026-03-10T13:00:00Z",
                                    observed_at="2026-03-10T14:59:58+00:00", busy_kernels=0,
                                    connections=2, gpu_utilization=3.5)
    new_event(payload)  # the payload is valid
    from_event = Signals.from_event(payload)
    assert from_event.last_activity == datetime(2026, 3, 10, 13, tzinfo=UTC)
    assert (from_event.connections, from_event.gpu_utilization) == (2, 3.5)
    agent = {"workspace_id": "ml-a--nb", "last_activity": "2026-03-10T13:00:00.123456Z",
             "busy_kernels": 1, "kernels": 2, "connections": 0,
             "observed_at": "2026-03-10T14:59:59+00:00"}
    from_agent = Signals.from_activity(agent, NOW)
    assert from_agent.busy_kernels == 1 and from_agent.gpu_utilization is None
    assert evaluate(ws(), CPU, from_agent, NOW).reason == IdleReason.BUSY
    # jupyter-server before it saw any activity: no last_activity at all.
    quiet = Signals.from_activity({"busy_kernels": 0}, NOW)
    assert quiet.last_activity is None and quiet.observed_at == NOW
    assert evaluate(ws(running_for=2 * H), CPU, quiet, NOW).pause  # idle since it started


# -- a GPU-idle alert of cluster monitoring is evidence about the GPU only --------------------
def _alert(duty: float | None = 0.0, observed_ago: int = 30) -> Signals:
    """What workspace.idle_detected with cause gpu_idle carries (last activity: when seen)."""
    seen = NOW - timedelta(seconds=observed_ago)
    return Signals(observed_at=seen, last_activity=seen, gpu_utilization=duty)


def test_a_gpu_alert_needs_the_runtime_to_say_anything() -> None:
    assert idle.corroborated(_alert(), None) is None
    verdict = evaluate(ws(profile="gpu-small"), GPU, idle.corroborated(_alert(), None), NOW)
    assert (verdict.pause, verdict.reason) == (False, IdleReason.NO_SIGNALS)


def test_a_quiet_gpu_does_not_pause_a_busy_kernel_or_a_user_at_work() -> None:
    running_cell = idle.corroborated(_alert(), sig(2 * H, busy=1))
    assert evaluate(ws(profile="gpu-small"), GPU, running_cell, NOW).reason == IdleReason.BUSY
    typing = idle.corroborated(_alert(), sig(3 * M))
    assert evaluate(ws(profile="gpu-small"), GPU, typing, NOW).reason == IdleReason.ACTIVE


def test_a_quiet_gpu_and_idle_kernels_pause_by_the_profiles_rule() -> None:
    joined = idle.corroborated(_alert(), sig(2 * H))
    assert joined is not None and joined.last_activity == NOW - timedelta(seconds=2 * H)
    verdict = evaluate(ws(profile="gpu-small"), GPU, joined, NOW)
    assert (verdict.pause, verdict.reason, verdict.rule) == (True, IdleReason.IDLE, 1)


def test_the_gpu_is_busy_if_either_saw_it_busy_and_the_older_observation_counts() -> None:
    assert idle.corroborated(_alert(duty=2.0), sig(2 * H, gpu=55.0)).gpu_utilization == 55.0
    assert idle.corroborated(_alert(duty=40.0), sig(2 * H)).gpu_utilization == 40.0
    assert idle.corroborated(_alert(duty=None), sig(2 * H)).gpu_utilization is None
    stale = idle.corroborated(_alert(observed_ago=11 * M), sig(2 * H))
    assert evaluate(ws(profile="gpu-small"), GPU, stale, NOW).reason == IdleReason.STALE_SIGNALS
