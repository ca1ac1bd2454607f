"""Who may publish which event: derived from what each component emits, never hand-granted.

A *component* is whatever publishes under its own identity: each deployed function (its
name, from ``functions/routes.py``; what it emits is its handler's outbox), what the
operators publish themselves (``stasis events publish``, ``stasis sandbox``, ``stasis down``:
the CLI's workspace verbs go through its ``cli`` function, as chat and the portal are
functions), the IDE access proxy,
the workspaces' own jobs API, and the runtimes that report what happened (the cluster
monitor on GKE, the node agent and the in-process null runtime locally). Every event it
publishes carries its name as the envelope's ``origin``.

:func:`publishers` turns "component -> events it emits" into "event -> components that may
send it": Terraform grants ``roles/pubsub.publisher`` on each topic to exactly those
(``deploy/tfvars.py`` writes the table), and the delivery guard dead-letters an event whose
origin is not among its senders (:func:`origin_refusal`). What the runtimes and the front
doors outside the functions emit is declared here (:data:`EXTERNAL`), each limited to its
kind: a front door only requests (:data:`REQUESTS`), a runtime only reports outcomes
(:data:`RUNTIME_OUTCOMES`); :func:`publishers` refuses a table that breaks that.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: The operators' `stasis` publishing directly (its workspace verbs are the ``cli`` function).
OPERATOR = "operator"
IDE_PROXY = "ide_proxy"
#: A workspace's kernel, through the notebook's jobs API (``stasis.jobs``).
WORKSPACE = "workspace"
#: The runtimes: the GKE cluster monitor, the local node agent, the in-process null runtime.
MONITOR = "monitor"
NODE_AGENT = "node_agent"
NULL_RUNTIME = "null_runtime"

#: What a person (or an agent on their behalf) asks for, through a front door.
REQUESTS = frozenset({
    "workspace.requested", "workspace.pause_requested", "workspace.resume_requested",
    "workspace.delete_requested", "sandbox.requested", "sandbox.resume_requested",
})
#: What a runtime reports about what it runs.
RUNTIME_OUTCOMES = frozenset({
    "workspace.ready", "workspace.runtime_failed", "workspace.idle_detected",
    "workspace.scheduled", "workspace.pause_requested", "snapshot.finished",
    "sandbox.finished", "sandbox.suspended", "sandbox.idle_detected", "job.finished",
})
#: The front doors a person signs in to: an event they send names the person (``actor``),
#: whose rights the handler checks against the catalog (``functions.domain.rights``).
PERSON_FRONT_DOORS = frozenset({"chat", "portal", "cli"})

#: What the components outside ``functions/routes.py`` emit. The kueue watch of the monitor
#: asks a pause when Kueue preempts (an outcome of the cluster's admission, not a person's).
EXTERNAL: Mapping[str, frozenset[str]] = {
    OPERATOR: REQUESTS,
    IDE_PROXY: frozenset({"workspace.resume_requested"}),
    WORKSPACE: frozenset({"job.submitted", "job.finished"}),
    MONITOR: RUNTIME_OUTCOMES,  # its pod, snapshot, sandbox, job and Kueue watches
    NODE_AGENT: frozenset({"workspace.ready", "workspace.runtime_failed", "snapshot.finished",
                           "sandbox.finished", "sandbox.suspended"}),
    NULL_RUNTIME: frozenset({"workspace.ready", "snapshot.finished", "sandbox.finished"}),
}
_KIND_OF_EXTERNAL: Mapping[str, frozenset[str]] = {
    OPERATOR: REQUESTS, IDE_PROXY: REQUESTS,
    WORKSPACE: frozenset({"job.submitted", "job.finished"}),
    MONITOR: RUNTIME_OUTCOMES, NODE_AGENT: RUNTIME_OUTCOMES, NULL_RUNTIME: RUNTIME_OUTCOMES,
}


def publishers(function_emits: Mapping[str, Iterable[str]],
               external: Mapping[str, Iterable[str]] = EXTERNAL) -> dict[str, frozenset[str]]:
    """Event name -> the components that emit it: every function's outbox
    (``function_emits``) and the components outside the functions (``external``). An
    external component that emits beyond its kind (a front door an outcome, a runtime a
    request) is a ValueError: that is the table's promise, not a grant to widen."""
    table: dict[str, set[str]] = {}
    for component, emitted in external.items():
        beyond = set(emitted) - _KIND_OF_EXTERNAL.get(component, frozenset())
        if beyond:
            raise ValueError(f"{component} may emit only its kind of event, not "
                             f"{', '.join(sorted(beyond))}")
        for name in emitted:
            table.setdefault(name, set()).add(component)
    for function, emitted in function_emits.items():
        if function in external:
            raise ValueError(f"{function} is both a function and an outside component")
        for name in emitted:
            table.setdefault(name, set()).add(function)
    return {name: frozenset(senders) for name, senders in sorted(table.items())}


def origin_refusal(event: str, origin: str, senders: Iterable[str]) -> str | None:
    """None if a component named ``origin`` may send ``event``, else why not (for the
    dead-letter record and the audit log)."""
    allowed = sorted(senders)
    if origin in allowed:
        return None
    who = ", ".join(allowed) or "nobody"
    if not origin:
        return f"{event} carries no origin; only {who} may send it"
    return f"{event} from {origin}, which may not send it (only {who} may)"
