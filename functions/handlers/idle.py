"""Idle auto-pause: the sweep that turns the runtime's activity signals into
workspace.idle_detected, and the handler that applies the idle policy to them.

Why a scheduled sweep in the control plane (HTTP function ``idle_sweep``, called by Cloud
Scheduler every few minutes, or ``stasis idle sweep``) rather than a loop in the node
agent: the candidates (RUNNING workspaces) and the policy (the catalog) live in Firestore,
which the agent does not read; the sweep asks the runtime for signals through the runtime
(``activity``), so the Kubernetes runtime's cluster monitor slots in without a second code
path; and one scheduled job is bounded and observable where N agent loops are not.

No write storms (kubeflow#6767): the sweep READS the RUNNING workspaces (one query on the
indexed ``state``), asks the runtime only about those whose policy could pause them by now
(``idle.needs_signals``), writes nothing, and publishes workspace.idle_detected only for
the ones the policy would pause. The handler re-reads the workspace (the sweep's view may
be stale: a resume in between), evaluates again (a GPU-idle alert of cluster monitoring,
cause ``gpu_idle``, with the kernels' state it asks the runtime for), and publishes
workspace.pause_requested (cause ``idle``, or ``schedule`` for the maximum age, with the
reason in words) under a requestid derived from the workspace's version, so the
lifecycle's ledger turns repeated sweeps into one pause. A sweep in which nothing is idle
writes nothing at all.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from events import Event, WorkspaceIdleDetected, WorkspacePauseRequested, new_event
from functions.domain import idle
from functions.domain.idle import IdleVerdict, Signals
from functions.domain.lifecycle import State, Workspace
from functions.handlers.deps import Deps
from functions.ports import catalog_knowing

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/idle"
_ACTIVITY_WORKERS = 8
_UNKNOWN_PROFILE = "unknown_profile"

#: What the idle rules read of a workspace document: the sweep fetches nothing else.
SWEEP_FIELDS = ("state_reason", "version", "updated_at", "created_at", "last_activity")

ActivitySource = Callable[[str], Mapping[str, Any] | None]


def sweep(deps: Deps, *, dry_run: bool = False,
          activity: ActivitySource | None = None) -> dict[str, Any]:
    """One pass over the RUNNING workspaces; returns what it found and did.

    ``activity(workspace_id)`` gives the runtime's signals (default: the runtime's own
    ``activity``; None where it has none, e.g. the null runtime).
    """
    started = time.monotonic()
    assert deps.fleet is not None, "the idle sweep needs deps.fleet"
    now = deps.clock()
    catalog = deps.catalog()
    running = deps.fleet.workspaces_in([State.RUNNING], fields=SWEEP_FIELDS)
    policies = {ws.id: catalog.profiles[ws.profile].idle_policy for ws in running
                if ws.profile in catalog.profiles}
    wanted = [ws.id for ws in running
              if ws.id in policies and idle.needs_signals(ws, policies[ws.id], now)]
    source = activity or getattr(deps.runtime, "activity", None)
    signals, errors = _signals(source, wanted, now)
    counts: Counter[str] = Counter()
    pauses: list[dict[str, Any]] = []
    for ws in running:
        policy = policies.get(ws.id)
        if policy is None:
            counts[_UNKNOWN_PROFILE] += 1
            continue
        verdict = idle.evaluate(ws, policy, signals.get(ws.id), now)
        counts[str(verdict.reason)] += 1
        if not verdict.pause:
            continue
        pauses.append({"workspace_id": ws.id, "reason": str(verdict.reason),
                       "message": verdict.message})
        if not dry_run:
            deps.bus.publish(new_event(detected(ws, signals.get(ws.id), now), source=SOURCE,
                                       requestid=idle.pause_request_id(ws)))
    return {"checked": len(running), "asked_runtime": len(wanted), "dry_run": dry_run,
            "idle": pauses, "verdicts": dict(sorted(counts.items())), "errors": errors,
            "seconds": round(time.monotonic() - started, 3)}


def handle(event: Event[Any], deps: Deps, consumer: str) -> IdleVerdict | None:
    """workspace.idle_detected -> the policy -> workspace.pause_requested (or nothing).

    Writes nothing itself: the pause goes through the lifecycle like any other, whose
    ledger makes a repeated request (same workspace version) one effect.
    """
    payload: WorkspaceIdleDetected = event.payload
    ws = deps.store.get_workspace(payload.workspace_id)
    profile = (catalog_knowing(deps, lambda c: c.knows(profile=ws.profile)).profiles
               .get(ws.profile) if ws is not None else None)
    if ws is None or profile is None:
        log.info("idle_detected for %s: no workspace or profile, ignored", payload.workspace_id)
        return None
    now = deps.clock()
    signals: Signals | None = Signals.from_event(payload)
    if payload.cause == idle.GPU_IDLE:  # monitoring saw the GPU only: ask for the kernels
        signals = idle.corroborated(Signals.from_event(payload),
                                    _runtime_signals(deps, ws.id, now))
    verdict = idle.evaluate(ws, profile.idle_policy, signals, now)
    log.info("idle_detected (%s) for %s: %s (%s)", payload.cause, ws.id, verdict.reason,
             verdict.message)
    if verdict.pause:
        requestid = idle.pause_request_id(ws)
        detail = f"{verdict.message}; {payload.evidence}" if payload.evidence else verdict.message
        deps.bus.publish(new_event(
            WorkspacePauseRequested(workspace_id=ws.id, actor=idle.ACTOR, cause=verdict.cause,
                                    detail=detail[:1000]),
            source=SOURCE, id=requestid, requestid=requestid))
    return verdict


def _runtime_signals(deps: Deps, ws_id: str, now: datetime) -> Signals | None:
    """What the runtime says of the kernels now (None where it cannot say)."""
    source: ActivitySource | None = getattr(deps.runtime, "activity", None)
    data = source(ws_id) if source is not None else None
    return Signals.from_activity(data, now) if data else None


def detected(ws: Workspace, signals: Signals | None, now: datetime) -> WorkspaceIdleDetected:
    """The idle_detected payload for ``ws``; without signals (the runtime did not answer,
    only the maximum age applies) the last activity is the workspace's own."""
    last = ((signals.last_activity if signals else None) or ws.last_activity
            or idle.running_since(ws, now))
    return WorkspaceIdleDetected(
        workspace_id=ws.id, last_activity=last.isoformat(),
        observed_at=(signals.observed_at if signals else now).isoformat(),
        busy_kernels=signals.busy_kernels if signals else 0,
        connections=signals.connections if signals else 0,
        gpu_utilization=signals.gpu_utilization if signals else None)


def _signals(source: ActivitySource | None, ids: list[str],
             now: datetime) -> tuple[dict[str, Signals], list[dict[str, str]]]:
    if source is None or not ids:
        return {}, []
    found: dict[str, Signals] = {}
    errors: list[dict[str, str]] = []

    def ask(ws_id: str) -> tuple[str, Signals | None, str | None]:
        try:
            data = source(ws_id)
            return ws_id, Signals.from_activity(data, now) if data else None, None
        except Exception as exc:  # one workspace's failure must not stop the sweep
            return ws_id, None, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=min(_ACTIVITY_WORKERS, len(ids))) as pool:
        for ws_id, signals, error in pool.map(ask, ids):
            if signals is not None:
                found[ws_id] = signals
            if error is not None:
                errors.append({"workspace_id": ws_id, "error": error})
    return found, errors
