"""Kubernetes service-account tokens (a workspace pod's projected token), verified with
PyJWT against the cluster's OIDC keys: signature (``jwt.PyJWKClient`` on the issuer's
JWKS, cached), issuer, audience and expiry. What the claims must then say is
``functions.domain.workspace_identity``'s decision.

GKE's issuer is ``https://container.googleapis.com/v1/projects/<p>/locations/<l>/
clusters/<c>``; its discovery document (``<issuer>/.well-known/openid-configuration``)
names the keys at ``<issuer>/jwks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jwt

from functions.ports import InvalidWorkspaceToken


class KubernetesTokens:
    def __init__(self, issuer: str, audience: str, *, jwks_url: str | None = None) -> None:
        self.issuer, self.audience = issuer, audience
        self._keys = jwt.PyJWKClient(jwks_url or f"{issuer.rstrip('/')}/jwks",
                                     cache_keys=True, lifespan=300, timeout=10)

    def verify(self, token: str) -> Mapping[str, Any]:
        """The token's claims; raises :class:`InvalidWorkspaceToken` with the reason."""
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims: Mapping[str, Any] = jwt.decode(
                token, key.key, algorithms=["RS256", "ES256"], audience=self.audience,
                issuer=self.issuer, options={"require": ["exp", "iat", "iss", "aud"]})
        except jwt.PyJWKClientConnectionError as exc:
            raise InvalidWorkspaceToken(f"the cluster's keys could not be read: {exc}",
                                        temporary=True) from exc
        except (jwt.PyJWKClientError, jwt.InvalidTokenError) as exc:
            raise InvalidWorkspaceToken(str(exc) or type(exc).__name__) from exc
        return claims
