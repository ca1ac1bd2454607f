"""The sandbox notifier (sandbox.state_changed -> chat) against fakes: whom it tells, what,
once."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from chat_fakes import NOW, FakeNotifier, FakeStore, chat_deps

from events import SandboxFinished, SandboxStateChanged, SandboxSuspended, new_event
from functions.chatops import notify
from functions.chatops.ports import ChatDeps
from functions.chatops.replies import ReplyTarget
from functions.delivery import PermanentFailure
from functions.domain.sandboxes import DEFAULT_POLICY, Limits, Sandbox, TeamQueue, finish

URL = "https://hooks.slack.com/commands/T0/1/abc"
SBX = "sbx-0123456789abcdef"
PATCH = f"gs://b/sandboxes/ml-a/{SBX}/patch.diff"
CONSUMER = "notify_chat_sandbox"


def _doc(state: str = "RUNNING", *, reply_to: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"id": SBX, "team": "ml-a", "requester": "alice", "repository": "/srv/calc",
            "command": "python -m pytest -x", "base_ref": "main",
            "limits": Limits(600, 2**30, 900, 64).to_doc(), "allowed_network": [],
            "state": state, "reason": "admitted", "requestid": "slack-r1",
            "requested_at": NOW - timedelta(minutes=2), "started_at": NOW - timedelta(minutes=2),
            "version": 2, "message": "running", "reply_to": reply_to, **fields}


def _finished(event_id: str = "e1", requestid: str = "slack-r1", **fields: Any) -> Any:
    """The sandbox.state_changed of an end the sandbox handler recorded."""
    change = SandboxStateChanged(sandbox_id=SBX, team="ml-a", requester="alice",
                                 from_state="RUNNING", to_state="SUCCEEDED",
                                 reason="succeeded", version=3)
    return new_event(SandboxStateChanged(**{**change.__dict__, **fields}), id=event_id,
                     requestid=requestid)


def _deps(doc: dict[str, Any] | None, *, record: bool = True,
          notifier: FakeNotifier | None = None) -> tuple[SimpleNamespace, ChatDeps]:
    chat = chat_deps(notifier=notifier)
    store: FakeStore = chat.reads  # type: ignore[assignment]
    if doc is not None:
        store.docs[("sandboxes", SBX)] = doc
    if record:
        chat.records.remember("slack-r1", {
            "slack_user": "U0ALICE", "channel": "C0", "slack_team": "T0",
            "response_url": URL, "issued_at": NOW, "response_url_uses": 0})
    return SimpleNamespace(chat=chat), chat


def _sent(chat: ChatDeps) -> list[dict[str, Any]]:
    notifier: FakeNotifier = chat.notifier  # type: ignore[assignment]
    return [m for _, m in notifier.responded + notifier.posted]


def _ended(**fields: Any) -> dict[str, Any]:
    """The record of a sandbox that ended SUCCEEDED, as the sandbox handler wrote it."""
    return _doc("SUCCEEDED", reason="succeeded", exit_status=0, files_changed=["calc.py"],
                patch_uri=PATCH, version=3, message=f"the task succeeded; a patch of 1 file "
                f"(120 bytes) is ready for review: stasis sandbox show {SBX}, then stasis "
                f"sandbox apply {SBX} --to CHECKOUT", **fields)


def test_the_requester_is_told_the_end_with_the_patch_to_review() -> None:
    deps, chat = _deps(_ended())
    assert notify.handle_sandbox(_finished(), deps, CONSUMER) == "response_url"  # type: ignore[arg-type]
    [message] = _sent(chat)
    assert message["text"].startswith(f"Sandbox `{SBX}` (`python -m pytest -x`) ended "
                                      "*SUCCEEDED*: the task succeeded; a patch of 1 file")
    assert f"stasis sandbox apply {SBX} --to CHECKOUT" in message["text"]
    assert f"`/ws sandbox show {SBX}` lists the files; the patch is at {PATCH}." \
        in message["text"]
    assert message["metadata"]["event_payload"] == {
        "requestid": "slack-r1", "sandbox_id": SBX, "state": "SUCCEEDED",
        "reason": "succeeded", "files_changed": 1}
    assert chat.records.recall("slack-r1")["response_url_uses"] == 1  # type: ignore[index]


def test_the_end_is_told_as_the_sandbox_handler_recorded_it() -> None:
    """The change the domain's own ``finish`` makes of a report, with the record it wrote."""
    report = SandboxFinished(sandbox_id=SBX, succeeded=False, exit_status=None,
                             termination="wall_clock_exceeded", patch_uri=PATCH,
                             patch_bytes=120, files_changed=["calc.py"])
    decision = finish(Sandbox.from_doc(_doc("RUNNING")), report, policy=DEFAULT_POLICY,
                      queue=TeamQueue(running=(SBX,)), load=lambda _: None, now=NOW)
    [ended] = decision.sandboxes
    [change] = decision.events
    deps, chat = _deps(ended.to_doc())
    notify.handle_sandbox(new_event(change, id=change.event_id, requestid="runtime-r"), deps,  # type: ignore[arg-type]
                          CONSUMER)
    [message] = _sent(chat)
    assert "ended *TIMED_OUT*: stopped: wall clock limit of 900 s exceeded; a patch of 1 file" \
        in message["text"]
    assert message["metadata"]["event_payload"]["state"] == "TIMED_OUT"


def test_one_notification_per_sandbox_whatever_reports_follow() -> None:
    deps, chat = _deps(_ended())
    notify.handle_sandbox(_finished("e1"), deps, CONSUMER)  # type: ignore[arg-type]
    late = _finished("reconcile-x", requestid="reconcile-x", to_state="FAILED",
                     reason="runtime_lost", version=4)
    assert notify.handle_sandbox(late, deps, CONSUMER) == "duplicate"  # type: ignore[arg-type]
    assert len(_sent(chat)) == 1


def test_without_the_record_the_reply_to_is_used_and_an_old_response_url_is_skipped() -> None:
    target = ReplyTarget("U0ALICE", "C0", "T0", URL, NOW - timedelta(hours=2))
    deps, chat = _deps(_ended(reply_to=target.encode()), record=False)
    assert notify.handle_sandbox(_finished(), deps, CONSUMER) == "chat.postMessage"  # type: ignore[arg-type]
    [(user, message)] = chat.notifier.posted  # type: ignore[attr-defined]
    assert user == "U0ALICE" and "*SUCCEEDED*" in message["text"]


@pytest.mark.parametrize(("doc", "change"), [
    (None, {}),
    (_doc("QUEUED"), {"from_state": "QUEUED", "to_state": "RUNNING", "reason": "promoted"}),
    (_doc("FAILED"), {"from_state": None, "to_state": "FAILED", "reason": "queue_full"}),
], ids=["no record", "not an end", "refused at once (the ack said so)"])
def test_what_is_not_the_end_of_a_sandbox_that_ran_tells_nobody(
        doc: dict[str, Any] | None, change: dict[str, Any]) -> None:
    deps, chat = _deps(doc)
    assert notify.handle_sandbox(_finished(**change), deps, CONSUMER) is None  # type: ignore[arg-type]
    assert _sent(chat) == []


def test_a_sandbox_from_the_cli_or_a_link_tells_nobody_here() -> None:
    deps, chat = _deps(_ended(requestid="cli-123"), record=True)
    assert notify.handle_sandbox(_finished(requestid="cli-123"), deps, CONSUMER) is None  # type: ignore[arg-type]
    assert _sent(chat) == []


def test_slack_refusing_for_good_is_a_permanent_failure() -> None:
    target = ReplyTarget("U0GONE")
    deps, _ = _deps(_ended(reply_to=target.encode()), record=False,
                    notifier=FakeNotifier(refuse="user_not_found"))
    with pytest.raises(PermanentFailure, match="user_not_found"):
        notify.handle_sandbox(_finished(), deps, CONSUMER)  # type: ignore[arg-type]


def test_a_send_that_fails_releases_its_claim_so_the_retry_tells() -> None:
    class Flaky(FakeNotifier):
        def post(self, channel: str, message: Any) -> None:
            raise ConnectionError("slack unreachable")

    deps, chat = _deps(_ended(reply_to=ReplyTarget("U0ALICE").encode()), record=False,
                       notifier=Flaky())
    with pytest.raises(ConnectionError):
        notify.handle_sandbox(_finished(), deps, CONSUMER)  # type: ignore[arg-type]
    chat.notifier = FakeNotifier()
    assert notify.handle_sandbox(_finished(), deps, CONSUMER) == "chat.postMessage"  # type: ignore[arg-type]


def _held(sequence: int = 1) -> Any:
    """The sandbox.state_changed of the ``sequence``-th suspension, as the domain makes it
    of the runtime's report."""
    from functions.domain.sandboxes import SandboxState, changed

    report = SandboxSuspended(
        sandbox_id=SBX, idle_seconds=600, sequence=sequence, method="freeze",
        checkpoint_uri=f"gs://b/sandboxes/ml-a/{SBX}/checkpoint-{sequence}.diff",
        checkpoint_bytes=90, files_changed=["calc.py", "x.py"])
    held = Sandbox.from_doc(_doc("SUSPENDED", version=2 * sequence + 1))
    change = changed(SandboxState.RUNNING, held, report)
    return new_event(change, id=change.event_id, requestid=f"held-{sequence}")


def test_a_suspension_is_told_once_each_time_with_how_to_resume() -> None:
    deps, chat = _deps(_doc("SUSPENDED"))
    handle = notify.handle_sandbox_suspended
    assert handle(_held(1), deps, "notify_chat_sandbox_suspended") == "response_url"  # type: ignore[arg-type]
    assert handle(_held(1), deps, "notify_chat_sandbox_suspended") == "duplicate"  # type: ignore[arg-type]
    assert handle(_held(2), deps, "notify_chat_sandbox_suspended") == "response_url"  # type: ignore[arg-type]
    first = _sent(chat)[0]
    assert first["text"] == (
        f"Sandbox `{SBX}` (`python -m pytest -x`) is *SUSPENDED*: it made no progress for "
        "10 min, so its slot was freed (frozen: its memory stays held). The diff so far (2 "
        f"files) is at gs://b/sandboxes/ml-a/{SBX}/checkpoint-1.diff. `/ws sandbox resume "
        f"{SBX}` brings it back.")
    assert first["metadata"]["event_payload"]["state"] == "SUSPENDED"
    # It ended since: the end's notification says what matters.
    deps, chat = _deps(_doc("SUCCEEDED"))
    assert handle(_held(1), deps, "notify_chat_sandbox_suspended") is None  # type: ignore[arg-type]
    assert _sent(chat) == []
