"""Slack on the local stack: its settings, and a client that talks to the chat function the
way Slack does.

`stasis up` starts the Slack sink (``stack/slack_sink.py``) and gives the function host
:func:`slack_env`: the local signing secret, bot token and the sink as Web API base URL.
Each may be overridden with the same variables (``STASIS_SLACK_SIGNING_SECRET``,
``STASIS_SLACK_BOT_TOKEN``, ``STASIS_SLACK_API_URL``, ``STASIS_SLACK_TEAM_ID``); the local
defaults below are for loopback only and are not secrets.

:class:`ChatClient` plays Slack: it builds the form body Slack posts for a slash command,
signs it (v0, with the timestamp header), posts it to the chat function, hands out a
response_url on the sink, and reads the sink for the notifications that follow.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from functions.chatops import signing
from stack import processes
from stack.settings import Settings

LOCAL_SIGNING_SECRET = "stasis-local-signing-secret"
LOCAL_BOT_TOKEN = "xoxb-stasis-local"
LOCAL_TEAM = "T0STASIS"
LOCAL_CHANNEL = "C0STASIS"
SINK_NAME = "slack-sink"
_TIMEOUT = 30


def signing_secret(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STASIS_SLACK_SIGNING_SECRET") or LOCAL_SIGNING_SECRET


def bot_token(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STASIS_SLACK_BOT_TOKEN") or LOCAL_BOT_TOKEN


def team_id(environ: Mapping[str, str] = os.environ) -> str:
    """The Slack team the chat function serves and :class:`ChatClient` signs as."""
    return environ.get("STASIS_SLACK_TEAM_ID") or LOCAL_TEAM


def slack_env(settings: Settings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the function host needs to serve chat on this stack."""
    return {
        "STASIS_SLACK_SIGNING_SECRET": signing_secret(environ),
        "STASIS_SLACK_BOT_TOKEN": bot_token(environ),
        "STASIS_SLACK_TEAM_ID": team_id(environ),
        "STASIS_SLACK_API_URL": environ.get("STASIS_SLACK_API_URL")
        or f"{settings.slack_sink_url}/api/",
    }


def sink_spec(settings: Settings) -> processes.ServiceSpec:
    """The Slack sink as a supervised service of the local stack."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return processes.ServiceSpec(
        name=SINK_NAME,
        argv=(sys.executable, "-m", "stack.slack_sink", "--port", str(settings.slack_sink_port),
              "--token", bot_token(), "--log", str(settings.data_dir / "slack" /
                                                   "messages.jsonl")),
        ready_url=f"{settings.slack_sink_url}/healthz",
        data_dir=settings.data_dir,
        env={"PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"},
        cwd=root,
    )


def warm_up(settings: Settings) -> threading.Thread:
    """Have the function host build the chat app and open its clients now, in the
    background (``GET /chat/``), so the first slash command acks well within 3 seconds.
    Best effort: a failure here shows up, with its reason, on the first real request."""

    def ping() -> None:
        with contextlib.suppress(requests.RequestException):
            session = requests.Session()
            session.trust_env = False
            session.get(f"{settings.functions_url}/chat/", timeout=60)

    thread = threading.Thread(target=ping, name="chat-warm-up", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Sent:
    """A slash command as sent, and the chat function's answer."""

    status: int
    body: dict[str, Any]
    requestid: str
    response_id: str
    seconds: float

    @property
    def text(self) -> str:
        return str(self.body.get("text") or self.body.get("error") or "")

    @property
    def follow(self) -> bool:
        """Whether a notification will follow (an event was published)."""
        payload = (self.body.get("metadata") or {}).get("event_payload") or {}
        return bool(payload.get("follow"))


class ChatClient:
    """Slack's side of a conversation with the chat function of one stack."""

    def __init__(self, settings: Settings, *, secret: str | None = None,
                 session: requests.Session | None = None) -> None:
        self.settings = settings
        self.secret = secret or signing_secret()
        self.http = session or requests.Session()
        self.http.trust_env = False  # loopback: never through a proxy
        self.chat_url = f"{settings.functions_url}/chat/"

    def body(self, text: str, *, user: str, trigger_id: str | None = None,
             response_id: str | None = None, channel: str = LOCAL_CHANNEL) -> str:
        """The form body Slack posts for ``/ws <text>``."""
        return urllib.parse.urlencode({
            "token": "local-verification-token", "team_id": team_id(),
            "team_domain": "stasis-local", "channel_id": channel,
            "channel_name": "directmessage", "user_id": user, "user_name": user.lower(),
            "command": "/ws", "text": text, "api_app_id": "A0STASIS",
            "is_enterprise_install": "false",
            "response_url": f"{self.settings.slack_sink_url}/response/{response_id}",
            "trigger_id": trigger_id or new_trigger_id(),
        })

    def post(self, body: str, *, timestamp: int | None = None, secret: str | None = None,
             retry: int | None = None, signature: str | None = None) -> requests.Response:
        """POST a body, signed as Slack signs it (or with the given forged parts)."""
        ts = int(time.time()) if timestamp is None else timestamp
        headers = signing.signed_headers(secret or self.secret, ts, body)
        if signature is not None:
            headers[signing.SIGNATURE_HEADER] = signature
        if retry is not None:
            headers[signing.RETRY_HEADER] = str(retry)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        return self.http.post(self.chat_url, data=body.encode(), headers=headers,
                              timeout=_TIMEOUT)

    def send(self, text: str, *, user: str, trigger_id: str | None = None,
             retry: int | None = None) -> Sent:
        """Send ``/ws <text>`` as Slack user ``user``; the ack and the request id."""
        trigger_id = trigger_id or new_trigger_id()
        response_id = uuid.uuid4().hex
        body = self.body(text, user=user, trigger_id=trigger_id, response_id=response_id)
        started = time.perf_counter()
        response = self.post(body, retry=retry)
        seconds = time.perf_counter() - started
        try:
            answer = response.json()
        except ValueError:
            answer = {"error": response.text}
        return Sent(response.status_code, answer if isinstance(answer, dict) else {},
                    signing.request_id(trigger_id, body), response_id, seconds)

    def messages(self, **filters: Any) -> list[dict[str, Any]]:
        """What the sink recorded (filters: after, response_id, channel, requestid, kind)."""
        params = {k: str(v) for k, v in filters.items() if v is not None}
        response = self.http.get(f"{self.settings.slack_sink_url}/messages", params=params,
                                 timeout=_TIMEOUT)
        response.raise_for_status()
        return list(response.json()["messages"])

    def outcome(self, sent: Sent, *, timeout: float = 300,
                interval: float = 0.2) -> dict[str, Any]:
        """The notification that reports how ``sent``'s request ended (every notification
        reports an outcome: the ack already announced the steps in between). Raises
        TimeoutError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.messages(requestid=sent.requestid)
            if rows:
                return rows[0]
            time.sleep(interval)
        raise TimeoutError(f"no notification for request {sent.requestid} within {timeout:.0f}s")


def slack_user_for(who: str, project: str) -> str:
    """A Slack user id: ``who`` itself if it is one (``U0ALICE``), else the Slack id the
    applied catalog maps Stasis user ``who`` to. Raises LookupError saying who has one."""
    if re.fullmatch(r"[UW][A-Z0-9]{2,}", who):
        return who
    from google.cloud import firestore

    from functions.domain.catalog import Catalog

    snap = firestore.Client(project=project).collection("catalog").document("current").get()
    if not snap.exists:
        raise LookupError("no catalog applied yet: `stasis admin apply FILE` first")
    catalog = Catalog.from_config(snap.to_dict() or {})
    mapped = {m.user: m.slack_user_id for t in catalog.teams.values() for m in t.members
              if m.slack_user_id}
    if who in mapped:
        return str(mapped[who])
    known = ", ".join(f"{u} ({s})" for u, s in mapped.items()) or "nobody"
    raise LookupError(f"{who} has no slack_user_id in the catalog; act as one who has "
                      f"(--as): {known}, or add slack_user_id to {who} in the admin file")


def new_trigger_id() -> str:
    """A trigger id shaped like Slack's (``<seconds>.<digits>.<hex>``), unique per command."""
    return f"{int(time.time())}.{secrets.randbelow(10**12):012d}.{secrets.token_hex(16)}"


def state_of(message: Mapping[str, Any]) -> tuple[str, str]:
    """(to_state, reason) from a notification's metadata; ("", "") if it has none."""
    metadata = message.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = None
    payload = (metadata or {}).get("event_payload") or {} if isinstance(metadata, dict) else {}
    return str(payload.get("state") or ""), str(payload.get("reason") or "")
