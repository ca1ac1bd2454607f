"""Slack's request signing (v0) and the request id of a slash command. Pure.

Slack signs every request: ``X-Slack-Signature: v0=HMAC_SHA256(signing secret,
"v0:{X-Slack-Request-Timestamp}:{raw body}")``, and receivers reject a timestamp more than
five minutes from their clock (replays). In the chat function bolt's ``RequestVerification``
checks it; this module is what signs (``stasis chat``, the benchmark, tests) and a second,
independent verifier for the tests to hold bolt to the same rule.

A valid signature says Slack sent the request, not from which Slack workspace: an app
installed in several workspaces, an Enterprise Grid org, or a Slack Connect channel shared
with another company all reach the same function with the same secret, and Slack user ids
are only unique within their workspace. :func:`foreign_workspace` is the check on every
request that it comes from the configured Slack team (and enterprise), before any user id
is mapped to a Stasis user.

A slash command's request id is derived from Slack's ``trigger_id`` (unique per
invocation, identical on a retry of the same invocation), so a retried request carries the
same ``requestid`` and the consumers' ledger gives it one effect.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

VERSION = "v0"
MAX_AGE_SECONDS = 5 * 60
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
SIGNATURE_HEADER = "X-Slack-Signature"
RETRY_HEADER = "X-Slack-Retry-Num"


def signature(secret: str, timestamp: int | str, body: str | bytes) -> str:
    """``v0=<hex>`` for ``body`` sent at ``timestamp`` (seconds since the epoch)."""
    raw = body.encode() if isinstance(body, str) else body
    base = f"{VERSION}:{timestamp}:".encode() + raw
    return f"{VERSION}=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(secret: str, timestamp: int, body: str | bytes) -> dict[str, str]:
    """The headers Slack sends with ``body``: content type, timestamp and signature."""
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }


def verify(secret: str, headers: Mapping[str, str], body: str | bytes, now: float) -> bool:
    """Whether ``headers`` carry a valid signature of ``body`` made within five minutes of
    ``now``. Header names are matched case-insensitively; comparison is constant-time."""
    lower = {k.lower(): v for k, v in headers.items()}
    timestamp = lower.get(TIMESTAMP_HEADER.lower(), "")
    given = lower.get(SIGNATURE_HEADER.lower(), "")
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent) > MAX_AGE_SECONDS:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), given)


def request_id(trigger_id: str | None, body: str | bytes) -> str:
    """The ``requestid`` of a slash command: stable across Slack's retries of it.

    From ``trigger_id`` when Slack sent one (always, for slash commands), else from the raw
    body, which a retry repeats byte for byte.
    """
    seed = trigger_id.encode() if trigger_id else (body.encode() if isinstance(body, str)
                                                    else body)
    return "slack-" + hashlib.sha256(seed).hexdigest()[:24]


def foreign_workspace(body: Mapping[str, object], *, team_id: str,
                      enterprise_id: str | None = None) -> str | None:
    """None if the request ``body`` (the form Slack posted) comes from the Slack team
    ``team_id`` (and, when configured, the Enterprise Grid org ``enterprise_id``); else why
    it is refused, in words for the person who typed it.

    A missing ``team_id`` is refused too: the user id means nothing without it.
    """
    team = str(body.get("team_id") or "")
    if team != team_id:
        shown = team or "no Slack team"
        return (f"Stasis is installed for another Slack workspace: this request came from "
                f"{shown}, and Stasis serves only {team_id}. Ask an admin of Stasis.")
    if enterprise_id is not None and str(body.get("enterprise_id") or "") != enterprise_id:
        shown = str(body.get("enterprise_id") or "") or "no Enterprise Grid org"
        return (f"Stasis is installed for another Slack organisation: this request came "
                f"from {shown}, and Stasis serves only {enterprise_id}. Ask an admin of "
                f"Stasis.")
    return None
