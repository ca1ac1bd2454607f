"""Sandbox handler: admission on sandbox.requested, completion on sandbox.finished, idle
suspension on sandbox.idle_detected and sandbox.suspended, and resume on
sandbox.resume_requested.

Each event takes one step through the pipeline (``functions.handlers.pipeline``; which
decision an event takes is the table :data:`STEPS`): in the transaction, load the sandbox,
the team's queue and the policy -> decide (``functions.domain.sandboxes``) -> write
``sandboxes/{id}``, the queue ``sandbox_queues/{team}``, the positions of those still
waiting and an audit entry. The outbox then carries what the runtime must do
(``functions.handlers.commands``: start what was admitted, resume what was promoted, clean
up what ended, release a Pod whose state a Pod Snapshot keeps, suspend what a cluster
reported idle) and a sandbox.state_changed for every record whose state changed, which the
chat notifier (``functions.chatops.notify``) tells the requester about.

A runtime that refuses to start a sandbox (a repository path that does not exist on the
node, say) is answered like the runtime would: a sandbox.finished ``failed_to_start`` is
published, so the sandbox is recorded FAILED and its slot goes to the next one. A runtime
that no longer has a sandbox it is asked to resume is answered the same way, with
``runtime_lost``.

Each suspension of a sandbox is its own request to the ledger: the runtime publishes the
n-th one with the requestid ``<the sandbox's requestid>.suspend-<n>``.

A runtime that only measures idleness (the cluster monitor, which reads but never writes)
reports sandbox.idle_detected; when the sandbox may be suspended the outbox asks
``runtime.suspend`` (on Kubernetes: a Pod Snapshot trigger), and the runtime's
sandbox.suspended then records it as above. A refusal (no running pod any more) is logged
and not retried: the next idle period is reported again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from events import (
    Event,
    SandboxFinished,
    SandboxIdleDetected,
    SandboxRequested,
    SandboxResumeRequested,
    SandboxSuspended,
)
from functions.domain.catalog import Catalog
from functions.domain.sandboxes import (
    Decision,
    Refusal,
    Request,
    Sandbox,
    SandboxPolicy,
    TeamQueue,
    admit,
    finish,
    idle_detected,
    request_resume,
    resolve_policy,
    suspend,
)
from functions.handlers import pipeline
from functions.handlers.commands import sandbox_deps
from functions.handlers.deps import Deps
from functions.ports import Subject, Tx, catalog_knowing

SOURCE = "//stasis/functions/sandboxes"
SANDBOXES = "sandboxes"
QUEUES = "sandbox_queues"


def handle(event: Event[Any], deps: Deps, consumer: str) -> Decision | None:
    """Apply a sandbox event; the decision (None: a duplicate)."""
    sandbox_deps(deps)  # refuses before anything is decided when sandboxes are not run
    decision: Decision | None = pipeline.run(event, event.payload, deps, consumer, STEPS)
    return decision


class _Read:
    """What a sandbox decision reads in its transaction: the sandbox it is about (and any
    other it promotes), the team's queue and the policy, each only when asked for."""

    def __init__(self, tx: Tx, sandbox_id: str, team: str | None) -> None:
        self.tx = tx
        self.sandbox = self.load(sandbox_id)
        #: The request's team, else the sandbox's ("": a sandbox nobody knows).
        self.team = team or (self.sandbox.team if self.sandbox is not None else "")

    def load(self, sandbox_id: str) -> Sandbox | None:
        doc = self.tx.get(SANDBOXES, sandbox_id)
        return Sandbox.from_doc(doc) if doc else None

    @property
    def queue(self) -> TeamQueue:
        return TeamQueue.from_doc(self.tx.get(QUEUES, self.team)) if self.team else TeamQueue()

    @property
    def policy(self) -> SandboxPolicy | Refusal:
        section = (self.tx.get("catalog", "current") or {}).get("sandboxes")
        return resolve_policy(section if isinstance(section, Mapping) else None, self.team)


Decide = Callable[[Any, _Read, Catalog, Event[Any], datetime], Decision]


def _admit(payload: SandboxRequested, read: _Read, catalog: Catalog, event: Event[Any],
           now: datetime) -> Decision:
    request = Request(
        sandbox_id=payload.sandbox_id, team=payload.team, requester=payload.requester,
        repository=payload.repository, command=payload.command, base_ref=payload.base_ref,
        limits=dict(payload.limits), allowed_network=tuple(payload.allowed_network),
        requestid=event.requestid, reply_to=payload.reply_to)
    return admit(request, team=catalog.teams.get(payload.team), policy=read.policy,
                 queue=read.queue, existing=read.sandbox, now=now)


def _finish(payload: SandboxFinished, read: _Read, catalog: Catalog, event: Event[Any],
            now: datetime) -> Decision:
    return finish(read.sandbox, payload, policy=read.policy, queue=read.queue, load=read.load,
                  now=now)


def _suspend(payload: SandboxSuspended, read: _Read, catalog: Catalog, event: Event[Any],
             now: datetime) -> Decision:
    return suspend(read.sandbox, payload, policy=read.policy, queue=read.queue,
                   load=read.load, now=now)


def _resume(payload: SandboxResumeRequested, read: _Read, catalog: Catalog,
            event: Event[Any], now: datetime) -> Decision:
    return request_resume(read.sandbox, payload.sandbox_id, payload.requester,
                          team=catalog.teams.get(read.team), policy=read.policy,
                          queue=read.queue, now=now)


def _idle(payload: SandboxIdleDetected, read: _Read, catalog: Catalog, event: Event[Any],
          now: datetime) -> Decision:
    return idle_detected(read.sandbox, payload)


def _step(decide: Decide) -> pipeline.StepFor:
    """The pipeline step of one sandbox event, deciding with ``decide``."""

    def step(event: Event[Any], payload: Any, deps: Deps, now: datetime) -> pipeline.Step:
        catalog: Catalog = catalog_knowing(
            deps, lambda c: c.knows(team=getattr(payload, "team", None)))
        sandbox_id = payload.sandbox_id

        def decide_in_tx(tx: Tx) -> Decision:
            read = _Read(tx, sandbox_id, getattr(payload, "team", None))
            decision = decide(payload, read, catalog, event, now)
            _persist(tx, decision, event, read.team,
                     getattr(payload, "requester", None) or event.source, now)
            return decision

        # One instance decides one sandbox at a time; others retry on conflict.
        return pipeline.Step(Subject("sandbox", sandbox_id, lock=f"sandbox:{sandbox_id}"),
                             decide_in_tx, SOURCE)

    return step


#: Which decision each sandbox event takes.
STEPS: dict[type[Any], pipeline.StepFor] = {
    SandboxRequested: _step(_admit),
    SandboxFinished: _step(_finish),
    SandboxSuspended: _step(_suspend),
    SandboxResumeRequested: _step(_resume),
    SandboxIdleDetected: _step(_idle),
}


def _persist(tx: Tx, decision: Decision, event: Event[Any], team: str, actor: str,
             now: datetime) -> None:
    for sandbox in decision.sandboxes:
        tx.set(SANDBOXES, sandbox.id, {**sandbox.to_doc(), "updated_at": now})
    if decision.queue is not None and team:
        tx.set(QUEUES, team, {**decision.queue.to_doc(), "team": team, "updated_at": now})
    for sandbox_id, position, message in decision.positions:
        tx.update(SANDBOXES, sandbox_id, {"queue_position": position, "message": message,
                                          "updated_at": now})
    subject = decision.subject
    pipeline.audit(tx, event, decision, actor=actor,
                   target=subject.id if subject is not None else event.payload.sandbox_id,
                   team=team, now=now)
