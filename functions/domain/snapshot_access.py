"""What a workspace's snapshot agent may touch in Cloud Storage on GKE: the Credential Access
Boundary of the token the cluster monitor hands it for one snapshot or one restore. Pure: no
I/O, no SDK (``functions.adapters.snapshot_credentials`` turns the rules into a token).

No workspace pod's own identity holds a grant on the workspaces' snapshot objects (Terraform,
``terraform/modules/stasis/iam.tf``). For each kernel snapshot or restore the monitor, which
may read and write every team's snapshot folder, exchanges its own token for a downscoped one
limited by :func:`boundary` and sends it with the request (``runtime.kubernetes.sidecar``);
the sidecar and the kernel it drives use only that token. So a kernel can write its own
workspace's snapshots, and a teammate's kernel, which holds a token for its own folder, cannot.

The boundary of a workspace is its folder, ``snapshots/<team>/<workspace>/``
(``retention.workspace_root``): every snapshot of it and its part pool ``_parts/``. A capture
reuses parts of its *base*, the snapshot it follows, which is always a snapshot of the same
workspace (``functions.kubernetes.workspaces``: the workspace's previous one), so the base's
manifest and parts are inside; a prefix or base outside the folder is refused
(:class:`OutsideWorkspace`) before any token is minted.

- **snapshot**: ``roles/storage.objectAdmin`` on objects whose name starts with the folder
  (upload parts and the manifest, upload a part again when a capture is retried, delete a
  failed capture's folder), and listing only with a prefix inside the folder (the manifest's
  check that its parts are stored, the failed capture's clean-up). Listing is authorised
  against the bucket, so its condition is on ``storage.googleapis.com/objectListPrefix``.
- **restore**: ``roles/storage.objectViewer`` on the same objects, no listing (a restore reads
  the manifest and the parts it names, and writes nothing).

The CEL attribute names are those of Google's Credential Access Boundary examples
(``resource.name`` ``projects/_/buckets/<bucket>/objects/<name>``,
``api.getAttribute('storage.googleapis.com/objectListPrefix', '')``); bucket and prefix are
checked against a strict alphabet, so neither can end the quoted string early.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from functions.domain.retention import workspace_root

Operation = Literal["snapshot", "restore"]

SNAPSHOT_ROLE = "roles/storage.objectAdmin"
RESTORE_ROLE = "roles/storage.objectViewer"
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class OutsideWorkspace(ValueError):
    """A snapshot, restore or base prefix that is not in the workspace's own folder."""


@dataclass(frozen=True)
class AccessRule:
    """One access boundary rule: ``permissions`` on ``resource`` when ``expression`` holds."""

    resource: str
    permissions: tuple[str, ...]
    expression: str
    title: str


def folder_of(workspace_id: str) -> str:
    """The workspace's snapshot folder (``snapshots/<team>/<workspace>/``), checked."""
    root = workspace_root(workspace_id)
    if not _NAME.match(root) or ".." in root or "//" in root:
        raise OutsideWorkspace(f"workspace id {workspace_id!r} makes no valid snapshot folder")
    return root


def check_inside(workspace_id: str, prefix: str) -> str:
    """``prefix`` normalized (``a/b``, no surrounding slashes) if it is strictly inside the
    workspace's folder; :class:`OutsideWorkspace` otherwise."""
    root = folder_of(workspace_id)
    cleaned = prefix.strip("/")
    if (not cleaned or not _NAME.match(cleaned) or ".." in cleaned.split("/")
            or "//" in cleaned or not (cleaned + "/").startswith(root)
            or cleaned + "/" == root):
        raise OutsideWorkspace(f"{prefix!r} is not a snapshot of workspace {workspace_id} "
                               f"(its folder is {root})")
    return cleaned


def boundary(bucket: str, workspace_id: str, prefix: str, operation: Operation, *,
             base_prefix: str | None = None) -> list[AccessRule]:
    """The rules of the token for one ``operation`` on the snapshot at ``prefix``."""
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"invalid bucket name {bucket!r}")
    check_inside(workspace_id, prefix)
    if base_prefix:
        check_inside(workspace_id, base_prefix)
    root = folder_of(workspace_id)
    objects = f"resource.name.startsWith('projects/_/buckets/{bucket}/objects/{root}')"
    resource = f"//storage.googleapis.com/projects/_/buckets/{bucket}"
    if operation == "snapshot":
        listing = f"api.getAttribute('{LIST_PREFIX}', '').startsWith('{root}')"
        return [AccessRule(resource, (f"inRole:{SNAPSHOT_ROLE}",), f"{objects} || {listing}",
                           "workspace-snapshot-folder")]
    if operation == "restore":
        return [AccessRule(resource, (f"inRole:{RESTORE_ROLE}",), objects,
                           "workspace-snapshot-read")]
    raise ValueError(f"unknown operation {operation!r}")
