"""Who gets the accelerators when there are not enough: the queue, priorities, borrowing
and preemption by pause. Pure: the caller passes what waits, what holds, the teams' quotas
and usage, the nodes' capacity and ``now``; nothing here reads or writes anything.

**Capacity** is counted per node and accelerator type (:class:`Node`): the local runtime's
node reports what its host has (``nvidia-smi``), and the admin file may *declare* a node's
accelerators (``nodes``), which replace what was detected of those types, so
queueing, priorities and preemption run end to end on a machine without GPUs.
:func:`nodes_of` merges the two. Where the runtime reports no node (a cluster, where Kueue
admits), only the teams' quotas are counted here.

**The queue**: a create or resume that does not fit its team's quota (borrowing included,
``functions.domain.quota``) or any node becomes QUEUED (``functions.domain.lifecycle``),
unless its profile says ``when_full: refuse``. :func:`plan` looks at every QUEUED request
in order -- higher priority first, then the oldest -- and:

1. fails a request that waited past its profile's ``max_wait_seconds`` (:class:`Expire`);
2. starts one that fits its team's quota and a node (:class:`Admit`, placed on the node
   with the least room that fits: big requests keep their chance); a request that does
   not fit does not hold back smaller ones behind it (Kueue's BestEffortFIFO);
3. otherwise, for the first ``heads`` blocked requests of each accelerator type, looks for
   **preemption by pause** (:class:`Preempt`): RUNNING workspaces of a lower priority (or,
   when a lender needs its own quota back, the borrowers' workspaces of any priority)
   whose accelerators would let it fit. They are chosen lowest priority first, idle before
   busy, the most recently started first (the least work to bring back). A busy kernel is
   never preempted unless its profile says ``preempt_busy_after_seconds``: then its owner
   is warned first (:class:`Warn`) and it is paused that long after the warning. Paused
   with its live state, the victim's resume is queued (the lifecycle does that) and its
   owner is told which request took its accelerators. Accelerators being freed for a
   request (its victims still PAUSING) are not taken twice;
4. says why every other request still waits, and where it stands (:class:`Wait`).

:func:`estimates` says, for people, when each waiting request may start: when enough of
the workspaces holding its accelerator type would be paused by their idle policy
(:func:`expected_release`) if they stayed idle from now on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.domain import idle, quota
from functions.domain.catalog import (
    AcceleratorKind,
    Catalog,
    DeclaredNode,
    IdleEffect,
    IdlePolicy,
    Profile,
    Quotas,
    Refusal,
    accelerator_kind,
    accelerator_matches,
)
from functions.domain.lifecycle import State, Workspace

#: How many blocked requests of one accelerator type may look for victims in one plan:
#: the plan runs again when their victims have paused, so the rest waits its turn.
PREEMPTION_HEADS = 4
#: A warning before a busy kernel is preempted stays good for this many grace periods.
WARNING_VALID_GRACES = 2


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One node's accelerators by type: in all (``accelerators``) and, of those, how many
    the admin declared (``declared``: no device behind them)."""

    id: str
    accelerators: Mapping[str, int]
    declared: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Demand:
    """The accelerators one workspace holds while it runs."""

    accelerator: str
    count: int

    @property
    def kind(self) -> AcceleratorKind:
        return accelerator_kind(self.accelerator)

    def usage(self) -> quota.Usage:
        if self.kind == AcceleratorKind.TPU:
            return quota.Usage(tpus=self.count)
        return quota.Usage(gpus=self.count)

    def __str__(self) -> str:
        return f"{self.count} x {self.accelerator}"


@dataclass(frozen=True)
class Waiting:
    """A QUEUED request."""

    workspace_id: str
    team: str
    version: int
    priority: int
    priority_class: str
    queued_at: datetime
    demand: Demand | None
    max_wait_seconds: int | None = None
    queued_for: str = "create"
    #: Waiting in the cluster's own queue (Kueue), which admits it: only its maximum wait
    #: is the plan's business.
    in_cluster: str | None = None


@dataclass(frozen=True)
class Holding:
    """A workspace that holds its accelerators (PROVISIONING, RUNNING, PAUSING, RESUMING)."""

    workspace_id: str
    team: str
    version: int
    priority: int
    priority_class: str
    state: str
    demand: Demand | None
    node: str | None = None
    running_since: datetime | None = None
    #: None: the runtime did not say (treated as busy: never preempted unasked).
    busy: bool | None = None
    #: The profile's ``preempt_busy_after_seconds``; None: a busy kernel is never preempted.
    busy_after_seconds: int | None = None
    warned_at: datetime | None = None
    #: The request a PAUSING workspace is being preempted for.
    preempted_by: str | None = None
    #: When its idle policy would pause it if it stayed idle from now on (estimates only).
    expected_release: datetime | None = None


@dataclass(frozen=True)
class Budget:
    """A team's GPU and TPU quotas and usage (its team document's counters)."""

    team: str
    quotas: Quotas
    used: quota.Usage
    cohort: str | None = None
    limit_gpus: int | None = None
    limit_tpus: int | None = None
    contact: str | None = None


# -- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    workspace_id: str
    version: int
    node: str | None
    message: str


@dataclass(frozen=True)
class Expire:
    workspace_id: str
    version: int
    message: str


@dataclass(frozen=True)
class Preempt:
    """Pause ``workspace_id`` (at ``version``) for ``for_workspace``; ``message`` is for its
    owner."""

    workspace_id: str
    version: int
    for_workspace: str
    message: str


@dataclass(frozen=True)
class Warn:
    """Tell the owner of a busy ``workspace_id`` that it will be paused for
    ``for_workspace`` in ``after_seconds``."""

    workspace_id: str
    version: int
    for_workspace: str
    after_seconds: int
    message: str


@dataclass(frozen=True)
class Wait:
    """Why a request still waits, and where it stands among those waiting for the same
    accelerator type (1: next)."""

    workspace_id: str
    position: int
    message: str


@dataclass
class Plan:
    admits: list[Admit] = field(default_factory=list)
    expiries: list[Expire] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    warnings: list[Warn] = field(default_factory=list)
    waits: dict[str, Wait] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.admits or self.expiries or self.preemptions or self.warnings)


# -- capacity -----------------------------------------------------------------------------------


def nodes_of(capabilities: Mapping[str, Any],
             declared: Mapping[str, DeclaredNode]) -> tuple[Node, ...] | None:
    """The nodes whose capacity the control plane counts: the runtime's node (local: one,
    named by ``capabilities["node"]``) with the accelerators the admin declared for it in
    place of what was detected of those types. None where the runtime reports no node (a
    cluster: Kueue and the autoscaler decide there)."""
    name = capabilities.get("node")
    if not isinstance(name, str) or not name:
        return None
    detected = {t: n for t, n in (capabilities.get("accelerators") or {}).items()
                if isinstance(t, str) and isinstance(n, int) and n > 0}
    extra = declared.get(name)
    said = dict(extra.accelerators) if extra is not None else {}
    kept = {t: n for t, n in detected.items()
            if not any(accelerator_matches(d, t) for d in said)}
    return (Node(name, {**kept, **{t: n for t, n in said.items() if n > 0}},
                 {t: n for t, n in said.items() if n > 0}),)


def with_declared(capabilities: Mapping[str, Any],
                  declared: Mapping[str, DeclaredNode]) -> dict[str, Any]:
    """The runtime's capabilities with its node's declared accelerators in, so the catalog's
    hardware check (``check_hardware``) accepts a profile a declaration covers."""
    nodes = nodes_of(capabilities, declared)
    if not nodes:
        return dict(capabilities)
    return {**capabilities, "accelerators": dict(nodes[0].accelerators),
            "declared_accelerators": dict(nodes[0].declared)}


def demand_of(profile: Profile | None) -> Demand | None:
    acc = profile.accelerator if profile is not None else None
    return Demand(acc.type, acc.count) if acc is not None else None


def node_key(node: Node, accelerator: str) -> str | None:
    """The node's name for ``accelerator`` (declared names are the catalog's; detected ones
    ``nvidia-smi``'s)."""
    if accelerator in node.accelerators:
        return accelerator
    return next((t for t in node.accelerators if accelerator_matches(accelerator, t)), None)


def free_on(node: Node, used: Mapping[str, int], demand: Demand) -> int:
    """How many of ``demand``'s accelerator type are free on ``node``, ``used`` being the
    node's usage counters (by the node's names)."""
    key = node_key(node, demand.accelerator)
    if key is None:
        return 0
    return max(0, node.accelerators[key] - int(used.get(key, 0)))


def place(nodes: Iterable[Node], used: Mapping[str, Mapping[str, int]],
          demand: Demand) -> Node | None:
    """The node with the least room that still fits ``demand`` (best fit), or None."""
    best: tuple[int, str, Node] | None = None
    for node in nodes:
        room = free_on(node, used.get(node.id, {}), demand)
        if room >= demand.count and (best is None or (room, node.id) < best[:2]):
            best = (room, node.id, node)
    return best[2] if best else None


def capacity_refusal(nodes: Iterable[Node], used: Mapping[str, Mapping[str, int]],
                     demand: Demand) -> str:
    """Why no node fits ``demand``, in words (``used``: the nodes' usage counters)."""
    listed = list(nodes)
    holding = [Holding(f"{n.id}/{k}", "", 0, 0, "", "RUNNING", Demand(k, int(c)), node=n.id)
               for n in listed for k, c in used.get(n.id, {}).items() if int(c) > 0]
    return _Capacity(listed, holding).refusal(demand)


# -- priorities and budgets ---------------------------------------------------------------------


def cohort_of(budget: Budget, budgets: Mapping[str, Budget]) -> quota.Cohort | None:
    """What ``budget``'s team may borrow: its cohort's quotas and usage, summed."""
    if budget.cohort is None:
        return None
    members = [b for b in budgets.values() if b.cohort == budget.cohort]
    total = quota.Usage(gpus=sum(b.quotas.gpus for b in members),
                        tpus=sum(b.quotas.tpus for b in members))
    used = quota.Usage(gpus=sum(b.used.gpus for b in members),
                       tpus=sum(b.used.tpus for b in members))
    return quota.Cohort(budget.cohort, total, used, budget.limit_gpus, budget.limit_tpus)


def cohort_for(catalog: Catalog, team_id: str,
               usage_of: Callable[[str], quota.Usage]) -> quota.Cohort | None:
    """What ``team_id`` may borrow from its cohort (``usage_of``: a team's usage counters),
    or None when it has no cohort."""
    team = catalog.teams.get(team_id)
    if team is None or team.cohort is None:
        return None
    members = [t for t in catalog.teams.values() if t.cohort == team.cohort]
    used = [usage_of(t.id) for t in members]
    return quota.Cohort(team.cohort,
                        quota.Usage(gpus=sum(t.quotas.gpus for t in members),
                                    tpus=sum(t.quotas.tpus for t in members)),
                        quota.Usage(gpus=sum(u.gpus for u in used),
                                    tpus=sum(u.tpus for u in used)),
                        team.borrowing_limit.get("gpus"), team.borrowing_limit.get("tpus"))


def quota_refusal(team: str, demand: Demand, budgets: Mapping[str, Budget]) -> str | None:
    """Why ``team``'s quota (borrowing included) does not take ``demand``, or None."""
    budget = budgets.get(team)
    if budget is None:
        return None
    admitted = quota.admit(budget.quotas, budget.used, demand.usage(), team,
                           contact=budget.contact)
    if isinstance(admitted, Refusal) and budget.cohort is not None:
        # Only over its own quota does the cohort matter (and cost the sum over it).
        admitted = quota.admit(budget.quotas, budget.used, demand.usage(), team,
                               contact=budget.contact, cohort=cohort_of(budget, budgets))
    return admitted.message if isinstance(admitted, Refusal) else None


def borrowing(budget: Budget) -> bool:
    """Whether the team holds more than its own GPU or TPU quota (it borrows)."""
    return budget.used.gpus > budget.quotas.gpus or budget.used.tpus > budget.quotas.tpus


# -- the plan -----------------------------------------------------------------------------------


def queue_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Higher priority first, then the oldest, then by id (a total order)."""
    return sorted(waiting, key=lambda w: (-w.priority, w.queued_at, w.workspace_id))


def plan(waiting: Iterable[Waiting], holding: Iterable[Holding], budgets: Mapping[str, Budget],
         nodes: Iterable[Node] | None, now: datetime, *,
         heads: int = PREEMPTION_HEADS) -> Plan:
    """What to do with the queue now (see the module docstring)."""
    return _Planner(list(holding), budgets, None if nodes is None else list(nodes),
                    now, heads).run(queue_order(waiting))


class _Capacity:
    """Free accelerators per (node, the node's name for the type), as the plan simulates
    admissions and pauses, with a best-fit lookup per requested type that costs the same
    for 1 node or 1,000 (rooms are small numbers: buckets of slots by room)."""

    def __init__(self, nodes: list[Node], holding: list[Holding]) -> None:
        self.nodes = {n.id: n for n in nodes}
        self.room: dict[tuple[str, str], int] = {
            (n.id, t): c for n in nodes for t, c in n.accelerators.items()}
        for h in holding:
            slot = self.slot(h.node, h.demand)
            if slot is not None:
                self.room[slot] -= h.demand.count if h.demand else 0
        self._pools: dict[str, dict[int, dict[tuple[str, str], None]]] = {}
        self._slot_pools: dict[tuple[str, str], list[str]] = defaultdict(list)
        #: Per requested type: [in all, declared, free], kept as rooms change.
        self._totals: dict[str, list[int]] = {}

    def slot(self, node: str | None, demand: Demand | None) -> tuple[str, str] | None:
        found = self.nodes.get(node or "")
        key = node_key(found, demand.accelerator) if found and demand else None
        return (found.id, key) if found and key else None

    def _pool(self, accelerator: str) -> dict[int, dict[tuple[str, str], None]]:
        pool = self._pools.get(accelerator)
        if pool is None:
            pool = self._pools[accelerator] = defaultdict(dict)
            total = declared = free = 0
            for node in self.nodes.values():
                key = node_key(node, accelerator)
                if key is not None:
                    pool[self.room[(node.id, key)]][(node.id, key)] = None
                    self._slot_pools[(node.id, key)].append(accelerator)
                    total += node.accelerators[key]
                    declared += node.declared.get(key, 0)
                    free += max(0, self.room[(node.id, key)])
            self._totals[accelerator] = [total, declared, free]
        return pool

    def best(self, demand: Demand) -> tuple[str, str] | None:
        """Best fit: a slot with the least room that takes ``demand``."""
        pool = self._pool(demand.accelerator)
        for room in sorted(r for r, slots in pool.items() if slots and r >= demand.count):
            return next(iter(pool[room]))
        return None

    def slots(self, accelerator: str) -> list[tuple[str, str]]:
        return [slot for slots in self._pool(accelerator).values() for slot in slots]

    def take(self, slot: tuple[str, str], count: int) -> None:
        """``count`` more in use on ``slot`` (negative: freed)."""
        before = self.room[slot]
        self.room[slot] = before - count
        for accelerator in self._slot_pools.get(slot, ()):
            pool = self._pools[accelerator]
            pool[before].pop(slot, None)
            pool[self.room[slot]][slot] = None
            self._totals[accelerator][2] += max(0, self.room[slot]) - max(0, before)

    def refusal(self, demand: Demand) -> str:
        self._pool(demand.accelerator)
        total, declared, free = self._totals[demand.accelerator]
        busy = total - free
        said = f" ({declared} declared)" if declared else ""
        return f"no node has {demand} free: {busy}/{total}{said} {demand.accelerator} in use"


class _Planner:
    """One pass of :func:`plan`: the capacity and usage it simulates as it admits and
    preempts."""

    def __init__(self, holding: list[Holding], budgets: Mapping[str, Budget],
                 nodes: list[Node] | None, now: datetime, heads: int) -> None:
        self.now, self.heads = now, heads
        self.budgets: dict[str, Budget] = dict(budgets)
        self.capacity = _Capacity(nodes, holding) if nodes is not None else None
        self.victims: dict[str, list[Holding]] = defaultdict(list)  # by node ("": none)
        self.freeing: dict[str, list[Holding]] = defaultdict(list)  # by request id
        for h in holding:
            if h.state == "PAUSING" and h.preempted_by:
                self.freeing[h.preempted_by].append(h)
            elif h.state == "RUNNING" and h.demand is not None:
                self.victims[h.node or ""].append(h)
        for group in self.victims.values():
            group.sort(key=_victim_order)
        self.everyone = sorted((h for group in self.victims.values() for h in group),
                               key=_victim_order)
        self.taken: set[str] = set()
        self.result = Plan()

    def run(self, order: list[Waiting]) -> Plan:
        tried: dict[str, int] = defaultdict(int)
        pools: dict[str, list[tuple[Waiting, str]]] = defaultdict(list)
        for w in order:
            if w.max_wait_seconds is not None and \
                    self.now - w.queued_at >= timedelta(seconds=w.max_wait_seconds):
                why = (f"{w.in_cluster} did not admit it" if w.in_cluster
                       else self._blocker(w) or "it did not fit")
                self.result.expiries.append(Expire(
                    w.workspace_id, w.version,
                    f"waited {_human(self.now - w.queued_at)}, the most its profile allows "
                    f"({_human(timedelta(seconds=w.max_wait_seconds))}): {why}"))
                continue
            if w.in_cluster:
                pools[f"{w.in_cluster}:{w.demand.accelerator if w.demand else ''}"].append(
                    (w, f"waiting for {w.in_cluster} to admit it"))
                continue
            if w.demand is None:
                self.result.admits.append(Admit(w.workspace_id, w.version, None, "started"))
                continue
            blocker = self._blocker(w)
            if blocker is None:
                self._admit(w)
                continue
            pool = w.demand.accelerator
            if self.freeing.get(w.workspace_id):
                names = ", ".join(h.workspace_id for h in self.freeing[w.workspace_id])
                blocker = f"waits for {names} to finish pausing, preempted for it"
                self._reserve(w, self.freeing[w.workspace_id], None)
            elif tried[pool] < self.heads:
                tried[pool] += 1
                blocker = self._preempt(w) or blocker
            pools[pool].append((w, blocker))
        for entries in pools.values():
            for position, (w, blocker) in enumerate(entries, start=1):
                self.result.waits[w.workspace_id] = Wait(w.workspace_id, position, blocker)
        return self.result

    # -- fitting ----------------------------------------------------------------------------

    def _blocker(self, w: Waiting) -> str | None:
        if w.demand is None:
            return None
        why = quota_refusal(w.team, w.demand, self.budgets)
        if why is not None:
            return why
        if self.capacity is not None and self.capacity.best(w.demand) is None:
            return self.capacity.refusal(w.demand)
        return None

    def _admit(self, w: Waiting) -> None:
        assert w.demand is not None
        slot = self.capacity.best(w.demand) if self.capacity is not None else None
        if self.capacity is not None and slot is not None:
            self.capacity.take(slot, w.demand.count)
        self._charge(w.team, w.demand, +1)
        node = slot[0] if slot else None
        where = f" on node {node}" if node else ""
        self.result.admits.append(Admit(w.workspace_id, w.version, node,
                                        f"{w.demand} free{where}"))

    def _charge(self, team: str, demand: Demand, sign: int) -> None:
        budget = self.budgets.get(team)
        if budget is None:
            return
        delta = demand.usage()
        used = budget.used + delta if sign > 0 else quota.release(budget.used, delta)
        self.budgets[team] = _replace_used(budget, used)

    # -- preemption -------------------------------------------------------------------------

    def _eligible(self, w: Waiting, h: Holding) -> bool:
        assert w.demand is not None
        if h.workspace_id in self.taken or h.demand is None or h.demand.kind != w.demand.kind:
            return False
        if not (h.busy is False or h.busy_after_seconds is not None):
            return False  # a busy (or unknown) kernel, and its profile never preempts those
        if h.priority < w.priority:
            return True
        # Reclaim: a lender within its own quota takes back what a borrower holds.
        lender, holder = self.budgets.get(w.team), self.budgets.get(h.team)
        if lender is None or holder is None or holder.team == lender.team:
            return False
        if lender.cohort is None or holder.cohort != lender.cohort or not borrowing(holder):
            return False
        gpu = w.demand.kind == AcceleratorKind.GPU
        own = lender.quotas.gpus if gpu else lender.quotas.tpus
        used = lender.used.gpus if gpu else lender.used.tpus
        return used + w.demand.count <= own

    def _preempt(self, w: Waiting) -> str | None:
        """Choose victims that would let ``w`` fit; record them; say what ``w`` waits for."""
        assert w.demand is not None
        best: tuple[tuple[int, int], list[Holding], tuple[str, str] | None] | None = None
        slots: list[tuple[str, str] | None] = (
            list(self.capacity.slots(w.demand.accelerator)) if self.capacity is not None
            else [None])
        for slot in slots:
            chosen = self._victims_for(w, slot)
            if not chosen:
                continue
            cost = (max(h.priority for h in chosen), len(chosen))
            if best is None or cost < best[0]:
                best = (cost, chosen, slot)
        if best is None:
            return None
        _, chosen, slot = best
        self._reserve(w, chosen, slot)
        names = []
        for h in chosen:
            names.append(h.workspace_id)
            if h.busy is False or self._warning_ripe(h):
                self.result.preemptions.append(Preempt(
                    h.workspace_id, h.version, w.workspace_id,
                    f"paused with its state for {w.workspace_id} ({w.priority_class}), which "
                    f"needed {w.demand}; your resume is queued and starts when they are "
                    "free again"))
            elif h.warned_at is None or not self._warning_valid(h):
                after = int(h.busy_after_seconds or 0)
                self.result.warnings.append(Warn(
                    h.workspace_id, h.version, w.workspace_id, after,
                    f"{w.workspace_id} ({w.priority_class}) needs the {w.demand.accelerator} "
                    f"this workspace holds: it will be paused with its state in "
                    f"{_human(timedelta(seconds=after))}, or as soon as its kernels are idle"))
        return f"preempting {', '.join(names)} for it (by pause)"

    def _victims_for(self, w: Waiting, slot: tuple[str, str] | None) -> list[Holding]:
        """The eligible victims, in order, after whose pause ``w`` fits on ``slot`` and in
        its team's quota; empty if there are none such."""
        assert w.demand is not None
        chosen: list[Holding] = []
        if slot is not None and self.capacity is not None:
            room = self.capacity.room[slot]
            for h in self.victims.get(slot[0], ()):
                if room >= w.demand.count:
                    break
                if self._eligible(w, h) and self.capacity.slot(h.node, h.demand) == slot:
                    chosen.append(h)
                    room += h.demand.count if h.demand else 0
            if room < w.demand.count:
                return []
        if quota_refusal(w.team, w.demand, self.budgets) is None:
            return chosen
        # Then enough quota: more victims of w's own team or of borrowers, anywhere.
        budgets = dict(self.budgets)
        for h in chosen:
            _release_into(budgets, h)
        for h in self.everyone:
            if quota_refusal(w.team, w.demand, budgets) is None:
                break
            if h in chosen or not self._eligible(w, h):
                continue
            if h.team == w.team or borrowing(budgets.get(h.team) or _NOBODY):
                chosen.append(h)
                _release_into(budgets, h)
        return chosen if quota_refusal(w.team, w.demand, budgets) is None else []

    def _reserve(self, w: Waiting, victims: list[Holding],
                 slot: tuple[str, str] | None) -> None:
        """As if ``w`` ran and its victims were paused: nobody later counts on either."""
        assert w.demand is not None
        for h in victims:
            self.taken.add(h.workspace_id)
            if h.demand is not None:
                self._charge(h.team, h.demand, -1)
                if self.capacity is not None:
                    freed = self.capacity.slot(h.node, h.demand)
                    if freed is not None:
                        self.capacity.take(freed, -h.demand.count)
                        slot = slot or freed
        if self.capacity is not None and slot is not None:
            self.capacity.take(slot, w.demand.count)
        self._charge(w.team, w.demand, +1)

    def _warning_ripe(self, h: Holding) -> bool:
        if h.warned_at is None or h.busy_after_seconds is None or not self._warning_valid(h):
            return False
        return self.now >= h.warned_at + timedelta(seconds=h.busy_after_seconds)

    def _warning_valid(self, h: Holding) -> bool:
        grace = timedelta(seconds=h.busy_after_seconds or 0)
        assert h.warned_at is not None
        return self.now <= h.warned_at + grace * WARNING_VALID_GRACES


_NOBODY = Budget("", Quotas(0, 0, 0, 0), quota.Usage())


def _victim_order(h: Holding) -> tuple[int, int, float]:
    """Lowest priority first, idle before busy, then the most recently started."""
    since = h.running_since.timestamp() if h.running_since else 0.0
    return (h.priority, 0 if h.busy is False else 1, -since)


def _replace_used(budget: Budget, used: quota.Usage) -> Budget:
    return Budget(budget.team, budget.quotas, used, budget.cohort, budget.limit_gpus,
                  budget.limit_tpus, budget.contact)


def _release_into(budgets: dict[str, Budget], h: Holding) -> None:
    budget = budgets.get(h.team)
    if budget is not None and h.demand is not None:
        budgets[h.team] = _replace_used(budget, quota.release(budget.used, h.demand.usage()))


# -- estimates ----------------------------------------------------------------------------------


def expected_release(policy: IdlePolicy | None, running_since: datetime | None,
                     last_activity: datetime | None, now: datetime) -> datetime | None:
    """When the idle policy would pause a RUNNING workspace that stays idle from ``now``:
    its maximum age, or its first pause rule counted from its last activity. None: the
    policy never pauses it on its own."""
    if policy is None or running_since is None:
        return None
    times = []
    if policy.max_age_seconds is not None:
        times.append(running_since + timedelta(seconds=policy.max_age_seconds))
    idle_from = max(t for t in (running_since, last_activity, None) if t is not None) \
        if last_activity is not None else running_since
    idle_from = min(idle_from, now)
    for rule in policy.rules:
        if rule.effect != IdleEffect.PAUSE:
            continue
        times.append(max(idle_from + timedelta(seconds=rule.idle_seconds),
                         running_since + timedelta(seconds=rule.min_running_seconds)))
    return max(min(times), now) if times else None


def estimates(plan_: Plan, waiting: Iterable[Waiting], holding: Iterable[Holding],
              now: datetime) -> dict[str, timedelta | None]:
    """When each request still waiting in ``plan_`` may start, if the workspaces holding its
    accelerator type pause when their idle policy would, one after the other, and each
    request ahead of it of the same type goes first (None: no estimate)."""
    holders = [h for h in holding if h.demand is not None]
    releases: dict[str, list[datetime]] = {}
    ahead: dict[str, int] = defaultdict(int)
    found: dict[str, timedelta | None] = {}
    for w in queue_order(w for w in waiting if w.workspace_id in plan_.waits):
        if w.demand is None:
            found[w.workspace_id] = None
            continue
        pool = w.demand.accelerator
        if pool not in releases:
            releases[pool] = sorted(
                h.expected_release for h in holders
                if h.demand is not None and h.expected_release is not None
                and accelerator_matches(pool, h.demand.accelerator)
                for _ in range(h.demand.count))
        ahead[pool] += w.demand.count
        times = releases[pool]
        found[w.workspace_id] = (max(timedelta(0), times[ahead[pool] - 1] - now)
                                 if len(times) >= ahead[pool] else None)
    return found


def _human(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m"
    return f"{secs}s"


def human(delta: timedelta | None) -> str:
    """An estimate for people: ``about 25m``, ``within a minute``, or ``unknown``."""
    if delta is None:
        return "unknown"
    return "within a minute" if delta < timedelta(minutes=1) else f"about {_human(delta)}"


# -- the documents as the plan reads them -------------------------------------------------------


@dataclass(frozen=True)
class View:
    """What :func:`plan` reads, made from the documents."""

    waiting: list[Waiting]
    holding: list[Holding]
    budgets: dict[str, Budget]
    nodes: tuple[Node, ...] | None


def view_of(catalog: Catalog, queued: list[Workspace], holders: list[Workspace],
            teams: Mapping[str, Mapping[str, Any]], capabilities: Mapping[str, Any],
            busy: Mapping[str, bool | None], now: datetime) -> View:
    """What the plan reads, from the documents and the runtime's capabilities."""
    budgets = budgets_of(catalog, {t: quota.Usage.from_dict(doc.get("usage"))
                                   for t, doc in teams.items()})
    return View([waiting_of(catalog, ws, now) for ws in queued],
                 [holding_of(catalog, ws, busy.get(ws.id), now) for ws in holders], budgets,
                 nodes_of(capabilities, catalog.scheduling.nodes))


def waiting_of(catalog: Catalog, ws: Workspace, now: datetime) -> Waiting:
    """A QUEUED workspace as the plan sees it."""
    profile = catalog.profiles.get(ws.profile)
    return Waiting(
        ws.id, ws.team, ws.version, ws.priority, ws.priority_class or "default",
        ws.queued_at or ws.updated_at or now,
        demand_of(profile),
        profile.scheduling.max_wait_seconds if profile else None, ws.queued_for or "create",
        ws.queued_by)


def holding_of(catalog: Catalog, ws: Workspace, busy: bool | None,
               now: datetime) -> Holding:
    """A workspace holding hardware as the plan sees it (``busy``: its kernels, as the
    runtime said; None: not asked)."""
    profile = catalog.profiles.get(ws.profile)
    since = idle.running_since(ws, now) if ws.state == State.RUNNING else None
    return Holding(
        ws.id, ws.team, ws.version, ws.priority, ws.priority_class or "default",
        str(ws.state), demand_of(profile), node=ws.node, running_since=since,
        busy=busy, busy_after_seconds=(profile.scheduling.preempt_busy_after_seconds
                                       if profile else None),
        warned_at=ws.preemption_warned_at, preempted_by=ws.preempted_by,
        expected_release=expected_release(
            profile.idle_policy if profile else None, since, ws.last_activity, now))


def budgets_of(catalog: Catalog, usage: Mapping[str, quota.Usage]) -> dict[str, Budget]:
    """Every team's GPU/TPU quotas, cohort and usage counters."""
    return {t.id: Budget(t.id, t.quotas, usage.get(t.id, quota.Usage()), t.cohort,
                                    t.borrowing_limit.get("gpus"),
                                    t.borrowing_limit.get("tpus"), t.who_to_ask)
            for t in catalog.teams.values()}


@dataclass(frozen=True)
class Outlook:
    """Where a QUEUED workspace stands: its place among those waiting for the same
    accelerators (1: next), why it waits, and when it may start (None: no estimate)."""

    position: int
    message: str
    estimate: timedelta | None

    def describe(self) -> str:
        return (f"position {self.position}, start {human(self.estimate)}: "
                f"{self.message}")


def outlook_of(catalog: Catalog, queued: list[Workspace], holders: list[Workspace],
               teams: Mapping[str, Mapping[str, Any]], capabilities: Mapping[str, Any],
               wanted: set[str], now: datetime) -> dict[str, Outlook]:
    """Where each QUEUED workspace among ``wanted`` stands, from the documents the caller
    read (the QUEUED ones, those holding hardware, the teams) and the runtime's
    capabilities: a plan is made and its waits and estimates are read, nothing is done."""
    view = view_of(catalog, queued, holders, teams, capabilities, {}, now)
    found = plan(view.waiting, view.holding, view.budgets, view.nodes, now)
    eta = estimates(found, view.waiting, view.holding, now)
    return {ws_id: Outlook(w.position, w.message, eta.get(ws_id))
            for ws_id, w in found.waits.items() if ws_id in wanted}
