"""The delivery guard: what happens to every message a function receives.

- A message that is not a valid Stasis event (not a CloudEvent, unknown type, a payload
  that breaks its schema, an event on the wrong topic) is dead-lettered at once with the
  reason, and acknowledged: retrying cannot fix it, and nothing is silently dropped.
- A handler that raises is retried by Pub/Sub (the function answers 500). Failures are
  counted per message in Firestore; at MAX_DELIVERY_ATTEMPTS the message is dead-lettered
  with the last error and acknowledged. Pub/Sub's own dead-letter policy (5 attempts) is
  configured as well, but it records no reason, and the emulator does not apply it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from events import Event, InvalidEvent, from_cloudevent, from_pubsub
from functions.handlers.deps import Deps

MAX_DELIVERY_ATTEMPTS = 5
log = logging.getLogger(__name__)

Handler = Callable[[Event[Any], Deps, str], Any]


class PermanentFailure(Exception):
    """A handler's way to say: retrying will not help; dead-letter with this reason."""


def deliver(cloud_event: Any, consumer: str, expected: str, handler: Handler,
            deps: Deps) -> None:
    """Decode the message inside ``cloud_event`` and run ``handler`` under the guard."""
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
    try:
        handler(event, deps, consumer)
    except PermanentFailure as exc:
        deps.dead_letters.dead_letter(consumer, data, attributes, reason=str(exc), attempts=1,
                                      message_id=message_id)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        attempts = deps.store.count_failure(message_id or event.id, consumer, reason,
                                            deps.clock())
        if attempts < MAX_DELIVERY_ATTEMPTS:
            log.warning("%s failed on %s (attempt %d, retried): %s", consumer,
                        event.describe(), attempts, reason)
            raise
        log.error("%s gave up on %s after %d attempts: %s", consumer, event.describe(),
                  attempts, reason)
        deps.dead_letters.dead_letter(
            consumer, data, attributes, attempts=attempts, message_id=message_id,
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
