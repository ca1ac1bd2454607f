"""How events about cluster objects are signed: their source and their deterministic ids.

The cluster monitor and its watchers are level-triggered: after a restart they see the same
objects and report them again. Each report's id is derived from what it is about (the
object and the request behind it), so a repeat is the same event and the control plane's
ledger absorbs it. The control plane reporting a sandbox's end itself (a cancel) uses the
watch's id, so whichever comes first counts.
"""

from __future__ import annotations

import hashlib

#: ``source`` of every event about the cluster's objects.
SOURCE = "//stasis/runtime/kubernetes"


def event_id(*parts: str) -> str:
    """The id of the report named by ``parts`` (a scope, then what it is about)."""
    return hashlib.sha256(":".join(parts).encode()).hexdigest()[:32]
