"""The scheduler: the pure plan of ``functions.domain.scheduling`` carried out as events.

A pass runs when a decision freed accelerators or a request joined the queue (the
``Schedule`` command of that decision's outbox, right after it committed) and with every
reconciler run (``stasis reconcile``, Cloud Scheduler): that is when queued requests past
their maximum wait fail. It reads the QUEUED workspaces (one indexed query, and nothing
more when none waits), the workspaces that hold hardware, the teams' usage counters and
the runtime's capabilities (with the nodes the admin file declares), and asks the runtime
about the kernels of the RUNNING workspaces a waiting request could preempt (busy or
idle). It writes nothing itself: every verdict is a workspace.scheduled event naming the
workspace version it saw, under a requestid derived from it, so the lifecycle's ledger
gives concurrent or repeated passes one effect, and a verdict about a version that moved
on changes nothing. The lifecycle's transaction checks the quota and the node again.

:func:`outlook` is the read side: where a QUEUED workspace stands, why it waits and an
estimate (``scheduling.outlook_of``, which the portal and the CLI call on what they read).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events import new_event
from events.payloads import WorkspaceScheduled
from functions.domain import idle, scheduling
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import HOLDS_HARDWARE, State, Workspace
from functions.handlers.deps import Deps

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/scheduler"
#: The most RUNNING workspaces one pass asks the runtime about (preemption candidates).
ASK_AT_MOST = 64
_ASK_WORKERS = 8


@dataclass
class Pass:
    """What one pass saw and did."""

    plan: scheduling.Plan = field(default_factory=scheduling.Plan)
    queued: int = 0
    published: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        p = self.plan
        return {"queued": self.queued,
                "admit": [a.workspace_id for a in p.admits],
                "expire": [e.workspace_id for e in p.expiries],
                "preempt": [{"workspace_id": x.workspace_id, "for": x.for_workspace}
                            for x in p.preemptions],
                "warn": [{"workspace_id": x.workspace_id, "for": x.for_workspace}
                         for x in p.warnings],
                "waiting": [{"workspace_id": w.workspace_id, "position": w.position,
                             "why": w.message} for w in p.waits.values()]}


def run(deps: Deps, *, fix: bool = True, why: str = "") -> Pass:
    """One pass over the queue; publishes its verdicts unless ``fix`` is False."""
    now = deps.clock()
    queued = _workspaces(deps, [State.QUEUED])
    if not queued:
        return Pass()
    view = _view(deps, queued, now)
    result = Pass(scheduling.plan(view.waiting, view.holding, view.budgets, view.nodes, now),
                  len(queued))
    log.info("schedule (%s): %d queued, %s", why or "pass", len(queued), result.summary())
    if not fix:
        return result
    plan = result.plan
    for verdict in (*plan.expiries, *plan.admits, *plan.preemptions, *plan.warnings):
        payload = _event(verdict)
        event_id = f"sched-{payload.action}-{payload.workspace_id}-v{payload.version}"
        deps.bus.publish(new_event(payload, source=SOURCE, id=event_id, requestid=event_id))
        result.published.append(event_id)
    return result


def outlook(deps: Deps, workspace_ids: Iterable[str]) -> dict[str, scheduling.Outlook]:
    """The outlook of each QUEUED workspace among ``workspace_ids`` (a read: nothing is
    published, no kernel is asked about)."""
    wanted = set(workspace_ids)
    queued = _workspaces(deps, [State.QUEUED])
    if not wanted & {ws.id for ws in queued}:
        return {}
    teams = deps.fleet.teams() if deps.fleet is not None else {}
    holders = _workspaces(deps, sorted(HOLDS_HARDWARE))
    return scheduling.outlook_of(deps.catalog(), queued, holders, teams,
                                 deps.runtime.capabilities(), wanted, deps.clock())


# -- what a pass reads --------------------------------------------------------------------------


def _workspaces(deps: Deps, states: list[State]) -> list[Workspace]:
    if deps.fleet is not None:
        return list(deps.fleet.workspaces_in(states))
    return list(deps.store.list_workspaces(states=states, limit=10_000))


def _view(deps: Deps, queued: list[Workspace], now: datetime) -> scheduling.View:
    catalog = deps.catalog()
    holders = _workspaces(deps, sorted(HOLDS_HARDWARE))
    waiting = [scheduling.waiting_of(catalog, ws, now) for ws in queued]
    busy = _busy(deps, catalog, holders, waiting, now)
    teams = deps.fleet.teams() if deps.fleet is not None else {}
    return scheduling.view_of(catalog, queued, holders, teams, deps.runtime.capabilities(),
                              busy, now)


def _busy(deps: Deps, catalog: Catalog, holders: list[Workspace],
          waiting: list[scheduling.Waiting], now: datetime) -> dict[str, bool | None]:
    """Whether each RUNNING workspace a waiting request could preempt has a busy kernel
    (or a busy GPU), as the runtime says now; unknown ones are left out (busy)."""
    if not waiting:
        return {}
    top = max(w.priority for w in waiting)
    lenders = {catalog.teams[w.team].cohort for w in waiting
               if w.team in catalog.teams and catalog.teams[w.team].cohort}
    candidates = [ws.id for ws in holders if ws.state == State.RUNNING and
                  scheduling.demand_of(catalog.profiles.get(ws.profile)) is not None and
                  (ws.priority < top or (ws.team in catalog.teams and
                                         catalog.teams[ws.team].cohort in lenders))]
    source: Callable[[str], Mapping[str, Any] | None] | None = getattr(
        deps.runtime, "activity", None)
    if source is None or not candidates:
        return {}
    found: dict[str, bool | None] = {}

    def ask(ws_id: str) -> tuple[str, bool | None]:
        try:
            data = source(ws_id)
        except Exception as exc:  # one workspace's failure must not stop the pass
            log.warning("schedule: no activity for %s: %s", ws_id, exc)
            return ws_id, None
        if not data:
            return ws_id, None
        signals = idle.Signals.from_activity(data, now)
        return ws_id, idle.is_busy(signals)

    with ThreadPoolExecutor(max_workers=min(_ASK_WORKERS, len(candidates))) as pool:
        for ws_id, busy in pool.map(ask, candidates[:ASK_AT_MOST]):
            found[ws_id] = busy
    return found


def _event(verdict: Any) -> WorkspaceScheduled:
    if isinstance(verdict, scheduling.Admit):
        return WorkspaceScheduled(verdict.workspace_id, verdict.version, "admit",
                                  node=verdict.node, message=verdict.message)
    if isinstance(verdict, scheduling.Expire):
        return WorkspaceScheduled(verdict.workspace_id, verdict.version, "expire",
                                  message=verdict.message)
    if isinstance(verdict, scheduling.Preempt):
        return WorkspaceScheduled(verdict.workspace_id, verdict.version, "preempt",
                                  for_workspace=verdict.for_workspace, message=verdict.message)
    assert isinstance(verdict, scheduling.Warn)
    return WorkspaceScheduled(verdict.workspace_id, verdict.version, "warn",
                              for_workspace=verdict.for_workspace,
                              after_seconds=verdict.after_seconds, message=verdict.message)
