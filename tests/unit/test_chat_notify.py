"""The notification consumer against fakes: whom it tells, through which door, once."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from chat_fakes import NOW, FakeNotifier, FakeStore, chat_deps, workspace

from events import WorkspaceStateChanged, new_event
from functions.chatops import notify
from functions.chatops.ports import ChatDeps
from functions.chatops.replies import ReplyTarget
from functions.delivery import PermanentFailure
from functions.domain.lifecycle import State

URL = "https://hooks.slack.com/commands/T0/1/abc"


def _record(deps: ChatDeps, requestid: str = "slack-r1", **changes: Any) -> None:
    record = {"slack_user": "U0ALICE", "channel": "C0", "slack_team": "T0",
              "response_url": URL, "issued_at": NOW, "response_url_uses": 0}
    record.update(changes)
    deps.records.remember(requestid, record)


def _paused(requestid: str = "slack-r1", version: int = 5, reply_to: str | None = None) -> Any:
    change = WorkspaceStateChanged(
        workspace_id="ml-a--mynb", team="ml-a", owner="alice", name="mynb",
        from_state="PAUSING", to_state="PAUSED", reason="paused", version=version,
        reply_to=reply_to)
    return new_event(change, id=f"ml-a--mynb-v{version}", requestid=requestid)


def _deps(**kw: Any) -> tuple[SimpleNamespace, ChatDeps]:
    ws = workspace("mynb", state=State.PAUSED, current_snapshot="ml-a--mynb-v4",
                   last_pause_ms=3400, version=5)
    chat = chat_deps(ws, **kw)
    store: FakeStore = chat.reads  # type: ignore[assignment]
    store.docs[("snapshots", "ml-a--mynb-v4")] = {"bytes": int(1.2 * 2**30)}
    return SimpleNamespace(chat=chat), chat


def test_the_requester_is_told_through_the_response_url() -> None:
    deps, chat = _deps()
    _record(chat)
    assert notify.handle(_paused(), deps, "notify_chat") == "response_url"  # type: ignore[arg-type]
    [(url, message)] = chat.notifier.responded  # type: ignore[attr-defined]
    assert url == URL and message["text"].startswith("mynb paused — 1.2 GiB in 3.4 s.")
    assert message["metadata"]["event_payload"]["requestid"] == "slack-r1"
    assert chat.records.recall("slack-r1")["response_url_uses"] == 1  # type: ignore[index]


def test_a_redelivered_change_is_not_told_twice() -> None:
    deps, chat = _deps()
    _record(chat)
    notify.handle(_paused(), deps, "notify_chat")  # type: ignore[arg-type]
    assert notify.handle(_paused(), deps, "notify_chat") == "duplicate"  # type: ignore[arg-type]
    assert len(chat.notifier.responded) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("why", ["expired", "used up", "refused by Slack"])
def test_otherwise_chat_post_message_to_the_user(why: str) -> None:
    deps, chat = _deps(notifier=FakeNotifier(url_works=why != "refused by Slack"))
    if why == "expired":
        _record(chat, issued_at=NOW - timedelta(minutes=31))
    elif why == "used up":
        _record(chat, response_url_uses=5)
    else:
        _record(chat)
    assert notify.handle(_paused(), deps, "notify_chat") == "chat.postMessage"  # type: ignore[arg-type]
    [(channel, message)] = chat.notifier.posted  # type: ignore[attr-defined]
    assert channel == "U0ALICE" and "mynb paused" in message["text"]


def test_without_a_record_the_workspaces_reply_to_is_used() -> None:
    deps, chat = _deps()
    old = ReplyTarget("U0BOB", "C9", "T0", URL, NOW - timedelta(hours=2)).encode()
    assert notify.handle(_paused("idle-1", reply_to=old), deps, "n") == "chat.postMessage"  # type: ignore[arg-type]
    assert chat.notifier.posted[0][0] == "U0BOB"  # type: ignore[attr-defined]
    fresh = ReplyTarget("U0BOB", "C9", "T0", URL, NOW - timedelta(minutes=5)).encode()
    assert notify.handle(_paused("idle-2", 6, fresh), deps, "n") == "response_url"  # type: ignore[arg-type]


@pytest.mark.parametrize("reply_to", [None, "slack:C1", "cli"])
def test_a_change_nobody_asked_for_in_chat_is_not_told(reply_to: str | None) -> None:
    deps, chat = _deps()
    assert notify.handle(_paused("cli-1", reply_to=reply_to), deps, "n") is None  # type: ignore[arg-type]
    assert chat.notifier.posted == chat.notifier.responded == []  # type: ignore[attr-defined]


def test_steps_the_ack_announced_are_skipped() -> None:
    deps, chat = _deps()
    _record(chat)
    change = WorkspaceStateChanged(workspace_id="ml-a--mynb", team="ml-a", owner="alice",
                                   name="mynb", from_state="RUNNING", to_state="PAUSING",
                                   reason="pause_started", version=4)
    assert notify.handle(new_event(change, requestid="slack-r1"), deps, "n") is None  # type: ignore[arg-type]


def test_slack_refusing_for_good_is_a_permanent_failure_with_its_reason() -> None:
    deps, chat = _deps(notifier=FakeNotifier(url_works=False, refuse="chat.postMessage: "
                                                                     "user_not_found"))
    _record(chat)
    with pytest.raises(PermanentFailure, match="user_not_found"):
        notify.handle(_paused(), deps, "notify_chat")  # type: ignore[arg-type]


def test_without_chat_configured_the_change_is_dead_lettered() -> None:
    with pytest.raises(PermanentFailure, match="not configured"):
        notify.handle(_paused(), SimpleNamespace(chat=None), "n")  # type: ignore[arg-type]
