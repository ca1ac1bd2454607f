"""Downscoped Cloud Storage tokens for the workspaces' snapshot agents (GKE): the SDK half of
``functions.domain.snapshot_access``, the cluster monitor's adapter (what runs in the cluster
imports no ``functions.adapters``).

:class:`DownscopedTokens` turns the domain's rules into google-auth's
``downscoped.CredentialAccessBoundary`` and exchanges the monitor's own token for one limited
to it (``google.auth.downscoped.Credentials``: Security Token Service,
``sts.googleapis.com/v1/token``, token exchange with the boundary as ``options``). The
exchange needs no IAM role of its own: a boundary only takes permissions away, so the
monitor's identity must hold what the token may use (Terraform grants it
``roles/storage.objectUser`` on every team's snapshot folder), and the project must have the
Security Token Service API enabled. The token expires with the monitor's source token (an
hour at most).

:class:`EmulatorTokens` is for the local stack and the K3s tests: fake-gcs-server ignores
authentication, so no token is sent, but the boundary is built the same way (a prefix outside
the workspace is refused alike, and the library validates the rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any, Protocol

from functions.domain.snapshot_access import AccessRule

#: What the monitor's source credential is scoped to (the boundary narrows it).
SOURCE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class SnapshotTokens(Protocol):
    """A credential for one snapshot or restore, or None where none is needed."""

    def mint(self, rules: Sequence[AccessRule]) -> dict[str, Any] | None: ...


def access_boundary(rules: Sequence[AccessRule]) -> Any:
    """The domain's rules as google-auth's ``CredentialAccessBoundary``."""
    from google.auth import downscoped

    return downscoped.CredentialAccessBoundary(rules=[
        downscoped.AccessBoundaryRule(
            available_resource=rule.resource,
            available_permissions=list(rule.permissions),
            availability_condition=downscoped.AvailabilityCondition(
                expression=rule.expression, title=rule.title))
        for rule in rules])


class DownscopedTokens:
    """Tokens exchanged from ``source`` (default: the process's Application Default
    Credentials, the monitor's Workload Identity), through ``request`` (default: a
    ``google.auth.transport.requests.Request``)."""

    def __init__(self, source: Any = None, request: Any = None) -> None:
        if source is None:
            import google.auth

            source, _ = google.auth.default(scopes=list(SOURCE_SCOPES))
        if request is None:
            from google.auth.transport.requests import Request

            request = Request()
        self._source = source
        self._request = request

    def mint(self, rules: Sequence[AccessRule]) -> dict[str, Any]:
        """``{"token", "expiry"}`` (ISO 8601 UTC, or None when unknown) of a new downscoped
        token; google-auth's errors (``RefreshError``, ``OAuthError``) propagate."""
        from google.auth import downscoped

        credentials = downscoped.Credentials(source_credentials=self._source,
                                             credential_access_boundary=access_boundary(rules))
        credentials.refresh(self._request)
        expiry = credentials.expiry  # naive UTC, as google-auth keeps it
        return {"token": credentials.token,
                "expiry": expiry.replace(tzinfo=UTC).isoformat() if expiry else None}


class EmulatorTokens:
    """fake-gcs-server: the boundary is built (and so checked), no token is needed."""

    def mint(self, rules: Sequence[AccessRule]) -> None:
        access_boundary(rules)
        return None
