"""The portal on the local stack: its session secret, and the sign-in link the CLI asks for.

`stasis up` gives every service :func:`session_env`: ``STASIS_SESSION_SECRET`` from the
environment, else a random secret kept in ``<data dir>/portal/session_secret`` (mode 0600)
so that a browser stays signed in across `stasis down`/`up` and the IDE access proxy,
another process of the stack, verifies the same cookies. Deleting the file signs everyone
out.

:func:`signin_link` is `stasis portal`'s request: ``POST <functions>/portal/signin-links``
with the CLI's identity (``X-Stasis-User``, as `stasis link create` sends it); the portal
answers a URL that works once, for 60 seconds.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from stack.settings import Settings


def secret_path(settings: Settings) -> Path:
    return settings.data_dir / "portal" / "session_secret"


def session_env(settings: Settings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``STASIS_SESSION_SECRET`` for the stack's services (created on first use)."""
    if environ.get("STASIS_SESSION_SECRET"):
        return {"STASIS_SESSION_SECRET": environ["STASIS_SESSION_SECRET"]}
    path = secret_path(settings)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return {"STASIS_SESSION_SECRET": path.read_text().strip()}


def portal_url(settings: Settings) -> str:
    return f"{settings.functions_url}/portal/"


def signin_link(settings: Settings, user: str, *, timeout: float = 30) -> dict[str, Any]:
    """The portal's answer to a sign-in request for ``user`` (``url``, ``expires_in``);
    raises ``RuntimeError`` with the portal's message when it refuses or does not answer."""
    session = requests.Session()
    session.trust_env = False  # loopback: no proxy from the environment
    try:
        response = session.post(f"{settings.functions_url}/portal/signin-links", json={},
                                headers={"X-Stasis-User": user}, timeout=timeout)
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise RuntimeError(f"the portal did not answer ({exc}); is the stack up "
                           "(`stasis status`)?") from exc
    if response.status_code >= 400:
        raise RuntimeError(str(body.get("message") or body))
    result: dict[str, Any] = body
    return result
