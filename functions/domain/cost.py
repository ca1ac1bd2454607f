"""The cost model: what a team's workspaces cost this month, where the month is heading,
and what auto-pause saved. Pure; the caller passes the history, the catalog and ``now``.

History comes from the audit log: the lifecycle writes one entry per event, in the
transaction of its decision, with ``outcome = "accepted: <reason>"``; each accepted reason
names the state the workspace entered (``REASON_STATE``). Walking a workspace's entries in
time order gives the spans it spent in each state:

- **compute**: states that hold hardware (``lifecycle.HOLDS_HARDWARE``) at the profile's
  ``hourly_cost``; GPU-hours are those hours times the profile's GPUs (TPU chips apart);
- **disk**: states that hold a workspace slot (``lifecycle.HOLDS_SLOT``: the home disk
  exists) at ``pricing.disk_gb_month`` for the profile's disk size;
- **snapshots**: each snapshot record from ``created_at`` until it expired or was deleted,
  at ``pricing.snapshot_gb_month`` for its bytes (a part shared by several snapshots of a
  workspace once);
- **saved by auto-pause**: PAUSED spans whose pause the idle policy asked for (actor
  ``idle-policy``), until the next resume, deletion or ``now``: the hardware it would
  otherwise have held, at the profile's price (an upper bound: the owner might have paused).

"Now" is the rate of what exists at ``now``; the forecast for the month is month-to-date
plus that rate for the rest of the month. A GB-month is 2^30 bytes for a calendar month.
A workspace's spans are priced at its current profile (a resume on another profile is
priced as the new one for the whole month).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.domain.catalog import AcceleratorKind, Catalog, Profile
from functions.domain.idle import ACTOR as IDLE_ACTOR
from functions.domain.lifecycle import HOLDS_HARDWARE, HOLDS_SLOT, Reason, State, Workspace
from functions.domain.retention import SnapshotRecord, held_bytes

GIB = 2**30
_ACCEPTED = "accepted: "
#: Audit actions of the lifecycle (other handlers audit into the same collection).
LIFECYCLE_ACTIONS = frozenset({
    "workspace.requested", "workspace.ready", "workspace.runtime_failed",
    "workspace.pause_requested", "snapshot.finished", "workspace.resume_requested",
    "workspace.delete_requested",
})

#: The state an accepted decision with this reason leaves the workspace in.
REASON_STATE: Mapping[str, State] = {
    Reason.CREATED: State.PROVISIONING,
    Reason.READY: State.RUNNING,
    Reason.RESUMED: State.RUNNING,
    Reason.PAUSE_STARTED: State.PAUSING,
    Reason.PAUSED: State.PAUSED,
    Reason.SNAPSHOT_FAILED: State.RUNNING,
    Reason.RESUME_STARTED: State.RESUMING,
    Reason.DELETE_STARTED: State.DELETING,
    Reason.DELETE_RETRIED: State.DELETING,
    Reason.DELETED: State.DELETED,
    Reason.PROVISION_FAILED: State.FAILED,
    Reason.RESUME_FAILED: State.FAILED,
    Reason.ADMISSION_REFUSED: State.FAILED,
}
#: The state a workspace was in before an accepted decision with this reason, where the
#: reason alone says (a delete may come from any state: the caller looks further back).
FROM_STATE: Mapping[str, State | None] = {
    Reason.CREATED: None,
    Reason.ADMISSION_REFUSED: None,
    Reason.READY: State.PROVISIONING,
    Reason.PROVISION_FAILED: State.PROVISIONING,
    Reason.RESUMED: State.RESUMING,
    Reason.RESUME_FAILED: State.RESUMING,
    Reason.PAUSE_STARTED: State.RUNNING,
    Reason.PAUSED: State.PAUSING,
    Reason.SNAPSHOT_FAILED: State.PAUSING,
    # PAUSED or FAILED: neither holds hardware; PAUSED holds the disk, as does a FAILED
    # workspace that still has a snapshot to resume from.
    Reason.RESUME_STARTED: State.PAUSED,
    Reason.DELETE_RETRIED: State.DELETING,
    Reason.DELETED: State.DELETING,
}
_AUTO_CAUSES = frozenset({"idle", "schedule"})
#: Where each reason comes in one pass through the lifecycle: the order of transitions
#: recorded at the same instant (an injected clock, or a runtime that answered at once).
_PASS_ORDER: Mapping[str, int] = {
    Reason.CREATED: 0, Reason.ADMISSION_REFUSED: 0, Reason.READY: 1,
    Reason.PROVISION_FAILED: 1, Reason.PAUSE_STARTED: 2, Reason.PAUSED: 3,
    Reason.SNAPSHOT_FAILED: 3, Reason.RESUME_STARTED: 4, Reason.RESUMED: 5,
    Reason.RESUME_FAILED: 5, Reason.DELETE_STARTED: 6, Reason.DELETE_RETRIED: 7,
    Reason.DELETED: 8,
}


@dataclass(frozen=True)
class Transition:
    """One accepted lifecycle decision: ``workspace_id`` entered ``state`` at ``time``."""

    workspace_id: str
    time: datetime
    reason: str
    state: State
    actor: str = ""


def transition_from_audit(entry: Mapping[str, Any]) -> Transition | None:
    """The transition an audit entry records, or None (a refusal, or not a transition)."""
    outcome = entry.get("outcome")
    when = entry.get("time")
    target = entry.get("target")
    if not (isinstance(outcome, str) and outcome.startswith(_ACCEPTED)
            and isinstance(when, datetime) and isinstance(target, str)):
        return None
    reason = outcome[len(_ACCEPTED):].strip()
    state = REASON_STATE.get(reason)
    if state is None:
        return None
    return Transition(target, when if when.tzinfo else when.replace(tzinfo=UTC), reason, state,
                      str(entry.get("actor") or ""))


def in_order(transitions: Iterable[Transition]) -> list[Transition]:
    """By time; transitions of the same instant in the order the lifecycle takes them."""
    return sorted(transitions, key=lambda t: (t.time, _PASS_ORDER.get(t.reason, 9)))


def needs_lookback(transitions: Sequence[Transition]) -> bool:
    """Whether the state before the first transition is unknown from the reason alone."""
    return bool(transitions) and transitions[0].reason not in FROM_STATE


def start_state(ws: Workspace, transitions: Sequence[Transition],
                before: Transition | None = None) -> State | None:
    """The state ``ws`` was in when the window opened.

    No transition in the window: the state it is in now. Otherwise the first transition's
    reason says, or (a delete) the state the last transition ``before`` the window left.
    """
    if not transitions:
        return ws.state
    first = transitions[0]
    if first.reason in FROM_STATE:
        return FROM_STATE[first.reason]
    return before.state if before is not None else None


@dataclass
class Spans:
    """Seconds a workspace spent in each kind of state inside the window."""

    hardware: float = 0.0
    disk: float = 0.0
    auto_paused: float = 0.0
    auto_pauses: int = 0


def spans(transitions: Sequence[Transition], initial: State | None, window_start: datetime,
          now: datetime, *, initially_auto_paused: bool = False) -> Spans:
    """Walk ``transitions`` (sorted by time, inside the window) from ``initial``."""
    result = Spans()
    state, since = initial, window_start
    auto = initially_auto_paused and initial == State.PAUSED
    pausing_auto = False

    def add(until: datetime) -> None:
        seconds = max(0.0, (min(until, now) - since).total_seconds())
        if state in HOLDS_HARDWARE:
            result.hardware += seconds
        if state in HOLDS_SLOT:
            result.disk += seconds
        if state == State.PAUSED and auto:
            result.auto_paused += seconds

    for tr in transitions:
        add(tr.time)
        since = max(since, tr.time)
        if tr.reason == Reason.PAUSE_STARTED:
            pausing_auto = tr.actor == IDLE_ACTOR
            result.auto_pauses += int(pausing_auto)
        auto = tr.state == State.PAUSED and pausing_auto
        state = tr.state
    add(now)
    return result


@dataclass(frozen=True)
class Month:
    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    @property
    def label(self) -> str:
        return f"{self.start:%Y-%m}"


def month_of(now: datetime) -> Month:
    """The calendar month (UTC) that contains ``now``."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    days = calendar.monthrange(now.year, now.month)[1]
    return Month(start, start + timedelta(days=days))


@dataclass
class _Totals:
    compute_hours: float = 0.0
    gpu_hours: float = 0.0
    tpu_chip_hours: float = 0.0
    compute_cost: float = 0.0
    compute_per_hour_now: float = 0.0
    running_now: int = 0
    disk_cost: float = 0.0
    disk_bytes_now: int = 0
    disk_per_hour_now: float = 0.0
    saved_hours: float = 0.0
    saved_gpu_hours: float = 0.0
    saved_cost: float = 0.0
    auto_pauses: int = 0
    paused_by_policy_now: int = 0
    workspaces: list[dict[str, Any]] = field(default_factory=list)


def team_rollup(team: str, workspaces: Iterable[Workspace],
                history: Mapping[str, Sequence[Transition]],
                initial: Mapping[str, State | None], snapshots: Iterable[SnapshotRecord],
                catalog: Catalog, now: datetime) -> dict[str, Any]:
    """The ``costs/{team}`` document: month to date, now, forecast, saved by auto-pause.

    ``history``: each workspace's transitions this month, sorted by time; ``initial``: its
    state when the month began (see :func:`start_state`).
    """
    month = month_of(now)
    elapsed = (now - month.start).total_seconds() / 3600
    remaining = max(0.0, month.hours - elapsed)
    pricing = catalog.pricing
    totals = _Totals()
    for ws in sorted(workspaces, key=lambda w: w.id):
        profile = catalog.profiles.get(ws.profile)
        transitions = history.get(ws.id, ())
        auto_now = ws.state == State.PAUSED and ws.pause_cause in _AUTO_CAUSES
        start = initial.get(ws.id, ws.state if not transitions else None)
        span = spans(transitions, start, month.start, now,
                     initially_auto_paused=auto_now and not transitions)
        if span.hardware == span.disk == 0 and ws.state not in HOLDS_SLOT:
            continue  # gone all month
        _add_workspace(totals, ws, profile, span, auto_now, pricing.disk_gb_month, month)
    snap_bytes_now, snap_gib_hours = _snapshot_usage(snapshots, month.start, now)
    snapshot_cost = snap_gib_hours / month.hours * pricing.snapshot_gb_month
    snapshot_per_hour = snap_bytes_now / GIB * pricing.snapshot_gb_month / month.hours
    total_mtd = totals.compute_cost + totals.disk_cost + snapshot_cost
    total_rate = totals.compute_per_hour_now + totals.disk_per_hour_now + snapshot_per_hour
    totals.workspaces.sort(key=lambda w: (-w["cost"], w["id"]))
    return {
        "team": team, "month": month.label, "currency": "USD", "computed_at": now,
        "hours_in_month": round(month.hours, 2), "hours_elapsed": round(elapsed, 2),
        "compute": {
            "hours": _r(totals.compute_hours), "gpu_hours": _r(totals.gpu_hours),
            "tpu_chip_hours": _r(totals.tpu_chip_hours), "cost": _usd(totals.compute_cost),
            "running_now": totals.running_now,
            "cost_per_hour_now": _usd(totals.compute_per_hour_now),
            "forecast_cost": _usd(totals.compute_cost
                                  + totals.compute_per_hour_now * remaining),
        },
        "disk": {
            "bytes_now": totals.disk_bytes_now, "cost": _usd(totals.disk_cost),
            "cost_per_month_now": _usd(totals.disk_per_hour_now * month.hours),
            "forecast_cost": _usd(totals.disk_cost + totals.disk_per_hour_now * remaining),
        },
        "snapshots": {
            "bytes_now": snap_bytes_now, "cost": _usd(snapshot_cost),
            "cost_per_month_now": _usd(snapshot_per_hour * month.hours),
            "forecast_cost": _usd(snapshot_cost + snapshot_per_hour * remaining),
        },
        "auto_pause": {
            "pauses": totals.auto_pauses, "paused_now": totals.paused_by_policy_now,
            "hours_saved": _r(totals.saved_hours), "gpu_hours_saved": _r(totals.saved_gpu_hours),
            "cost_saved": _usd(totals.saved_cost),
        },
        "total": {"cost": _usd(total_mtd),
                  "forecast_cost": _usd(total_mtd + total_rate * remaining)},
        "workspaces": totals.workspaces[:100],
    }


def _add_workspace(totals: _Totals, ws: Workspace, profile: Profile | None, span: Spans,
                   auto_now: bool, disk_gb_month: float, month: Month) -> None:
    hours, disk_hours, saved = span.hardware / 3600, span.disk / 3600, span.auto_paused / 3600
    hourly = profile.hourly_cost if profile else 0.0
    gpus = tpus = 0
    if profile is not None and profile.accelerator is not None:
        if profile.accelerator.kind == AcceleratorKind.GPU:
            gpus = profile.accelerator.count
        else:
            tpus = profile.accelerator.count
    disk_bytes = profile.disk.size_bytes if profile else 0
    disk_rate = disk_bytes / GIB * disk_gb_month / month.hours  # USD per hour
    compute_cost, disk_cost = hours * hourly, disk_hours * disk_rate
    totals.compute_hours += hours
    totals.gpu_hours += hours * gpus
    totals.tpu_chip_hours += hours * tpus
    totals.compute_cost += compute_cost
    totals.disk_cost += disk_cost
    totals.saved_hours += saved
    totals.saved_gpu_hours += saved * gpus
    totals.saved_cost += saved * hourly
    totals.auto_pauses += span.auto_pauses
    if ws.state in HOLDS_HARDWARE:
        totals.running_now += 1
        totals.compute_per_hour_now += hourly
    if ws.state in HOLDS_SLOT:
        totals.disk_bytes_now += disk_bytes
        totals.disk_per_hour_now += disk_rate
    totals.paused_by_policy_now += int(auto_now)
    totals.workspaces.append({
        "id": ws.id, "profile": ws.profile, "state": str(ws.state),
        "compute_hours": _r(hours), "gpu_hours": _r(hours * gpus),
        "cost": _usd(compute_cost + disk_cost), "hours_saved": _r(saved),
        "priced": profile is not None,
    })


def _snapshot_usage(records: Iterable[SnapshotRecord], start: datetime,
                    now: datetime) -> tuple[int, float]:
    """(live bytes at ``now``, GiB-hours stored since ``start``). A part that several
    snapshots of a workspace share is stored, and counted, once: from the first of them
    recorded to the last of them gone."""
    records = list(records)
    spans: dict[str, list[Any]] = {}  # object name -> [bytes, stored from, stored until]
    for record in records:
        began = max(start, record.created_at or start)
        ended = now if record.live else min(now, record.ended_at or now)
        for name, size in record.units().items():
            span = spans.setdefault(name, [size, began, ended])
            span[1], span[2] = min(span[1], began), max(span[2], ended)
    gib_hours = sum(size / GIB * (ended - began).total_seconds() / 3600
                    for size, began, ended in spans.values() if ended > began)
    return sum(held_bytes(records).values()), gib_hours


def _usd(value: float) -> float:
    return round(value, 4)


def _r(value: float) -> float:
    return round(value, 3)


__all__ = [
    "FROM_STATE",
    "GIB",
    "LIFECYCLE_ACTIONS",
    "REASON_STATE",
    "Month",
    "Spans",
    "Transition",
    "in_order",
    "month_of",
    "needs_lookback",
    "spans",
    "start_state",
    "team_rollup",
    "transition_from_audit",
]
