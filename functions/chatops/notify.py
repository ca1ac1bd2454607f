"""Tell the requester how their chat request turned out (consumer of the state changes).

Which request: a state change carries the ``requestid`` of the event that caused it, and
every event downstream of a chat request (the runtime's workspace.ready, snapshot.finished,
...) keeps that id, so the chat record ``chat_requests/{requestid}`` names who asked and
where to answer. Without one (an idle pause, a CLI request on a workspace created from
chat) the workspace's own ``reply_to`` (set by ``/ws create``) is used. Without either the
change came from elsewhere and nobody is told.

Where: the request's ``response_url`` while Slack still takes messages there (30 minutes,
5 messages; ephemeral, in the conversation where the user typed the command), else
``chat.postMessage`` to the user (the app's direct messages).

Once: each change (its event id is deterministic: ``<workspace>-v<version>``) is marked in
``chat_notified/`` after it was sent; a redelivery finds the mark and sends nothing. A crash
between sending and marking sends it again (at least once, never lost).

Failures: Slack unreachable or rate limiting raises (Pub/Sub retries); Slack refusing the
message for good (an unknown user, a revoked token) is a PermanentFailure, dead-lettered
with Slack's reason.

Sandboxes (:func:`handle_sandbox` and :func:`handle_sandbox_suspended`, consumers of
sandbox.state_changed, which the sandbox handler emits once it recorded a change): the
same two ways. The end of a sandbox that ran is told once per sandbox; a suspension once
per suspension, with how to resume it (what it says comes from the state change: how long
it idled, how it is held, its checkpoint). A request refused at once (no state before) was
answered by the ack already. The mark is claimed before sending, since a change may be
delivered twice at once, and released when the send fails; a crash between the claim and
the send loses that one notification (``/ws sandbox list`` still shows the end). The target
is the chat record of the request that asked for the sandbox (``sandboxes/{id}.requestid``),
else the request's ``reply_to``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from events import Event, SandboxStateChanged, WorkspaceStateChanged
from functions.chatops import replies
from functions.chatops.ports import ChatDeps, NotifyRefused
from functions.delivery import PermanentFailure
from functions.handlers.deps import Deps

log = logging.getLogger(__name__)


def handle(event: Event[Any], deps: Deps, consumer: str) -> str | None:
    """Send the notification for one state change; returns how it went (for tests/logs)."""
    change: WorkspaceStateChanged = event.payload
    chat: ChatDeps | None = getattr(deps, "chat", None)
    if chat is None:
        raise PermanentFailure("chat is not configured in this deployment")
    record = chat.records.recall(event.requestid)
    target = _target(record) or replies.ReplyTarget.decode(change.reply_to)
    if target is None:
        return None  # not a chat request: nobody to tell here
    ws = chat.reads.get_workspace(change.workspace_id)
    snapshot = None
    if change.to_state == "PAUSED" and ws is not None and ws.current_snapshot:
        snapshot = chat.reads.get("snapshots", ws.current_snapshot)
    note = replies.notification(change, ws, snapshot)
    if note is None:
        return None
    key = hashlib.sha256(f"{consumer}|{event.id}".encode()).hexdigest()
    if chat.records.notified(key):
        return "duplicate"
    message = note.message(change, event.requestid)
    via = _send(chat, target, record, event.requestid, message)
    chat.records.mark_notified(key, {"event_id": event.id, "requestid": event.requestid,
                                     "workspace_id": change.workspace_id,
                                     "state": change.to_state, "via": via}, chat.clock())
    log.info("told %s about %s %s via %s", target.user, change.workspace_id, change.to_state,
             via)
    return via


def _send(chat: ChatDeps, target: replies.ReplyTarget, record: dict[str, Any] | None,
          requestid: str, message: dict[str, Any]) -> str:
    """The response_url while usable, else a DM; how it went."""
    now = chat.clock()
    via = None
    if target.response_url:
        usable = (chat.records.use_response_url(requestid, now) if record is not None
                  else target.response_url_valid(now))
        if usable and chat.notifier.respond(target.response_url, message):
            via = "response_url"
    if via is None:
        try:
            chat.notifier.post(target.user, message)
        except NotifyRefused as exc:
            raise PermanentFailure(f"Slack refused the notification to {target.user}: "
                                   f"{exc}") from exc
        via = "chat.postMessage"
    return via


def handle_sandbox(event: Event[Any], deps: Deps, consumer: str) -> str | None:
    """Tell the requester how their sandbox ended; returns how it went (tests/logs)."""
    change: SandboxStateChanged = event.payload
    if change.to_state not in replies.SANDBOX_ENDED or change.from_state is None:
        return None  # not an end, or a request refused at once (the ack said so)
    chat = _chat(deps)
    doc = chat.reads.get("sandboxes", change.sandbox_id)
    if doc is None:
        return None
    return _tell_once(chat, doc, event, f"{consumer}|{change.sandbox_id}",
                      lambda requestid: replies.sandbox_notification(doc, requestid),
                      change.to_state)


def handle_sandbox_suspended(event: Event[Any], deps: Deps, consumer: str) -> str | None:
    """Tell the requester their sandbox was suspended (idle) and how to bring it back;
    once per suspension."""
    change: SandboxStateChanged = event.payload
    if change.to_state != "SUSPENDED":
        return None
    chat = _chat(deps)
    doc = chat.reads.get("sandboxes", change.sandbox_id)
    if doc is None or doc.get("state") in replies.SANDBOX_ENDED:
        return None  # unknown, or it ended since: the end says what matters
    return _tell_once(chat, doc, event, f"{consumer}|{change.sandbox_id}|v{change.version}",
                      lambda requestid: replies.sandbox_suspended_notification(
                          doc, change, requestid), "SUSPENDED")


def _chat(deps: Deps) -> ChatDeps:
    chat: ChatDeps | None = getattr(deps, "chat", None)
    if chat is None:
        raise PermanentFailure("chat is not configured in this deployment")
    return chat


def _tell_once(chat: ChatDeps, doc: Mapping[str, Any], event: Event[Any], mark: str,
               message: Any, state: str) -> str | None:
    """Send ``message(requestid)`` to whoever asked for the sandbox ``doc``, once per
    ``mark``. The mark is claimed before sending: two reports of one sandbox (the
    runtime's and the reconciler's, or one delivered twice) may arrive at once."""
    sandbox_id = str(doc.get("id"))
    requestid = str(doc.get("requestid") or event.requestid)
    record = chat.records.recall(requestid)
    target = _target(record) or replies.ReplyTarget.decode(doc.get("reply_to"))
    if target is None:
        return None  # asked for from the CLI or through a link: nobody to tell here
    key = hashlib.sha256(mark.encode()).hexdigest()
    detail = {"event_id": event.id, "requestid": requestid, "sandbox_id": sandbox_id,
              "state": state}
    if not chat.records.claim_notification(key, detail, chat.clock()):
        return "duplicate"
    try:
        via = _send(chat, target, record, requestid, message(requestid))
    except BaseException:
        chat.records.release_notification(key)  # not sent: the retry may send it
        raise
    chat.records.mark_notified(key, {**detail, "via": via}, chat.clock())
    log.info("told %s that sandbox %s is %s via %s", target.user, sandbox_id, state, via)
    return via


def _target(record: dict[str, Any] | None) -> replies.ReplyTarget | None:
    if not record or not record.get("slack_user"):
        return None
    return replies.ReplyTarget(user=str(record["slack_user"]), channel=record.get("channel"),
                               team=record.get("slack_team"),
                               response_url=record.get("response_url"),
                               issued_at=record.get("issued_at"))
