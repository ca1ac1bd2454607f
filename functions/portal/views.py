"""What each portal page shows: plain data for its template, built from plain inputs. Pure.

The figures are the domain's: cost from ``functions.domain.cost`` (the team rollup run over
one workspace: the catalog's hourly cost times its own running time this month, disk and
snapshot storage), the idle badge from ``idle.outlook``, progress from
``functions.domain.progress``, quota from ``functions.domain.quota``. Nothing here reads or
writes; ``web`` gathers the inputs through the store and the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from datetime import datetime
from typing import Any

from functions.dashboard import stats
from functions.domain import cost, quota
from functions.domain.catalog import (
    Catalog,
    EnvironmentStatus,
    Profile,
    Refusal,
    Team,
    human_bytes,
)
from functions.domain.idle import IdleOutlook
from functions.domain.lifecycle import IN_TRANSITION, State, Workspace
from functions.domain.progress import Progress
from functions.domain.redaction import redact
from functions.domain.retention import SnapshotRecord
from functions.domain.scheduling import Outlook, human

#: States whose page follows the runtime (progress line, auto-refresh); a QUEUED one is
#: followed until it starts.
FOLLOWED = frozenset(IN_TRANSITION | {State.REQUESTED, State.QUEUED})
#: After an action, the states in which its page stops following the workspace: until the
#: lifecycle has taken the request, the workspace is still in the state it was asked from.
SETTLED: Mapping[str, frozenset[State]] = {
    "create": frozenset({State.RUNNING, State.FAILED}),
    "pause": frozenset({State.PAUSED, State.FAILED}),
    "resume": frozenset({State.RUNNING, State.FAILED}),
}


def awaiting(ws: Workspace, action: str | None) -> bool:
    """Whether the page shown after ``action`` still waits for the workspace to settle (a
    pause whose snapshot failed settles back in RUNNING, with that reason)."""
    settled = SETTLED.get(action or "")
    if settled is None:
        return False
    if action == "pause" and ws.state == State.RUNNING and ws.state_reason == "snapshot_failed":
        return False
    return ws.state not in settled


def workspace_cost(ws: Workspace, audit: Iterable[Mapping[str, Any]],
                   snapshots: Iterable[SnapshotRecord], catalog: Catalog, now: datetime,
                   before: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """$/hour now and this month so far for one workspace: ``cost.team_rollup`` over it
    alone. ``audit``: its audit entries (any; the month's transitions are picked here);
    ``before``: its latest entries before the month, newest first, needed only when its
    first transition this month does not say the state it left (a delete)."""
    month = cost.month_of(now)
    transitions = cost.in_order(_transitions(ws.id, audit, since=month.start))
    previous = next(iter(_transitions(ws.id, before)), None)
    initial = cost.start_state(ws, transitions, previous)
    doc = cost.team_rollup(ws.team, [ws], {ws.id: transitions}, {ws.id: initial},
                           [s for s in snapshots if s.workspace_id == ws.id], catalog, now)
    hours = doc["hours_in_month"] or 1.0
    per_hour = doc["compute"]["cost_per_hour_now"] + (
        doc["disk"]["cost_per_month_now"] + doc["snapshots"]["cost_per_month_now"]) / hours
    return {"per_hour": round(per_hour, 4), "month": doc["total"]["cost"],
            "month_label": doc["month"], "priced": ws.profile in catalog.profiles,
            "per_hour_text": stats.usd(per_hour) + "/h", "month_text": stats.usd(
                doc["total"]["cost"])}


def needs_lookback(ws: Workspace, audit: Iterable[Mapping[str, Any]], now: datetime) -> bool:
    """Whether :func:`workspace_cost` needs the entries before the month too."""
    month = cost.month_of(now)
    return cost.needs_lookback(cost.in_order(_transitions(ws.id, audit, since=month.start)))


def _transitions(ws_id: str, entries: Iterable[Mapping[str, Any]],
                 since: datetime | None = None) -> list[cost.Transition]:
    found = []
    for entry in entries:
        if entry.get("action") not in cost.LIFECYCLE_ACTIONS:
            continue
        transition = cost.transition_from_audit(entry)
        if transition is not None and transition.workspace_id == ws_id and (
                since is None or transition.time >= since):
            found.append(transition)
    return found


def workspace_row(ws: Workspace, *, catalog: Catalog, now: datetime,
                  snapshot: Mapping[str, Any] | None = None, progress: Progress | None = None,
                  cost_now: Mapping[str, Any] | None = None, idle: IdleOutlook | None = None,
                  open_url: str | None = None, may_change: bool = False,
                  queue: Outlook | None = None) -> dict[str, Any]:
    """One workspace as the list and its own page show it (``queue``: where a QUEUED one
    stands, ``scheduling.outlook_of``)."""
    env = catalog.environments.get(ws.environment)
    ide = catalog.ides.get(ws.ide)
    profile = catalog.profiles.get(ws.profile)
    state = State(ws.state)
    return {
        "id": ws.id, "name": ws.name, "team": ws.team, "owner": ws.owner,
        "state": str(state), "message": ws.state_message or "",
        "followed": state in FOLLOWED,
        "progress": progress.as_dict() if progress else None,
        "ide": ide.title if ide else ws.ide, "ide_id": ws.ide,
        "environment": env.title if env else ws.environment, "environment_id": ws.environment,
        "profile": profile.title if profile else ws.profile, "profile_id": ws.profile,
        "cost": dict(cost_now) if cost_now else None,
        "idle": ({"seconds_left": idle.seconds_left, "reason": str(idle.reason),
                  "text": idle.message} if idle and state == State.RUNNING else None),
        "snapshot": snapshot_row(snapshot, now) if snapshot else None,
        "open_url": open_url if state == State.RUNNING else None,
        "may_change": may_change,
        "can_pause": may_change and state == State.RUNNING,
        "can_resume": may_change and state in (State.PAUSED, State.FAILED)
                      and bool(ws.current_snapshot),
        "can_delete": may_change and state not in (State.DELETING, State.DELETED),
        "can_cancel": may_change and state == State.QUEUED,
        "queue": ({"position": queue.position, "estimate": human(queue.estimate),
                   "why": queue.message, "text": queue.describe()}
                  if queue is not None and state == State.QUEUED else None),
        "created": stats.ago(ws.created_at, now),
    }


def snapshot_row(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    return {"id": doc.get("id", ""), "bytes": int(doc.get("bytes") or 0),
            "size": human_bytes(int(doc.get("bytes") or 0)),
            "age": stats.ago(doc.get("created_at"), now), "status": doc.get("status", ""),
            "method": doc.get("method", ""), "expires": stats.until(doc.get("expires_at"), now),
            "duration": stats.seconds_ms(doc.get("duration_ms")),
            "skipped": len(doc.get("skipped") or [])}


def form_options(catalog: Catalog, team: Team, usage: Mapping[str, Any],
                 available_ides: Set[str]) -> dict[str, Any]:
    """The new-workspace form as ``team`` sees the catalog: IDEs (unavailable ones say
    why), environments (hidden and unapproved absent, deprecated ones with their message,
    redirects shown with their successor), the team's profiles with their hourly cost and
    whether the team's remaining quota admits one more, and that remaining quota."""
    ides = []
    for ide in catalog.ides.values():
        resolved = catalog.resolve_ide(ide.id, available_ides)
        ides.append({"id": ide.id, "title": ide.title,
                     "note": resolved.message if isinstance(resolved, Refusal) else ""})
    environments = []
    for env in catalog.environments.values():
        if env.redirect is not None:
            successor = catalog.environments[env.redirect]
            environments.append({"id": env.id, "title": f"{env.title} → {successor.title}",
                                 "note": f"replaced by {successor.id}"
                                         + (f": {env.message}" if env.message else "")})
        elif env.usable:
            deprecated = env.status == EnvironmentStatus.DEPRECATED
            environments.append({"id": env.id, "title": env.title,
                                 "note": f"deprecated: {env.message}" if deprecated else ""})
    held = quota.Usage.from_dict(usage)
    profiles = [_profile_option(p, team, held) for p in catalog.profiles_for(team.id)]
    limits = team.quotas
    return {
        "team": team.id, "ides": ides, "environments": environments, "profiles": profiles,
        "quota": {
            "workspaces": f"{max(0, limits.workspaces - held.workspaces)} of "
                          f"{limits.workspaces}",
            "gpus": f"{max(0, limits.gpus - held.gpus)} of {limits.gpus}",
            "tpus": f"{max(0, limits.tpus - held.tpus)} of {limits.tpus}",
            "snapshot_bytes": f"{human_bytes(max(0, limits.snapshot_bytes - held.snapshot_bytes))}"
                              f" of {human_bytes(limits.snapshot_bytes)}",
        },
    }


def _profile_option(profile: Profile, team: Team, held: quota.Usage) -> dict[str, Any]:
    admitted = quota.admit(team.quotas, held, quota.demand_of(profile), team.id,
                           contact=team.who_to_ask)
    acc = profile.accelerator
    return {"id": profile.id, "title": profile.title, "hourly": stats.usd(profile.hourly_cost),
            "hardware": f"{profile.cpus:g} CPU, {profile.memory}"
                        + (f", {acc}" if acc else ""),
            "over_quota": admitted.message if isinstance(admitted, Refusal) else ""}


def resume_profiles(catalog: Catalog, ws: Workspace) -> list[dict[str, str]]:
    """The profiles a paused workspace may resume on (its team's), its own first."""
    own = [p for p in catalog.profiles_for(ws.team) if p.id == ws.profile]
    others = [p for p in catalog.profiles_for(ws.team) if p.id != ws.profile]
    return [{"id": p.id, "title": f"{p.title} ({stats.usd(p.hourly_cost)}/h)"}
            for p in own + others]


def link_row(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A link as the links function lists it (``functions/proxy/issuer.py``)."""
    return {**row, "expires": stats.until(row.get("expires_at"), now),
            "last_used": stats.ago(row.get("last_used_at"), now) or "never"}


def sandbox_row(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    return {"id": doc.get("id", ""), "state": doc.get("state", ""),
            "repository": redact(doc.get("repository")), "command": redact(doc.get("command")),
            "requester": doc.get("requester", ""), "message": redact(doc.get("message")),
            "exit_status": doc.get("exit_status"),
            "files_changed": len(doc.get("files_changed") or ()),
            "requested": stats.ago(doc.get("requested_at"), now),
            "has_patch": bool(doc.get("patch_uri"))}


def newest_first(docs: Sequence[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    return sorted(docs, key=lambda d: str(d.get(key) or ""), reverse=True)
