"""The delivery guard against the real Firestore and Pub/Sub emulators.

Pub/Sub redelivery is played by calling the guard again with the same message, as the
push subscription does after a 500; tests/e2e covers the real redelivery loop.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from google.cloud import firestore

from events import WorkspaceReady, new_event, to_pubsub
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.pubsub_bus import PubSubBus
from functions.delivery import MAX_DELIVERY_ATTEMPTS, deliver
from stack import deadletters, topology


def _push(event: Any, message_id: str) -> CloudEvent:
    data, attributes = to_pubsub(event)
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                       "source": "//pubsub.googleapis.com/test", "id": message_id},
                      {"message": {"data": base64.b64encode(data).decode(),
                                   "attributes": attributes, "messageId": message_id}})


@pytest.fixture
def deps(emulator_env: dict[str, str]) -> SimpleNamespace:
    project = emulator_env["STASIS_PROJECT"]
    topology.ensure(project, "http://127.0.0.1:9/")  # push endpoints unused here
    bus = PubSubBus(project)
    return SimpleNamespace(store=FirestoreStore(firestore.Client(project=project)), bus=bus,
                           dead_letters=bus, clock=lambda: datetime.now(UTC), project=project)


def test_a_handler_that_raises_is_retried_then_dead_lettered(deps: SimpleNamespace) -> None:
    calls = []

    def flaky(event: Any, _deps: Any, consumer: str) -> None:
        calls.append(event.id)
        raise ConnectionError("node agent unreachable")

    event = new_event(WorkspaceReady(workspace_id="ml-a--wsp", url="u", runtime_handle="h"))
    message = _push(event, "m-1")
    for attempt in range(1, MAX_DELIVERY_ATTEMPTS):
        with pytest.raises(ConnectionError):
            deliver(message, "on_workspace_ready", "workspace.ready", flaky, deps)
        assert deadletters.peek(deps.project) == [], f"dead-lettered after {attempt}"
    deliver(message, "on_workspace_ready", "workspace.ready", flaky, deps)  # acked now
    assert len(calls) == MAX_DELIVERY_ATTEMPTS
    [row] = deadletters.peek(deps.project)
    assert row["id"] == event.id and row["attempts"] == MAX_DELIVERY_ATTEMPTS
    assert row["reason"] == ("failed 5 times, last error: ConnectionError: "
                             "node agent unreachable")


def test_an_event_on_the_wrong_topic_is_dead_lettered(deps: SimpleNamespace) -> None:
    event = new_event(WorkspaceReady(workspace_id="ml-a--wsp", url="u", runtime_handle="h"))
    deliver(_push(event, "m-2"), "on_pause_requested", "workspace.pause_requested",
            lambda *a: pytest.fail("must not run"), deps)
    [row] = deadletters.peek(deps.project)
    assert row["consumer"] == "on_pause_requested"
    assert "workspace.ready delivered to on_pause_requested" in row["reason"]
