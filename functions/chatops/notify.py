"""Tell the requester how their chat request turned out (consumer of workspace.state_changed).

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
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from events import Event, WorkspaceStateChanged
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
    now = chat.clock()
    via = None
    if target.response_url:
        usable = (chat.records.use_response_url(event.requestid, now) if record is not None
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
    chat.records.mark_notified(key, {"event_id": event.id, "requestid": event.requestid,
                                     "workspace_id": change.workspace_id,
                                     "state": change.to_state, "via": via}, now)
    log.info("told %s about %s %s via %s", target.user, change.workspace_id, change.to_state,
             via)
    return via


def _target(record: dict[str, Any] | None) -> replies.ReplyTarget | None:
    if not record or not record.get("slack_user"):
        return None
    return replies.ReplyTarget(user=str(record["slack_user"]), channel=record.get("channel"),
                               team=record.get("slack_team"),
                               response_url=record.get("response_url"),
                               issued_at=record.get("issued_at"))
