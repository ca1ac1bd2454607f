"""Sustained load on a local stack: requests at a steady rate, their latency over time, and
the function host's memory (``bench/load.py`` is the long run; ``tests/e2e/test_load.py``
a short one).

On a stack whose null runtime takes the workspaces named ``load-*`` (and, with
``LoadPlan.local``, more on the local runtime beside them: real JupyterLab servers on this
host, routed by ``STASIS_NULL_RUNTIME_MATCH``, ``functions.adapters.split_runtime``), team
ml-a's quota raised to fit: every workspace is created, then for ``seconds`` ``rate``
requests a second are published, each a pause of a RUNNING workspace or a resume of a
PAUSED one (a workspace with a request in flight gets none). A request's latency is from its
publish to the ``workspace.state_changed`` that ends it (PAUSED, RUNNING), read from a pull
subscription by its ``ce-requestid``; each is 3 to 4 deliveries through Pub/Sub push, the
function host (two workers) and Firestore transactions. Every ``window`` seconds: requests
sent and done, p50/p99 latency, the function host's memory (RSS of the gunicorn master and
its workers, summed) and the host's memory in use. With ``trace_memory`` (the host started
with ``STASIS_HOST_TRACEMALLOC``, ``stack.host``) the report also says, per worker, the
allocation sites that grew most between the end of the creates and the end of the run.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
from google.cloud import pubsub_v1

from events import (
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import workspace_id
from functions.adapters.pubsub_bus import PubSubBus
from functions.bootstrap import CATALOG_TTL_SECONDS
from functions.domain.publishers import OPERATOR
from harness.stats import summary
from stack import local

TEAM = "ml-a"
#: The null runtime's share of the workspaces (``STASIS_NULL_RUNTIME_MATCH``).
NULL_MATCH = f"{TEAM}--load-*"
#: How long the host is left alone before its allocations are read at the end: what is
#: still traced then was kept, not in flight.
QUIET_SECONDS = 20.0


@dataclass(frozen=True)
class LoadPlan:
    workspaces: int = 200
    rate: float = 50.0
    seconds: float = 600.0
    window: float = 60.0
    #: Workspaces on the local runtime beside the null ones (the stack runs the local one).
    local: int = 0
    #: Whether the function host traces its allocations (``stack.host``).
    trace_memory: bool = False
    #: How long after the last request the run waits for the ones still in flight (one
    #: not done by then counts as ``unfinished``).
    drain: float = 60.0


def run(settings: Any, plan: LoadPlan, say: Callable[[str], Any] = lambda _: None
        ) -> dict[str, Any]:
    """The report of one run on the stack of ``settings`` (already up)."""
    _raise_quota(settings, plan.workspaces + plan.local)
    # a raised quota is a change, not a new name: it is in effect once every function
    # instance has read the catalog again (functions.bootstrap)
    time.sleep(CATALOG_TTL_SECONDS + 0.5)
    bus = PubSubBus(settings.project, origin=OPERATOR)
    subscriber = pubsub_v1.SubscriberClient()
    sub = subscriber.subscription_path(settings.project, f"load-{uuid.uuid4().hex[:8]}")
    subscriber.create_subscription(request={"name": sub, "topic": (
        f"projects/{settings.project}/topics/stasis-workspace-state-changed")})
    lock = threading.Lock()
    sent: dict[str, tuple[float, str, str]] = {}  # requestid -> (at, ws, final state)
    done: dict[str, float] = {}
    state: dict[str, str] = {}
    busy: set[str] = set()

    def on_change(message: Any) -> None:
        message.ack()
        data = json.loads(message.data)
        rid = message.attributes.get("ce-requestid", "")
        with lock:
            if rid in sent and rid not in done and data.get("to_state") == sent[rid][2]:
                done[rid] = time.monotonic()
                state[sent[rid][1]] = sent[rid][2]
                busy.discard(sent[rid][1])

    streaming = subscriber.subscribe(sub, on_change)
    pool = ThreadPoolExecutor(max_workers=16)

    def send(payload: Any, ws: str, until: str) -> None:
        event = new_event(payload, source="//bench/load", requestid=uuid.uuid4().hex)
        with lock:
            sent[event.requestid] = (time.monotonic(), ws, until)
            busy.add(ws)
        pool.submit(bus.publish, event)

    names = [f"real-{i}" for i in range(plan.local)] + [
        f"load-{i}" for i in range(plan.workspaces)]
    ids = [workspace_id(TEAM, name) for name in names]
    local_ids = set(ids[:plan.local])
    began = time.monotonic()
    for name, ws in zip(names, ids, strict=True):
        send(WorkspaceRequested(team=TEAM, owner="dev", name=name, profile="cpu-small"),
             ws, "RUNNING")
    while time.monotonic() - began < 600:
        with lock:
            if not busy:
                break
        time.sleep(0.5)
    say(f"load: {len(state)} workspaces created")
    created = {"seconds": round(time.monotonic() - began, 1),
               "running": sum(1 for s in state.values() if s == "RUNNING"),
               "running_local": sum(1 for ws, s in state.items()
                                    if s == "RUNNING" and ws in local_ids)}
    with lock:
        sent.clear()
        done.clear()
        busy.clear()
    if plan.trace_memory:
        _workers_memory(settings, baseline=True)
    ledgered_before = _ledgered(settings)
    start = time.monotonic()
    next_window, cursor, ticks = start + plan.window, 0, 0
    window_rss: list[float] = [_host_rss(settings)]
    window_used: list[float] = [_used_mib()]
    skipped = 0
    while time.monotonic() - start < plan.seconds:
        ticks += 1
        target = start + ticks / plan.rate
        time.sleep(max(0.0, target - time.monotonic()))
        with lock:
            free = [ws for ws in ids if ws not in busy and ws in state]
        if not free:
            skipped += 1
        else:
            ws = free[cursor % len(free)]
            cursor += 1
            if state[ws] == "RUNNING":
                send(WorkspacePauseRequested(ws, "dev"), ws, "PAUSED")
            else:
                send(WorkspaceResumeRequested(ws, "dev"), ws, "RUNNING")
        if time.monotonic() >= next_window:
            window_rss.append(_host_rss(settings))
            window_used.append(_used_mib())
            next_window += plan.window
    drained = time.monotonic() + plan.drain  # the last requests land
    while time.monotonic() < drained:
        with lock:
            if len(done) == len(sent):
                break
        time.sleep(0.5)
    ledgered = _ledgered(settings) - ledgered_before
    traced = None
    if plan.trace_memory:  # once the fan-out (chat notices, audits) behind them is done too
        time.sleep(QUIET_SECONDS)
        traced = _workers_memory(settings, baseline=False)
    window_rss.append(_host_rss(settings))
    window_used.append(_used_mib())
    # By when each request was sent, counted once all had their time to land.
    windows = [_window(lock, sent, done, start + i * plan.window,
                       start + (i + 1) * plan.window, start, window_rss[i + 1],
                       window_used[i + 1])
               for i in range(len(window_rss) - 1)]
    streaming.cancel()
    pool.shutdown(wait=False)
    with lock:
        latencies = [(done[r] - sent[r][0]) * 1000 for r in done]
        by_runtime = {kind: [(done[r] - sent[r][0]) * 1000 for r in done
                             if (sent[r][1] in local_ids) == (kind == "local")]
                      for kind in ("null", "local")}
        unfinished = len(sent) - len(done)
        unfinished_local = sum(1 for r, (_at, ws, _s) in sent.items()
                               if r not in done and ws in local_ids)
    rss = [w["host_rss_mib"] for w in windows]
    return {
        "workspaces": plan.workspaces, "local": plan.local, "rate_asked": plan.rate,
        "seconds": plan.seconds, "created": created, "requests": len(sent),
        "unfinished": unfinished, "unfinished_local": unfinished_local,
        "skipped_all_busy": skipped,
        "rate_done": round(len(latencies) / plan.seconds, 1),
        # deliveries the ledgered handlers committed (each one event handled once); the
        # fan-out to consumers without a ledger (chat notices, audit) comes on top
        "ledgered_deliveries": {"count": ledgered,
                                "per_second": round(ledgered / plan.seconds, 1),
                                "per_request": round(ledgered / max(1, len(sent)), 2)},
        "latency_ms": summary(latencies, digits=0),
        "latency_ms_by_runtime": {kind: summary(values, digits=0)
                                  for kind, values in by_runtime.items() if values},
        "host_rss_mib": {"start": round(window_rss[0], 1), "end": rss[-1], "max": max(rss)},
        "machine_used_mib": {"start": round(window_used[0]), "end": round(window_used[-1])},
        "windows": windows,
        **({"traced_by_worker": traced} if traced is not None else {}),
    }


def _ledgered(settings: Any) -> int:
    """How many deliveries the ledgered handlers have committed so far (``processed/*``)."""
    from google.cloud import firestore

    from functions.adapters.firestore_store import LEDGER

    db = firestore.Client(project=settings.project)
    return int(db.collection(LEDGER).count().get()[0][0].value)


def _host_rss(settings: Any) -> float:
    row = next(r for r in local.status(settings) if r["name"] == "functions")
    host = psutil.Process(row["pid"])
    return sum(p.memory_info().rss for p in [host, *host.children(recursive=True)]) / 2**20


def _used_mib() -> float:
    """The machine's memory in use (the workspaces' servers and kernels included)."""
    return float(psutil.virtual_memory().used) / 2**20


def _workers_memory(settings: Any, *, baseline: bool) -> dict[str, Any]:
    """``GET /_memory`` of each worker (gunicorn hands each call to one of them, so: asked
    until every worker answered, or 60 calls)."""
    import requests

    seen: dict[str, Any] = {}
    for _ in range(60):
        body = requests.get(f"{settings.functions_url}/_memory",
                            params={"baseline": "1"} if baseline else {}, timeout=60).json()
        seen.setdefault(str(body["pid"]), body)
        if len(seen) >= settings.function_workers:
            break
    return seen


def _raise_quota(settings: Any, workspaces: int) -> None:
    """Room for every workspace: the example's ml-a may have 10."""
    from stack import admin

    config = admin.load(local.EXAMPLE_CONFIG)
    for team in config["teams"]:
        if team["id"] == TEAM:
            team["quotas"]["workspaces"] = workspaces * 2
    admin.apply(settings, config, actor="bench-load", source="bench/load.py")


def _window(lock: threading.Lock, sent: dict[str, tuple[float, str, str]],
            done: dict[str, float], begin: float, end: float, start: float,
            rss: float, used: float) -> dict[str, Any]:
    with lock:
        latencies = [(done[r] - sent[r][0]) * 1000 for r in done if begin <= sent[r][0] < end]
        count = sum(1 for at, _ws, _s in sent.values() if begin <= at < end)
    stats = summary(latencies, digits=0)
    return {"from_s": round(begin - start), "sent": count, "done": len(latencies),
            "p50_ms": stats.get("p50"), "p99_ms": stats.get("p99"),
            "host_rss_mib": round(rss, 1), "machine_used_mib": round(used)}
