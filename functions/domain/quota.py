"""Team quotas: what a workspace holds, and whether a team may take more.

A team document keeps ``usage`` counters ``{workspaces, gpus, tpus, snapshot_bytes}`` next to
its quotas. Handlers change them only inside the transaction that changes the workspace,
with the pure :func:`admit` and :func:`release` below, so the transaction body is trivial
and the reconciler can recompute the counters from scratch with :func:`held_by`.

What a workspace holds (``functions.domain.lifecycle`` names the states):

- its **workspace slot** in every state of ``lifecycle.HOLDS_SLOT`` (all but FAILED and
  DELETED). A PAUSED workspace keeps its slot: its home disk and snapshot still exist and
  cost money, so pausing frees accelerators, and only deleting frees a slot.
- its **accelerators** (GPUs, or TPU chips) only in ``lifecycle.HOLDS_HARDWARE``
  (PROVISIONING, RUNNING, PAUSING, RESUMING). They are released when the pause's snapshot
  finished and admitted again on resume, so a resume can be refused while the team's GPUs
  are all in use; resuming on another profile admits that profile's accelerators.
- **snapshot bytes** follow the snapshot, not the workspace: admitted when a snapshot is
  recorded (snapshot.finished, succeeded), released when it expires or is deleted.

Quotas are checked only for what a request adds: a team over a quota (an admin lowered
it) keeps what it has, and a request that needs none of the exceeded resource still goes.

**Borrowing** (Kueue's cohorts, the same rule on every runtime): a team of a cohort may go
over its own GPU or TPU quota by what the cohort's teams leave unused, at most its
``borrowing_limit``; the cohort as a whole never holds more than the sum of its quotas.
The lender gets it back by preemption: ``functions.domain.scheduling`` pauses the
borrower's workspace when the lender's request waits within the lender's own quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from functions.domain.catalog import (
    AcceleratorKind,
    Profile,
    Quotas,
    Refusal,
    RefusalReason,
    human_bytes,
)
from functions.domain.lifecycle import HOLDS_HARDWARE, HOLDS_SLOT

_WS_LIST = "see `stasis ws list`"


@dataclass(frozen=True)
class Usage:
    """What a team holds, or what a request needs (the same four counters)."""

    workspaces: int = 0
    gpus: int = 0
    tpus: int = 0
    snapshot_bytes: int = 0

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"usage {name} must be a whole number >= 0, got {value!r}")

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.workspaces + other.workspaces, self.gpus + other.gpus,
                     self.tpus + other.tpus, self.snapshot_bytes + other.snapshot_bytes)

    def as_dict(self) -> dict[str, int]:
        """The ``usage`` field of a team document."""
        return {"workspaces": self.workspaces, "gpus": self.gpus, "tpus": self.tpus,
                "snapshot_bytes": self.snapshot_bytes}

    @classmethod
    def from_dict(cls, counters: Mapping[str, Any] | None) -> Usage:
        """From a team document's ``usage``; missing counters (a new team) are zero."""
        counters = counters or {}
        return cls(*(int(counters.get(k, 0)) for k in
                     ("workspaces", "gpus", "tpus", "snapshot_bytes")))


@dataclass(frozen=True)
class Cohort:
    """What a team may borrow: its cohort's quotas and usage summed over all of its teams
    (this one included), and the team's own borrowing limits (None: no limit)."""

    name: str
    quota: Usage
    used: Usage
    limit_gpus: int | None = None
    limit_tpus: int | None = None

    def borrowable(self, plain: str) -> tuple[int, int, int | None]:
        """(cohort quota, cohort usage, the team's limit) of ``GPU`` or ``TPU``."""
        if plain == "GPU":
            return self.quota.gpus, self.used.gpus, self.limit_gpus
        return self.quota.tpus, self.used.tpus, self.limit_tpus


@dataclass(frozen=True)
class Admitted:
    """The request fits; ``usage`` is the team's usage with it included."""

    usage: Usage

    @property
    def ok(self) -> bool:
        return True


#: The outcome of :func:`admit`: branch with ``isinstance(result, Refusal)``.
Admission: TypeAlias = Admitted | Refusal


def accelerators_of(profile: Profile) -> Usage:
    """The accelerators a running workspace on ``profile`` holds (no slot): what a resume
    needs and what a finished pause gives back."""
    acc = profile.accelerator
    if acc is None:
        return Usage()
    if acc.kind == AcceleratorKind.TPU:
        return Usage(tpus=acc.count)
    return Usage(gpus=acc.count)


def demand_of(profile: Profile) -> Usage:
    """What a new workspace on ``profile`` needs: one workspace slot and its accelerators."""
    return Usage(workspaces=1) + accelerators_of(profile)


def snapshot_demand(size_bytes: int) -> Usage:
    """What recording (or, released, deleting) a snapshot of ``size_bytes`` changes."""
    return Usage(snapshot_bytes=size_bytes)


def held_by(state: str, profile: Profile) -> Usage:
    """What one workspace in ``state`` holds, snapshots aside (see the module docstring)."""
    held = Usage()
    if state in HOLDS_SLOT:
        held += Usage(workspaces=1)
    if state in HOLDS_HARDWARE:
        held += accelerators_of(profile)
    return held


def admit(quotas: Quotas, usage: Usage, demand: Usage, team_id: str, *,
          contact: str | None = None, cohort: Cohort | None = None) -> Admission:
    """``usage + demand`` if it stays within ``quotas`` (or, for GPUs and TPUs, within what
    ``cohort`` lends), else the first counter it breaks.

    Only counters the demand increases are checked. ``contact`` (the team's, see
    ``Team.who_to_ask``) is named when the team has no quota at all for what it asks.
    """
    ask = contact or "your team admin"
    if _exceeds(usage.workspaces, demand.workspaces, quotas.workspaces):
        if quotas.workspaces == 0:
            return Refusal(RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
                           f"team {team_id} may not create workspaces (quota 0): ask {ask}")
        return Refusal(RefusalReason.WORKSPACE_QUOTA_EXCEEDED,
                       f"team {team_id} has {usage.workspaces}/{quotas.workspaces} workspaces "
                       f"(paused ones count too): delete one, {_WS_LIST}")
    for reason, used, needed, limit, unit, plain in (
        (RefusalReason.GPU_QUOTA_EXCEEDED, usage.gpus, demand.gpus, quotas.gpus,
         "GPUs", "GPU"),
        (RefusalReason.TPU_QUOTA_EXCEEDED, usage.tpus, demand.tpus, quotas.tpus,
         "TPU chips", "TPU"),
    ):
        if not _exceeds(used, needed, limit):
            continue
        if cohort is not None:
            refusal = _borrow(cohort, plain, unit, reason, team_id, used, needed, limit)
            if refusal is None:
                continue
            return refusal
        if limit == 0:
            return Refusal(reason, f"team {team_id} has no {plain} quota: choose a profile "
                                   f"without {unit}, or ask {ask} for {plain} quota")
        needs = "" if used >= limit else f" and this workspace needs {needed}"
        return Refusal(reason, f"team {team_id} uses {used}/{limit} {unit}{needs}: pause or "
                               f"delete one, {_WS_LIST}")
    if _exceeds(usage.snapshot_bytes, demand.snapshot_bytes, quotas.snapshot_bytes):
        stored = f"{human_bytes(usage.snapshot_bytes)}/{human_bytes(quotas.snapshot_bytes)}"
        needs = ("" if usage.snapshot_bytes >= quotas.snapshot_bytes
                 else f" and this snapshot needs {human_bytes(demand.snapshot_bytes)}")
        return Refusal(RefusalReason.SNAPSHOT_QUOTA_EXCEEDED,
                       f"team {team_id} stores {stored} of snapshots{needs}: delete "
                       f"workspaces or snapshots you no longer need, {_WS_LIST}")
    return Admitted(usage + demand)


def _borrow(cohort: Cohort, plain: str, unit: str, reason: RefusalReason, team_id: str,
            used: int, needed: int, own: int) -> Refusal | None:
    """None if the cohort lends what ``own`` quota lacks, else why not."""
    total, in_use, limit = cohort.borrowable(plain)
    over = used + needed - own
    if limit is not None and over > limit:
        return Refusal(reason, f"team {team_id} uses {used}/{own} {unit} and may borrow at "
                               f"most {limit} from cohort {cohort.name}: pause or delete one, "
                               f"{_WS_LIST}")
    if in_use + needed > total:
        return Refusal(reason, f"team {team_id} uses {used}/{own} {unit} and cohort "
                               f"{cohort.name} has none idle to lend ({in_use}/{total} in "
                               f"use): pause or delete one, {_WS_LIST}")
    return None


def release(usage: Usage, demand: Usage) -> Usage:
    """``usage - demand``, never below zero: releasing twice (a redelivered event) or a
    counter that drifted must not make a team's usage negative."""
    return Usage(max(0, usage.workspaces - demand.workspaces), max(0, usage.gpus - demand.gpus),
                 max(0, usage.tpus - demand.tpus),
                 max(0, usage.snapshot_bytes - demand.snapshot_bytes))


def _exceeds(used: int, needed: int, limit: int) -> bool:
    return needed > 0 and used + needed > limit
