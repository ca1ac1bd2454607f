"""How events leave the node agent.

``Publisher`` is all the agent needs (``publish(event) -> message id``, the same shape
as the control plane's Bus). ``PubSubPublisher`` sends to ``projects/<project>/topics/
<topic of the event>`` with the Pub/Sub client (the emulator through
``PUBSUB_EMULATOR_HOST``); ``RecordingPublisher`` keeps events in memory for tests.

An outcome event that cannot be published is retried a few times with backoff: the control
plane waits for it (a workspace stays PROVISIONING or PAUSING until the reconciler steps
in), so it is worth more than a log line.

Each event leaves stamped with the publishing component's ``origin`` (``ce-origin``: the
node agent's, or the cluster monitor's where it uses this publisher), which the control
plane checks against who may send that event (``functions.domain.publishers``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Protocol

from events import Event, to_pubsub

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, event: Event[Any]) -> str: ...


#: The components of ``functions.domain.publishers`` that publish through this module.
NODE_AGENT = "node_agent"
MONITOR = "monitor"


class PubSubPublisher:
    def __init__(self, project: str, *, origin: str, attempts: int = 5,
                 timeout: float = 30.0) -> None:
        self.project = project
        self.origin = origin
        self.attempts = attempts
        self.timeout = timeout
        self._client: Any = None
        self._lock = threading.Lock()

    def _publisher(self) -> Any:
        # Built on first use (or by ``warm``): importing and connecting the client is not
        # free, and a process that never publishes (a status call) should not pay for it.
        with self._lock:
            if self._client is None:
                from google.cloud import pubsub_v1

                self._client = pubsub_v1.PublisherClient()
            return self._client

    def warm(self, timeout: float = 10.0) -> None:
        """Import and connect the client now (one topic listing), not on the first outcome:
        the first workspace's ready waited 0.26 s more than the next one's for it. Best
        effort: a failure here meets the first publish, which retries."""
        try:
            list(self._publisher().list_topics(request={"project": f"projects/{self.project}"},
                                               retry=None, timeout=timeout))
        except Exception as exc:  # a warm-up must not stop the agent
            log.warning("warming the Pub/Sub client failed: %s", exc)

    def publish(self, event: Event[Any]) -> str:
        client = self._publisher()
        topic = client.topic_path(self.project, event.topic)
        data, attributes = to_pubsub(replace(event, origin=self.origin))
        delay = 0.5
        for attempt in range(1, self.attempts + 1):
            try:
                message_id = str(client.publish(topic, data, **attributes).result(self.timeout))
                log.info("published %s", event.describe())
                return message_id
            except Exception as exc:
                if attempt == self.attempts:
                    raise
                log.warning(
                    "publishing %s to %s failed (attempt %d): %s",
                    event.describe(),
                    topic,
                    attempt,
                    exc,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")


class RecordingPublisher:
    """Keeps every published event; ``wait_for`` blocks until one matches."""

    def __init__(self) -> None:
        self.events: list[Event[Any]] = []
        self._cond = threading.Condition()

    def publish(self, event: Event[Any]) -> str:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()
        return event.id

    def names(self) -> list[str]:
        with self._cond:
            return [e.name for e in self.events]

    def wait_for(self, name: str, *, timeout: float = 60.0, **fields: Any) -> Event[Any]:
        """The first event of that name whose payload has these field values."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event.name == name and all(
                        getattr(event.payload, k, None) == v for k, v in fields.items()
                    ):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"no {name} {fields} within {timeout:g}s; got "
                        f"{[e.name for e in self.events]}"
                    )
                self._cond.wait(remaining)
