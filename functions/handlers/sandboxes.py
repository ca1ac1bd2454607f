"""Sandbox handler: admission on sandbox.requested, completion on sandbox.finished, idle
suspension on sandbox.idle_detected and sandbox.suspended, and resume on
sandbox.resume_requested.

load (in the transaction: the sandbox, the team's queue, the policy) -> decide
(``functions.domain.sandboxes``) -> persist (same transaction: ``sandboxes/{id}``, the
queue ``sandbox_queues/{team}``, the positions of those still waiting, an audit entry, the
ledger with its outbox) -> start what was admitted, resume what was promoted -> mark the
ledger entry done.

The requester is told through Firestore and the event itself: ``sandboxes/{id}.message``
says what happened and how to review the patch (``stasis sandbox show ID``), and
sandbox.finished is on its own topic, where a notifier (chat) can subscribe; a separate
``sandbox.state_changed`` event would only repeat it.

A runtime that refuses to start a sandbox (a repository path that does not exist on the
node, say) is answered like the runtime would: a sandbox.finished ``failed_to_start`` is
published, so the sandbox is recorded FAILED and its slot goes to the next one. A runtime
that no longer has a sandbox it is asked to resume is answered the same way, with
``runtime_lost``.

What a sandbox holds on its runtime after it ends or is held goes through the same outbox:
a recorded end asks ``runtime.cleanup`` (a cluster deletes the Pod, Secret, policies and
bundle; the monitor that reported the end only reads), and a suspension by Pod Snapshot
asks ``runtime.release`` (the Pod goes; the snapshot keeps it).

Each suspension of a sandbox is its own request to the ledger: the runtime publishes the
n-th one with the requestid ``<the sandbox's requestid>.suspend-<n>``.

A runtime that only measures idleness (the cluster monitor, which reads but never writes)
reports sandbox.idle_detected; when the sandbox may be suspended the outbox asks
``runtime.suspend`` (on Kubernetes: a Pod Snapshot trigger), and the runtime's
sandbox.suspended then records it as above. A refusal (no running pod any more) is logged
and not retried: the next idle period is reported again.
"""

from __future__ import annotations

import logging
from typing import Any

from events import (
    Event,
    SandboxFinished,
    SandboxIdleDetected,
    SandboxRequested,
    SandboxResumeRequested,
    SandboxSuspended,
    new_event,
)
from functions.domain.catalog import Catalog
from functions.domain.sandboxes import (
    Decision,
    Request,
    RunSpec,
    SandboxState,
    TeamQueue,
    admit,
    finish,
    idle_detected,
    request_resume,
    resolve_policy,
    suspend,
)
from functions.handlers.deps import Deps
from functions.handlers.sandbox_ports import SandboxDeps, SandboxView
from functions.ports import RuntimeRefused

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/sandboxes"
SANDBOXES = "sandboxes"
QUEUES = "sandbox_queues"
#: A suspension whose state lives in a Pod Snapshot: the Pod itself can go.
POD_METHOD = "pod"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply a sandbox event; the decision (None: a duplicate)."""
    if isinstance(event.payload, SandboxRequested):
        return _requested(event, event.payload, deps, consumer)
    if isinstance(event.payload, SandboxFinished):
        return _finished(event, event.payload, deps, consumer)
    if isinstance(event.payload, SandboxSuspended):
        return _suspended(event, event.payload, deps, consumer)
    if isinstance(event.payload, SandboxResumeRequested):
        return _resume_requested(event, event.payload, deps, consumer)
    if isinstance(event.payload, SandboxIdleDetected):
        return _idle_detected(event, event.payload, deps, consumer)
    raise TypeError(f"the sandbox handler does not take {event.name}")


def _sandboxes(deps: Deps) -> SandboxDeps:
    sandboxes: SandboxDeps | None = deps.sandboxes
    if sandboxes is None:
        raise RuntimeError("sandboxes are not configured (Deps.sandboxes is None)")
    return sandboxes


def _requested(event: Event[Any], payload: SandboxRequested, deps: Deps,
               consumer: str) -> Decision | None:
    now = deps.clock()
    catalog: Catalog = deps.catalog()
    request = Request(
        sandbox_id=payload.sandbox_id, team=payload.team, requester=payload.requester,
        repository=payload.repository, command=payload.command, base_ref=payload.base_ref,
        limits=dict(payload.limits), allowed_network=tuple(payload.allowed_network),
        requestid=event.requestid, reply_to=payload.reply_to)

    def decide(view: SandboxView) -> tuple[list[dict[str, Any]], Decision]:
        policy = resolve_policy(view.policy_section(), payload.team)
        decision = admit(request, team=catalog.teams.get(payload.team), policy=policy,
                         queue=view.queue(payload.team), existing=view.sandbox(request.sandbox_id),
                         now=now)
        _persist(view, decision, event, payload.team, payload.requester, now)
        return _outbox(decision), decision

    return _run(event, deps, consumer, payload.sandbox_id, decide, now)


def _finished(event: Event[Any], payload: SandboxFinished, deps: Deps,
              consumer: str) -> Decision | None:
    now = deps.clock()

    def decide(view: SandboxView) -> tuple[list[dict[str, Any]], Decision]:
        sandbox = view.sandbox(payload.sandbox_id)
        team = sandbox.team if sandbox is not None else ""
        policy = resolve_policy(view.policy_section(), team)
        queue = view.queue(team) if sandbox is not None else None
        decision = finish(sandbox, payload, policy=policy, queue=queue or TeamQueue(),
                          load=view.sandbox, now=now)
        _persist(view, decision, event, team, event.source, now)
        ended = [{"cleanup": payload.sandbox_id, "team": team}] if decision.accepted else []
        return [*ended, *_outbox(decision)], decision

    return _run(event, deps, consumer, payload.sandbox_id, decide, now)


def _suspended(event: Event[Any], payload: SandboxSuspended, deps: Deps,
               consumer: str) -> Decision | None:
    now = deps.clock()

    def decide(view: SandboxView) -> tuple[list[dict[str, Any]], Decision]:
        sandbox = view.sandbox(payload.sandbox_id)
        team = sandbox.team if sandbox is not None else ""
        policy = resolve_policy(view.policy_section(), team)
        queue = view.queue(team) if sandbox is not None else TeamQueue()
        decision = suspend(sandbox, payload, policy=policy, queue=queue, load=view.sandbox,
                           now=now)
        _persist(view, decision, event, team, event.source, now)
        held = ([{"release": payload.sandbox_id, "team": team}]
                if decision.accepted and payload.method == POD_METHOD else [])
        return [*held, *_outbox(decision)], decision

    return _run(event, deps, consumer, payload.sandbox_id, decide, now)


def _resume_requested(event: Event[Any], payload: SandboxResumeRequested, deps: Deps,
                      consumer: str) -> Decision | None:
    now = deps.clock()
    catalog: Catalog = deps.catalog()

    def decide(view: SandboxView) -> tuple[list[dict[str, Any]], Decision]:
        sandbox = view.sandbox(payload.sandbox_id)
        team = sandbox.team if sandbox is not None else ""
        policy = resolve_policy(view.policy_section(), team)
        queue = view.queue(team) if sandbox is not None else TeamQueue()
        decision = request_resume(sandbox, payload.sandbox_id, payload.requester,
                                  team=catalog.teams.get(team), policy=policy, queue=queue,
                                  now=now)
        _persist(view, decision, event, team, payload.requester, now)
        return _outbox(decision), decision

    return _run(event, deps, consumer, payload.sandbox_id, decide, now)


def _idle_detected(event: Event[Any], payload: SandboxIdleDetected, deps: Deps,
                   consumer: str) -> Decision | None:
    now = deps.clock()

    def decide(view: SandboxView) -> tuple[list[dict[str, Any]], Decision]:
        sandbox = view.sandbox(payload.sandbox_id)
        decision = idle_detected(sandbox, payload)
        _persist(view, decision, event, sandbox.team if sandbox is not None else "",
                 event.source, now)
        return _outbox(decision), decision

    return _run(event, deps, consumer, payload.sandbox_id, decide, now)


def _outbox(decision: Decision) -> list[dict[str, Any]]:
    return [*({"start": s} for s in decision.start), *({"resume": s} for s in decision.resume),
            *({"suspend": c.sandbox_id, "team": c.team, "sequence": c.sequence,
               "idle_seconds": c.idle_seconds} for c in decision.suspend)]


def _run(event: Event[Any], deps: Deps, consumer: str, subject: str, decide: Any,
         now: Any) -> Decision | None:
    store = _sandboxes(deps).store
    result = store.transact(event, consumer, decide, subject=subject, now=now)
    _send(result.ledger.outbox, deps, event)
    if result.ledger.status == "pending":
        store.mark_done(result.ledger.key)
    decision: Decision | None = result.value
    if decision is not None:
        log.info("%s %s: %s (%s) %s", event.name, subject,
                 "accepted" if decision.accepted else "refused", decision.reason,
                 decision.message)
    return decision


def _persist(view: SandboxView, decision: Decision, event: Event[Any], team: str, actor: str,
             now: Any) -> None:
    for sandbox in decision.sandboxes:
        view.set(SANDBOXES, sandbox.id, {**sandbox.to_doc(), "updated_at": now})
    if decision.queue is not None and team:
        view.set(QUEUES, team, {**decision.queue.to_doc(), "team": team, "updated_at": now})
    for sandbox_id, position, message in decision.positions:
        view.update(SANDBOXES, sandbox_id, {"queue_position": position, "message": message,
                                            "updated_at": now})
    subject = decision.subject
    target = subject.id if subject is not None else getattr(event.payload, "sandbox_id", "")
    view.set("audit", "", {
        "actor": actor, "action": event.name, "target": target, "team": team,
        "outcome": ("accepted: " if decision.accepted else "refused: ") + str(decision.reason),
        "message": decision.message, "event_id": event.id, "requestid": event.requestid,
        "time": now,
    })
    view.outcome.update({
        "accepted": decision.accepted, "reason": str(decision.reason),
        "message": decision.message,
        "state": str(subject.state) if subject is not None else None,
        "queue_position": subject.queue_position if subject is not None else None,
        "started": list(decision.start),
        "resumed": list(decision.resume),
    })


def _send(outbox: list[dict[str, Any]], deps: Deps, event: Event[Any]) -> None:
    sandboxes = _sandboxes(deps)
    for item in outbox:
        if "cleanup" in item:
            sandboxes.runtime.cleanup(item["cleanup"], team=item["team"])
            continue
        if "release" in item:
            try:
                sandboxes.runtime.release(item["release"], team=item["team"])
            except RuntimeRefused as exc:  # no snapshot to come back to: it keeps running
                log.warning("sandbox %s stays on its node: %s", item["release"], exc)
            continue
        if "suspend" in item:
            try:
                sandboxes.runtime.suspend(item["suspend"], team=item["team"],
                                          sequence=int(item["sequence"]),
                                          idle_seconds=int(item["idle_seconds"]))
            except RuntimeRefused as exc:  # it ended or moved meanwhile: nothing to hold
                log.warning("sandbox %s not suspended: %s", item["suspend"], exc)
            continue
        resuming = "resume" in item
        sandbox = sandboxes.store.get(item["resume"] if resuming else item["start"])
        if sandbox is None or sandbox.state != SandboxState.RUNNING:
            continue  # it ended or was held meanwhile (a redelivered outbox): nothing to do
        spec = RunSpec.of(sandbox, deps.snapshot_bucket)
        try:
            if resuming:
                sandboxes.runtime.resume(spec)
            else:
                sandboxes.runtime.start(spec)
        except RuntimeRefused as exc:
            # Permanent: report it as the runtime would, so the slot is freed.
            failure = SandboxFinished(
                sandbox.id, False, termination="runtime_lost" if resuming else "failed_to_start",
                error=f"the runtime refused to {'resume' if resuming else 'start'} it: {exc}")
            deps.bus.publish(new_event(failure, source=SOURCE, requestid=sandbox.requestid))
