"""Reading what the cluster reports on an object: conditions, container states, times.

Pure functions of the object as the API server returns it (a JSON dict), shared by the
runtimes and the cluster monitor: whether a pod is Ready, why it will never start, how one
of its containers ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

#: Waiting reasons after which a container never starts on its own (the image or the
#: config is wrong: waiting longer changes nothing).
FATAL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "CreateContainerConfigError", "CreateContainerError",
                           "RunContainerError"})


def conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status") or {}
    return [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions(obj) if c.get("type") == kind), None)


def container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The init containers' statuses, then the containers'."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or [])]


def terminated(pod: Mapping[str, Any], container: str) -> Mapping[str, Any] | None:
    """How ``container`` ended (its ``state.terminated``), or None while it has not."""
    for entry in container_statuses(pod):
        if entry.get("name") == container:
            state = entry.get("state") or {}
            ended = state.get("terminated")
            return ended if isinstance(ended, Mapping) else None
    return None


def waiting_failure(pod: Mapping[str, Any]) -> str | None:
    """A container that waits for a reason it never recovers from, in words, or None."""
    for container in container_statuses(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return (f"container {container.get('name')} cannot start: {waiting['reason']}"
                    f"{': ' + waiting['message'] if waiting.get('message') else ''}")
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    ready = condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True") and not (
        (pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod will not come up on its own (a permanent failure), or None."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"the workspace pod failed: {status.get('reason') or status.get('message')}"
    return waiting_failure(pod)


def timestamp_ms(text: Any) -> int:
    """An RFC 3339 time the API server wrote (``...Z``) in epoch milliseconds; 0 when absent
    or unreadable."""
    if not text:
        return 0
    try:
        return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0
