"""Lifecycle handler: every event that moves a workspace goes through here.

load (in the transaction) -> decide (functions.domain) -> persist (same transaction) ->
send the outbox (runtime commands, state_changed events) -> mark the ledger entry done.
A redelivered event whose entry is still pending sends its outbox again: every command and
event in it is idempotent (runtime calls are, derived events have deterministic ids).
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from events import (
    Event,
    SnapshotFinished,
    WorkspaceRequested,
    WorkspaceRuntimeFailed,
    WorkspaceStateChanged,
    from_pubsub,
    new_event,
    to_pubsub,
)
from events.payloads import WORKSPACE_SEPARATOR
from functions.domain import admission, retention
from functions.domain.lifecycle import (
    Decision,
    Destroy,
    DiscardSnapshot,
    Provision,
    Reason,
    Release,
    Restore,
    RuntimeDestroyed,
    Signal,
    Snapshot,
    Workspace,
    decide,
    refuse_admission,
)
from functions.handlers.deps import Deps
from functions.ports import RuntimeRefused, WorkspaceSpec
from functions.ports import Transaction as TxView

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/lifecycle"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply one lifecycle event; returns the decision (None for a duplicate)."""
    return apply(event, event.payload, deps, consumer)


def apply(event: Event[Any], signal: Signal, deps: Deps, consumer: str) -> Decision | None:
    """Apply an event or an internal signal (runtime destroyed, reconciler) to its workspace."""
    ws_id = signal.workspace_id
    team_id = ws_id.split(WORKSPACE_SEPARATOR)[0]
    now = deps.clock()
    catalog = deps.catalog()
    requested = signal if isinstance(signal, WorkspaceRequested) else None
    capabilities = deps.runtime.capabilities() if requested else {}

    def decide_in_tx(view: TxView) -> tuple[Workspace | None, list[dict[str, Any]], Decision]:
        decision = decide(view.workspace, signal, now)
        if requested and decision.accepted:
            decision = _check_request(view, decision, catalog, requested, capabilities, now)
        decision = _charge(view, decision, catalog, requested, now)
        _record(view, decision, event, signal, catalog, now)
        return (decision.workspace if decision.accepted else None,
                _outbox(decision, event), decision)

    _release_before_pause_commits(signal, deps, now)
    result = deps.store.transition(event, consumer, ws_id, decide_in_tx, team=team_id, now=now)
    _send(result.ledger.outbox, deps, event)
    if result.ledger.status == "pending":
        deps.store.mark_done(result.ledger.key)
    decision: Decision | None = result.value
    if decision is not None:
        log.info("%s %s: %s (%s) %s", event.name, ws_id,
                 "accepted" if decision.accepted else "refused", decision.reason,
                 decision.message)
    return decision


def _check_request(view: TxView, decision: Decision, catalog: Any,
                   requested: WorkspaceRequested, capabilities: Any, now: datetime) -> Decision:
    """Catalog and hardware: refused as FAILED with the reason, or the resolved request."""
    check = admission.check_request(catalog, requested, capabilities)
    if check.refusal or decision.workspace is None:
        return refuse_admission(view.workspace, requested, check.refusal or "refused", now)
    ws = dataclasses.replace(decision.workspace, environment=check.environment or
                             decision.workspace.environment,
                             state_message="; ".join(check.notices))
    return dataclasses.replace(decision, workspace=ws, message=ws.state_message)


def _release_before_pause_commits(signal: Signal, deps: Deps, now: datetime) -> None:
    """PAUSED promises the hardware is free: stop the server before the state says so.

    Decided on a plain read first; the transaction decides again, and if it refuses (a
    concurrent delete won), the release was still right: the workspace was not to run.
    """
    if not (isinstance(signal, SnapshotFinished) and signal.succeeded):
        return
    preview = decide(deps.store.get_workspace(signal.workspace_id), signal, now)
    if preview.accepted and any(isinstance(c, Release) for c in preview.commands):
        deps.runtime.release(signal.workspace_id)


def _charge(view: TxView, decision: Decision, catalog: Any,
            requested: WorkspaceRequested | None, now: datetime) -> Decision:
    """Move the team's usage counters with the state change, refusing over quota."""
    if not decision.accepted or decision.workspace is None:
        return decision
    ws = decision.workspace
    refusal = admission.charge(catalog, decision.previous_state, view.workspace, ws,
                               view.usage(ws.team))
    if refusal is None:
        return decision
    if requested is not None:
        # Recorded as FAILED, holding nothing: the usage counters stay as they were.
        return refuse_admission(view.workspace, requested, refusal, now)
    # A resume over quota leaves the workspace as it was, with the reason.
    return Decision(False, Reason.ADMISSION_REFUSED, view.workspace, (), refusal,
                    decision.previous_state)


def _record(view: TxView, decision: Decision, event: Event[Any], signal: Signal,
            catalog: Any, now: datetime) -> None:
    """The snapshot record and the audit entry, in the transaction of the decision."""
    ws = decision.workspace
    if decision.accepted and ws is not None:
        if isinstance(signal, SnapshotFinished) and ws.current_snapshot == signal.snapshot_id:
            view.set("snapshots", signal.snapshot_id,
                     admission.snapshot_record(catalog, ws, signal, now))
            usage = view.usage(ws.team)
            usage["snapshot_bytes"] = int(usage.get("snapshot_bytes", 0)) + signal.bytes
        if isinstance(signal, RuntimeDestroyed) and signal.released_snapshot_bytes:
            usage = view.usage(ws.team)
            usage["snapshot_bytes"] = max(
                0, int(usage.get("snapshot_bytes", 0)) - signal.released_snapshot_bytes)
    actor = getattr(signal, "actor", None) or getattr(signal, "owner", None) or event.source
    outcome = ("accepted: " if decision.accepted else "refused: ") + str(decision.reason)
    view.set("audit", "", {
        "actor": actor, "action": event.name, "target": signal.workspace_id,
        "outcome": outcome, "message": decision.message, "event_id": event.id,
        "requestid": event.requestid, "team": signal.workspace_id.split(WORKSPACE_SEPARATOR)[0],
        "time": now,
    })
    view.outcome.update({"accepted": decision.accepted, "reason": str(decision.reason),
                         "message": decision.message,
                         "state": str(ws.state) if ws is not None else None})


def _outbox(decision: Decision, event: Event[Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"command": type(c).__name__, **dataclasses.asdict(c)} for c in decision.commands]
    ws = decision.workspace
    if decision.changed_state and ws is not None:
        changed = new_event(
            WorkspaceStateChanged(
                workspace_id=ws.id, team=ws.team, owner=ws.owner, name=ws.name,
                from_state=str(decision.previous_state) if decision.previous_state else None,
                to_state=str(ws.state), reason=str(decision.reason), version=ws.version,
                message=decision.message, url=ws.url, reply_to=ws.reply_to),
            source=SOURCE, id=f"{ws.id}-v{ws.version}", requestid=event.requestid)
        data, attributes = to_pubsub(changed)
        items.append({"publish": data.decode(), "attributes": attributes})
    return items


def _send(outbox: list[dict[str, Any]], deps: Deps, event: Event[Any]) -> None:
    for item in outbox:
        if "publish" in item:
            deps.bus.publish(from_pubsub(item["publish"].encode(), item["attributes"]))
            continue
        _execute(item, deps, event)


def _execute(item: dict[str, Any], deps: Deps, event: Event[Any]) -> None:
    kind = item["command"]
    ws_id = item["workspace_id"]
    if kind == Release.__name__:
        deps.runtime.release(ws_id)
        return
    if kind == DiscardSnapshot.__name__:
        deps.snapshots.discard(ws_id, item["snapshot_id"])
        return
    if kind == Destroy.__name__:
        deps.runtime.destroy(ws_id, keep_home=item["keep_home"])
        # Snapshots go with the workspace unless the retention policy keeps them (the
        # janitor then expires them by age, count and bytes like any other).
        released = (deps.snapshots.discard_all(ws_id)
                    if _snapshots_go_with(ws_id, deps) else 0)
        apply(event, RuntimeDestroyed(ws_id, released), deps, "internal-destroyed")
        return
    ws = deps.store.get_workspace(ws_id)
    if ws is None:
        return
    spec = workspace_spec(ws, deps, event.requestid)
    try:
        if kind == Provision.__name__:
            deps.runtime.provision(spec)
        elif kind == Snapshot.__name__:
            deps.runtime.snapshot(spec, item["snapshot_id"])
        elif kind == Restore.__name__:
            deps.runtime.restore(spec, item["snapshot_id"])
    except RuntimeRefused as exc:
        # Permanent: report it as the runtime would, so the lifecycle records the failure.
        failure: Any
        if kind == Snapshot.__name__:
            failure = SnapshotFinished(ws_id, item["snapshot_id"], False, error=str(exc))
        else:
            operation = "provision" if kind == Provision.__name__ else "resume"
            failure = WorkspaceRuntimeFailed(ws_id, operation, str(exc))
        deps.bus.publish(new_event(failure, source=SOURCE, requestid=event.requestid))


def _snapshots_go_with(ws_id: str, deps: Deps) -> bool:
    ws = deps.store.get_workspace(ws_id)
    return ws is None or retention.deletes_with_workspace(deps.catalog(), ws.team, ws.profile)


def workspace_spec(ws: Workspace, deps: Deps, requestid: str) -> WorkspaceSpec:
    catalog = deps.catalog()
    return WorkspaceSpec(
        workspace_id=ws.id, team=ws.team, owner=ws.owner, name=ws.name, ide=ws.ide,
        environment=admission.environment_of(catalog, ws.environment),
        profile=admission.profile_of(catalog, ws.profile),
        snapshot_bucket=deps.snapshot_bucket,
        snapshot_prefix=f"snapshots/{ws.team}/{ws.id}", requestid=requestid)
