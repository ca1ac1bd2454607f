"""Who is calling: the IAP-signed identity in a deployment, an explicit dev identity locally.

Behind Identity-Aware Proxy every request carries ``x-goog-iap-jwt-assertion``, an ES256
JWT signed by Google; it is verified with google-auth's ``id_token.verify_token`` against
IAP's public keys, the expected audience (``/projects/<number>/global/backendServices/<id>``
or ``/projects/<number>/apps/<project>``, ``STASIS_IAP_AUDIENCE``) and IAP's issuer.
Without a verified assertion the request is refused, whatever else it carries. Programmatic
callers (an agent with a link) present their IAP credential in ``Proxy-Authorization``,
because ``Authorization`` carries the link token.

Locally there is no IAP: :class:`DevIdentity` takes the user from ``X-Stasis-User`` (the
CLI's ``--as``), which is only ever honoured when the deployment chose it explicitly
(``STASIS_IDENTITY=dev``, the local stack's setting).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from functions.proxy.ports import Caller, Unauthenticated

IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
IAP_ISSUER = "https://cloud.google.com/iap"
IAP_HEADER = "X-Goog-IAP-JWT-Assertion"
DEV_HEADER = "X-Stasis-User"
_CERTS_CACHE_SECONDS = 3600.0


class _CachedCerts:
    """A google-auth transport that fetches IAP's keys at most once an hour (they rotate
    rarely; fetching them per request would put a network call on every check)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.cached: dict[str, tuple[Any, float]] = {}

    def __call__(self, url: str, method: str = "GET", **kwargs: Any) -> Any:
        with self.lock:
            hit = self.cached.get(url)
            if hit and time.monotonic() - hit[1] < _CERTS_CACHE_SECONDS:
                return hit[0]
        response = self.inner(url, method=method, **kwargs)
        if getattr(response, "status", None) == 200:
            with self.lock:
                self.cached[url] = (response, time.monotonic())
        return response


class IapIdentity:
    def __init__(self, audience: str, *, request: Any = None,
                 certs_url: str = IAP_CERTS_URL) -> None:
        if not audience:
            raise ValueError("IAP verification needs the expected audience "
                             "(STASIS_IAP_AUDIENCE)")
        if request is None:
            from google.auth.transport import requests as google_requests

            request = google_requests.Request()
        self.audience = audience
        self.request = _CachedCerts(request)
        self.certs_url = certs_url

    def caller(self, headers: Mapping[str, str]) -> Caller:
        from google.oauth2 import id_token

        assertion = _header(headers, IAP_HEADER)
        if not assertion:
            raise Unauthenticated("no IAP assertion: requests must come through IAP")
        try:
            claims = id_token.verify_token(assertion, self.request, audience=self.audience,
                                           certs_url=self.certs_url)
        except Exception as exc:  # google-auth raises ValueError and its own errors
            raise Unauthenticated(f"invalid IAP assertion: {exc}") from exc
        if claims.get("iss") != IAP_ISSUER:
            raise Unauthenticated(f"IAP assertion from issuer {claims.get('iss')!r}")
        user = claims.get("email") or claims.get("sub")
        if not user:
            raise Unauthenticated("IAP assertion without an identity")
        return Caller(str(user), "iap")


class DevIdentity:
    """The local stack's explicit dev identity: ``X-Stasis-User``, default ``default``."""

    def __init__(self, default: str = "dev") -> None:
        self.default = default

    def caller(self, headers: Mapping[str, str]) -> Caller:
        return Caller(_header(headers, DEV_HEADER) or self.default, "dev")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def certs_json(keys: Mapping[str, str]) -> bytes:
    """IAP's key document format ({key id: PEM public key}), for tests."""
    return json.dumps(dict(keys)).encode()
