"""Monitoring triggers: the raw messages of the monitoring topic become Stasis events.

Everything cluster monitoring says arrives on one topic (:data:`TOPIC`), as its sender
wrote it: Cloud Monitoring's Pub/Sub notification channel, the log sink of preemptions and
node deletions, the ``alertmanager`` webhook (:func:`serve_webhook`, which only
authenticates and relays), and ``stasis events monitoring FILE.json`` on the local stack.
Its push subscription feeds :func:`handle` (the ``on_monitoring`` function, a ``Raw``
route), which

1. reads the message (``functions.domain.monitoring.read``: signals, or refusals with a
   reason);
2. finds each signal's workspaces: by the pod's labels among the workspaces that hold
   hardware (the store), or, for a lost node, those the runtime placed on it;
3. publishes one event per workspace (workspace.idle_detected with cause ``gpu_idle``,
   workspace.runtime_alert, workspace.preempted) under this consumer's ledger entry, keyed
   by the notification and the workspace: a redelivered or replayed notification changes
   nothing. The idle policy and the lifecycle decide what the events do;
4. dead-letters the message once, with every refusal's reason (malformed, unsupported,
   closed, stale, no or unknown workspace). A node that ran no workspace is only logged:
   that is not bad input.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events import Event, new_event, to_pubsub
from functions.delivery import PermanentFailure, RawMessage
from functions.domain import monitoring
from functions.domain.lifecycle import HOLDS_HARDWARE, Workspace
from functions.domain.monitoring import Refusal, Refused, Signal, WorkspaceRef
from functions.handlers import pipeline
from functions.handlers.deps import Deps
from functions.kubernetes.objects.workspace import workspace_names
from functions.ports import Entry, Subject

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/monitoring"
#: The topic every monitoring source publishes onto, as its sender writes the message.
TOPIC = "stasis-monitoring"
#: Alertmanager batches alerts by group; a body larger than this is not a webhook.
MAX_WEBHOOK_BYTES = 1 << 20


@dataclass
class Outcome:
    """What one message did: the events it published (not the duplicates), what it refused."""

    published: list[Event[Any]] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def handle(message: RawMessage, deps: Deps, consumer: str) -> Outcome:
    try:
        payload = json.loads(message.data)
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise PermanentFailure(f"{Refusal.MALFORMED}: not JSON ({exc})") from exc
    now = deps.clock()
    reading = monitoring.read(payload, now)
    outcome = Outcome(refused=list(reading.refused))
    for signal in reading.signals:
        workspace_ids = _workspaces(signal, deps, outcome)
        for ws_id in workspace_ids:
            event_id = monitoring.event_id(signal, ws_id)
            event = new_event(monitoring.event_for(signal, ws_id), source=SOURCE, id=event_id,
                              requestid=event_id, time=now)
            if _once(event, ws_id, deps, consumer, now):
                outcome.published.append(event)
    for event in outcome.published:
        log.info("%s: %s for %s", reading.source, event.name, event.subject)
    if outcome.refused:
        reason = "; ".join(f"{r.reason}: {r.message}" for r in outcome.refused)
        log.warning("%s: dead-lettering message %s: %s", reading.source, message.message_id,
                    reason)
        deps.dead_letters.dead_letter(consumer, message.data, dict(message.attributes),
                                      reason=reason, attempts=1,
                                      message_id=message.message_id)
    return outcome


@dataclass(frozen=True)
class Relay:
    """The webhook's dependencies: its token (None: not configured) and how it publishes a
    body onto :data:`TOPIC` (the message id)."""

    token: str | None
    publish: Callable[[bytes], str]


def serve_webhook(request: Any, relay: Relay) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The ``alertmanager`` HTTP function."""
    return webhook(request.headers.get("Authorization"), request.get_data(), relay.token,
                   relay.publish)


def webhook(authorization: str | None, body: bytes, token: str | None,
            relay: Callable[[bytes], str]) -> tuple[dict[str, Any], int, dict[str, str]]:
    """Alertmanager's webhook (``http_config.authorization``: a bearer token from Secret
    Manager, compared in constant time; never open: without a configured token every
    request is refused). An authenticated body is relayed unchanged onto the monitoring
    topic, where :func:`handle` reads it like any other notification, dead letters
    included; Alertmanager gets its 2xx at once."""
    if not token:
        return ({"error": "the Alertmanager webhook has no token configured "
                          "(STASIS_ALERTMANAGER_TOKEN): it accepts nothing"}, 503, {})
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                             token.encode()):
        return ({"error": "unauthenticated: send Authorization: Bearer <token> "
                          "(Alertmanager: http_config.authorization.credentials_file)"},
                401, {"WWW-Authenticate": 'Bearer realm="stasis-alertmanager"'})
    if len(body) > MAX_WEBHOOK_BYTES:
        return {"error": f"body over {MAX_WEBHOOK_BYTES} bytes"}, 413, {}
    return {"relayed": relay(body)}, 202, {}


def _workspaces(signal: Signal, deps: Deps, outcome: Outcome) -> list[str]:
    """The workspaces ``signal`` is about; an unknown one is added to the refusals."""
    if signal.node is not None:
        placed = monitoring.on_node(signal.node, ((s.workspace_id, s.detail.get("node"))
                                                  for s in deps.runtime.list()))
        if not placed:
            log.info("%s: no workspace on node %s", signal.kind, signal.node)
        return placed
    ref = signal.workspace
    assert ref is not None, "a signal names a workspace or a node"
    ws = match(ref, deps.store.list_workspaces(team=ref.team, states=HOLDS_HARDWARE))
    if ws is None:
        outcome.refused.append(Refused(
            Refusal.UNKNOWN_WORKSPACE,
            f"{ref.describe()} matches no workspace that holds hardware"
            f"{' in team ' + ref.team if ref.team else ''}: {signal.detail}"))
        return []
    return [ws.id]


def match(ref: WorkspaceRef, workspaces: Iterable[Workspace]) -> Workspace | None:
    """The workspace ``ref`` names among ``workspaces``, by the names the Kubernetes
    builders give its pod (collision-free slugs of the workspace id)."""
    for ws in workspaces:
        pod = workspace_names(ws.team, ws.id)
        if monitoring.names(ref, ws.team, pod.label, pod.pod):
            return ws
    return None


def _once(event: Event[Any], ws_id: str, deps: Deps, consumer: str, now: datetime) -> bool:
    """Publish ``event`` through this consumer's ledger entry (its outbox, written in the
    entry's transaction, nothing else); False for a duplicate."""
    data, attributes = to_pubsub(event)
    outbox = [{"publish": data.decode(), "attributes": attributes}]
    committed = deps.store.transact(
        event, consumer, Subject("workspace", ws_id),
        lambda tx: Entry(outbox, {"published": event.name}, decision=event), now=now)
    for pending in pipeline.decode(committed.outbox):  # sent again if we died right here
        deps.bus.publish(pending)
    if committed.pending:
        deps.store.mark_done(committed.key)
    return committed.decision is not None
