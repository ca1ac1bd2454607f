"""The HTTP faces of the periodic jobs: the reconciler, the idle sweep, the janitor and the
cost rollup.

Cloud Scheduler calls them on the crons of ``functions/routes.py`` (locally
``stack/scheduler.py``; ``stasis reconcile|idle sweep|janitor|cost`` call them now). Each reads
its query string, runs its job with the control plane's ``Deps`` and answers JSON; a bad
parameter is a 400 with the reason.
"""

from __future__ import annotations

from typing import Any

from functions.handlers import cost, idle, reconciler
from functions.handlers import janitor as janitor_job
from functions.handlers.deps import Deps
from functions.ports import RuntimeUnavailable


def reconcile(request: Any, deps: Deps) -> Any:
    """Repair stuck transitions (``?dry_run=1``: only say which); answers the plan."""
    try:
        plan = reconciler.reconcile(deps, fix=request.args.get("dry_run") is None)
    except RuntimeUnavailable as exc:  # the next scheduled run tries again
        return {"error": f"the runtime did not answer: {exc}"}, 503
    return {"repairs": reconciler.summary(plan), "schedule": plan.schedule}


def idle_sweep(request: Any, deps: Deps) -> Any:
    """Pause idle workspaces (``?dry_run=1``: only say which)."""
    return idle.sweep(deps, dry_run=request.args.get("dry_run") is not None)


def janitor(request: Any, deps: Deps) -> Any:
    """Snapshot retention and orphans; ``?mode=report|policy|fix`` (default policy)."""
    mode = request.args.get("mode", "policy")
    if mode not in janitor_job.MODES:
        return {"error": f"unknown mode {mode!r}: one of {', '.join(janitor_job.MODES)}"}, 400
    return janitor_job.run(deps, mode=mode)


def cost_rollup(request: Any, deps: Deps) -> Any:
    """Per-team cost rollups (``?team=T``; ``?dry_run=1``: computed, not written)."""
    try:
        return {"teams": cost.rollup(deps, team=request.args.get("team") or None,
                                     write=request.args.get("dry_run") is None)}
    except ValueError as exc:
        return {"error": str(exc)}, 400
