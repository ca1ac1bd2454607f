"""Whether a Kubernetes service-account token is the workspace it claims to be (issue 17
§3, GKE). Pure: the caller verified the token's signature, issuer, audience and expiry
(``functions.adapters.kubernetes_tokens``) and passes its claims, the workspace's document
and the namespace and service account that document says its pod runs as (the same name
functions that built them, ``functions.kubernetes.objects``).

The ``kubernetes.io`` claims (``namespace``, ``serviceaccount.name``) name the pod's KSA:
one per workspace, its name hashing the workspace id and incarnation, so a teammate's
token names another KSA and a token of an earlier incarnation names one no document has.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from functions.domain.lifecycle import State, Workspace

_GONE = (State.DELETING, State.DELETED)


class Refusal(StrEnum):
    NO_WORKSPACE = "no such workspace"
    GONE = "the workspace is deleted"
    NOT_KUBERNETES = "the token has no kubernetes.io claims"
    OTHER_NAMESPACE = "the token is of another namespace"
    OTHER_ACCOUNT = "the token is of another workspace's service account"


def kubernetes_refusal(claims: Mapping[str, Any], workspace: Workspace | None, *,
                       namespace: str, service_account: str) -> Refusal | None:
    """None when ``claims`` are of ``workspace``'s own KSA, else why not."""
    if workspace is None:
        return Refusal.NO_WORKSPACE
    if workspace.state in _GONE:
        return Refusal.GONE
    kube = claims.get("kubernetes.io")
    if not isinstance(kube, Mapping) or not isinstance(kube.get("serviceaccount"), Mapping):
        return Refusal.NOT_KUBERNETES
    account = kube["serviceaccount"]
    if kube.get("namespace") != namespace:
        return Refusal.OTHER_NAMESPACE
    if account.get("name") != service_account:
        return Refusal.OTHER_ACCOUNT
    return None
