"""Lifecycle handler: every event that moves a workspace goes through here.

Each one takes the same step through the pipeline (``functions.handlers.pipeline``): in the
transaction, load the workspace -> decide (``functions.domain.lifecycle.decide``; a request
also checked against the catalog and this runtime's hardware, every change charged to the
team's usage counters and, where the runtime reports its node, to the node's accelerator
counters ``nodes/{node}``) -> write the workspace, the counters, the snapshot record and the
audit entry. A create or resume that does not fit becomes QUEUED (``lifecycle.enqueue``)
when its profile queues. The outbox then carries the runtime commands
(``functions.handlers.commands``), a look at the queue when accelerators were freed or a
request joined it (``scheduling.Schedule``) and the workspace.state_changed event.

One thing happens before the transaction: a successful snapshot.finished (and a pause
or preemption of a workspace whose memory snapshots are off, which takes no snapshot)
releases the workspace's hardware first, because PAUSED promises it is free.

Whether a workspace's memory may be snapshotted is the catalog's answer for its team and
environment (``Catalog.memory_snapshots_for``), recorded on the workspace before every
decision so the domain decides with the admin file as it is now.
"""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime
from typing import Any

from events import (
    Event,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
)
from events.payloads import WORKSPACE_SEPARATOR, WorkspaceScheduled
from functions.domain import admission, links, retention, scheduling
from functions.domain.catalog import Catalog, Refusal, RefusalReason
from functions.domain.ide import ide_url
from functions.domain.lifecycle import (
    HOLDS_HARDWARE,
    Decision,
    Reason,
    Release,
    RuntimeDestroyed,
    Schedule,
    Signal,
    State,
    Workspace,
    decide,
    enqueue,
    enqueue_in_cluster,
    refuse_admission,
    still_queued,
)
from functions.domain.publishers import PERSON_FRONT_DOORS
from functions.domain.quota import Usage
from functions.domain.rights import request_refusal
from functions.handlers import pipeline
from functions.handlers.deps import Deps
from functions.ports import Subject, Tx, catalog_knowing

SOURCE = "//stasis/functions/lifecycle"
WORKSPACES = "workspaces"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply one lifecycle event; returns the decision (None for a duplicate)."""
    decision: Decision | None = pipeline.run(event, event.payload, deps, consumer, STEPS)
    return decision


def _transition(event: Event[Any], signal: Signal, deps: Deps, now: datetime) -> pipeline.Step:
    """An event or an internal signal (runtime destroyed) applied to its workspace."""
    ws_id = signal.workspace_id
    team = ws_id.split(WORKSPACE_SEPARATOR)[0]
    requested = signal if isinstance(signal, WorkspaceRequested) else None
    # what the event names is checked against the applied catalog, not a stale copy of it
    catalog = catalog_knowing(deps, lambda c: c.knows(
        team=team, member=requested.owner if requested else None,
        profile=getattr(signal, "profile", None), ide=requested.ide if requested else None,
        environment=requested.environment if requested else None))
    capabilities = _capabilities(signal, deps, catalog)
    nodes = scheduling.nodes_of(capabilities, catalog.scheduling.nodes)
    cluster_queue = capabilities.get("admission")  # Kueue admits accelerators there
    _release_before_pause_commits(event, signal, deps, catalog, now)

    def decide_in_tx(tx: Tx) -> Decision:
        doc = tx.get(WORKSPACES, ws_id)
        current = with_policy(Workspace.from_doc(doc) if doc is not None else None, catalog)
        usage = _Usage(tx, team)
        decision = _permitted(current, signal, event.origin, catalog) or \
            _through_proxy(decide(current, signal, now), deps.ide_proxy_url)
        if requested and decision.accepted:
            decision = _check_request(current, decision, catalog, requested, capabilities, now)
        decision = _prioritized(decision, catalog)
        counters = _Nodes(tx, nodes)
        decision = _to_cluster_queue(decision, catalog, cluster_queue, now)
        decision = _charge(current, decision, catalog, signal, usage, counters, tx, now)
        _record(tx, decision, event, signal, catalog, usage, now)
        if decision.accepted and decision.workspace is not None:
            written = with_policy(decision.workspace, catalog)
            assert written is not None
            tx.set(WORKSPACES, ws_id, written.to_doc())
        usage.write()
        counters.write()
        return decision

    # One instance admits a team's requests one at a time.
    return pipeline.Step(Subject("workspace", ws_id, lock=f"team:{team}"), decide_in_tx, SOURCE)


#: Every lifecycle signal takes the same step: the domain's ``decide`` tells them apart.
STEPS: dict[type[Any], pipeline.StepFor] = {kind: _transition for kind in typing.get_args(Signal)}


def _capabilities(signal: Signal, deps: Deps, catalog: Catalog) -> dict[str, Any]:
    """The runtime's capabilities, with its node's declared accelerators, for a signal that
    may take accelerators now (a create, a resume or a start on an accelerator profile);
    empty for the rest, which asks the runtime nothing."""
    wanted = isinstance(signal, WorkspaceRequested)
    if isinstance(signal, WorkspaceResumeRequested):
        ws = deps.store.get_workspace(signal.workspace_id)
        profile = catalog.profiles.get(signal.profile or (ws.profile if ws else ""))
        wanted = profile is not None and profile.accelerator is not None
    if isinstance(signal, WorkspaceScheduled):
        wanted = signal.action == "admit" and signal.node is not None
    if isinstance(signal, SnapshotFinished) and signal.succeeded:
        # a preempted workspace's resume is queued: in the cluster's queue, if it has one
        ws = deps.store.get_workspace(signal.workspace_id)
        wanted = ws is not None and ws.pause_cause == "preempted"
    if not wanted:
        return {}
    return scheduling.with_declared(deps.runtime.capabilities(), catalog.scheduling.nodes)


class _Nodes:
    """The accelerator counters of the runtime's nodes (``nodes/{id}``: ``{"used": {type:
    n}}``), read in the transaction only when a change needs them, written back when they
    moved. ``modelled``: the runtime reports its nodes (else capacity is not counted)."""

    def __init__(self, tx: Tx, nodes: tuple[scheduling.Node, ...] | None) -> None:
        self.tx, self.nodes = tx, nodes or ()
        self.modelled = nodes is not None
        self._read: dict[str, dict[str, int]] = {}
        self._used: dict[str, dict[str, int]] = {}

    def used(self, node_id: str) -> dict[str, int]:
        if node_id not in self._used:
            doc = self.tx.get("nodes", node_id) or {}
            self._read[node_id] = {k: int(v) for k, v in (doc.get("used") or {}).items()}
            self._used[node_id] = dict(self._read[node_id])
        return self._used[node_id]

    def place(self, demand: scheduling.Demand, prefer: str | None) -> str | None:
        """The node ``demand`` goes on: ``prefer`` (the scheduler's) if it still fits there,
        else the best fit; None if no node has it free."""
        used = {n.id: self.used(n.id) for n in self.nodes}
        preferred = [n for n in self.nodes if n.id == prefer]
        found = scheduling.place(preferred, used, demand) or \
            scheduling.place(self.nodes, used, demand)
        return found.id if found is not None else None

    def refusal(self, demand: scheduling.Demand) -> str:
        return scheduling.capacity_refusal(self.nodes, {n.id: self.used(n.id)
                                                        for n in self.nodes}, demand)

    def change(self, node_id: str, demand: scheduling.Demand, sign: int) -> None:
        """``demand`` taken (+1) or given back (-1) on ``node_id``; never below zero."""
        node = next((n for n in self.nodes if n.id == node_id), None)
        key = scheduling.node_key(node, demand.accelerator) if node else demand.accelerator
        used = self.used(node_id)
        used[key or demand.accelerator] = max(0, used.get(key or demand.accelerator, 0)
                                              + sign * demand.count)

    def write(self) -> None:
        for node_id, used in self._used.items():
            if used != self._read.get(node_id):
                self.tx.set("nodes", node_id, {"used": used}, merge=True)


class _Usage:
    """The team's usage counters, read in the transaction only when a change needs them,
    and written back when they moved."""

    def __init__(self, tx: Tx, team: str) -> None:
        self.tx, self.team = tx, team
        self._read: dict[str, Any] | None = None
        self._counters: dict[str, Any] | None = None

    def counters(self) -> dict[str, Any]:
        """The counters; changes to the returned dict are written."""
        if self._counters is None:
            self._read = dict((self.tx.get("teams", self.team) or {}).get("usage") or {})
            self._counters = dict(self._read)
        return self._counters

    def write(self) -> None:
        if self._counters is not None and self._counters != self._read:
            self.tx.update("teams", self.team, {"usage": self._counters})


_VERBS: dict[type[Any], str] = {
    WorkspaceRequested: "create", WorkspacePauseRequested: "pause",
    WorkspaceResumeRequested: "resume", WorkspaceDeleteRequested: "delete",
}


def _permitted(current: Workspace | None, signal: Signal, origin: str,
               catalog: Catalog) -> Decision | None:
    """A person's request through a front door (``publishers.PERSON_FRONT_DOORS``: chat,
    the portal, the CLI's function) checked
    against the catalog: refused (and audited, as every decision) when its actor may not
    do it; None to decide as usual. The front door checked first; this is the check a
    wrong or forged front door cannot skip."""
    verb = _VERBS.get(type(signal))
    if verb is None or origin not in PERSON_FRONT_DOORS:
        return None
    if isinstance(signal, WorkspaceRequested):
        actor, team_id, owner, name = signal.owner, signal.team, None, signal.name
    elif current is None or not isinstance(
            signal, WorkspacePauseRequested | WorkspaceResumeRequested | WorkspaceDeleteRequested):
        return None  # the domain says there is no such workspace (the rest are _VERBS')
    else:
        actor, team_id, owner, name = signal.actor, current.team, current.owner, current.name
    refusal = request_refusal(catalog.teams.get(team_id), actor, team_id=team_id,
                              owner=owner, name=name, verb=verb)
    if refusal is None:
        return None
    return Decision(False, Reason.NOT_PERMITTED, current, (), refusal,
                    current.state if current is not None else None)


def _through_proxy(decision: Decision, proxy_url: str | None) -> Decision:
    """Where there is an IDE access proxy, a running workspace's ``url`` is its IDE through
    the proxy; the runtime's direct address (and token) stays with the runtime's status,
    for the control plane only (the proxies, the idle sweep)."""
    ws = decision.workspace
    if not proxy_url or not decision.accepted or ws is None or ws.state != State.RUNNING \
            or not ws.url:
        return decision
    return dataclasses.replace(decision, workspace=dataclasses.replace(
        ws, url=ide_url(proxy_url, ws.id)))


def _check_request(current: Workspace | None, decision: Decision, catalog: Any,
                   requested: WorkspaceRequested, capabilities: Any, now: datetime) -> Decision:
    """Catalog and hardware: refused as FAILED with the reason, or the resolved request."""
    check = admission.check_request(catalog, requested, capabilities)
    if check.refusal or decision.workspace is None:
        return refuse_admission(current, requested, check.refusal or "refused", now)
    ws = dataclasses.replace(decision.workspace, environment=check.environment or
                             decision.workspace.environment,
                             state_message="; ".join(check.notices))
    return dataclasses.replace(decision, workspace=ws, message=ws.state_message)


def with_policy(ws: Workspace | None, catalog: Catalog) -> Workspace | None:
    """``ws`` with its memory-snapshot policy as the catalog says it now."""
    if ws is None:
        return None
    allowed = catalog.memory_snapshots_for(ws.team, ws.environment)
    return ws if ws.memory_snapshots == allowed else dataclasses.replace(
        ws, memory_snapshots=allowed)


def _release_before_pause_commits(event: Event[Any], signal: Signal, deps: Deps,
                                  catalog: Catalog, now: datetime) -> None:
    """PAUSED promises the hardware is free: stop the server before the state says so.

    Decided on a plain read first (a person's request checked against the catalog as the
    transaction checks it, so a refused pause stops nothing); the transaction decides
    again, and if it refuses (a concurrent delete won), the release was still right: the
    workspace was not to run.
    """
    pausing = isinstance(signal, WorkspacePauseRequested | WorkspaceScheduled)
    if not ((isinstance(signal, SnapshotFinished) and signal.succeeded) or pausing):
        return
    current = with_policy(deps.store.get_workspace(signal.workspace_id), catalog)
    if pausing and (current is None or current.memory_snapshots):
        return  # a pause with a snapshot releases when the snapshot is done
    preview = _permitted(current, signal, event.origin, catalog) or decide(current, signal, now)
    if preview.accepted and preview.workspace is not None and \
            preview.workspace.state in (State.PAUSED, State.QUEUED) and \
            any(isinstance(c, Release) for c in preview.commands):
        deps.runtime.release(signal.workspace_id)


def _prioritized(decision: Decision, catalog: Catalog) -> Decision:
    """A workspace that asks to run carries its priority class (the scheduler's order)."""
    ws = decision.workspace
    starting = (State.PROVISIONING, State.RESUMING)
    if not decision.accepted or ws is None or ws.state not in starting or \
            decision.previous_state in (*starting, State.QUEUED):
        return decision
    priority = catalog.priority_for(ws.team, ws.profile)
    return dataclasses.replace(decision, workspace=dataclasses.replace(
        ws, priority=priority.value, priority_class=priority.id))


def _to_cluster_queue(decision: Decision, catalog: Catalog, queue: str | None,
                      now: datetime) -> Decision:
    """Where the cluster admits accelerators (Kueue), a create or resume that takes some,
    and a preempted workspace's queued resume, wait in its queue with their pods gated."""
    ws = decision.workspace
    if queue is None or not decision.accepted or ws is None or \
            scheduling.demand_of(catalog.profiles.get(ws.profile)) is None:
        return decision
    starting = ws.state in (State.PROVISIONING, State.RESUMING) and \
        decision.previous_state not in HOLDS_HARDWARE
    if starting or decision.reason == Reason.REQUEUED:
        return enqueue_in_cluster(decision, str(queue), now)
    return decision


def _charge(current: Workspace | None, decision: Decision, catalog: Catalog, signal: Signal,
            usage: _Usage, nodes: _Nodes, tx: Tx, now: datetime) -> Decision:
    """Move the team's usage counters and the node's with the state change. What does not
    fit its team's quota or any node waits as QUEUED (the profile permitting), or is
    refused: a create as FAILED, a resume left as it was, a start stays QUEUED."""
    ws = decision.workspace
    if not decision.accepted or ws is None:
        return decision
    previous = decision.previous_state
    takes = ws.state in HOLDS_HARDWARE and previous not in HOLDS_HARDWARE
    gives = previous in HOLDS_HARDWARE and ws.state not in HOLDS_HARDWARE
    demand = scheduling.demand_of(catalog.profiles.get(ws.profile))
    trial = dict(usage.counters())
    if current is not None and current.queued_by and takes:
        # The cluster's queue admitted it (it holds the quotas): counted, never refused.
        admission.charge_refusal(catalog, previous, current, ws, trial, enforce=False)
        usage.counters().update(trial)
        return decision
    refusal = _quota(catalog, previous, current, ws, trial, tx)
    node: str | None = None
    if refusal is None and takes and demand is not None and nodes.modelled:
        node = nodes.place(demand, getattr(signal, "node", None))
        if node is None:
            refusal = Refusal(RefusalReason.NO_CAPACITY, nodes.refusal(demand))
    if refusal is None:
        usage.counters().update(trial)
        if node is not None and demand is not None:
            nodes.change(node, demand, +1)
            decision = dataclasses.replace(decision, workspace=dataclasses.replace(ws, node=node))
        old = scheduling.demand_of(catalog.profiles.get(current.profile)) if current else None
        if gives and current is not None and current.node and old is not None:
            nodes.change(current.node, old, -1)
        if (gives and old is not None) or decision.reason == Reason.REQUEUED:
            decision = _schedule(decision, f"{ws.id} gave back {old}")
        return decision
    if isinstance(signal, WorkspaceScheduled) and current is not None:
        return still_queued(current, refusal.message)
    if ws.state in (State.PROVISIONING, State.RESUMING) and \
            admission.may_queue(catalog, ws.profile, refusal):
        queued = enqueue(decision, refusal.message, now)
        assert queued.workspace is not None
        held = admission.charge_refusal(catalog, previous, current, queued.workspace,
                                        usage.counters())
        if held is None:
            return _schedule(queued, f"{ws.id} joined the queue")
        refusal = held
    if isinstance(signal, WorkspaceRequested):
        # Recorded as FAILED, holding nothing: the usage counters stay as they were.
        return refuse_admission(current, signal, refusal.message, now)
    # A resume over quota leaves the workspace as it was, with the reason.
    return Decision(False, Reason.ADMISSION_REFUSED, current, (), refusal.message, previous)


def _quota(catalog: Catalog, previous: State | None, current: Workspace | None,
           ws: Workspace, counters: dict[str, Any], tx: Tx) -> Refusal | None:
    """The team's quota for this change (``counters`` updated in place when it fits); over
    its own GPU/TPU quota, a team of a cohort may borrow what the cohort leaves unused."""
    refusal = admission.charge_refusal(catalog, previous, current, ws, counters)
    borrowable = (RefusalReason.GPU_QUOTA_EXCEEDED, RefusalReason.TPU_QUOTA_EXCEEDED)
    if refusal is None or refusal.reason not in borrowable:
        return refusal

    def usage_of(team: str) -> Usage:
        return Usage.from_dict(counters if team == ws.team else
                               (tx.get("teams", team) or {}).get("usage"))

    cohort = scheduling.cohort_for(catalog, ws.team, usage_of)
    if cohort is None:
        return refusal
    return admission.charge_refusal(catalog, previous, current, ws, counters, cohort=cohort)


def _schedule(decision: Decision, why: str) -> Decision:
    """The decision, with a look at the queue once it is committed."""
    return dataclasses.replace(decision, commands=(*decision.commands, Schedule(why)))


def _record(tx: Tx, decision: Decision, event: Event[Any], signal: Signal, catalog: Any,
            usage: _Usage, now: datetime) -> None:
    """The snapshot record and the audit entry, in the transaction of the decision."""
    ws = decision.workspace
    if decision.accepted and ws is not None:
        if isinstance(signal, SnapshotFinished) and ws.current_snapshot == signal.snapshot_id:
            doc = admission.snapshot_record(catalog, ws, signal, now)
            tx.set("snapshots", signal.snapshot_id, doc)
            # Parts shared with the workspace's other live snapshots are counted once:
            # only what none of them holds is added (read in this transaction, as the
            # expiry of a sibling reads them in its own).
            siblings = [retention.SnapshotRecord.from_doc(i, d)
                        for i, d in tx.find("snapshots", "workspace", ws.id)]
            added = retention.unshared_bytes(
                retention.SnapshotRecord.from_doc(signal.snapshot_id, doc), siblings)
            counters = usage.counters()
            counters["snapshot_bytes"] = int(counters.get("snapshot_bytes", 0)) + added
        if isinstance(signal, RuntimeDestroyed) and signal.released_snapshot_bytes:
            counters = usage.counters()
            counters["snapshot_bytes"] = max(
                0, int(counters.get("snapshot_bytes", 0)) - signal.released_snapshot_bytes)
        if isinstance(signal, RuntimeDestroyed) and ws.state == State.DELETED:
            # The workspace's links go with it, in the transaction that records it deleted.
            for token_hash, link in tx.find("links", "workspace", ws.id):
                if link.get("revoked_at") is None:
                    tx.update("links", token_hash, links.revoked_with_workspace(now))
    actor = getattr(signal, "actor", None) or getattr(signal, "owner", None) or event.source
    pipeline.audit(tx, event, decision, actor=actor, target=signal.workspace_id,
                   team=signal.workspace_id.split(WORKSPACE_SEPARATOR)[0], now=now)
