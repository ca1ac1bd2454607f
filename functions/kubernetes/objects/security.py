"""The security contexts of every Stasis pod and container: Pod Security ``restricted``.

Team and system namespaces enforce the ``restricted`` Pod Security level, so every pod
Stasis makes (workspaces, sandboxes, job hosts, the monitor) runs non-root with the
RuntimeDefault seccomp profile, and every container without privilege escalation or
capabilities. One copy of each, so no builder can drift below the level.
"""

from __future__ import annotations

from typing import Any


def runtime_default_seccomp() -> dict[str, Any]:
    return {"type": "RuntimeDefault"}


def restricted_container(*, read_only_root: bool = False, user: int | None = None,
                         group: int | None = None, seccomp: bool = False) -> dict[str, Any]:
    """A container's ``securityContext``: no privilege escalation, every capability
    dropped, non-root; optionally a read-only root file system, its own user and group
    and the seccomp profile (a pod-level one covers containers that do not say)."""
    context: dict[str, Any] = {"allowPrivilegeEscalation": False,
                               "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    if user is not None:
        context["runAsUser"] = user
    if group is not None:
        context["runAsGroup"] = group
    if seccomp:
        context["seccompProfile"] = runtime_default_seccomp()
    return context


def restricted_pod(uid: int, gid: int, *, fs_group: int | None = None,
                   fs_group_change_policy: str | None = None) -> dict[str, Any]:
    """A pod's ``securityContext``: non-root as ``uid``:``gid`` with the RuntimeDefault
    seccomp profile; ``fs_group`` owns the pod's volumes."""
    context: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid}
    if fs_group is not None:
        context["fsGroup"] = fs_group
    if fs_group_change_policy is not None:
        context["fsGroupChangePolicy"] = fs_group_change_policy
    context["seccompProfile"] = runtime_default_seccomp()
    return context
