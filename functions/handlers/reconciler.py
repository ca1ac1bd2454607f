"""The reconciler: repairs stuck transitions and processes that outlived their state.

Runs on a schedule (Cloud Scheduler -> the ``reconcile`` function) and on demand
(``stasis reconcile``). Reads the workspaces in transition or at rest with a possible
process, asks the runtime what it runs, and acts on the pure plan of
functions.domain.reconcile: repairs are published as events, orphans are released.
RUNNING sandboxes past their wall clock + grace get a sandbox.finished ``runtime_lost``.
RUNNING local jobs whose workspace's server stopped get a job.finished ``runtime_lost``,
and so do RUNNING kubernetes jobs that have had no JobSet for 5 minutes. RUNNING
workspaces whose server vanished get workspace.preempted ``server_lost``, checkpoints come
due by their profile's policy, and a scheduler pass looks at the queue (queued requests
past their maximum wait fail there).

First of all, the relay: a decided request whose outbox is still unsent past
``RELAY_AFTER`` (its deliveries were spent while the runtime was away: the delivery guard
then acknowledges it, ``functions.delivery``) is handed to its consumer again, in this
process, with the event its ledger entry kept; the consumer finds its entry and sends the
outbox, exactly as a redelivery would. It runs before the runtime is listed, so a restore it
starts counts as the runtime's operation, not as a stuck transition.
"""

from __future__ import annotations

import logging
from typing import Any

from events import new_event
from functions.domain.jobs import JobState
from functions.domain.lifecycle import State
from functions.domain.reconcile import (
    Plan,
    Relay,
    RuntimeView,
    checkpoints_due,
    lost_cluster_jobs,
    lost_jobs,
    plan,
    relays_due,
    sandbox_repairs,
)
from functions.domain.sandboxes import SandboxState
from functions.handlers import scheduler
from functions.handlers.deps import Deps

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/reconciler"
_WATCHED = [State.PROVISIONING, State.PAUSING, State.RESUMING, State.DELETING, State.PAUSED,
            State.FAILED, State.RUNNING, State.QUEUED]


def reconcile(deps: Deps, *, fix: bool = True) -> Plan:
    relays = _relay(deps, fix=fix)
    # The runtime first: a server that starts after this look is not taken for lost.
    observed = deps.clock()
    runtime = {s.workspace_id: RuntimeView(s.running, s.operation)
               for s in deps.runtime.list()}
    workspaces = deps.store.list_workspaces(states=_WATCHED, limit=10_000)
    now = deps.clock()
    result = plan(workspaces, runtime, now, observed_at=observed)
    result.relays = relays
    if any(ws.state == State.RUNNING for ws in workspaces):
        catalog = deps.catalog()
        every = {p.id: p.scheduling.checkpoint_every_seconds
                 for p in catalog.profiles.values()
                 if p.scheduling.checkpoint_every_seconds}
        repaired = {r.workspace_id for r in result.repairs}
        # what it recorded, and the admin file as it is now (an edit since its last event)
        result.repairs.extend(r for r in checkpoints_due(
            workspaces, every, now, memory_snapshots=lambda ws: ws.memory_snapshots and
            catalog.memory_snapshots_for(ws.team, ws.environment))
            if r.workspace_id not in repaired)
    _repair_sandboxes(deps, result, fix=fix)
    _repair_jobs(deps, result, fix=fix)
    result.schedule = scheduler.run(deps, fix=fix, why="reconciler").summary()
    if not fix:
        return result
    for repair in result.repairs:
        log.warning("reconcile %s: %s", repair.workspace_id, repair.why)
        if repair.release:
            deps.runtime.release(repair.workspace_id)
        if repair.event is not None:
            deps.bus.publish(new_event(repair.event, source=SOURCE, id=repair.event_id,
                                       requestid=repair.event_id))
    return result


def _relay(deps: Deps, *, fix: bool) -> list[Relay]:
    """Hand each pending entry past ``RELAY_AFTER`` back to its event function."""
    pending = {p.key: p for p in deps.store.pending()}
    due, given_up = relays_due(((p.key, p.consumer, p.processed_at) for p in pending.values()),
                               deps.consumers, deps.clock())
    for relay in given_up:
        log.error("relay %s (%s): %s, no longer tried", relay.key, relay.consumer, relay.why)
    if not fix:
        return due
    for relay in due:
        event = pending[relay.key].event
        log.warning("relay %s to %s: %s", event.describe(), relay.consumer, relay.why)
        try:
            deps.consumers[relay.consumer](event, deps, relay.consumer)
        except Exception as exc:  # still unsent: the next run tries again
            log.warning("relay %s to %s failed: %s", event.describe(), relay.consumer, exc)
    return due


def _repair_sandboxes(deps: Deps, result: Plan, *, fix: bool) -> None:
    """RUNNING sandboxes whose runtime went silent past their wall clock end runtime_lost
    (through the sandbox handler, like a runtime report), which frees their slots."""
    if deps.sandboxes is None:
        return
    running = deps.sandboxes.store.list(states=(SandboxState.RUNNING,), limit=1000)
    result.sandboxes.extend(sandbox_repairs(running, deps.clock()))
    if not fix:
        return
    for repair in result.sandboxes:
        log.warning("reconcile sandbox %s: %s", repair.sandbox_id, repair.why)
        deps.bus.publish(new_event(repair.event, source=SOURCE, id=repair.event_id,
                                   requestid=repair.event_id))


def _repair_jobs(deps: Deps, result: Plan, *, fix: bool) -> None:
    """RUNNING local jobs whose kernel went with their workspace's server end runtime_lost
    (through the jobs handler, like the kernel's own report), which gives their
    accelerators back."""
    if deps.jobs is None:
        return
    running = deps.jobs.list(states=(JobState.RUNNING,), limit=1000)
    ids = {job.workspace_id for job in running if job.workspace_id}
    workspaces = {ws_id: deps.store.get_workspace(ws_id) for ws_id in sorted(ids)}
    result.jobs.extend(lost_jobs(running, workspaces, deps.clock()))
    # kubernetes jobs whose JobSet is gone without a report of their end
    job_runtime = getattr(deps, "job_runtime", None)
    if job_runtime is not None:
        result.jobs.extend(lost_cluster_jobs(running, job_runtime.job_ids(), deps.clock()))
    if not fix:
        return
    for repair in result.jobs:
        log.warning("reconcile job %s: %s", repair.job_id, repair.why)
        deps.bus.publish(new_event(repair.event, source=SOURCE, id=repair.event_id,
                                   requestid=repair.event_id))


def summary(result: Plan) -> list[dict[str, Any]]:
    """Every repair, and what the scheduler's pass did (``schedule``)."""
    return [{"workspace_id": r.workspace_id, "why": r.why,
             "action": "release" if r.release else (type(r.event).__name__ if r.event else "")}
            for r in result.repairs] + [
        {"sandbox_id": r.sandbox_id, "why": r.why, "action": "SandboxFinished"}
        for r in result.sandboxes] + [
        {"job_id": r.job_id, "why": r.why, "action": "JobFinished"} for r in result.jobs] + [
        {"ledger_entry": r.key, "consumer": r.consumer, "why": r.why, "action": "relay"}
        for r in result.relays]
