"""The delivery guard against the real Firestore and Pub/Sub emulators.

Pub/Sub redelivery is played by calling the guard again with the same message, as the
push subscription does after a 500; tests/e2e covers the real redelivery loop.
"""

from __future__ import annotations

import base64
import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from google.cloud import firestore

from events import SnapshotFinished, WorkspaceDeleteRequested, WorkspaceReady, new_event, to_pubsub
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.pubsub_bus import PubSubBus
from functions.delivery import MAX_DELIVERY_ATTEMPTS, deliver
from functions.ports import OutboxUnsent
from functions.routes import PUBLISHERS
from stack import topology
from stasis_cli import deadletters


def _push(event: Any, message_id: str, origin: str = "node_agent") -> CloudEvent:
    """The push of ``event`` as ``origin`` published it."""
    data, attributes = to_pubsub(dataclasses.replace(event, origin=origin))
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                       "source": "//pubsub.googleapis.com/test", "id": message_id},
                      {"message": {"data": base64.b64encode(data).decode(),
                                   "attributes": attributes, "messageId": message_id}})


@pytest.fixture
def deps(emulator_env: dict[str, str]) -> SimpleNamespace:
    project = emulator_env["STASIS_PROJECT"]
    topology.ensure(project, "http://127.0.0.1:9/")  # push endpoints unused here
    bus = PubSubBus(project, origin="operator")
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
            deliver(message, "on_workspace_ready", "workspace.ready", flaky, deps,
                    senders=PUBLISHERS["workspace.ready"])
        assert deadletters.peek(deps.project) == [], f"dead-lettered after {attempt}"
    deliver(message, "on_workspace_ready", "workspace.ready", flaky, deps,
            senders=PUBLISHERS["workspace.ready"])  # acked now
    assert len(calls) == MAX_DELIVERY_ATTEMPTS
    [row] = deadletters.peek(deps.project)
    assert row["id"] == event.id and row["attempts"] == MAX_DELIVERY_ATTEMPTS
    assert row["reason"] == ("failed 5 times, last error: ConnectionError: "
                             "node agent unreachable")


def test_a_decided_request_whose_outbox_would_not_send_is_acked_for_the_relay(
        deps: SimpleNamespace) -> None:
    """Its decision is committed and its ledger entry keeps the event: dead-lettering it
    would show an operator a request that the reconciler's relay then carries out."""
    def unsent(event: Any, _deps: Any, consumer: str) -> None:
        raise OutboxUnsent("entry-key", ConnectionError("node agent unreachable"))

    event = new_event(WorkspaceReady(workspace_id="ml-a--wsq", url="u", runtime_handle="h"))
    message = _push(event, "m-9")
    for _ in range(1, MAX_DELIVERY_ATTEMPTS):
        with pytest.raises(OutboxUnsent):
            deliver(message, "on_workspace_ready", "workspace.ready", unsent, deps,
                    senders=PUBLISHERS["workspace.ready"])
    deliver(message, "on_workspace_ready", "workspace.ready", unsent, deps,
            senders=PUBLISHERS["workspace.ready"])  # acked, not dead-lettered
    assert deadletters.peek(deps.project) == []


def test_an_event_on_the_wrong_topic_is_dead_lettered(deps: SimpleNamespace) -> None:
    event = new_event(WorkspaceReady(workspace_id="ml-a--wsp", url="u", runtime_handle="h"))
    deliver(_push(event, "m-2"), "on_pause_requested", "workspace.pause_requested",
            lambda *a: pytest.fail("must not run"), deps,
            senders=PUBLISHERS["workspace.pause_requested"])
    [row] = deadletters.peek(deps.project)
    assert row["consumer"] == "on_pause_requested"
    assert "workspace.ready delivered to on_pause_requested" in row["reason"]


def _audit(deps: SimpleNamespace, event_id: str) -> list[dict[str, Any]]:
    db = firestore.Client(project=deps.project)
    query = db.collection("audit").where(filter=firestore.FieldFilter("event_id", "==", event_id))
    return [d.to_dict() for d in query.get()]


def test_a_snapshot_finished_from_the_chat_origin_is_dead_lettered_and_audited(
        deps: SimpleNamespace) -> None:
    forged = new_event(SnapshotFinished("ml-b--victim", "snap-1", True, uri="gs://b/x"))
    deliver(_push(forged, "m-3", origin="chat"), "on_snapshot_finished", "snapshot.finished",
            lambda *a: pytest.fail("a forged outcome must not reach the handler"), deps,
            senders=PUBLISHERS["snapshot.finished"])
    [row] = deadletters.peek(deps.project)
    assert row["id"] == forged.id and row["consumer"] == "on_snapshot_finished"
    assert row["reason"].startswith("snapshot.finished from chat, which may not send it")
    [entry] = _audit(deps, forged.id)
    assert entry["outcome"] == "refused: forbidden_origin" and entry["origin"] == "chat"
    assert (entry["target"], entry["team"]) == ("ml-b--victim", "ml-b")


def test_an_event_without_an_origin_is_refused(deps: SimpleNamespace) -> None:
    event = new_event(WorkspaceDeleteRequested("ml-b--victim", actor="carol"))
    deliver(_push(event, "m-4", origin=""), "on_delete_requested",
            "workspace.delete_requested", lambda *a: pytest.fail("must not run"), deps,
            senders=PUBLISHERS["workspace.delete_requested"])
    [row] = deadletters.peek(deps.project)
    assert "carries no origin" in row["reason"]


def test_a_delete_from_the_chat_function_s_identity_reaches_the_lifecycle(
        deps: SimpleNamespace) -> None:
    """Chat may ask deletes (who asked is the lifecycle's check: tests/unit/
    test_publishers.py), the proxy may not."""
    ran: list[str] = []
    event = new_event(WorkspaceDeleteRequested("ml-b--victim", actor="alice"))
    for origin, message_id in (("chat", "m-5"), ("proxy", "m-6")):
        deliver(_push(event, message_id, origin=origin), "on_delete_requested",
                "workspace.delete_requested", lambda e, *a: ran.append(e.origin), deps,
                senders=PUBLISHERS["workspace.delete_requested"])
    assert ran == ["chat"]
    [row] = deadletters.peek(deps.project)
    assert row["reason"].startswith("workspace.delete_requested from proxy")
