"""The scheduler's plan as tables: who starts, who waits and why, whom a waiting request
preempts by pause (and whom never), borrowing and reclaim within a cohort, the maximum
wait, and the estimates. Pure: every input is written out, ``now`` is fixed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.domain import scheduling
from functions.domain.catalog import DeclaredNode, IdleEffect, IdlePolicy, IdleRule, Quotas
from functions.domain.quota import Usage
from functions.domain.scheduling import (
    Budget,
    Demand,
    Holding,
    Node,
    Waiting,
    expected_release,
    nodes_of,
    plan,
    with_declared,
)

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
L4 = Demand("nvidia-l4", 1)
INTERACTIVE, BATCH, BACKGROUND = 1000, 500, 100


def wait(ws: str, priority: int = INTERACTIVE, *, ago: int = 60, demand: Demand | None = L4,
         max_wait: int | None = None, version: int = 1) -> Waiting:
    return Waiting(ws, ws.split("--")[0], version, priority, f"p{priority}",
                   NOW - timedelta(seconds=ago), demand, max_wait)


def hold(ws: str, priority: int = BACKGROUND, *, node: str | None = "n1",
         busy: bool | None = False, state: str = "RUNNING", since: int = 600,
         demand: Demand | None = L4, **kw: Any) -> Holding:
    return Holding(ws, ws.split("--")[0], 3, priority, f"p{priority}", state, demand,
                   node=node, running_since=NOW - timedelta(seconds=since), busy=busy, **kw)


def budgets(**teams: tuple[int, int]) -> dict[str, Budget]:
    """team=(GPU quota, GPUs used), no cohort."""
    return {t: Budget(t, Quotas(10, quota_, 0, 0), Usage(gpus=used))
            for t, (quota_, used) in teams.items()}


def cohort(limit: int | None = None, **teams: tuple[int, int]) -> dict[str, Budget]:
    return {t: Budget(t, Quotas(10, quota_, 0, 0), Usage(gpus=used), "research", limit)
            for t, (quota_, used) in teams.items()}


ONE_L4 = [Node("n1", {"nvidia-l4": 1})]
TWO_L4 = [Node("n1", {"nvidia-l4": 2})]
PLENTY = budgets(a=(8, 0), b=(8, 0), c=(8, 0))


def admitted(p: scheduling.Plan) -> list[str]:
    return [a.workspace_id for a in p.admits]


def preempted(p: scheduling.Plan) -> list[tuple[str, str]]:
    return [(x.workspace_id, x.for_workspace) for x in p.preemptions]


# -- who starts ---------------------------------------------------------------------------------


def test_free_capacity_goes_in_priority_order_then_oldest_first() -> None:
    queue = [wait("a--low", BACKGROUND, ago=300), wait("b--old", ago=200),
             wait("c--new", ago=100)]
    p = plan(queue, [], PLENTY, TWO_L4, NOW)
    assert admitted(p) == ["b--old", "c--new"]
    assert [a.node for a in p.admits] == ["n1", "n1"]
    left = p.waits["a--low"]
    assert left.position == 1
    assert left.message == "no node has 1 x nvidia-l4 free: 2/2 nvidia-l4 in use"


def test_a_request_that_does_not_fit_does_not_hold_back_a_smaller_one() -> None:
    queue = [wait("a--big", demand=Demand("nvidia-l4", 2), ago=300), wait("b--small")]
    p = plan(queue, [hold("c--x", INTERACTIVE, node="n1")], PLENTY, TWO_L4, NOW)
    assert admitted(p) == ["b--small"]
    assert p.waits["a--big"].position == 1


def test_best_fit_keeps_the_roomy_node_for_big_requests() -> None:
    nodes = [Node("roomy", {"nvidia-l4": 4}), Node("tight", {"nvidia-l4": 1})]
    p = plan([wait("a--one")], [], PLENTY, nodes, NOW)
    assert [a.node for a in p.admits] == ["tight"]


def test_detected_names_serve_the_catalogs_and_other_types_never() -> None:
    nodes = [Node("n1", {"nvidia-tesla-t4": 1, "nvidia-l4": 0})]
    p = plan([wait("a--t4", demand=Demand("nvidia-t4", 1)), wait("b--l4")], [], PLENTY, nodes,
             NOW)
    assert admitted(p) == ["a--t4"]
    assert "b--l4" in p.waits


def test_the_teams_quota_holds_its_request_while_others_go() -> None:
    queue = [wait("a--over", ago=300), wait("b--fits")]
    p = plan(queue, [], budgets(a=(1, 1), b=(1, 0)), TWO_L4, NOW)
    assert admitted(p) == ["b--fits"]
    assert p.waits["a--over"].message.startswith("team a uses 1/1 GPUs")


def test_without_nodes_only_the_quotas_count() -> None:
    queue = [wait(f"a--w{i}", ago=100 - i) for i in range(3)]
    p = plan(queue, [], budgets(a=(2, 0)), None, NOW)
    assert admitted(p) == ["a--w0", "a--w1"]
    assert p.waits["a--w2"].message.startswith("team a uses 2/2 GPUs")


def test_a_cpu_request_in_the_queue_starts() -> None:
    p = plan([wait("a--cpu", demand=None)], [], PLENTY, ONE_L4, NOW)
    assert admitted(p) == ["a--cpu"] and p.admits[0].node is None


def test_positions_count_per_accelerator_type() -> None:
    nodes = [Node("n1", {"nvidia-l4": 0, "nvidia-h100-80gb": 0})]
    queue = [wait("a--l4-1", ago=300), wait("a--h100", demand=Demand("nvidia-h100-80gb", 1),
                                                ago=200), wait("b--l4-2", ago=100)]
    p = plan(queue, [], PLENTY, nodes, NOW)
    assert {w: p.waits[w].position for w in p.waits} == {"a--l4-1": 1, "a--h100": 1,
                                                         "b--l4-2": 2}


# -- the maximum wait ---------------------------------------------------------------------------


def test_past_its_maximum_wait_a_request_fails_with_what_it_waited_for() -> None:
    queue = [wait("a--late", ago=3600, max_wait=1800), wait("b--patient", ago=7200)]
    p = plan(queue, [hold("c--x", INTERACTIVE)], PLENTY, ONE_L4, NOW)
    [expired] = p.expiries
    assert expired.workspace_id == "a--late"
    assert expired.message == ("waited 1h, the most its profile allows (30m): no node has "
                               "1 x nvidia-l4 free: 1/1 nvidia-l4 in use")
    assert "a--late" not in p.waits and "b--patient" in p.waits


# -- preemption by pause ------------------------------------------------------------------------


PREEMPTION_TABLE: dict[str, tuple[list[Holding], list[tuple[str, str]], list[str]]] = {
    # name: (holders of the L4s, preempted (victim, for), warned); the waiting request says
    # whom it preempts (the warned, or those already warned, too)
    "a lower-priority idle workspace is paused":
        ([hold("a--low", BACKGROUND)], [("a--low", "b--high")], []),
    "the same priority is never preempted":
        ([hold("a--peer", INTERACTIVE)], [], []),
    "a higher priority is never preempted":
        ([hold("a--boss", INTERACTIVE + 1)], [], []),
    "a busy kernel is never preempted unless its profile says so":
        ([hold("a--busy", BACKGROUND, busy=True)], [], []),
    "a kernel the runtime could not describe counts as busy":
        ([hold("a--unknown", BACKGROUND, busy=None)], [], []),
    "a busy kernel whose profile allows it is warned first":
        ([hold("a--busy", BACKGROUND, busy=True, busy_after_seconds=600)], [], ["a--busy"]),
    "a warned busy kernel is not warned again within its grace":
        ([hold("a--busy", BACKGROUND, busy=True, busy_after_seconds=600,
               warned_at=NOW - timedelta(seconds=300))], [], []),
    "and is paused once its grace is over":
        ([hold("a--busy", BACKGROUND, busy=True, busy_after_seconds=600,
               warned_at=NOW - timedelta(seconds=601))], [("a--busy", "b--high")], []),
    "a warning long stale is given again":
        ([hold("a--busy", BACKGROUND, busy=True, busy_after_seconds=600,
               warned_at=NOW - timedelta(hours=1))], [], ["a--busy"]),
    "a starting workspace is not preempted":
        ([hold("a--starting", BACKGROUND, state="PROVISIONING")], [], []),
    "nor one already pausing":
        ([hold("a--pausing", BACKGROUND, state="PAUSING")], [], []),
    "the lowest priority goes first":
        ([hold("a--batch", BATCH), hold("c--background", BACKGROUND)],
         [("c--background", "b--high")], []),
    "idle goes before busy of the same priority":
        ([hold("a--busy", BACKGROUND, busy=True, busy_after_seconds=60),
          hold("c--idle", BACKGROUND)], [("c--idle", "b--high")], []),
    "of the same priority, the most recently started goes first (the least work lost)":
        ([hold("a--old", BACKGROUND, since=7200), hold("c--new", BACKGROUND, since=60)],
         [("c--new", "b--high")], []),
}


@pytest.mark.parametrize("case", list(PREEMPTION_TABLE))
def test_preemption(case: str) -> None:
    holders, victims, warned = PREEMPTION_TABLE[case]
    nodes = [Node("n1", {"nvidia-l4": len(holders)})]
    p = plan([wait("b--high", INTERACTIVE)], holders, PLENTY, nodes, NOW)
    assert preempted(p) == victims
    assert [w.workspace_id for w in p.warnings] == warned
    assert admitted(p) == []
    why = p.waits["b--high"].message
    chosen = [v for v, _ in victims] + warned or \
        [h.workspace_id for h in holders if h.warned_at is not None]
    if chosen:
        assert why == f"preempting {', '.join(chosen)} for it (by pause)"
    else:
        assert why.startswith("no node has 1 x nvidia-l4 free")


def test_the_victim_is_told_which_request_took_its_accelerators() -> None:
    p = plan([wait("b--high", INTERACTIVE)], [hold("a--low")], PLENTY, ONE_L4, NOW)
    [victim] = p.preemptions
    assert victim.version == 3
    assert victim.message == ("paused with its state for b--high (p1000), which needed "
                              "1 x nvidia-l4; your resume is queued and starts when they are "
                              "free again")


def test_a_warning_says_when_and_why() -> None:
    busy = hold("a--busy", busy=True, busy_after_seconds=600)
    [warning] = plan([wait("b--high")], [busy], PLENTY, ONE_L4, NOW).warnings
    assert (warning.for_workspace, warning.after_seconds) == ("b--high", 600)
    assert warning.message == ("b--high (p1000) needs the nvidia-l4 this workspace holds: it "
                               "will be paused with its state in 10m, or as soon as its "
                               "kernels are idle")


def test_victims_must_free_the_same_node() -> None:
    nodes = [Node("n1", {"nvidia-l4": 1}), Node("n2", {"nvidia-l4": 1})]
    holders = [hold("a--low1", node="n1"), hold("c--low2", node="n2")]
    p = plan([wait("b--two", demand=Demand("nvidia-l4", 2))], holders, PLENTY, nodes, NOW)
    assert preempted(p) == []


def test_the_cheapest_node_is_chosen() -> None:
    nodes = [Node("n1", {"nvidia-l4": 1}), Node("n2", {"nvidia-l4": 1})]
    holders = [hold("a--batch", BATCH, node="n1"), hold("c--bg", BACKGROUND, node="n2")]
    p = plan([wait("b--high")], holders, PLENTY, nodes, NOW)
    assert preempted(p) == [("c--bg", "b--high")]


def test_one_victim_is_not_counted_twice() -> None:
    queue = [wait("b--first", ago=200), wait("c--second", ago=100)]
    p = plan(queue, [hold("a--low")], PLENTY, ONE_L4, NOW)
    assert preempted(p) == [("a--low", "b--first")]
    assert p.waits["c--second"].message.startswith("no node has")


def test_capacity_being_freed_for_a_request_is_waited_for_not_taken_again() -> None:
    pausing = hold("a--low", state="PAUSING", preempted_by="b--high")
    queue = [wait("b--high", ago=200), wait("c--also-high", ago=100)]
    p = plan(queue, [pausing, hold("d--low2")], PLENTY, TWO_L4, NOW)
    assert p.waits["b--high"].message == "waits for a--low to finish pausing, preempted for it"
    # the other victim goes to the second request, not to the first one again
    assert preempted(p) == [("d--low2", "c--also-high")]


def test_only_the_first_blocked_requests_of_a_type_look_for_victims() -> None:
    queue = [wait(f"b--w{i}", ago=100 - i) for i in range(3)]
    holders = [hold(f"a--low{i}", node="n1") for i in range(3)]
    nodes = [Node("n1", {"nvidia-l4": 3})]
    p = plan(queue, holders, PLENTY, nodes, NOW, heads=2)
    assert [f for _, f in preempted(p)] == ["b--w0", "b--w1"]


def test_a_team_at_its_quota_pauses_its_own_lower_priority_workspace() -> None:
    p = plan([wait("a--urgent", INTERACTIVE)], [hold("a--batch", BATCH, node=None)],
             budgets(a=(1, 1)), None, NOW)
    assert preempted(p) == [("a--batch", "a--urgent")]


def test_quota_is_not_freed_by_another_teams_workspace() -> None:
    p = plan([wait("a--urgent", INTERACTIVE)], [hold("b--batch", BATCH, node=None)],
             budgets(a=(1, 1), b=(1, 1)), None, NOW)
    assert preempted(p) == []


# -- borrowing within a cohort ------------------------------------------------------------------


def test_a_team_borrows_what_its_cohort_leaves_idle() -> None:
    p = plan([wait("b--extra")], [], cohort(a=(2, 0), b=(1, 1)), TWO_L4, NOW)
    assert admitted(p) == ["b--extra"]


def test_a_borrowing_limit_caps_it() -> None:
    p = plan([wait("b--extra")], [], cohort(limit=0, a=(2, 0), b=(1, 1)), TWO_L4, NOW)
    assert p.waits["b--extra"].message.startswith(
        "team b uses 1/1 GPUs and may borrow at most 0 from cohort research")


def test_a_cohort_never_holds_more_than_its_quotas() -> None:
    p = plan([wait("b--extra")], [], cohort(a=(1, 1), b=(1, 1)), TWO_L4, NOW)
    assert p.waits["b--extra"].message.startswith(
        "team b uses 1/1 GPUs and cohort research has none idle to lend (2/2 in use)")


def test_the_lender_reclaims_from_a_borrower_whatever_its_priority() -> None:
    # b borrowed a's GPU; a now wants it back within its own quota.
    holders = [hold("b--own", INTERACTIVE, since=900), hold("b--borrowed", INTERACTIVE + 5)]
    p = plan([wait("a--mine", BACKGROUND)], holders, cohort(a=(1, 0), b=(1, 2)), TWO_L4, NOW)
    assert preempted(p) == [("b--borrowed", "a--mine")] or \
        preempted(p) == [("b--own", "a--mine")]
    assert len(p.preemptions) == 1


def test_a_team_over_its_own_quota_reclaims_nothing() -> None:
    holders = [hold("b--x", INTERACTIVE)]
    p = plan([wait("a--more", BACKGROUND)], holders, cohort(a=(1, 1), b=(1, 1)), TWO_L4, NOW)
    assert preempted(p) == []


# -- capacity: detected and declared ------------------------------------------------------------


def test_the_runtimes_node_with_its_declared_accelerators() -> None:
    caps = {"node": "local", "accelerators": {"nvidia-l4": 1, "nvidia-t4": 2}}
    declared = {"local": DeclaredNode("local", {"nvidia-l4": 2, "tpu-v5-lite-podslice": 0})}
    [node] = nodes_of(caps, declared) or ()
    assert node == Node("local", {"nvidia-t4": 2, "nvidia-l4": 2}, {"nvidia-l4": 2})
    assert with_declared(caps, declared)["declared_accelerators"] == {"nvidia-l4": 2}
    assert nodes_of({"accelerators": {"nvidia-l4": 1}}, declared) is None  # no node: a cluster
    assert nodes_of({"node": "other"}, declared) == (Node("other", {}, {}),)


def test_a_declared_accelerator_is_said_so_when_it_is_full() -> None:
    node = Node("local", {"nvidia-l4": 1}, {"nvidia-l4": 1})
    p = plan([wait("b--high")], [hold("a--peer", INTERACTIVE, node="local")], PLENTY, [node],
             NOW)
    assert p.waits["b--high"].message == ("no node has 1 x nvidia-l4 free: 1/1 (1 declared) "
                                          "nvidia-l4 in use")
    assert scheduling.capacity_refusal([node], {"local": {"nvidia-l4": 1}}, L4) == \
        p.waits["b--high"].message


def test_place_and_free_on() -> None:
    nodes = [Node("n1", {"nvidia-l4": 2}), Node("n2", {"nvidia-l4": 1})]
    assert scheduling.place(nodes, {"n2": {"nvidia-l4": 1}}, L4) == nodes[0]
    assert scheduling.place(nodes, {}, L4) == nodes[1]
    assert scheduling.place(nodes, {"n1": {"nvidia-l4": 2}, "n2": {"nvidia-l4": 1}}, L4) is None


# -- estimates ----------------------------------------------------------------------------------


POLICY = IdlePolicy((IdleRule(1200, 0, IdleEffect.PAUSE),), max_age_seconds=3600)


@pytest.mark.parametrize(("running_for", "idle_for", "expected"), [
    (600, 0, 1200),        # its idle rule: 20 min from now
    (600, 600, 600),       # idle for 10 min already: 10 more
    (3000, 0, 600),        # its maximum age comes first
    (7200, 0, 0),          # overdue: now
])
def test_expected_release(running_for: int, idle_for: int, expected: int) -> None:
    since = NOW - timedelta(seconds=running_for)
    when = expected_release(POLICY, since, NOW - timedelta(seconds=idle_for), NOW)
    assert when == NOW + timedelta(seconds=expected)
    assert expected_release(None, since, None, NOW) is None
    assert expected_release(IdlePolicy(()), since, None, NOW) is None


def test_estimates_follow_the_holders_releases_in_queue_order() -> None:
    holders = [hold("a--x", INTERACTIVE, expected_release=NOW + timedelta(minutes=30)),
               hold("a--y", INTERACTIVE, expected_release=NOW + timedelta(minutes=10))]
    queue = [wait("b--first", ago=200), wait("b--second", ago=100), wait("b--third", ago=50)]
    p = plan(queue, holders, PLENTY, TWO_L4, NOW)
    eta = scheduling.estimates(p, queue, holders, NOW)
    assert eta == {"b--first": timedelta(minutes=10), "b--second": timedelta(minutes=30),
                   "b--third": None}
    assert scheduling.human(eta["b--first"]) == "about 10m"
    assert scheduling.human(None) == "unknown"


def test_the_plan_is_pure_and_deterministic() -> None:
    queue = [wait(f"b--w{i}", INTERACTIVE - i, ago=i) for i in range(5)]
    holders = [hold(f"a--h{i}", BACKGROUND, since=i * 10) for i in range(3)]
    nodes = [Node("n1", {"nvidia-l4": 3})]
    first = plan(queue, holders, PLENTY, nodes, NOW)
    assert plan(list(reversed(queue)), list(reversed(holders)), PLENTY, nodes, NOW) == first
