"""The cost rollup: one ``costs/{team}`` document per team, which the dashboard reads.

Runs on a schedule (Cloud Scheduler -> the ``cost_rollup`` HTTP function, hourly) and on
demand (``stasis cost [--team T]``). Per team it reads the team's workspaces, its audit
entries since the first of the month (the lifecycle's transitions), its snapshot records,
and prices them with ``functions.domain.cost``; the document is written only when a figure
moved (not for a new timestamp alone).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime
from typing import Any

from functions.domain import cost
from functions.domain.cost import LIFECYCLE_ACTIONS, Transition
from functions.handlers.deps import Deps


def rollup(deps: Deps, *, team: str | None = None, write: bool = True) -> list[dict[str, Any]]:
    """The rollup of ``team`` (default: every team of the catalog), written unless
    ``write`` is False; returns the documents, JSON-ready."""
    assert deps.fleet is not None, "the cost rollup needs deps.fleet"
    started = time.monotonic()
    now = deps.clock()
    catalog = deps.catalog()
    month = cost.month_of(now)
    if team and team not in catalog.teams:
        raise ValueError(f"there is no team {team}; teams: {', '.join(catalog.teams) or 'none'}")
    teams = [team] if team else sorted(catalog.teams)
    docs = []
    for team_id in teams:
        workspaces = deps.fleet.workspaces(team=team_id)
        history = _history(deps.fleet.audit_since(team_id, month.start))
        initial = {}
        for ws in workspaces:
            transitions = history.get(ws.id, [])
            before = None
            if cost.needs_lookback(transitions):
                before = _last_transition(deps.fleet.audit_before(ws.id, month.start))
            initial[ws.id] = cost.start_state(ws, transitions, before)
        doc = cost.team_rollup(team_id, workspaces, history, initial,
                               deps.fleet.snapshot_records(team=team_id), catalog, now)
        written = deps.fleet.put_rollup(team_id, doc) if write else False
        docs.append({**_jsonable(doc), "written": written})
    for doc in docs:
        doc["seconds"] = round(time.monotonic() - started, 3)
    return docs


def _history(entries: list[dict[str, Any]]) -> dict[str, list[Transition]]:
    history: dict[str, list[Transition]] = defaultdict(list)
    for entry in entries:
        if entry.get("action") not in LIFECYCLE_ACTIONS:
            continue
        transition = cost.transition_from_audit(entry)
        if transition is not None:
            history[transition.workspace_id].append(transition)
    return {ws_id: cost.in_order(transitions) for ws_id, transitions in history.items()}


def _last_transition(entries: list[dict[str, Any]]) -> Transition | None:
    """The newest transition among entries (newest first) from before the window."""
    for entry in entries:
        if entry.get("action") in LIFECYCLE_ACTIONS:
            transition = cost.transition_from_audit(entry)
            if transition is not None:
                return transition
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
