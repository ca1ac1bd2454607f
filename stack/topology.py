"""The Pub/Sub topology and the bucket of the local stack, derived from functions/routes.py.

One topic per event type; for each event function a push subscription on its event's topic
that delivers to the function host as Eventarc would (the functions framework turns the
Pub/Sub push into a CloudEvent), with a retry policy and a dead-letter policy (5 attempts)
naming the function's dead-letter topic; for each dead-letter topic a pull subscription
that ``stasis dlq`` reads. A ``Raw`` route's topic (monitoring's, whose messages are not
Stasis events) is created and pushed the same way. Every name comes from the route
(``Route.subscription`` and the rest), exactly as Terraform gets it
(``deploy/tfvars.py``). Idempotent: creating what exists is fine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1, storage

from events import CATALOG
from functions.delivery import MAX_DELIVERY_ATTEMPTS
from functions.routes import ROUTES

ACK_DEADLINE_SECONDS = 60


@dataclass(frozen=True)
class Topology:
    topics: list[str]
    push_subscriptions: dict[str, str]  # subscription -> endpoint
    dead_letter_subscriptions: list[str]


def ensure(
    project: str,
    functions_url: str,
    *,
    publisher: pubsub_v1.PublisherClient | None = None,
    subscriber: pubsub_v1.SubscriberClient | None = None,
) -> Topology:
    publisher = publisher or pubsub_v1.PublisherClient()
    subscriber = subscriber or pubsub_v1.SubscriberClient()
    topics = [spec.topic for spec in CATALOG.values()]
    topics += sorted({r.topic for r in ROUTES.values() if r.event is None})  # raw (Raw routes)
    for topic in topics:
        _create_topic(publisher, project, topic)
    pushes: dict[str, str] = {}
    dlq_subs: list[str] = []
    for route in ROUTES.values():
        dlq = route.dead_letter_topic
        _create_topic(publisher, project, dlq)
        dlq_sub = route.dead_letter_subscription
        _create_subscription(
            subscriber,
            {
                "name": subscriber.subscription_path(project, dlq_sub),
                "topic": publisher.topic_path(project, dlq),
                "ack_deadline_seconds": ACK_DEADLINE_SECONDS,
            },
        )
        dlq_subs.append(dlq_sub)
        name = route.subscription
        endpoint = f"{functions_url.rstrip('/')}/{route.function}/"
        _create_subscription(
            subscriber,
            {
                "name": subscriber.subscription_path(project, name),
                "topic": publisher.topic_path(project, route.topic),
                "push_config": {"push_endpoint": endpoint},
                "ack_deadline_seconds": ACK_DEADLINE_SECONDS,
                "retry_policy": {
                    "minimum_backoff": {"seconds": 1},
                    "maximum_backoff": {"seconds": 60},
                },
                "dead_letter_policy": {
                    "dead_letter_topic": publisher.topic_path(project, dlq),
                    "max_delivery_attempts": MAX_DELIVERY_ATTEMPTS,
                },
                "enable_message_ordering": route.ordered,
            },
        )
        pushes[name] = endpoint
    return Topology(topics, pushes, dlq_subs)


def ensure_bucket(project: str, bucket: str) -> None:
    client = storage.Client.create_anonymous_client()
    client.project = project
    with contextlib.suppress(gexc.Conflict):
        client.create_bucket(bucket)


def _create_topic(publisher: pubsub_v1.PublisherClient, project: str, topic: str) -> None:
    with contextlib.suppress(gexc.AlreadyExists):
        publisher.create_topic(name=publisher.topic_path(project, topic))


def _create_subscription(subscriber: pubsub_v1.SubscriberClient, request: dict[str, Any]) -> None:
    with contextlib.suppress(gexc.AlreadyExists):
        subscriber.create_subscription(request=request)
