"""A workspace's identity: the credential its kernel carries to the control plane.

``STASIS_WORKSPACE_TOKEN`` is ``<workspace id>.<HMAC-SHA256 hex>`` of the workspace id and
its incarnation (``Workspace.incarnation``: a later workspace of the same id has another)
under the control plane's workspace key (``STASIS_WORKSPACE_KEY``, which the node agent and
the functions hold, no workspace). The node agent mints it for each start; the
``workspace_api`` function recomputes it from the workspace's document and takes team and
owner from that document, never from what the kernel sends. Here, beside the events,
because both sides of that HTTP contract compute it. Pure.
"""

from __future__ import annotations

import hashlib
import hmac

TOKEN_VAR = "STASIS_WORKSPACE_TOKEN"
URL_VAR = "STASIS_WORKSPACE_URL"
#: On Kubernetes: the path of the pod's projected service-account token (its workspace's
#: own KSA, audience ``stasis-workspace``), which the kubelet rotates: read it per call.
TOKEN_FILE_VAR = "STASIS_WORKSPACE_TOKEN_FILE"
KEY_VAR = "STASIS_WORKSPACE_KEY"


def workspace_token(key: str, workspace_id: str, incarnation: str | None) -> str:
    mac = hmac.new(key.encode(), f"{workspace_id}\n{incarnation or ''}".encode(),
                   hashlib.sha256).hexdigest()
    return f"{workspace_id}.{mac}"


def claimed_workspace(token: str) -> str | None:
    """The workspace a token claims to be (to load its document), or None if malformed."""
    workspace_id, dot, mac = token.rpartition(".")
    return workspace_id if dot and workspace_id and len(mac) == 64 else None


def verify(key: str, token: str, workspace_id: str, incarnation: str | None) -> bool:
    return hmac.compare_digest(token, workspace_token(key, workspace_id, incarnation))
