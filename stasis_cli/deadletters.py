"""Read the dead-letter topics without consuming them (`stasis dlq`).

Each function's dead-letter topic has a pull subscription; messages are pulled and their
ack deadline reset to zero, so they stay for the next reader (an operator fixes the cause
and republishes, or acks them explicitly).
"""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from functions.routes import ROUTES


def peek(project: str, *, max_messages: int = 100) -> list[dict[str, Any]]:
    subscriber = pubsub_v1.SubscriberClient()
    rows: list[dict[str, Any]] = []
    for function, route in ROUTES.items():
        path = subscriber.subscription_path(project, route.dead_letter_subscription)
        try:
            response = subscriber.pull(
                request={"subscription": path, "max_messages": max_messages,
                         "return_immediately": True},
                timeout=5,
            )
        except (gexc.NotFound, gexc.DeadlineExceeded):
            continue
        ack_ids = []
        for received in response.received_messages:
            msg = received.message
            attrs = dict(msg.attributes)
            rows.append(
                {
                    "consumer": attrs.get("stasis-dlq-consumer", function),
                    "type": attrs.get("ce-type"),
                    "id": attrs.get("ce-id"),
                    "requestid": attrs.get("ce-requestid"),
                    "reason": attrs.get(
                        "stasis-dlq-reason", "dead-lettered by Pub/Sub (no reason recorded)"
                    ),
                    "attempts": int(attrs.get("stasis-dlq-attempts", "0") or 0),
                    "time": attrs.get("stasis-dlq-time"),
                    "message_id": msg.message_id,
                    "data": msg.data.decode(errors="replace")[:2000],
                }
            )
            ack_ids.append(received.ack_id)
        if ack_ids:
            subscriber.modify_ack_deadline(
                request={"subscription": path, "ack_ids": ack_ids, "ack_deadline_seconds": 0}
            )
    return rows
