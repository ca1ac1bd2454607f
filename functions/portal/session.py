"""A browser's signed session: who it is, for the portal and the IDE access proxy alike.

The portal issues it (after a one-time sign-in URL locally, or from a verified IAP identity
in a deployment) as the cookie ``stasis_session`` (HttpOnly, SameSite=Strict); the IDE
access proxy verifies the same cookie on every request and WebSocket upgrade. One secret,
``STASIS_SESSION_SECRET``, is shared by both; rotating it signs everyone out.

The value is ``<base64url(json)>.<base64url(hmac-sha256)>`` with the user, a random
session id (so a session can be told apart in the audit log and revoked), and the issue
and expiry times as Unix seconds. Written with the standard library on purpose: the format
is twenty lines, and both sides must agree on it byte for byte.

The CSRF token of a session is an HMAC of its session id under a derived key: a form
carries it, a request without the right one is refused. It needs no storage and cannot be
computed without the secret.

Pure: time is passed in, nothing is read from the environment here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

COOKIE = "stasis_session"
#: How long a signed-in browser stays signed in.
MAX_AGE_SECONDS = 12 * 3600
_CSRF_CONTEXT = b"stasis-csrf-v1"


@dataclass(frozen=True)
class Session:
    user: str
    session_id: str
    issued_at: int
    expires_at: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, body: str) -> str:
    return _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())


def issue(user: str, secret: bytes, now: float, *, max_age: int = MAX_AGE_SECONDS,
          session_id: str | None = None) -> tuple[Session, str]:
    """A new session for ``user`` and its cookie value."""
    if not secret:
        raise ValueError("a session needs a secret (STASIS_SESSION_SECRET)")
    session = Session(user=user, session_id=session_id or secrets.token_urlsafe(12),
                      issued_at=int(now), expires_at=int(now) + max_age)
    body = _b64(json.dumps({"u": session.user, "s": session.session_id,
                            "i": session.issued_at, "e": session.expires_at},
                           separators=(",", ":")).encode())
    return session, f"{body}.{_mac(secret, body)}"


def verify(value: str | None, secret: bytes, now: float) -> Session | None:
    """The session a cookie value carries, or None if it is missing, forged or expired."""
    if not value or not secret or value.count(".") != 1:
        return None
    body, mac = value.split(".")
    if not hmac.compare_digest(mac, _mac(secret, body)):
        return None
    try:
        data = json.loads(_unb64(body))
        session = Session(user=str(data["u"]), session_id=str(data["s"]),
                          issued_at=int(data["i"]), expires_at=int(data["e"]))
    except (ValueError, KeyError, TypeError):
        return None
    return session if session.issued_at <= now < session.expires_at else None


def csrf_token(session: Session, secret: bytes) -> str:
    """The CSRF token every state-changing form of this session must carry."""
    key = hmac.new(secret, _CSRF_CONTEXT, hashlib.sha256).digest()
    return _b64(hmac.new(key, session.session_id.encode(), hashlib.sha256).digest())


def csrf_ok(session: Session, secret: bytes, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(str(token), csrf_token(session, secret))
