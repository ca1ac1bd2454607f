"""What Stasis writes on every object's metadata, and how it reads it back.

Every label and annotation key Stasis uses is declared here, in one table, so no two object
families use one key for two things. Labels hold slugs (``names.slug``: Kubernetes limits
label values); annotations keep the raw ids. Every object Stasis makes carries
``app.kubernetes.io/managed-by: stasis`` (:func:`meta`), and nothing Stasis reads is trusted
as its own without it (:func:`is_managed`): an API server may ignore a label selector (kmock
does), so readers check the labels again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from functions.kubernetes.objects.names import slug

# -- labels (values are slugs) -----------------------------------------------------------------

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
APP_NAME = "app.kubernetes.io/name"
STASIS = "stasis"
LABEL_TEAM = "stasis.dev/team"
LABEL_WORKSPACE = "stasis.dev/workspace"
LABEL_METHOD = "stasis.dev/snapshot-method"
LABEL_SNAPSHOT = "stasis.dev/snapshot"
LABEL_SANDBOX = "stasis.dev/sandbox"
LABEL_JOB = "stasis.dev/job"
LABEL_PROFILE = "stasis.dev/profile"
#: Pod Security admission: team and system namespaces enforce ``restricted``.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_VERSION = "pod-security.kubernetes.io/enforce-version"
#: Every namespace carries its own name (Kubernetes sets it), which NetworkPolicies select.
NAMESPACE_NAME = "kubernetes.io/metadata.name"

#: The label selector of everything Stasis made (servers may ignore it: check again).
MANAGED_SELECTOR = f"{MANAGED_BY}={STASIS}"

# -- annotations (raw values) ------------------------------------------------------------------

ANN_TEAM_ID = "stasis.dev/team-id"
ANN_REQUESTID = "stasis.dev/requestid"
# workspaces and their snapshots
ANN_WORKSPACE_ID = "stasis.dev/workspace-id"
ANN_OWNER = "stasis.dev/owner"
ANN_PROFILE = "stasis.dev/profile"
ANN_IDE = "stasis.dev/ide"
#: "jupyterlab" or "vscode": with the workspace id, where the IDE's server serves
#: (``events.payloads.ide_server_path``). A pod without it predates base paths ("/").
ANN_IDE_KIND = "stasis.dev/ide-kind"
ANN_SNAPSHOT_ID = "stasis.dev/snapshot-id"
ANN_REQUESTED_AT = "stasis.dev/requested-at-ms"
ANN_ACCELERATOR = "stasis.dev/accelerator"
ANN_ACCELERATOR_COUNT = "stasis.dev/accelerator-count"
ANN_OPERATION = "stasis.dev/operation"
#: The workspace's version when its pod was made (Kueue: the QUEUED version it waits at).
ANN_VERSION = "stasis.dev/workspace-version"
#: Kernel method: the adapter asks for a snapshot by annotating the pod; the monitor acts.
ANN_SNAPSHOT_REQUEST = "stasis.dev/snapshot-request"
#: Kernel method: a re-created pod carries what to restore; the monitor acts once it runs.
ANN_RESTORE_REQUEST = "stasis.dev/restore-request"
# sandboxes
ANN_SANDBOX_ID = "stasis.dev/sandbox-id"
ANN_BUCKET = "stasis.dev/bucket"
ANN_PREFIX = "stasis.dev/prefix"
ANN_BASE_SHA = "stasis.dev/base-sha"
ANN_NETWORK = "stasis.dev/network"
ANN_MEMORY = "stasis.dev/memory-limit"
ANN_SEQUENCE = "stasis.dev/suspension"
ANN_IDLE_SECONDS = "stasis.dev/idle-seconds"
# jobs
ANN_SUBMITTED_AT = "stasis.dev/submitted-at-ms"
ANN_JOB_URI = "stasis.dev/job-uri"
#: GKE Workload Identity: the Google service account a Kubernetes service account acts as.
GKE_SERVICE_ACCOUNT = "iam.gke.io/gcp-service-account"


def meta(name: str, namespace: str | None = None, *, labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An object's metadata: its name (and namespace), Stasis's label and ``labels``, and
    ``annotations`` when there are any."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = {MANAGED_BY: STASIS, **(labels or {})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return metadata


def team_labels(team: str) -> dict[str, str]:
    return {LABEL_TEAM: slug(team)}


# -- reading metadata back ---------------------------------------------------------------------


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def is_managed(obj: Mapping[str, Any]) -> bool:
    return labels_of(obj).get(MANAGED_BY) == STASIS


def json_annotation(obj: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A JSON-valued annotation as a dict; None if absent or not a JSON object."""
    raw = annotations_of(obj).get(key)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def as_int(value: Any) -> int:
    """An annotation's (or a JSON field's) whole number; 0 when absent or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
