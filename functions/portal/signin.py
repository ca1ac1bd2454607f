"""One-time sign-in links for a portal without IAP (the local stack): the rules. Pure.

``stasis portal [--as USER]`` asks the portal for a link; the portal draws 256 random bits,
stores only their SHA-256 as ``portal_signins/{hash}`` (user, created_at, expires_at,
used_at) and answers the URL once. Opening the URL consumes the document in one Firestore
transaction (the adapter), deciding with :func:`consume`: the first use within
:data:`TTL_SECONDS` signs the browser in (the session cookie of ``session.py``); any later
use, an expired link or an unknown token is refused with what to do instead. The token is
in no log and no document; ``expire_at`` lets a Firestore TTL policy purge old records.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

#: How long a sign-in link works (the issue's 60 seconds).
TTL_SECONDS = 60
TOKEN_PREFIX = "stasis_signin_"
COLLECTION = "portal_signins"
#: How long a used or expired record is kept before the TTL policy purges it.
KEEP = timedelta(days=1)
_AGAIN = "run `stasis portal` for a new one"


class Outcome(StrEnum):
    SIGNED_IN = "signed_in"
    UNKNOWN = "unknown"
    USED = "used"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    user: str | None
    message: str

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.SIGNED_IN


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def record(user: str, now: datetime) -> dict[str, Any]:
    """The ``portal_signins/{hash}`` document of a new link for ``user``."""
    return {"user": user, "created_at": now, "expires_at": now + timedelta(seconds=TTL_SECONDS),
            "used_at": None, "expire_at": now + KEEP}


def consume(doc: dict[str, Any] | None, now: datetime) -> Verdict:
    """Whether the link whose record is ``doc`` signs in now; the adapter writes
    ``used_at = now`` in the same transaction when it does."""
    if doc is None:
        return Verdict(Outcome.UNKNOWN, None, f"this sign-in link is not valid: {_AGAIN}")
    if doc.get("used_at") is not None:
        return Verdict(Outcome.USED, None, f"this sign-in link was already used (it works "
                                           f"once): {_AGAIN}")
    expires = doc.get("expires_at")
    if not isinstance(expires, datetime) or now >= expires:
        return Verdict(Outcome.EXPIRED, None, f"this sign-in link expired (it works for "
                                              f"{TTL_SECONDS} seconds): {_AGAIN}")
    return Verdict(Outcome.SIGNED_IN, str(doc["user"]), "signed in")
