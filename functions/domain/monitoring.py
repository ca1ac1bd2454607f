"""Monitoring signals: what a platform's monitoring says, read as Stasis evidence. Pure.

Three formats arrive on the monitoring topic, as their senders write them:

- a **Cloud Monitoring** notification (``{"version": "1.2", "incident": {...}}``, the
  schema of its Pub/Sub and webhook channels): an alert policy's incident on a workspace
  container. Which signal it is comes from the policy's user label ``stasis_signal``
  (``gpu_idle``, ``gpu_memory_high``, ``oom_killed``; Terraform sets it), else from the
  metric type. The workspace is found by the pod's labels, which GKE puts in
  ``metadata.user_labels`` (``stasis.dev/workspace``, ``stasis.dev/team``), or by the
  pod's name in the resource or metric labels (a :class:`WorkspaceRef`; which workspace
  carries those names is the Kubernetes objects' to say, ``functions.kubernetes.objects``,
  and the handler matches them);
- a **Cloud Logging** entry routed by a log sink: ``compute.instances.preempted`` (the
  system-event audit log of a Spot VM Compute Engine reclaimed) and
  ``io.k8s.core.v1.nodes.delete`` (the cluster's admin-activity audit log). They name a
  node (a GKE node is named after its VM); the workspaces on it come from the runtime;
- an **Alertmanager** webhook body (``"version": "4"``), relayed by the ``alertmanager``
  function: each alert carries the rule's ``stasis_signal`` label and the pod's
  ``namespace``/``pod`` (DCGM exporter) or ``label_stasis_dev_workspace`` (kube-state-
  metrics' pod labels); see ``examples/prometheus/stasis-rules.yaml``.

``read(payload, now) -> Reading``: the signals it carries and, for what is refused, a
named reason (malformed, unsupported, closed, stale, no workspace), which the handler
dead-letters. A closed incident or a resolved alert changes nothing; a signal older than
the bound (``MAX_ALERT_AGE`` for alerts, ``MAX_LOG_AGE`` for log entries) is not acted
on. Each signal has a ``key`` (source, its id, its state): the handler's ledger gives a
key one effect per workspace, so a redelivered or replayed notification changes nothing.

``event_for(signal, workspace_id)``: the Stasis event a signal becomes. Monitoring is
evidence and never decides: a GPU-idle alert becomes workspace.idle_detected with cause
``gpu_idle`` (the idle handler asks the runtime for the kernels, then the profile's idle
policy rules: a busy kernel is not paused because its GPU is quiet); OOM kills and GPU
memory become workspace.runtime_alert (noted for the owner); a lost node becomes
workspace.preempted for each workspace the runtime placed on it (the lifecycle decides
whether that server was the one lost).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from events.payloads import WorkspaceIdleDetected, WorkspacePreempted, WorkspaceRuntimeAlert
from functions.domain.idle import MAX_SIGNAL_AGE

#: An alert older than this (from its incident's opening, or past the end Alertmanager
#: gave it) is not acted on: the same bound as any other activity signal.
MAX_ALERT_AGE = MAX_SIGNAL_AGE
#: A node lost longer ago than this is not acted on (the lifecycle still checks that the
#: server was running before the node went away).
MAX_LOG_AGE = timedelta(hours=6)
#: The label naming the signal: on a Cloud Monitoring policy (``policy_user_labels``) and
#: on a Prometheus rule (the alert's labels).
SIGNAL_LABEL = "stasis_signal"
#: The notification schema Stasis reads (Cloud Monitoring's Pub/Sub and webhook channels).
NOTIFICATION_VERSION = "1.2"
ALERTMANAGER_VERSION = "4"
PREEMPTED_METHOD = "compute.instances.preempted"
NODE_DELETED_METHOD = "io.k8s.core.v1.nodes.delete"
#: The workspace pod's labels a notification names it by, as the Kubernetes builders set
#: them (``functions.kubernetes.objects.meta``; a test keeps the two the same).
LABEL_WORKSPACE = "stasis.dev/workspace"
LABEL_TEAM = "stasis.dev/team"


class Kind(StrEnum):
    GPU_IDLE = "gpu_idle"
    GPU_MEMORY_HIGH = "gpu_memory_high"
    OOM_KILLED = "oom_killed"
    SPOT_PREEMPTION = "spot_preemption"
    NODE_DELETED = "node_deleted"


#: What an alert may say it is (``stasis_signal``); losing a node comes from the logs only.
ALERT_KINDS = frozenset({Kind.GPU_IDLE, Kind.GPU_MEMORY_HIGH, Kind.OOM_KILLED})
_BY_METRIC = {
    "kubernetes.io/container/accelerator/duty_cycle": Kind.GPU_IDLE,
    "kubernetes.io/container/accelerator/memory_used": Kind.GPU_MEMORY_HIGH,
}


class Refusal(StrEnum):
    """Why a notification (or one alert of it) changes nothing."""

    MALFORMED = "malformed"
    UNSUPPORTED = "unsupported"
    CLOSED = "closed"
    STALE = "stale"
    NO_WORKSPACE = "no_workspace"
    UNKNOWN_WORKSPACE = "unknown_workspace"


@dataclass(frozen=True)
class WorkspaceRef:
    """How a notification names a workspace: the pod's labels, or its namespace and name."""

    label: str | None = None
    team: str | None = None
    namespace: str | None = None
    pod: str | None = None

    def describe(self) -> str:
        if self.label:
            return f"pod label {LABEL_WORKSPACE}={self.label}" + (
                f" (team {self.team})" if self.team else "")
        return f"pod {self.namespace or '?'}/{self.pod}"


@dataclass(frozen=True)
class Signal:
    """One piece of evidence about one workspace (``workspace``) or one node (``node``)."""

    kind: Kind
    #: Source, id and state: what makes two deliveries the same notification.
    key: str
    observed_at: datetime
    #: The evidence in words, for the owner and the audit log.
    detail: str
    workspace: WorkspaceRef | None = None
    node: str | None = None
    value: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Refused:
    reason: Refusal
    message: str


@dataclass(frozen=True)
class Reading:
    source: str
    signals: tuple[Signal, ...] = ()
    refused: tuple[Refused, ...] = ()


def read(payload: Any, now: datetime) -> Reading:
    """What ``payload`` (a decoded JSON message of the monitoring topic) says at ``now``."""
    if not isinstance(payload, Mapping):
        return _refuse("unknown", Refusal.MALFORMED,
                       f"a monitoring message is a JSON object, not {type(payload).__name__}")
    if "incident" in payload:
        return _cloud_monitoring(payload, now)
    if "alerts" in payload:
        return _alertmanager(payload, now)
    if "protoPayload" in payload or "logName" in payload:
        return _cloud_logging(payload, now)
    return _refuse("unknown", Refusal.UNSUPPORTED,
                   "neither a Cloud Monitoring notification (incident), an Alertmanager "
                   "webhook (version 4, alerts) nor a Cloud Logging entry (logName)")


def names(ref: WorkspaceRef, team: str, label: str, pod: str) -> bool:
    """Whether ``ref`` names the workspace of ``team`` whose pod carries ``label`` and is
    called ``pod``: by the label when it has one, else by the pod's name; a team label must
    agree too."""
    if ref.team and ref.team != team:
        return False
    return ref.label == label if ref.label else ref.pod == pod


def on_node(node: str, placements: Iterable[tuple[str, str | None]]) -> list[str]:
    """The workspaces placed on ``node``, from the runtime's (workspace id, node) pairs."""
    return sorted({ws_id for ws_id, placed in placements if placed == node})


def event_for(signal: Signal, workspace_id: str) -> Any:
    """The Stasis event payload ``signal`` becomes for one workspace."""
    observed = signal.observed_at.isoformat()
    if signal.kind == Kind.GPU_IDLE:
        # Nothing here says when the user was last active: the idle handler asks the
        # runtime. Until it does, "now" is the safe answer (it makes nothing look idle).
        duty = None if signal.value is None else min(100.0, max(0.0, signal.value))
        return WorkspaceIdleDetected(workspace_id=workspace_id, last_activity=observed,
                                     observed_at=observed, gpu_utilization=duty,
                                     cause="gpu_idle", evidence=signal.detail[:1000])
    if signal.kind in (Kind.SPOT_PREEMPTION, Kind.NODE_DELETED):
        assert signal.node is not None
        return WorkspacePreempted(workspace_id=workspace_id, node=signal.node,
                                  preempted_at=observed, cause=str(signal.kind),
                                  detail=signal.detail[:1000])
    return WorkspaceRuntimeAlert(workspace_id=workspace_id, alert=str(signal.kind),
                                 observed_at=observed, detail=signal.detail[:1000],
                                 value=signal.value, threshold=signal.threshold)


def event_id(signal: Signal, workspace_id: str) -> str:
    """Deterministic: one notification, one event per workspace, however often delivered."""
    digest = hashlib.sha256(f"{signal.key}|{workspace_id}".encode()).hexdigest()[:24]
    return f"monitoring-{digest}"


# --- Cloud Monitoring ----------------------------------------------------------------------
def _cloud_monitoring(payload: Mapping[str, Any], now: datetime) -> Reading:
    source = "cloud_monitoring"
    version = str(payload.get("version"))
    incident = payload.get("incident")
    if version != NOTIFICATION_VERSION:
        return _refuse(source, Refusal.UNSUPPORTED,
                       f"notification version {version!r}: Stasis reads version "
                       f"{NOTIFICATION_VERSION} (Cloud Monitoring's Pub/Sub and webhook schema)")
    if not isinstance(incident, Mapping) or not _text(incident.get("incident_id")):
        return _refuse(source, Refusal.MALFORMED, "the notification has no incident_id")
    incident_id = _text(incident.get("incident_id"))
    state = str(incident.get("state") or "").lower()
    policy = _text(incident.get("policy_name")) or "an unnamed policy"
    what = f"incident {incident_id} ({policy})"
    kind = _incident_kind(incident)
    if kind is None:
        metric = _mapping(incident.get("metric")).get("type")
        return _refuse(source, Refusal.UNSUPPORTED,
                       f"{what} on {metric or 'no metric'} is not a Stasis signal: label the "
                       f"policy {SIGNAL_LABEL}={'|'.join(sorted(ALERT_KINDS))}")
    if state == "closed":
        return _refuse(source, Refusal.CLOSED, f"{what} closed: an incident that ends "
                       "changes nothing")
    if state != "open":
        return _refuse(source, Refusal.MALFORMED, f"{what} has state {state!r}, not open "
                       "or closed")
    started = _epoch(incident.get("started_at"))
    if started is None:
        return _refuse(source, Refusal.MALFORMED, f"{what}: started_at is not a Unix time")
    if now - started > MAX_ALERT_AGE:
        return _refuse(source, Refusal.STALE, f"{what} opened at {started.isoformat()}, "
                       f"{_age(now - started)} ago: a signal older than "
                       f"{_age(MAX_ALERT_AGE)} is not acted on")
    resource = _mapping(_mapping(incident.get("resource")).get("labels"))
    metric = _mapping(_mapping(incident.get("metric")).get("labels"))
    ref = _workspace_ref(_mapping(_mapping(incident.get("metadata")).get("user_labels")),
                         resource, metric)
    if ref is None:
        return _refuse(source, Refusal.NO_WORKSPACE,
                       f"{what} names no workspace: expected the pod label {LABEL_WORKSPACE} "
                       "in metadata.user_labels, or a namespace and pod")
    value = _number(incident.get("observed_value"))
    threshold = _number(incident.get("threshold_value"))
    window = _duration(_mapping(_mapping(incident.get("condition"))
                                .get("conditionThreshold")).get("duration"))
    container = _first(resource, metric, keys=("container_name", "container"))
    detail = (f"{_measured(kind, value, threshold, window, container)} "
              f"(Cloud Monitoring {what})")
    return Reading(source, (Signal(kind, f"{source} {incident_id} {state}", started, detail,
                                   workspace=ref, value=value, threshold=threshold),))


def _incident_kind(incident: Mapping[str, Any]) -> Kind | None:
    label = _mapping(incident.get("policy_user_labels")).get(SIGNAL_LABEL)
    if label in ALERT_KINDS:
        return Kind(label)
    return _BY_METRIC.get(str(_mapping(incident.get("metric")).get("type")))


# --- Alertmanager --------------------------------------------------------------------------
def _alertmanager(payload: Mapping[str, Any], now: datetime) -> Reading:
    source = "alertmanager"
    version = str(payload.get("version"))
    alerts = payload.get("alerts")
    if version != ALERTMANAGER_VERSION:
        return _refuse(source, Refusal.UNSUPPORTED, f"Alertmanager webhook version {version!r}:"
                       f" Stasis reads version {ALERTMANAGER_VERSION}")
    if not isinstance(alerts, list) or not alerts:
        return _refuse(source, Refusal.MALFORMED, "the webhook carries no alerts")
    signals: list[Signal] = []
    refused: list[Refused] = []
    for index, alert in enumerate(alerts, start=1):
        outcome = _alert(index, alert, now)
        if isinstance(outcome, Signal):
            signals.append(outcome)
        else:
            refused.append(outcome)
    return Reading(source, tuple(signals), tuple(refused))


def _alert(index: int, alert: Any, now: datetime) -> Signal | Refused:
    if not isinstance(alert, Mapping):
        return Refused(Refusal.MALFORMED, f"alert {index} is not an object")
    labels = {str(k): str(v) for k, v in _mapping(alert.get("labels")).items()}
    annotations = _mapping(alert.get("annotations"))
    what = f"alert {index} ({labels.get('alertname', 'unnamed')})"
    kind = labels.get(SIGNAL_LABEL)
    status = str(alert.get("status"))
    if kind not in ALERT_KINDS:
        return Refused(Refusal.UNSUPPORTED, f"{what} is not a Stasis signal: its rule sets no "
                       f"{SIGNAL_LABEL} label ({'|'.join(sorted(ALERT_KINDS))})")
    if status == "resolved":
        return Refused(Refusal.CLOSED, f"{what} resolved: an alert that ends changes nothing")
    starts = _rfc3339(alert.get("startsAt"))
    if status != "firing" or starts is None:
        return Refused(Refusal.MALFORMED, f"{what}: status {status!r}, startsAt "
                       f"{alert.get('startsAt')!r}")
    ends = _rfc3339(alert.get("endsAt"))
    if ends is not None and ends.year > 1:  # Alertmanager writes year 1 for "no end yet"
        if ends < now - MAX_ALERT_AGE:
            return Refused(Refusal.STALE, f"{what} ended at {ends.isoformat()}, "
                           f"{_age(now - ends)} ago")
        observed = min(now, ends)
    elif now - starts > MAX_ALERT_AGE:
        return Refused(Refusal.STALE, f"{what} started {_age(now - starts)} ago and gives no "
                       f"end: a signal older than {_age(MAX_ALERT_AGE)} is not acted on")
    else:
        observed = starts
    ref = _workspace_ref({}, labels)
    if ref is None:
        return Refused(Refusal.NO_WORKSPACE, f"{what} names no workspace: expected the labels "
                       "namespace and pod, or label_stasis_dev_workspace")
    fingerprint = str(alert.get("fingerprint") or hashlib.sha256(
        repr(sorted(labels.items())).encode()).hexdigest()[:16])
    value, threshold = _number(annotations.get("value")), _number(annotations.get("threshold"))
    container = labels.get("exported_container") or labels.get("container")
    detail = (f"{_measured(Kind(kind), value, threshold, None, container)} "
              f"(Alertmanager {what}, since {starts.isoformat()})")
    return Signal(Kind(kind), f"alertmanager {fingerprint} {alert.get('startsAt')} firing",
                  observed, detail, workspace=ref, value=value, threshold=threshold)


# --- Cloud Logging -------------------------------------------------------------------------
def _cloud_logging(entry: Mapping[str, Any], now: datetime) -> Reading:
    source = "cloud_logging"
    proto = _mapping(entry.get("protoPayload"))
    method = str(proto.get("methodName") or "")
    insert_id = _text(entry.get("insertId"))
    when = _rfc3339(entry.get("timestamp"))
    if method not in (PREEMPTED_METHOD, NODE_DELETED_METHOD):
        return _refuse(source, Refusal.UNSUPPORTED,
                       f"log entry {method or '(no protoPayload.methodName)'}: Stasis reads "
                       f"{PREEMPTED_METHOD} and {NODE_DELETED_METHOD}")
    node = str(proto.get("resourceName") or "").rstrip("/").rpartition("/")[2]
    if not insert_id or when is None or not node:
        return _refuse(source, Refusal.MALFORMED,
                       f"{method} entry without insertId, timestamp or resourceName")
    code = _mapping(proto.get("status")).get("code")
    if method == NODE_DELETED_METHOD and code not in (None, 0):
        return _refuse(source, Refusal.UNSUPPORTED,
                       f"deleting node {node} failed (status {code}): nothing was lost")
    if now - when > MAX_LOG_AGE:
        return _refuse(source, Refusal.STALE, f"{method} of {node} at {when.isoformat()}, "
                       f"{_age(now - when)} ago: older than {_age(MAX_LOG_AGE)}")
    if method == PREEMPTED_METHOD:
        kind = Kind.SPOT_PREEMPTION
        said = _text(_mapping(proto.get("status")).get("message"))
        detail = f"Compute Engine preempted instance {node}" + (f" ({said})" if said else "")
    else:
        kind = Kind.NODE_DELETED
        cluster = _mapping(_mapping(entry.get("resource")).get("labels")).get("cluster_name")
        who = _mapping(proto.get("authenticationInfo")).get("principalEmail")
        detail = (f"node {node} was deleted from cluster {cluster or '?'}"
                  + (f" by {who}" if who else ""))
    log = str(entry.get("logName") or "")
    return Reading(source, (Signal(kind, f"{source} {log} {insert_id}", when,
                                   f"{detail} (Cloud Logging {insert_id})", node=node),))


# --- helpers -------------------------------------------------------------------------------
_WORKSPACE_KEYS = ("label_stasis_dev_workspace", "stasis_dev_workspace")
_TEAM_KEYS = ("label_stasis_dev_team", "stasis_dev_team")
# exported_*: Prometheus renames a series' own label when the scrape target has one of the
# same name (the DCGM exporter's pod): the workload's pod is then the exported one.
_NAMESPACE_KEYS = ("namespace_name", "exported_namespace", "namespace")
_POD_KEYS = ("pod_name", "exported_pod", "pod")


def _workspace_ref(user_labels: Mapping[str, Any],
                   *labels: Mapping[str, Any]) -> WorkspaceRef | None:
    label = _text(user_labels.get(LABEL_WORKSPACE)) or _first(*labels, keys=_WORKSPACE_KEYS)
    team = _text(user_labels.get(LABEL_TEAM)) or _first(*labels, keys=_TEAM_KEYS)
    pod = _first(*labels, keys=_POD_KEYS)
    if not label and not pod:
        return None
    return WorkspaceRef(label=label, team=team, pod=pod,
                        namespace=_first(*labels, keys=_NAMESPACE_KEYS))


def _measured(kind: Kind, value: float | None, threshold: float | None,
              window: int | None, container: str | None) -> str:
    over = f" for {_age(timedelta(seconds=window))}" if window else ""
    if kind == Kind.GPU_IDLE:
        limit = f" (under {threshold:g}%{over})" if threshold is not None else over
        return f"GPU duty cycle {_num(value)}%{limit}"
    if kind == Kind.GPU_MEMORY_HIGH:
        limit = f" (over {threshold:.0%}{over})" if threshold is not None else over
        used = f"{value:.0%}" if value is not None else "near all"
        return f"GPU memory {used} used{limit}: a larger model or batch will fail to allocate"
    return (f"container {container or '?'} was OOM-killed: what ran in it (the kernels) "
            "restarted with empty memory; a profile with more memory avoids it")


def _refuse(source: str, reason: Refusal, message: str) -> Reading:
    return Reading(source, (), (Refused(reason, message),))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _first(*maps: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        for labels in maps:
            if found := _text(labels.get(key)):
                return found
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _epoch(value: Any) -> datetime | None:
    seconds = _number(value)
    return None if seconds is None or seconds <= 0 else datetime.fromtimestamp(seconds, UTC)


def _rfc3339(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if "." in text:  # Cloud Logging writes nanoseconds; datetime keeps microseconds
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _duration(value: Any) -> int | None:
    """``"1200s"`` (a protobuf Duration in JSON) -> 1200."""
    if isinstance(value, str) and value.endswith("s"):
        seconds = _number(value[:-1])
        return int(seconds) if seconds else None
    return None


def _age(delta: timedelta) -> str:
    seconds = max(0, round(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds / 3600:.1f}h" if seconds < 172800 else f"{seconds // 86400} days"


__all__ = [
    "ALERT_KINDS",
    "MAX_ALERT_AGE",
    "MAX_LOG_AGE",
    "SIGNAL_LABEL",
    "Kind",
    "Reading",
    "Refusal",
    "Refused",
    "Signal",
    "WorkspaceRef",
    "event_for",
    "event_id",
    "names",
    "on_node",
    "read",
]
