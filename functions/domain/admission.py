"""Admission: may this request run, and what does each transition do to the team's usage.

Glue between the lifecycle (which state a workspace moves to), the catalog (what the team
may use) and the quotas (how much it holds). Pure: the handler passes the catalog, the team's
usage counters as read in its transaction, and the runtime's capabilities.

A create or resume refused for its accelerators -- the team's GPU or TPU quota (borrowing
included), or no node with them free -- may wait instead (:func:`may_queue`: the profile's
``when_full``); the lifecycle then makes it QUEUED. Everything else (the workspace count,
snapshot storage, what the catalog or the host will never offer) is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from events.payloads import SnapshotFinished, WorkspaceRequested
from functions.domain import quota
from functions.domain.catalog import (
    Catalog,
    Profile,
    Refusal,
    RefusalReason,
    Role,
    WhenFull,
)
from functions.domain.lifecycle import HOLDS_SLOT, State, Workspace
from functions.domain.retention import part_names


@dataclass(frozen=True)
class RequestCheck:
    """A request's verdict: refused with a message, or accepted with what it resolved to."""

    refusal: str | None
    environment: str | None = None
    notices: tuple[str, ...] = ()


def check_request(catalog: Catalog, request: WorkspaceRequested,
                  capabilities: dict[str, Any]) -> RequestCheck:
    """Membership, profile, environment (deprecated warns, redirect followed), IDE, hardware."""
    team = catalog.teams.get(request.team)
    if team is not None:
        member = team.member(request.owner)
        if member is None:
            return RequestCheck(f"{request.owner} is not a member of team {team.id}; "
                                f"ask {team.who_to_ask} to add you")
        if member.role == Role.VIEWER:
            return RequestCheck(f"{request.owner} is a viewer of team {team.id} and cannot "
                                f"create workspaces; ask {team.who_to_ask}")
    resolution = catalog.resolve_request(
        request.team, request.profile, request.environment, request.ide,
        available_ides=set(capabilities.get("ides") or ()), host_capabilities=capabilities)
    if isinstance(resolution, Refusal):
        return RequestCheck(resolution.message)
    selection = resolution.value
    return RequestCheck(None, selection.environment.id,
                        tuple(n.message for n in resolution.notices))


#: Refusals a request may wait out in the queue: its accelerators, which come back.
QUEUEABLE = frozenset({RefusalReason.GPU_QUOTA_EXCEEDED, RefusalReason.TPU_QUOTA_EXCEEDED,
                       RefusalReason.NO_CAPACITY})


def may_queue(catalog: Catalog, profile_id: str, refusal: Refusal) -> bool:
    """Whether a create or resume refused with ``refusal`` waits as QUEUED instead."""
    profile = catalog.profiles.get(profile_id)
    return (refusal.reason in QUEUEABLE and profile is not None
            and profile.scheduling.when_full == WhenFull.QUEUE)


def charge(catalog: Catalog, previous: State | None, old: Workspace | None,
           new: Workspace, usage: dict[str, Any], *,
           cohort: quota.Cohort | None = None) -> str | None:
    """Update ``usage`` (a team document's counters, in place) for ``old`` -> ``new``.

    Returns a refusal message, leaving ``usage`` untouched, when what the transition adds
    exceeds the team's quota (``cohort``: what its cohort lends). Releases never fail and
    never go below zero.
    """
    refusal = charge_refusal(catalog, previous, old, new, usage, cohort=cohort)
    return refusal.message if refusal is not None else None


def preview(catalog: Catalog, previous: State | None, old: Workspace | None, new: Workspace,
            usage: dict[str, Any]) -> tuple[str | None, str | None]:
    """What a front door says before it publishes a create or resume: (a refusal, or None)
    and, when the team's quota will make it wait, (why it will be queued, or None)."""
    refusal = charge_refusal(catalog, previous, old, new, dict(usage))
    if refusal is None:
        return None, None
    if may_queue(catalog, new.profile, refusal):
        return None, refusal.message
    return refusal.message, None


def charge_refusal(catalog: Catalog, previous: State | None, old: Workspace | None,
                   new: Workspace, usage: dict[str, Any], *,
                   cohort: quota.Cohort | None = None, enforce: bool = True) -> Refusal | None:
    """:func:`charge`, with the refusal's reason; ``enforce`` False counts without
    refusing (what a cluster's own queue admitted: Kueue holds those quotas)."""
    team = catalog.teams.get(new.team)
    before = _held(catalog, previous, old.profile if old else new.profile)
    after = _held(catalog, new.state, new.profile)
    acquire = _minus(after, before)
    give_back = _minus(before, after)
    current = quota.Usage.from_dict(usage)
    if acquire != quota.Usage() and team is not None and enforce:
        admitted = quota.admit(team.quotas, current, acquire, team.id, contact=team.who_to_ask,
                               cohort=cohort)
        if isinstance(admitted, Refusal):
            return admitted
        current = admitted.usage
    elif acquire != quota.Usage() and team is not None:
        current = current + acquire
    current = quota.release(current, give_back)
    usage.update(current.as_dict())
    return None


def snapshot_record(catalog: Catalog, ws: Workspace, finished: SnapshotFinished,
                    now: datetime) -> dict[str, Any]:
    """The ``snapshots/{id}`` document of a successful snapshot, with its expiry, its
    manifest's sha256 (what every restore must match) and the pool parts it uses."""
    expires_at = None
    if ws.profile in catalog.profiles:
        retention = catalog.retention_for(ws.team, ws.profile)
        expires_at = now + timedelta(days=retention.max_age_days)
    return {
        "workspace": ws.id, "team": ws.team, "owner": ws.owner, "uri": finished.uri,
        "bytes": finished.bytes, "method": finished.method, "profile": ws.profile,
        "accelerator": finished.accelerator, "accelerator_count": finished.accelerator_count,
        "status": "ready", "duration_ms": finished.duration_ms, "created_at": now,
        "expires_at": expires_at, "captured": list(finished.captured),
        "skipped": [dict(s) for s in finished.skipped],
        "manifest_sha256": finished.manifest_sha256,
        "uploaded_bytes": finished.uploaded_bytes,
        # None: a snapshot without a part list (``pod``) holds its own bytes.
        "parts": part_names(finished.parts, ws.id) if finished.parts else None,
    }


def environment_of(catalog: Catalog, env_id: str) -> dict[str, Any]:
    env = catalog.environments.get(env_id)
    if env is None:
        return {"id": env_id, "python": "default"}
    return {"id": env.id, "image": env.image, "python": env.python}


def profile_of(catalog: Catalog, profile_id: str) -> dict[str, Any]:
    profile = catalog.profiles.get(profile_id)
    if profile is None:
        return {"id": profile_id}
    acc = profile.accelerator
    return {
        "id": profile.id, "cpu": profile.cpus, "memory": profile.memory,
        "memory_bytes": profile.memory_bytes,
        "accelerator": {"type": acc.type, "count": acc.count, "topology": acc.topology}
        if acc else None,
        "node_selector": dict(profile.node_selector),
        "tolerations": [t.to_k8s() for t in profile.tolerations],
        "provisioning": str(profile.provisioning), "reservation": profile.reservation,
        "snapshot_method": str(profile.snapshot.method),
    }


def _held(catalog: Catalog, state: State | None, profile_id: str) -> quota.Usage:
    if state is None:
        return quota.Usage()
    profile: Profile | None = catalog.profiles.get(profile_id)
    if profile is None:
        # A profile removed from the catalog since: the slot is all we can account for.
        return quota.Usage(workspaces=1 if state in HOLDS_SLOT else 0)
    return quota.held_by(state, profile)


def _minus(a: quota.Usage, b: quota.Usage) -> quota.Usage:
    return quota.Usage(max(0, a.workspaces - b.workspaces), max(0, a.gpus - b.gpus),
                       max(0, a.tpus - b.tpus), max(0, a.snapshot_bytes - b.snapshot_bytes))
