"""What the bot says: sizes and times for people, notifications, reply targets; and Slack's
request signing (checked against slack_sdk's own verifier)."""

from __future__ import annotations

import ast
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from slack_sdk.signature import SignatureVerifier

from events import WorkspaceStateChanged
from functions.chatops import replies, signing
from functions.chatops.replies import ReplyTarget, human_duration, human_size, notification
from functions.domain.lifecycle import State, Workspace

T0 = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (900, "900 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (32 * 2**20, "32 MiB"),
    (int(1.2 * 2**30), "1.2 GiB"), (1879048192, "1.8 GiB"), (3 * 2**40, "3 TiB"),
])
def test_sizes(n: int, text: str) -> None:
    assert human_size(n) == text


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0 ms"), (850, "850 ms"), (1000, "1 s"), (3400, "3.4 s"), (59_940, "59.9 s"),
    (60_000, "1 min"), (125_000, "2 min 5 s"), (3_600_000, "1 h"), (3_780_000, "1 h 3 min"),
])
def test_durations(ms: int, text: str) -> None:
    assert human_duration(ms) == text


def _change(to: str, frm: str | None, reason: str, **kw: object) -> WorkspaceStateChanged:
    base = dict(workspace_id="ml-a--mynb", team="ml-a", owner="alice", name="mynb",
                from_state=frm, to_state=to, reason=reason, version=5)
    base.update(kw)
    return WorkspaceStateChanged(**base)  # type: ignore[arg-type]


WS = Workspace(id="ml-a--mynb", team="ml-a", owner="alice", name="mynb", profile="cpu-small",
               state=State.PAUSED, version=5, current_snapshot="ml-a--mynb-v4",
               first_start_ms=2100, last_pause_ms=3400, last_resume_ms=1900)
SNAP = {"bytes": int(1.2 * 2**30), "duration_ms": 3000,
        "skipped": [{"name": "lock", "type": "_thread.lock", "reason": "cannot be pickled"}]}


def test_paused_says_size_and_time_and_what_was_not_kept() -> None:
    note = notification(_change("PAUSED", "PAUSING", "paused"), WS, SNAP)
    assert note is not None and note.state == "PAUSED"
    assert note.text.startswith("mynb paused — 1.2 GiB in 3.4 s.")
    assert "`lock` (cannot be pickled)" in note.text
    assert "`/ws resume mynb`" in note.text


def test_a_pause_nobody_asked_for_says_why() -> None:
    note = notification(_change("PAUSED", "PAUSING", "paused",
                                message="idle for 1 h 5 min"), WS, {"bytes": 2048})
    assert note is not None
    assert note.text.startswith("mynb paused — 2 KiB in 3.4 s (idle for 1 h 5 min).")


@pytest.mark.parametrize(("change", "says"), [
    (_change("RUNNING", "PROVISIONING", "ready", url="http://127.0.0.1:9/lab"),
     "mynb is RUNNING in 2.1 s: http://127.0.0.1:9/lab"),
    (_change("RUNNING", "RESUMING", "resumed", url="http://h/lab"),
     "mynb resumed: RUNNING again in 1.9 s with its kernels: http://h/lab"),
    (_change("RUNNING", "PAUSING", "snapshot_failed", message="kernel died"),
     "pause of mynb failed: kernel died. It is still RUNNING"),
    (_change("FAILED", "RESUMING", "resume_failed", message="no GPU left"),
     "resume of mynb failed: no GPU left — its snapshot is kept: try `/ws resume mynb`"),
    (_change("PAUSED", "RESUMING", "snapshot_integrity",
             message="manifest.json has sha256 9f..., the snapshot record says 3e..."),
     "resume of mynb refused: manifest.json has sha256 9f..., the snapshot record says 3e. "
     "Its snapshot does not match what was recorded"),
    (_change("PAUSED", "RESUMING", "restore_refused",
             message="this kernel has no accelerator: resume it with its device arrays on CPU "
                     "(`stasis ws resume --device-arrays-to-cpu`)"),
     "(`/ws resume --device-arrays-to-cpu`). mynb stays PAUSED, nothing was lost."),
    (_change("PAUSED", "RESUMING", "resume_interrupted",
             message="node agent restarted during the resume"),
     "resume of mynb was interrupted: node agent restarted during the resume. mynb stays "
     "PAUSED, nothing was lost: try `/ws resume mynb` again."),
    (_change("FAILED", "PROVISIONING", "provision_failed", message="image pull"),
     "mynb failed to start: image pull — try `/ws delete mynb`"),
    (_change("FAILED", None, "admission_refused", message="team ml-a uses 4/4 GPUs: pause"),
     "mynb was not created: team ml-a uses 4/4 GPUs: pause."),
    (_change("DELETED", "DELETING", "deleted"), "mynb deleted."),
    # when the GPUs run out
    (_change("QUEUED", None, "queued", message="queued: team ml-a uses 4/4 GPUs: pause or "
                                               "delete one, see `stasis ws list`"),
     "mynb is QUEUED (team ml-a uses 4/4 GPUs: pause or delete one, see `/ws list`). It "
     "starts by itself; `/ws status mynb` says where it stands, `/ws delete mynb` cancels it."),
    (_change("QUEUED", "PAUSING", "requeued",
             message="paused with its state for ml-b--hi (interactive), which needed "
                     "1 x nvidia-l4; your resume is queued"),
     "mynb was paused with its state for ml-b--hi (interactive), which needed 1 x nvidia-l4;"
     " your resume is queued. Its live state is in its snapshot"),
    (_change("RUNNING", "RUNNING", "preemption_warning",
             message="ml-b--hi (interactive) needs the nvidia-l4 this workspace holds: it "
                     "will be paused with its state in 10m"),
     "Heads-up: ml-b--hi (interactive) needs the nvidia-l4 this workspace holds: it will be "
     "paused with its state in 10m. Save your work"),
    (_change("FAILED", "QUEUED", "queue_expired",
             message="waited 4h, the most its profile allows (4h): no node has 1 x nvidia-l4 "
                     "free"),
     "mynb did not start: it waited 4h, the most its profile allows (4h): no node has"),
    (_change("PAUSED", "QUEUED", "queue_cancelled"),
     "mynb stays PAUSED: its queued resume was cancelled."),
])
def test_outcomes(change: WorkspaceStateChanged, says: str) -> None:
    note = notification(change, WS, None)
    assert note is not None
    assert says in note.text


@pytest.mark.parametrize("to", ["PROVISIONING", "PAUSING", "RESUMING", "DELETING"])
def test_steps_the_ack_announced_are_not_repeated(to: str) -> None:
    assert notification(_change(to, "RUNNING", "x"), WS, None) is None


def test_a_document_older_than_the_change_is_not_used_for_numbers() -> None:
    old = dataclasses.replace(WS, version=3)
    note = notification(_change("PAUSED", "PAUSING", "paused"), old, {"bytes": 1024})
    assert note is not None and note.text.startswith("mynb paused — 1 KiB.")


def test_messages_carry_the_request_in_slack_metadata() -> None:
    change = _change("DELETED", "DELETING", "deleted")
    message = notification(change, WS, None).message(change, "slack-abc")  # type: ignore[union-attr]
    assert message["metadata"]["event_payload"] == {
        "requestid": "slack-abc", "workspace_id": "ml-a--mynb", "state": "DELETED",
        "reason": "deleted", "version": 5}
    ack = replies.ack("ok", "slack-abc", follow=True, workspace_id="ml-a--mynb")
    assert ack["response_type"] == "ephemeral" and "`slack-abc`" in ack["text"]
    assert ack["metadata"]["event_payload"]["follow"] is True


def test_reply_targets_round_trip_and_junk_is_ignored() -> None:
    target = ReplyTarget("U0ALICE", "C1", "T1", "https://hooks.slack.com/commands/T1/1/x", T0)
    assert ReplyTarget.decode(target.encode()) == target
    assert ReplyTarget.decode(ReplyTarget("U1").encode()) == ReplyTarget("U1")
    for junk in (None, "", "slack:C1", "slack:{", 'slack:{"user": 3}', "mailto:x", "slack:[]"):
        assert ReplyTarget.decode(junk) is None
    assert target.response_url_valid(T0 + timedelta(minutes=29))
    assert not target.response_url_valid(T0 + timedelta(minutes=30))
    assert not ReplyTarget("U1").response_url_valid(T0)


# -- signing ---------------------------------------------------------------------------------

def test_signatures_are_the_ones_slack_sdk_accepts() -> None:
    body = "command=%2Fws&text=create+mynb&trigger_id=1.2.3"
    now = int(time.time())
    headers = signing.signed_headers("s3cret", now, body)
    assert SignatureVerifier("s3cret").is_valid(body, headers["X-Slack-Request-Timestamp"],
                                                headers["X-Slack-Signature"])
    assert signing.verify("s3cret", headers, body, now)
    lower = {k.lower(): v for k, v in headers.items()}
    assert signing.verify("s3cret", lower, body, now + 299)


@pytest.mark.parametrize("tamper", ["secret", "body", "old", "future", "no-timestamp"])
def test_forged_or_stale_requests_fail_verification(tamper: str) -> None:
    body, now = "text=list", int(time.time())
    headers = signing.signed_headers("s3cret", now, body)
    check_body, at = body, now
    if tamper == "secret":
        headers = signing.signed_headers("other", now, body)
    elif tamper == "body":
        check_body = "text=delete+mynb"
    elif tamper == "old":
        at = now + 301
    elif tamper == "future":
        at = now - 301
    else:
        headers.pop("X-Slack-Request-Timestamp")
    assert not signing.verify("s3cret", headers, check_body, at)
    if tamper != "no-timestamp":
        verifier = SignatureVerifier("s3cret", clock=_Clock(at))
        assert not verifier.is_valid(check_body, headers["X-Slack-Request-Timestamp"],
                                     headers["X-Slack-Signature"])


class _Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


def test_request_ids_are_stable_across_retries_and_distinct_across_commands() -> None:
    assert signing.request_id("1.2.abc", "x") == signing.request_id("1.2.abc", "y")
    assert signing.request_id("1.2.abc", "x") != signing.request_id("1.2.abd", "x")
    assert signing.request_id(None, "body") == signing.request_id(None, b"body")
    assert signing.request_id(None, "body").startswith("slack-")


# -- layers ----------------------------------------------------------------------------------

PURE = ("grammar", "replies", "signing")
ALLOWED = ("events", "functions.domain", "functions.chatops")


@pytest.mark.parametrize("module", PURE)
def test_the_pure_chat_modules_import_no_sdk_and_do_no_io(module: str) -> None:
    tree = ast.parse((ROOT / "functions" / "chatops" / f"{module}.py").read_text())
    stdlib = {"__future__", "collections", "dataclasses", "datetime", "difflib", "enum",
              "hashlib", "hmac", "json", "math", "re", "typing", "unicodedata"}
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in stdlib or name.startswith(ALLOWED), f"{module} imports {name}"
