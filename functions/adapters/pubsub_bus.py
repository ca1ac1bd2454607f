"""Pub/Sub: publishing events, and the dead-letter topics.

Admission events (workspace.requested, workspace.resume_requested) are published with the
team as ordering key, so that on GCP a team's admissions reach the function one at a time
and never contend on the team document. A dead-lettered message keeps the original data and
attributes and adds why it failed (``stasis-dlq-reason``), which consumer gave up and after
how many attempts: Pub/Sub's own dead-lettering does not record a reason, and the emulator
does not dead-letter at all, so the delivery guard does it explicitly.

Every event leaves with its publisher's ``origin`` (``ce-origin``): the bus's own component,
or, for the functions' shared bus, the function being served (``functions.origin``). What
the event said before is overwritten: a component speaks only for itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from google.cloud import pubsub_v1

from events import Event, to_pubsub
from functions.delivery import ORDERED_BY_TEAM, dead_letter_topic


class PubSubBus:
    """``origin``: the component publishing (``functions.domain.publishers``), or a callable
    that says which one is at work now."""

    def __init__(self, project: str, *, origin: str | Callable[[], str],
                 publisher: pubsub_v1.PublisherClient | None = None) -> None:
        self.project = project
        self._origin = origin if callable(origin) else (lambda: origin)
        self.publisher = publisher or pubsub_v1.PublisherClient(
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))

    def publish(self, event: Event[Any]) -> str:
        origin = self._origin()
        if not origin:
            raise RuntimeError(f"{event.name} published by no component: no origin")
        data, attributes = to_pubsub(dataclasses.replace(event, origin=origin))
        ordering_key = ""
        if event.name in ORDERED_BY_TEAM:
            ordering_key = str(getattr(event.payload, "team", "") or event.subject.split("--")[0])
        topic = self.publisher.topic_path(self.project, event.topic)
        future = self.publisher.publish(topic, data, ordering_key=ordering_key, **attributes)
        try:
            return str(future.result(timeout=30))
        except Exception:
            if ordering_key:
                # An ordered publish that failed pauses its key until resumed.
                self.publisher.resume_publish(topic, ordering_key)
            raise

    def publish_unchecked(self, name: str, data: bytes, requestid: str | None = None) -> str:
        """Publish bytes as event ``name`` without validation: for exercising rejection."""
        import uuid

        from events.payloads import CATALOG, CE_TYPE_PREFIX, TOPIC_PREFIX

        spec = CATALOG.get(name)
        topic = spec.topic if spec else TOPIC_PREFIX + name.replace(".", "-").replace("_", "-")
        event_id = uuid.uuid4().hex
        return self.publish_raw(topic, data, {
            "ce-specversion": "1.0", "ce-type": CE_TYPE_PREFIX + name, "ce-id": event_id,
            "ce-source": "//stasis/cli", "ce-requestid": requestid or event_id,
            "ce-origin": self._origin()})

    def publish_raw(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        path = self.publisher.topic_path(self.project, topic)
        return str(self.publisher.publish(path, data, **dict(attributes)).result(timeout=30))

    def dead_letter(self, consumer: str, data: bytes, attributes: Mapping[str, str], *,
                    reason: str, attempts: int, message_id: str = "") -> str:
        attrs = dict(attributes)
        attrs.update({
            "stasis-dlq-reason": reason[:1000],
            "stasis-dlq-consumer": consumer,
            "stasis-dlq-attempts": str(attempts),
            "stasis-dlq-message-id": message_id,
            "stasis-dlq-time": datetime.now(UTC).isoformat(),
        })
        return self.publish_raw(dead_letter_topic(consumer), data, attrs)
