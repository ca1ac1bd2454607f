"""The scheduler's decision time at fleet size: ``functions.domain.scheduling.plan`` (pure)
with 10,000 queued requests over 1,000 nodes (prints JSON).

1,000 nodes of 8 L4s each (a tenth of them with 8 H100s instead), 50 teams (cohorts of 5)
with generous quotas, and three priority classes. Scenarios, each timed over ``--repeats``:

- ``full``: every accelerator is held by RUNNING workspaces (a third of them idle and of
  the lowest class); 10,000 requests wait: the plan finds nothing free, and the first
  blocked requests of each type look for victims to preempt by pause;
- ``freed``: the same, with 400 of the holders just paused (capacity freed): the plan
  places 400 requests, best fit, in priority order;
- ``estimates``: when each waiting request may start (``scheduling.estimates``), on ``full``.

    .venv/bin/python bench/scheduler_decision.py [--queued 10000] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime, timedelta

from common import summary

from functions.domain import scheduling
from functions.domain.catalog import Quotas
from functions.domain.quota import Usage

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PRIORITIES = (1000, 500, 100)


def fleet(n_nodes: int, n_queued: int, freed: int, seed: int = 7) -> tuple[
        list[scheduling.Waiting], list[scheduling.Holding], dict[str, scheduling.Budget],
        list[scheduling.Node]]:
    rng = random.Random(seed)
    nodes = [scheduling.Node(f"n{i:04d}", {"nvidia-h100-80gb" if i % 10 == 0 else "nvidia-l4": 8})
             for i in range(n_nodes)]
    teams = [f"team-{i:02d}" for i in range(50)]
    holding: list[scheduling.Holding] = []
    used: dict[str, int] = {t: 0 for t in teams}
    for node in nodes:
        [(kind, count)] = node.accelerators.items()
        for j in range(count):
            team = rng.choice(teams)
            idle = rng.random() < 1 / 3
            priority = 100 if idle else rng.choice(PRIORITIES)
            holding.append(scheduling.Holding(
                f"{team}--h-{node.id}-{j}", team, 3, priority, str(priority), "RUNNING",
                scheduling.Demand(kind, 1), node=node.id,
                running_since=NOW - timedelta(minutes=rng.randint(1, 600)),
                busy=not idle, expected_release=NOW + timedelta(minutes=rng.randint(1, 600))))
            used[team] += 1
    for h in rng.sample(holding, freed):
        holding.remove(h)
        used[h.team] -= 1
    budgets = {t: scheduling.Budget(t, Quotas(10_000, 400, 0, 0), Usage(gpus=used[t]),
                                    f"cohort-{i // 5}") for i, t in enumerate(teams)}
    waiting = [scheduling.Waiting(
        f"{rng.choice(teams)}--q-{i}", "", i, rng.choice(PRIORITIES), "p",
        NOW - timedelta(seconds=rng.randint(1, 3_600)),
        scheduling.Demand("nvidia-h100-80gb" if i % 10 == 0 else "nvidia-l4",
                          rng.choice((1, 1, 1, 2, 4))), 14_400)
        for i in range(n_queued)]
    waiting = [scheduling.Waiting(w.workspace_id, w.workspace_id.split("--")[0], w.version,
                                  w.priority, w.priority_class, w.queued_at, w.demand,
                                  w.max_wait_seconds) for w in waiting]
    return waiting, holding, budgets, nodes


def timed(fn: object, repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = fn()  # type: ignore[operator]
        times.append((time.perf_counter() - began) * 1000)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report: dict[str, object] = {"queued": args.queued, "nodes": args.nodes,
                                 "accelerators": args.nodes * 8}
    for name, freed in (("full", 0), ("freed", min(400, args.nodes * 8 // 2))):
        waiting, holding, budgets, nodes = fleet(args.nodes, args.queued, freed)
        times, plan = timed(lambda w=waiting, h=holding, b=budgets, n=nodes:
                            scheduling.plan(w, h, b, n, NOW), args.repeats)
        assert isinstance(plan, scheduling.Plan)
        report[name] = {"ms": summary(times), "admits": len(plan.admits),
                        "preemptions": len(plan.preemptions), "expiries": len(plan.expiries),
                        "waiting": len(plan.waits), "holders": len(holding)}
        if name == "full":
            eta, _ = timed(lambda p=plan, w=waiting, h=holding:
                           scheduling.estimates(p, w, h, NOW), args.repeats)
            report["estimates"] = {"ms": summary(eta)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
