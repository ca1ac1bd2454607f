"""The chat front door against the real emulators and a real Slack sink (in this process):
the request record and the event a signed command leaves behind, a retry's single effect,
and the notifier's two doors with Slack's limits."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pubsub_support
import pytest
import requests
import yaml
from google.cloud import firestore

from events import WorkspaceRequested, WorkspaceStateChanged, from_pubsub, new_event
from functions.adapters.chat_store import ChatStore
from functions.adapters.firestore_store import workspace_to_doc
from functions.adapters.pubsub_bus import PubSubBus
from functions.adapters.slack import ChatFunction, SlackNotifier, SlackSettings
from functions.chatops import notify, signing
from functions.chatops.ports import ChatDeps, NotifyRefused
from functions.chatops.service import answer
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from stack import slack_sink, topology

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))
SECRET, TOKEN = "integration-secret", "xoxb-integration"


@pytest.fixture
def sink() -> Iterator[str]:
    server = slack_sink.serve(0, TOKEN)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def chat(emulator_env: dict[str, str], sink: str) -> ChatDeps:
    project = emulator_env["STASIS_PROJECT"]
    topology.ensure(project, "http://127.0.0.1:9/")  # push endpoints unused here
    store = ChatStore(firestore.Client(project=project))
    notifier = SlackNotifier(SlackSettings(SECRET, TOKEN, f"{sink}/api/"))
    return ChatDeps(reads=store, records=store, notifier=notifier,
                    bus=PubSubBus(project, origin="chat"),
                    catalog=lambda: CATALOG, clock=lambda: datetime.now(UTC))


def _signed(text: str, sink: str, trigger: str) -> tuple[str, dict[str, str]]:
    body = urllib.parse.urlencode({
        "command": "/ws", "text": text, "user_id": "U0ALICE", "team_id": "T0",
        "channel_id": "C0", "response_url": f"{sink}/response/r-{trigger}",
        "trigger_id": trigger})
    return body, signing.signed_headers(SECRET, int(time.time()), body)


def test_a_signed_create_leaves_a_record_and_one_event_even_when_slack_retries(
        chat: ChatDeps, emulator_env: dict[str, str], sink: str) -> None:
    project = emulator_env["STASIS_PROJECT"]
    subscription = pubsub_support.subscribe(project, "stasis-workspace-requested")
    app = ChatFunction(SlackSettings(SECRET, TOKEN, f"{sink}/api/", team_id="T0"),
                       lambda req: answer(req, chat))
    body, headers = _signed("create mynb --profile cpu-small", sink, "1.2.trig")
    first = app.dispatch(body, headers)
    retried = app.dispatch(body, {**headers, signing.RETRY_HEADER: "1"})
    assert first.status == retried.status == 200
    assert json.loads(first.body)["text"] == json.loads(retried.body)["text"]
    requestid = signing.request_id("1.2.trig", body)
    events = [from_pubsub(m.data, dict(m.attributes))
              for m in pubsub_support.pull(subscription, want=2)]
    assert len(events) == 2
    assert {(e.id, e.requestid) for e in events} == {(requestid, requestid)}  # one request
    assert isinstance(events[0].payload, WorkspaceRequested)
    assert events[0].payload.reply_to and "r-1.2.trig" in events[0].payload.reply_to
    record = chat.records.recall(requestid)
    assert record is not None and record["workspace_id"] == "ml-a--mynb"
    assert record["response_url"] == f"{sink}/response/r-1.2.trig"
    assert record["response_url_uses"] == 0


def _change(version: int) -> Any:
    payload = WorkspaceStateChanged(
        workspace_id="ml-a--mynb", team="ml-a", owner="alice", name="mynb",
        from_state="PAUSING" if version % 2 else "RESUMING",
        to_state="PAUSED" if version % 2 else "RUNNING",
        reason="paused" if version % 2 else "resumed", version=version, url="http://h/lab")
    return new_event(payload, id=f"ml-a--mynb-v{version}", requestid="slack-req")


def test_notifications_use_the_response_url_five_times_then_post_to_the_user(
        chat: ChatDeps, emulator_env: dict[str, str], sink: str) -> None:
    db = firestore.Client(project=emulator_env["STASIS_PROJECT"])
    db.collection("workspaces").document("ml-a--mynb").set(workspace_to_doc(Workspace(
        id="ml-a--mynb", team="ml-a", owner="alice", name="mynb", profile="cpu-small",
        state=State.PAUSED, version=99, current_snapshot="ml-a--mynb-v8", last_pause_ms=3400)))
    db.collection("snapshots").document("ml-a--mynb-v8").set({"bytes": int(1.2 * 2**30)})
    chat.records.remember("slack-req", {
        "slack_user": "U0ALICE", "channel": "C0", "response_url": f"{sink}/response/abc",
        "issued_at": datetime.now(UTC), "response_url_uses": 0})
    deps: Any = type("D", (), {"chat": chat})()
    ways = [notify.handle(_change(v), deps, "notify_chat") for v in range(1, 8)]
    assert ways == ["response_url"] * 5 + ["chat.postMessage"] * 2
    assert notify.handle(_change(1), deps, "notify_chat") == "duplicate"
    messages = requests.get(f"{sink}/messages", params={"requestid": "slack-req"},
                            timeout=5).json()["messages"]
    assert [m["kind"] for m in messages] == ["response_url"] * 5 + ["chat.postMessage"] * 2
    assert messages[0]["text"].startswith("mynb paused — 1.2 GiB in 3.4 s.")
    assert messages[-1]["channel"] == "U0ALICE"
    assert messages[-1]["metadata"]["event_payload"]["state"] == "PAUSED"


def test_an_expired_response_url_is_not_even_tried(chat: ChatDeps, sink: str) -> None:
    chat.records.remember("slack-old", {
        "slack_user": "U0BOB", "response_url": f"{sink}/response/old",
        "issued_at": datetime.now(UTC) - timedelta(minutes=31), "response_url_uses": 0})
    assert not chat.records.use_response_url("slack-old", datetime.now(UTC))
    assert not chat.records.use_response_url("slack-missing", datetime.now(UTC))


def test_the_notifier_maps_slacks_answers(sink: str) -> None:
    good = SlackNotifier(SlackSettings(SECRET, TOKEN, f"{sink}/api/"))
    bad = SlackNotifier(SlackSettings(SECRET, "xoxb-revoked", f"{sink}/api/"))
    message = {"text": "hello", "metadata": {"event_type": "t", "event_payload": {"a": 1}}}
    good.post("U0ALICE", message)
    with pytest.raises(NotifyRefused, match="invalid_auth"):
        bad.post("U0ALICE", message)
    with pytest.raises(NotifyRefused, match="channel_not_found"):
        good.post("", message)
    assert not good.respond("https://evil.example/steal", message)  # never followed
    for _ in range(5):
        assert good.respond(f"{sink}/response/five", message)
    assert not good.respond(f"{sink}/response/five", message)  # Slack: used_url
