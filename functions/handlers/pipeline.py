"""The one transition pipeline: transact -> send the outbox -> mark done -> log.

Every event that changes a workspace, a sandbox or a job takes the same four steps
(:func:`run`); a family module (``lifecycle``, ``sandboxes``, ``jobs``) only says, in a
table from payload type to :class:`Step`, what its transaction is about and how it decides:

1. **transact**: ``Deps.store`` (the :class:`functions.ports.Ledger`) runs the step's
   ``decide(tx)`` in ONE transaction with the ledger entry of (consumer, event type,
   requestid). ``decide`` reads documents, decides with the pure domain, writes the
   documents the decision changes and returns the decision (``functions.domain.decision``:
   accepted, reason, message, commands, events). Its commands and events are encoded into
   the entry's outbox in the same transaction. A duplicate decides nothing and returns the
   stored entry.
2. **send the outbox**, in order: first the commands, decoded back to their dataclasses and
   carried out through ``functions.handlers.commands.EXECUTORS``, then the events (each
   family's ``<family>.state_changed``, with deterministic ids) published on the bus.
3. **mark done**: the entry's outbox was sent. A crash before this leaves the entry
   pending, and the redelivery of the event sends the same outbox again (every command is
   idempotent and checks it still applies to the subject as it is now, and an event sent
   twice has the same id). An outbox that fails to send raises ``OutboxUnsent``; when the
   deliveries are spent (the node agent away longer than Pub/Sub's retries), the
   reconciler's relay delivers the entry's event to its consumer again.
4. **log** what was decided.

The outbox, as stored: ``{"command": "<type name>", "fields": {...}}`` for a command,
``{"publish": "<data>", "attributes": {...}}`` (a Pub/Sub message) for an event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from events import Event, crashpoints, from_pubsub, new_event, to_pubsub
from functions.domain.decision import Decided
from functions.handlers.commands import EXECUTORS, Context
from functions.handlers.deps import Deps
from functions.ports import Entry, OutboxUnsent, Subject, Tx

log = logging.getLogger(__name__)

#: Command types by name, for decoding an outbox.
_COMMANDS: dict[str, type[Any]] = {kind.__name__: kind for kind in EXECUTORS}
assert len(_COMMANDS) == len(EXECUTORS), "command type names must be unique"


@dataclass(frozen=True)
class Step:
    """One event's transaction: what it is about, how it decides, and whose events it
    emits (the family's CloudEvents source)."""

    subject: Subject
    decide: Callable[[Tx], Decided]
    source: str


#: How a family builds the step of one payload type: ``(event, payload, deps, now)``.
StepFor = Callable[[Event[Any], Any, Deps, datetime], Step]


def run(event: Event[Any], signal: Any, deps: Deps, consumer: str,
        steps: Mapping[type[Any], StepFor]) -> Any:
    """Apply ``signal`` (the event's payload, or an internal signal of the same family) as
    ``consumer``; the decision, None for a duplicate."""
    step_for = steps.get(type(signal))
    if step_for is None:
        raise TypeError(f"{consumer} does not take {type(signal).__name__}")
    now = deps.clock()
    step = step_for(event, signal, deps, now)

    def decide(tx: Tx) -> Entry:
        decision = step.decide(tx)
        return Entry(encode(decision, source=step.source, requestid=event.requestid),
                     decision.outcome(), decision)

    committed = deps.store.transact(event, consumer, step.subject, decide, now=now)
    if committed.pending:
        crashpoints.reach("pipeline.committed", detail=event.name)
    context = Context(deps, event, step.source,
                      lambda again, as_consumer: run(event, again, deps, as_consumer, steps))
    try:
        for item in decode(committed.outbox):
            if isinstance(item, Event):
                deps.bus.publish(item)
            else:
                EXECUTORS[type(item)](item, context)
    except Exception as exc:
        if not committed.pending:
            raise
        raise OutboxUnsent(committed.key, exc) from exc
    if committed.pending:
        deps.store.mark_done(committed.key)
    decision: Decided | None = committed.decision
    if decision is not None:
        log.info("%s %s: %s (%s) %s", event.name, step.subject.id,
                 "accepted" if decision.accepted else "refused", decision.reason,
                 decision.message)
    return decision


def encode(decision: Decided, *, source: str, requestid: str) -> list[dict[str, Any]]:
    """The outbox of ``decision``: its commands, then its events as Pub/Sub messages."""
    items: list[dict[str, Any]] = []
    for command in decision.commands:
        if type(command) not in EXECUTORS:
            raise TypeError(f"no executor for {type(command).__name__}")
        items.append({"command": type(command).__name__,
                      "fields": dataclasses.asdict(command)})
    for payload in decision.events:
        data, attributes = to_pubsub(new_event(payload, source=source, id=payload.event_id,
                                               requestid=requestid))
        items.append({"publish": data.decode(), "attributes": attributes})
    return items


def decode(outbox: list[dict[str, Any]]) -> list[Any]:
    """An outbox back to its commands (dataclasses) and events (envelopes)."""
    items: list[Any] = []
    for item in outbox:
        if "publish" in item:
            items.append(from_pubsub(item["publish"].encode(), item["attributes"]))
            continue
        kind = _COMMANDS.get(item.get("command", ""))
        if kind is None:
            raise ValueError(f"the outbox holds an unknown command: {item!r}")
        items.append(kind(**item["fields"]))
    return items


def audit(tx: Tx, event: Event[Any], decision: Decided, *, actor: str, target: str,
          team: str, now: datetime) -> None:
    """The audit entry of one decision, written in its transaction."""
    tx.set("audit", "", {
        "actor": actor, "action": event.name, "target": target, "team": team,
        "outcome": ("accepted: " if decision.accepted else "refused: ") + str(decision.reason),
        "message": decision.message, "event_id": event.id, "requestid": event.requestid,
        "time": now,
    })
