"""Idle rules: when a running workspace pauses on its own. Pure; ``now`` is passed in.

``evaluate(workspace, policy, signals, now) -> IdleVerdict`` reads like the lifecycle: an
early-return ladder, one *why* per branch, a named reason for every answer. The policy is
the profile's :class:`~functions.domain.catalog.IdlePolicy` (ordered rules, a grace after
resume, a maximum age); the signals are what the runtime saw (jupyter-server's
``last_activity``, busy kernels, open connections, GPU utilisation where there is a GPU).

The ladder, first answer wins:

1. not RUNNING: nothing to do (``not_running``).
2. signals observed more than ``MAX_SIGNAL_AGE`` ago: keep (``stale_signals``); a delayed or
   redelivered event must not pause a workspace on old evidence.
3. a busy kernel, or a GPU at least ``GPU_BUSY_PERCENT`` % busy: keep (``busy``). Busy work
   is never idle, and not even the maximum age pauses it: a kernel snapshot queues behind
   the running cell and would fail, so the maximum age waits for the cell to finish.
4. running at least ``max_age_seconds`` since it started or resumed: pause (``max_age``,
   cause ``schedule``), idle or not, signals or not.
5. within ``grace_after_resume_seconds`` of a resume (or of a pause that failed and left
   the workspace running): keep (``grace``). A restored server can report a stale
   ``last_activity`` from before the pause (kubeflow#6648); a failed pause is not retried
   in a tight loop either.
6. no pause rule can apply yet, whatever the signals (idle time never exceeds the time
   since the workspace became RUNNING): keep (``too_early``).
7. no signals (the runtime could not say): keep (``no_signals``).
8. the rules in order: the first whose ``idle_seconds`` and ``min_running_seconds`` are
   both reached decides: ``pause`` -> pause (``idle``); ``none`` -> keep (``rule_none``).
9. no rule reached: keep (``active``).

A GPU-idle alert of cluster monitoring (workspace.idle_detected with cause ``gpu_idle``)
is evidence about the GPU only: :func:`corroborated` joins it with what the runtime says of
the kernels, and the same ladder decides. Without the runtime's answer nothing pauses
(``no_signals``), and a kernel running a cell keeps the workspace whatever its GPU does.

Idle time counts from the latest of: the runtime's ``last_activity``, the workspace's own
``last_activity`` (the lifecycle stamps it when the workspace becomes RUNNING) and the
moment it became RUNNING, so a timestamp older than the current run never counts.
Open connections alone are not activity: a forgotten browser tab keeps a websocket open for
days; whatever the user does through it (a cell, a keystroke in a terminal, a save) moves
``last_activity``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from events.payloads import WorkspaceIdleDetected
from functions.domain.catalog import IdleEffect, IdlePolicy
from functions.domain.lifecycle import Reason, State, Workspace

#: Signals older than this are not acted on.
MAX_SIGNAL_AGE = timedelta(minutes=10)
#: A GPU this busy (percent, as nvidia-smi reports it) counts as work in progress.
GPU_BUSY_PERCENT = 10.0
#: ``WorkspaceIdleDetected.cause`` of a cluster monitoring GPU-idle alert.
GPU_IDLE = "gpu_idle"
#: Actor of the pause requests the idle policy makes (audit, cost: "saved by auto-pause").
ACTOR = "idle-policy"
#: How the workspace last became RUNNING, for the grace period.
_GRACE_AFTER = frozenset({str(Reason.RESUMED), str(Reason.SNAPSHOT_FAILED)})


class IdleReason(StrEnum):
    """Why a verdict was reached; str values so a typo is a NameError, not a new reason."""

    NOT_RUNNING = "not_running"
    STALE_SIGNALS = "stale_signals"
    BUSY = "busy"
    MAX_AGE = "max_age"
    GRACE = "grace"
    TOO_EARLY = "too_early"
    NO_SIGNALS = "no_signals"
    IDLE = "idle"
    RULE_NONE = "rule_none"
    ACTIVE = "active"


_DECIDED_WITHOUT_SIGNALS = frozenset({IdleReason.NOT_RUNNING, IdleReason.GRACE,
                                     IdleReason.TOO_EARLY})


@dataclass(frozen=True)
class Signals:
    """What the runtime saw of one workspace at ``observed_at``."""

    observed_at: datetime
    last_activity: datetime | None = None
    busy_kernels: int = 0
    connections: int = 0
    gpu_utilization: float | None = None

    @classmethod
    def from_event(cls, payload: WorkspaceIdleDetected) -> Signals:
        return cls(observed_at=parse_time(payload.observed_at),
                   last_activity=parse_time(payload.last_activity),
                   busy_kernels=payload.busy_kernels, connections=payload.connections,
                   gpu_utilization=payload.gpu_utilization)

    @classmethod
    def from_activity(cls, activity: Mapping[str, Any], now: datetime) -> Signals:
        """From the node agent's ``GET /workspaces/<id>/activity`` answer."""
        last = activity.get("last_activity")
        observed = activity.get("observed_at")
        gpu = activity.get("gpu_utilization")
        return cls(observed_at=parse_time(observed) if isinstance(observed, str) else now,
                   last_activity=parse_time(last) if isinstance(last, str) else None,
                   busy_kernels=int(activity.get("busy_kernels") or 0),
                   connections=int(activity.get("connections") or 0),
                   gpu_utilization=float(gpu) if isinstance(gpu, int | float) else None)


@dataclass(frozen=True)
class IdleVerdict:
    """Pause or keep, why, and what the owner is told when it pauses."""

    pause: bool
    reason: IdleReason
    message: str
    #: ``WorkspacePauseRequested.cause`` of the pause: ``idle`` or ``schedule`` (max age).
    cause: str = "idle"
    idle_seconds: int | None = None
    running_seconds: int = 0
    #: 1-based index of the rule that decided, if one did.
    rule: int | None = None


def evaluate(ws: Workspace, policy: IdlePolicy, signals: Signals | None,
             now: datetime) -> IdleVerdict:
    """Whether ``ws`` pauses now under ``policy``, given what the runtime saw. Pure."""
    if ws.state != State.RUNNING:
        return IdleVerdict(False, IdleReason.NOT_RUNNING, f"{ws.state}, not RUNNING")
    since = running_since(ws, now)
    running = _seconds(now - since)
    if signals is not None and now - signals.observed_at > MAX_SIGNAL_AGE:
        return IdleVerdict(False, IdleReason.STALE_SIGNALS,
                           f"signals observed {_human(_seconds(now - signals.observed_at))} "
                           "ago", running_seconds=running)
    if signals is not None and (busy := _busy(signals)):
        return IdleVerdict(False, IdleReason.BUSY, busy, running_seconds=running)
    if policy.max_age_seconds is not None and running >= policy.max_age_seconds:
        return IdleVerdict(True, IdleReason.MAX_AGE,
                           f"idle policy: running for {_human(running)}, the most profile "
                           f"{ws.profile} allows ({_human(policy.max_age_seconds)}); "
                           f"{_resume_hint(ws)}",
                           cause="schedule", running_seconds=running)
    if ws.state_reason in _GRACE_AFTER and running < policy.grace_after_resume_seconds:
        return IdleVerdict(False, IdleReason.GRACE,
                           f"{_human(running)} since it {_became_running(ws)}; the grace "
                           f"period is {_human(policy.grace_after_resume_seconds)}",
                           running_seconds=running)
    # Idle time never exceeds the time since it became RUNNING: until a pause rule's
    # thresholds fit in that time, no signal can make it apply (the sweep skips asking).
    if not any(rule.effect == IdleEffect.PAUSE
               and running >= max(rule.idle_seconds, rule.min_running_seconds)
               for rule in policy.rules):
        return IdleVerdict(False, IdleReason.TOO_EARLY,
                           f"running for {_human(running)}; no pause rule can apply yet",
                           running_seconds=running)
    if signals is None:
        return IdleVerdict(False, IdleReason.NO_SIGNALS, "the runtime reported no activity",
                           running_seconds=running)
    latest = max(t for t in (signals.last_activity, ws.last_activity, since) if t is not None)
    idle = _seconds(now - latest)
    for index, rule in enumerate(policy.rules, start=1):
        if idle < rule.idle_seconds or running < rule.min_running_seconds:
            continue
        if rule.effect == IdleEffect.NONE:
            return IdleVerdict(False, IdleReason.RULE_NONE,
                               f"idle for {_human(idle)}, but rule {index} keeps it running",
                               idle_seconds=idle, running_seconds=running, rule=index)
        return IdleVerdict(True, IdleReason.IDLE,
                           f"idle policy: no activity for {_human(idle)}; profile "
                           f"{ws.profile} pauses after {_human(rule.idle_seconds)} idle "
                           f"(rule {index}); {_resume_hint(ws)}",
                           idle_seconds=idle, running_seconds=running, rule=index)
    return IdleVerdict(False, IdleReason.ACTIVE, f"idle for {_human(idle)}; no rule applies yet",
                       idle_seconds=idle, running_seconds=running)


def corroborated(evidence: Signals, runtime: Signals | None) -> Signals | None:
    """A GPU-idle alert's ``evidence`` joined with the ``runtime``'s own signals.

    Monitoring measured the GPU and nothing else: the kernels, the last activity and the
    connections are the runtime's, and without them there is nothing to decide on (None:
    ``no_signals``). The GPU counts as busy if either saw it busy, and the older of the two
    observations is the age of the whole (a stale alert stays stale).
    """
    if runtime is None:
        return None
    gpu = [g for g in (evidence.gpu_utilization, runtime.gpu_utilization) if g is not None]
    return replace(runtime, observed_at=min(evidence.observed_at, runtime.observed_at),
                   gpu_utilization=max(gpu) if gpu else None)


@dataclass(frozen=True)
class IdleOutlook:
    """What the owner reads next to a RUNNING workspace: how long until the policy pauses it
    if nothing happens, or why it will not (``seconds_left`` None)."""

    seconds_left: int | None
    reason: IdleReason
    message: str


def outlook(ws: Workspace, policy: IdlePolicy, signals: Signals | None,
            now: datetime) -> IdleOutlook:
    """The time left before ``policy`` pauses ``ws`` if it stays idle from now on.

    The same ladder as :func:`evaluate`, run forward: busy work and stale or missing
    evidence are said as they are; otherwise the earliest moment at which either the
    maximum age or the first rule (in order) reached is a pause, never inside the grace
    period after a resume. Idle time counts from the latest activity seen (the workspace's
    own ``last_activity`` when the runtime reported none). Pure.
    """
    verdict = evaluate(ws, policy, signals, now)
    if verdict.pause:
        return IdleOutlook(0, verdict.reason, verdict.message)
    if verdict.reason in (IdleReason.NOT_RUNNING, IdleReason.STALE_SIGNALS, IdleReason.BUSY):
        return IdleOutlook(None, verdict.reason, f"won't pause: {verdict.message}")
    since = running_since(ws, now)
    running = _seconds(now - since)
    seen = signals.last_activity if signals is not None else None
    idle = _seconds(now - max(t for t in (seen, ws.last_activity, since) if t is not None))
    grace_left = (max(0, policy.grace_after_resume_seconds - running)
                  if ws.state_reason in _GRACE_AFTER else 0)
    idle_at = _first_idle_pause(policy, idle, running)
    if idle_at is not None:
        idle_at = max(idle_at, grace_left)
    age_at = (max(0, policy.max_age_seconds - running)
              if policy.max_age_seconds is not None else None)
    options = [t for t in (idle_at, age_at) if t is not None]
    if not options:
        return IdleOutlook(None, verdict.reason, f"profile {ws.profile}'s idle policy does "
                                                 "not pause it")
    left = min(options)
    if age_at is not None and left == age_at and (idle_at is None or age_at <= idle_at):
        why = f"profile {ws.profile} runs at most {_human(policy.max_age_seconds or 0)}"
    else:
        why = f"if idle; idle for {_human(idle)}"
    if verdict.reason == IdleReason.GRACE:
        why += f"; grace after resume, {_human(grace_left)} left"
    return IdleOutlook(left, verdict.reason, f"pauses in {_human(left)} ({why})")


def _first_idle_pause(policy: IdlePolicy, idle: int, running: int) -> int | None:
    """Seconds from now until the first rule reached (in order) is a pause, idle from now
    on; None if a ``none`` rule always gets there first, or there is no pause rule."""
    reach = [max(0, rule.idle_seconds - idle, rule.min_running_seconds - running)
             for rule in policy.rules]
    for moment in sorted(set(reach)):
        decider = next(r for r, at in zip(policy.rules, reach, strict=True) if at <= moment)
        if decider.effect == IdleEffect.PAUSE:
            return moment
    return None


def needs_signals(ws: Workspace, policy: IdlePolicy, now: datetime) -> bool:
    """Whether the runtime's signals could change the verdict. False while the workspace
    is not RUNNING, in its grace period, or too young for any pause rule: the sweep then
    does not ask the runtime at all."""
    return evaluate(ws, policy, None, now).reason not in _DECIDED_WITHOUT_SIGNALS


def running_since(ws: Workspace, now: datetime) -> datetime:
    """When ``ws`` became RUNNING this time (started, resumed, or back after a failed pause).

    The lifecycle stamps ``updated_at`` on every transition and a RUNNING workspace's last
    transition is the one into RUNNING (refused events write nothing).
    """
    return ws.updated_at or ws.created_at or now


def pause_request_id(ws: Workspace) -> str:
    """The requestid of the idle pause of ``ws`` at its current version.

    Deterministic: every sweep that finds the same RUNNING version idle asks for the same
    pause, and the lifecycle's ledger gives a request one effect, so repeated sweeps (or a
    redelivered idle_detected) pause once and write nothing more.
    """
    return f"idle-{ws.id}-v{ws.version}"


def parse_time(text: str) -> datetime:
    """An RFC 3339 time; one without a zone is taken as UTC (jupyter-server writes one)."""
    value = datetime.fromisoformat(text)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def is_busy(signals: Signals) -> bool:
    """Whether a kernel or the GPU is at work (what the idle rules never pause)."""
    return _busy(signals) is not None


def _busy(signals: Signals) -> str | None:
    if signals.busy_kernels > 0:
        kernels = "kernel is" if signals.busy_kernels == 1 else "kernels are"
        return f"{signals.busy_kernels} {kernels} busy"
    if signals.gpu_utilization is not None and signals.gpu_utilization >= GPU_BUSY_PERCENT:
        return f"the GPU is {signals.gpu_utilization:g}% busy"
    return None


def _became_running(ws: Workspace) -> str:
    return "resumed" if ws.state_reason == str(Reason.RESUMED) else "came back from a failed pause"


def _resume_hint(ws: Workspace) -> str:
    return f"resume with `stasis ws resume {ws.name} --team {ws.team}`"


def _seconds(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds()))


def _human(seconds: int) -> str:
    """``3720`` -> ``1h 2m``; ``45`` -> ``45s``; ``86400`` -> ``24h``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs and minutes < 10 else f"{minutes}m"
    return f"{secs}s"


__all__ = [
    "ACTOR",
    "GPU_BUSY_PERCENT",
    "GPU_IDLE",
    "MAX_SIGNAL_AGE",
    "IdleOutlook",
    "IdleReason",
    "IdleVerdict",
    "Signals",
    "corroborated",
    "evaluate",
    "needs_signals",
    "outlook",
    "parse_time",
    "pause_request_id",
    "running_since",
]
