"""Seeing what a test's code published to the Pub/Sub emulator: a pull subscription on a
topic, and the messages it got. Importable from any test module (``tests/`` is on sys.path)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from google.cloud import pubsub_v1


def subscribe(project: str, topic: str) -> str:
    """A new pull subscription on ``topic`` (created before the publish it should see)."""
    subscriber = pubsub_v1.SubscriberClient()
    name = subscriber.subscription_path(project, f"t-{secrets.token_hex(5)}")
    subscriber.create_subscription(request={"name": name,
                                            "topic": f"projects/{project}/topics/{topic}"})
    return name


def pull(subscription: str, want: int, timeout: float = 20) -> list[Any]:
    """Messages until ``want`` arrived or ``timeout`` passed (acknowledged as they come)."""
    subscriber = pubsub_v1.SubscriberClient()
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        response = subscriber.pull(request={"subscription": subscription, "max_messages": 10,
                                            "return_immediately": True}, timeout=10)
        got.extend(m.message for m in response.received_messages)
        if response.received_messages:
            subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [
                m.ack_id for m in response.received_messages]})
        else:
            time.sleep(0.1)
    return got
