"""The delivery guard: what happens to every message a function receives.

- A message that is not a valid Stasis event (not a CloudEvent, unknown type, a payload
  that breaks its schema, an event on the wrong topic) is dead-lettered at once with the
  reason, and acknowledged: retrying cannot fix it, and nothing is silently dropped.
- An event whose ``origin`` (the component that published it) may not send its type
  (``functions.domain.publishers``: ``senders``, from ``functions/routes.py``'s PUBLISHERS)
  is refused the same way, and the refusal is audited: a forged request or outcome never
  reaches the handler.
- A handler that raises is retried by Pub/Sub (the function answers 500). Failures are
  counted per message in Firestore; at MAX_DELIVERY_ATTEMPTS the message is dead-lettered
  with the last error and acknowledged. Pub/Sub's own dead-letter policy (5 attempts) is
  configured as well, but it records no reason, and the emulator does not apply it.
  Except a decided request whose outbox would not send (``OutboxUnsent``: the decision is
  committed, only its commands or events are missing): at the last attempt it is
  acknowledged, not dead-lettered, and the reconciler's relay sends its outbox from the
  ledger entry, which holds the event (``functions.handlers.reconciler``).
- A raw message (one Stasis does not write: Cloud Monitoring's notifications, log sink
  entries) reaches its consumer through :func:`deliver_raw`, under the same rules; its
  handler says what is wrong with it by raising PermanentFailure.
- The delivery terms every deployment shares (the Pub/Sub adapter, the local topology and
  Terraform, through ``functions/routes.py``): each consumer's dead-letter topic
  (:func:`dead_letter_topic`), and the events delivered in order per team.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from events import Event, InvalidEvent, from_cloudevent, from_pubsub
from events.payloads import WORKSPACE_SEPARATOR
from functions.domain.publishers import origin_refusal
from functions.handlers.deps import Deps
from functions.ports import OutboxUnsent

MAX_DELIVERY_ATTEMPTS = 5
#: Admission events: published with the team as ordering key and delivered in that order,
#: so that a team's admissions reach the function one at a time.
ORDERED_BY_TEAM = frozenset({"workspace.requested", "workspace.resume_requested"})
DLQ_PREFIX = "stasis-dlq-"
log = logging.getLogger(__name__)

Handler = Callable[[Event[Any], Deps, str], Any]


@dataclass(frozen=True)
class RawMessage:
    """A Pub/Sub message as its sender published it (not a Stasis event)."""

    data: bytes
    attributes: Mapping[str, str]
    message_id: str


RawHandler = Callable[[RawMessage, Deps, str], Any]


def dead_letter_topic(consumer: str) -> str:
    """The dead-letter topic of one consumer's subscription."""
    return DLQ_PREFIX + consumer.replace("_", "-")


class PermanentFailure(Exception):
    """A handler's way to say: retrying will not help; dead-letter with this reason."""


def deliver(cloud_event: Any, consumer: str, expected: str, handler: Handler,
            deps: Deps, *, senders: frozenset[str]) -> None:
    """Decode the message inside ``cloud_event`` and run ``handler`` under the guard, if
    its origin is one of ``senders`` (the components that may send ``expected``)."""
    data, attributes, message_id = _unwrap(cloud_event)
    try:
        event = _decode(cloud_event, data, attributes)
        if event.name != expected:
            raise InvalidEvent(f"{event.name} delivered to {consumer}, which takes {expected}")
    except InvalidEvent as exc:
        log.warning("dead-lettering message %s for %s: %s", message_id, consumer, exc.reason)
        deps.dead_letters.dead_letter(consumer, data, attributes, reason=exc.reason, attempts=1,
                                      message_id=message_id)
        return
    refusal = origin_refusal(event.name, event.origin, senders)
    if refusal is not None:
        log.warning("refusing %s for %s: %s", event.describe(), consumer, refusal)
        _audit_refusal(deps, event, consumer, refusal)
        deps.dead_letters.dead_letter(consumer, data, attributes, reason=refusal, attempts=1,
                                      message_id=message_id)
        return
    _guarded(lambda: handler(event, deps, consumer), RawMessage(data, attributes, message_id),
             consumer, deps, event.id, event.describe())


def _audit_refusal(deps: Deps, event: Event[Any], consumer: str, refusal: str) -> None:
    """The audit entry of an event refused for its origin, with whom it claimed to act for."""
    payload = event.payload
    target = str(getattr(payload, "workspace_id", "") or getattr(payload, "sandbox_id", "")
                 or event.subject)
    actor = getattr(payload, "actor", None) or getattr(payload, "owner", None) or \
        getattr(payload, "requester", None) or event.source
    deps.store.audit({
        "actor": str(actor), "action": event.name, "target": target,
        "team": str(getattr(payload, "team", "") or target.split(WORKSPACE_SEPARATOR)[0]),
        "outcome": "refused: forbidden_origin", "message": refusal, "origin": event.origin,
        "consumer": consumer, "event_id": event.id, "requestid": event.requestid,
        "time": deps.clock(),
    })


def deliver_raw(cloud_event: Any, consumer: str, handler: RawHandler, deps: Deps) -> None:
    """Run ``handler`` on the raw Pub/Sub message inside ``cloud_event`` under the guard."""
    message = RawMessage(*_unwrap(cloud_event))
    _guarded(lambda: handler(message, deps, consumer), message, consumer, deps,
             message.message_id, {"message_id": message.message_id})


def _guarded(run: Callable[[], Any], message: RawMessage, consumer: str, deps: Deps,
             failure_key: str, described: Any) -> None:
    try:
        run()
    except PermanentFailure as exc:
        deps.dead_letters.dead_letter(consumer, message.data, dict(message.attributes),
                                      reason=str(exc), attempts=1,
                                      message_id=message.message_id)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        attempts = deps.store.count_failure(message.message_id or failure_key, consumer,
                                            reason, deps.clock())
        if attempts < MAX_DELIVERY_ATTEMPTS:
            log.warning("%s failed on %s (attempt %d, retried): %s", consumer, described,
                        attempts, reason)
            raise
        if isinstance(exc, OutboxUnsent):  # decided: the ledger holds it, not the message
            log.error("%s: the outbox of %s is still unsent after %d attempts (%s); the "
                      "reconciler's relay sends it", consumer, described, attempts, reason)
            return
        log.error("%s gave up on %s after %d attempts: %s", consumer, described, attempts,
                  reason)
        deps.dead_letters.dead_letter(
            consumer, message.data, dict(message.attributes), attempts=attempts,
            message_id=message.message_id,
            reason=f"failed {attempts} times, last error: {reason}")


def _unwrap(cloud_event: Any) -> tuple[bytes, dict[str, str], str]:
    """(data, attributes, message id) of the Pub/Sub message, or of a direct CloudEvent."""
    payload = cloud_event.data
    if isinstance(payload, dict) and isinstance(payload.get("message"), dict):
        message = payload["message"]
        try:
            data = base64.b64decode(message.get("data") or b"")
        except ValueError:
            data = str(message.get("data")).encode()
        attributes = {str(k): str(v) for k, v in (message.get("attributes") or {}).items()}
        return data, attributes, str(message.get("messageId") or message.get("message_id") or "")
    # A Stasis CloudEvent delivered directly (structured or binary HTTP).
    attrs = {f"ce-{k}": str(v) for k, v in cloud_event.get_attributes().items()}
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return body, attrs, str(cloud_event["id"])


def _decode(cloud_event: Any, data: bytes, attributes: dict[str, str]) -> Event[Any]:
    if str(cloud_event["type"]).startswith("dev.stasis."):
        return from_cloudevent(cloud_event)
    return from_pubsub(data, attributes)
