"""What each dashboard page reads and shows: a template context per page.

Each page function takes a :class:`Context` (the request's reader, the applied catalog,
``now``) and the query parameters, issues a fixed number of bounded reads through the
:class:`~functions.dashboard.reads.Reader` port, and returns plain data for its template.
No SDK here; the adapter behind the port decides how to run the queries.

Reads per page load (T teams, P profiles, S = 9 workspace states, page size N <= 200; every
page also reads ``catalog/current`` for the admin check, and a page after the first reads
its cursor's document):

========== ===================================================================
fleet      1 + S + T + P counts, the T team documents (one batched read), a page
snapshots  3T aggregations, T oldest-snapshot queries (1 doc each), two pages of N
cost       the T rollups ``costs/{team}`` (one batched read; the cost sweep writes them)
latency    P queries of at most 500 workspaces each, projected to the timings
links      4T counts, one page of N links
sandboxes  7 counts (one per state), one page of N sandboxes
audit      one page of N audit entries
========== ===================================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from events import CATALOG as EVENT_CATALOG
from functions.dashboard import charts, stats
from functions.dashboard.reads import Aggregation, Page, PageQuery, Reader, Where
from functions.domain.catalog import parse_quantity
from functions.domain.lifecycle import Reason, State
from functions.domain.redaction import redact
from functions.queries import IndexedQuery

PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
#: Latency percentiles come from the most recently updated workspaces of each profile.
LATENCY_SAMPLE = 500
EXPIRING_DAYS = 7
TIMINGS = (("first_start_ms", "First start"), ("last_pause_ms", "Pause"),
           ("last_resume_ms", "Resume"))
LINK_STATUSES = ("active", "expired", "revoked")
#: Snapshot statuses (functions/domain/retention.py) and the janitor's orphan reason.
SNAPSHOT_READY = "ready"
ORPHAN_REASON = "objects_missing"
#: Reasons worth showing next to a state; the others only restate it ("paused").
NOTEWORTHY = frozenset({Reason.SNAPSHOT_FAILED, Reason.PROVISION_FAILED, Reason.RESUME_FAILED,
                        Reason.STUCK, Reason.ADMISSION_REFUSED, Reason.DELETE_RETRIED})
_CURSOR = re.compile(r"[A-Za-z0-9._~:@+=-]{1,256}")
FLEET_FILTERS = ("team", "profile", "state", "owner")
LINK_FILTERS = ("team", "workspace", "creator")
AUDIT_FILTERS = (("actor", "actor"), ("workspace", "target"), ("action", "action"),
                 ("team", "team"))

# The pages' queries that need a composite index; ``deploy/indexes.py`` derives Terraform's
# indexes from them, and the query port refuses any other such query (functions/queries.py).
FLEET_PAGE = IndexedQuery("workspaces", optional=FLEET_FILTERS, order=(("created_at", "desc"),))
LATENCY_SAMPLES = IndexedQuery("workspaces", equal=("profile",), optional=("team",),
                               order=(("updated_at", "desc"),))
SNAPSHOTS_EXPIRING_COUNT = IndexedQuery("snapshots", equal=("team", "status"),
                                        ranges=("expires_at",))
SNAPSHOTS_OLDEST = IndexedQuery("snapshots", equal=("team", "status"),
                                order=(("created_at", "asc"),))
SNAPSHOTS_EXPIRING = IndexedQuery("snapshots", equal=("status",), optional=("team",),
                                  ranges=("expires_at",), order=(("expires_at", "asc"),))
SNAPSHOTS_ORPHANS = IndexedQuery("snapshots", equal=("expired_reason",), optional=("team",),
                                 order=(("expired_at", "desc"),))
LINKS_UNREVOKED_COUNT = IndexedQuery("links", equal=("team", "revoked_at"),
                                     ranges=("expires_at",))
LINKS_REVOKED_COUNT = IndexedQuery("links", equal=("team",), ranges=("revoked_at",))
LINKS_ACTIVE = IndexedQuery("links", equal=("revoked_at",), optional=LINK_FILTERS,
                            ranges=("expires_at",), order=(("expires_at", "asc"),))
LINKS_EXPIRED = IndexedQuery("links", equal=("revoked_at",), optional=LINK_FILTERS,
                             ranges=("expires_at",), order=(("expires_at", "desc"),))
LINKS_REVOKED = IndexedQuery("links", optional=LINK_FILTERS, ranges=("revoked_at",),
                             order=(("revoked_at", "desc"),))
LINKS_PAGE = IndexedQuery("links", optional=LINK_FILTERS, order=(("created_at", "desc"),))
SANDBOXES_PAGE = IndexedQuery("sandboxes", optional=("team", "state"),
                              order=(("requested_at", "desc"),))
AUDIT_PAGE = IndexedQuery("audit", optional=tuple(f for _, f in AUDIT_FILTERS),
                          order=(("time", "desc"),))
QUERIES = (FLEET_PAGE, LATENCY_SAMPLES, SNAPSHOTS_EXPIRING_COUNT, SNAPSHOTS_OLDEST,
           SNAPSHOTS_EXPIRING, SNAPSHOTS_ORPHANS, LINKS_UNREVOKED_COUNT, LINKS_REVOKED_COUNT,
           LINKS_ACTIVE, LINKS_EXPIRED, LINKS_REVOKED, LINKS_PAGE, SANDBOXES_PAGE, AUDIT_PAGE)


class BadRequest(ValueError):
    """A query parameter the page cannot use; the message says which and why."""


class NotYours(BadRequest):
    """A team the viewer is not an admin of (403)."""


@dataclass(frozen=True)
class Context:
    reader: Reader
    catalog: Mapping[str, Any]
    now: datetime
    #: Builds a URL of this dashboard: ``url("fleet", team="ml-a")``.
    url: Callable[..., str]
    #: The teams the viewer may see (``access.Verdict.teams``): None for every team.
    visible: frozenset[str] | None = frozenset()

    @property
    def teams(self) -> list[Mapping[str, Any]]:
        """The catalog's teams the viewer may see."""
        return [t for t in self.catalog.get("teams") or [] if isinstance(t, Mapping)
                and (self.visible is None or t.get("id") in self.visible)]

    @property
    def team_ids(self) -> list[str]:
        return [str(t["id"]) for t in self.teams if "id" in t]

    @property
    def profiles(self) -> list[Mapping[str, Any]]:
        return [p for p in self.catalog.get("profiles") or [] if isinstance(p, Mapping)]

    @property
    def profile_ids(self) -> list[str]:
        return [str(p["id"]) for p in self.profiles if "id" in p]


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def _text(params: Mapping[str, str], name: str, limit: int = 200) -> str | None:
    value = (params.get(name) or "").strip()
    if len(value) > limit:
        raise BadRequest(f"{name} is longer than {limit} characters")
    return value or None


def _cursor(params: Mapping[str, str]) -> str | None:
    value = (params.get("cursor") or "").strip()
    if not value:
        return None
    if not _CURSOR.fullmatch(value) or value in (".", ".."):
        raise BadRequest("cursor is not a document id: follow the page's 'Next' link")
    return value


def _size(params: Mapping[str, str]) -> int:
    raw = (params.get("size") or "").strip()
    if not raw:
        return DEFAULT_PAGE_SIZE
    if not raw.isdigit() or int(raw) not in PAGE_SIZES:
        raise BadRequest(f"size must be one of {', '.join(map(str, PAGE_SIZES))}")
    return int(raw)


def _choice(params: Mapping[str, str], name: str, allowed: Sequence[str]) -> str | None:
    value = _text(params, name)
    if value is not None and value not in allowed:
        raise BadRequest(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _pager(ctx: Context, page_name: str, params: Mapping[str, str], page: Page,
           keep: Sequence[str]) -> dict[str, Any]:
    """Links to the first and the next page, keeping the filters ``keep``."""
    kept = {k: params[k] for k in keep if params.get(k)}
    number = int(params["page"]) if (params.get("page") or "").isdigit() else 1
    return {
        "number": number,
        "first": ctx.url(page_name, **kept) if params.get("cursor") else None,
        "next": (ctx.url(page_name, **kept, cursor=page.cursor, page=str(number + 1))
                 if page.cursor else None),
    }


#: Firestore's limit on the values of one ``in`` filter.
MAX_IN = 30


def _team_scope(ctx: Context, team: str | None) -> Where:
    """The team filter every read of a page carries: the chosen team, which must be one the
    viewer may see, else all the viewer may see (no filter for a platform admin)."""
    if team is not None:
        if ctx.visible is not None and team not in ctx.visible:
            raise NotYours(f"team {team} is not one of yours: you are an admin of "
                           f"{', '.join(sorted(ctx.visible))}")
        return (("team", "==", team),)
    if ctx.visible is None:
        return ()
    if len(ctx.visible) > MAX_IN:
        raise BadRequest(f"you are an admin of {len(ctx.visible)} teams: choose one (team=)")
    return (("team", "in", sorted(ctx.visible)),)


def _count(result: Mapping[str, float]) -> int:
    return int(result.get("count", 0))


# --------------------------------------------------------------------------------------------
# Fleet
# --------------------------------------------------------------------------------------------


def fleet(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """Workspaces by state, team and profile (counts under the other filters), each team's
    usage against its quotas, and one page of workspaces, newest first."""
    states = [str(s) for s in State]
    chosen = {"team": _text(params, "team"), "profile": _text(params, "profile"),
              "state": _choice(params, "state", states), "owner": _text(params, "owner")}
    size, cursor = _size(params), _cursor(params)
    where: Where = (*_team_scope(ctx, chosen["team"]),
                    *((k, "==", v) for k, v in chosen.items() if v and k != "team"))

    def without(dimension: str) -> Where:
        return tuple(w for w in where if w[0] != dimension)

    dims = {"state": states, "team": ctx.team_ids, "profile": ctx.profile_ids}
    aggs = [Aggregation("workspaces", where)]
    for dim, values in dims.items():
        aggs += [Aggregation("workspaces", (*without(dim), (dim, "==", v))) for v in values]
    results = iter(ctx.reader.aggregate(aggs))
    total = _count(next(results))
    facets: dict[str, list[dict[str, Any]]] = {}
    for dim, values in dims.items():
        others = {k: v for k, v in chosen.items() if v and k != dim}
        if params.get("size"):
            others["size"] = str(size)
        facets[dim] = [{"value": v, "count": _count(next(results)),
                        "selected": chosen[dim] == v, "url": ctx.url("fleet", **others, **{dim: v})}
                       for v in values]
        facets[dim].insert(0, {"value": "all", "count": None, "selected": not chosen[dim],
                               "url": ctx.url("fleet", **others)})
    page = ctx.reader.page(PageQuery.of(FLEET_PAGE, where, size, cursor))
    rows = [_workspace_row(doc, ctx.now) for doc in page.docs]
    team_docs = ctx.reader.documents("teams", ctx.team_ids)
    team_usage = [_team_usage(ctx, team, team_docs.get(str(team["id"])) or {})
                  for team in ctx.teams if "id" in team]
    state_chart = charts.bars(
        "Workspaces by state" + (" (filtered)" if where else ""),
        [charts.Bar(f["value"], f["count"], f"{f['count']:,}") for f in facets["state"][1:]
         if f["count"]], fmt=lambda v: f"{v:g}")
    return {"title": "Fleet", "filters": chosen, "total": total, "facets": facets,
            "rows": rows, "pager": _pager(ctx, "fleet", params, page, (*FLEET_FILTERS, "size")),
            "teams": team_usage, "chart": state_chart, "size": size,
            "states": states, "team_ids": ctx.team_ids, "profile_ids": ctx.profile_ids}


def _workspace_row(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    created = stats.aware(doc.get("created_at"))
    return {
        "id": doc.get("id"), "name": doc.get("name"), "team": doc.get("team"),
        "owner": doc.get("owner"), "profile": doc.get("profile"), "state": doc.get("state"),
        "reason": doc.get("state_reason") if doc.get("state_reason") in NOTEWORTHY else "",
        "message": doc.get("state_message") or "",
        "created": stats.when(created), "age": stats.span(now - created) if created else "",
        "last_activity": stats.ago(doc.get("last_activity"), now),
        "snapshot": doc.get("current_snapshot") or "",
        "first_start": stats.seconds_ms(doc.get("first_start_ms")),
        "last_pause": stats.seconds_ms(doc.get("last_pause_ms")),
        "last_resume": stats.seconds_ms(doc.get("last_resume_ms")),
        "pause_cause": doc.get("pause_cause") or "",
    }


def _team_usage(ctx: Context, team: Mapping[str, Any], doc: Mapping[str, Any]
                ) -> dict[str, Any]:
    usage = doc.get("usage") or {}
    quotas = team.get("quotas") or {}
    try:
        snapshot_quota: int | None = parse_quantity(str(quotas.get("snapshot_bytes")))
    except ValueError:
        snapshot_quota = None
    return {"id": team["id"], "title": team.get("title", ""),
            "workspaces": usage.get("workspaces", 0), "workspaces_quota": quotas.get("workspaces"),
            "gpus": usage.get("gpus", 0), "gpus_quota": quotas.get("gpus"),
            "tpus": usage.get("tpus", 0), "tpus_quota": quotas.get("tpus"),
            "snapshot_bytes": stats.size(usage.get("snapshot_bytes", 0)),
            "snapshot_quota": stats.size(snapshot_quota) if snapshot_quota is not None else "",
            "url": ctx.url("fleet", team=str(team["id"]))}


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


def snapshots(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """Per team: live bytes and count, oldest, expiring soon, orphans the janitor found;
    then the snapshots expiring soonest and the janitor's orphans, paginated."""
    team = _text(params, "team")
    days_raw = (params.get("days") or str(EXPIRING_DAYS)).strip()
    if not days_raw.isdigit() or not 1 <= int(days_raw) <= 365:
        raise BadRequest("days must be a whole number of days between 1 and 365")
    days = int(days_raw)
    horizon = ctx.now + timedelta(days=days)
    size, cursor = _size(params), _cursor(params)
    teams = ctx.team_ids
    aggs: list[Aggregation] = []
    for t in teams:
        live: Where = (("team", "==", t), ("status", "==", SNAPSHOT_READY))
        aggs += [Aggregation("snapshots", live, sums=("bytes",)),
                 Aggregation.of(SNAPSHOTS_EXPIRING_COUNT, (*live, ("expires_at", "<=", horizon))),
                 Aggregation("snapshots", (("team", "==", t), ("expired_reason", "==",
                                                               ORPHAN_REASON)))]
    results = ctx.reader.aggregate(aggs)
    quotas = {str(t["id"]): (t.get("quotas") or {}).get("snapshot_bytes") for t in ctx.teams}
    per_team: list[dict[str, Any]] = []
    for i, t in enumerate(teams):
        live_r, expiring_r, orphan_r = results[3 * i: 3 * i + 3]
        oldest = ctx.reader.page(PageQuery.of(
            SNAPSHOTS_OLDEST, (("team", "==", t), ("status", "==", SNAPSHOT_READY)), 1)).docs
        total_bytes = int(live_r.get("sum:bytes", 0))
        per_team.append({
            "team": t, "count": _count(live_r), "bytes": total_bytes,
            "size": stats.size(total_bytes),
            "quota": _quota_text(quotas.get(t)),
            "oldest": stats.when(oldest[0].get("created_at")) if oldest else "",
            "oldest_age": stats.ago(oldest[0].get("created_at"), ctx.now) if oldest else "",
            "oldest_id": oldest[0]["id"] if oldest else "",
            "expiring": _count(expiring_r), "orphans": _count(orphan_r),
            "url": ctx.url("snapshots", team=t, days=str(days)),
        })
    scope = _team_scope(ctx, team)
    expiring = ctx.reader.page(PageQuery.of(
        SNAPSHOTS_EXPIRING,
        (*scope, ("status", "==", SNAPSHOT_READY), ("expires_at", "<=", horizon)), size, cursor))
    orphans = ctx.reader.page(PageQuery.of(
        SNAPSHOTS_ORPHANS, (*scope, ("expired_reason", "==", ORPHAN_REASON)), 25))
    chart = charts.bars("Live snapshot storage per team (GiB)",
                        [charts.Bar(r["team"], r["bytes"] / 2**30, r["size"]) for r in per_team],
                        fmt=lambda v: f"{v:g}")
    return {"title": "Snapshots", "team": team, "days": days, "per_team": per_team,
            "chart": chart, "team_ids": teams,
            "expiring": [_snapshot_row(d, ctx.now) for d in expiring.docs],
            "pager": _pager(ctx, "snapshots", params, expiring, ("team", "days", "size")),
            "orphans": [_snapshot_row(d, ctx.now) for d in orphans.docs],
            "orphans_more": orphans.cursor is not None}


def _quota_text(raw: Any) -> str:
    try:
        return stats.size(parse_quantity(str(raw))) if raw is not None else ""
    except ValueError:
        return str(raw)


def _snapshot_row(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    return {"id": doc.get("id"), "workspace": doc.get("workspace"), "team": doc.get("team"),
            "owner": doc.get("owner") or "", "profile": doc.get("profile") or "",
            "bytes": stats.size(doc.get("bytes")), "method": doc.get("method") or "",
            "status": doc.get("status") or "", "created": stats.when(doc.get("created_at")),
            "expires": stats.when(doc.get("expires_at")),
            "expires_in": stats.until(doc.get("expires_at"), now),
            "reason": doc.get("expired_reason") or "",
            "found": stats.when(doc.get("expired_at"))}


# --------------------------------------------------------------------------------------------
# Cost
# --------------------------------------------------------------------------------------------


def cost(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """Each team's rollup document ``costs/{team}`` (functions/domain/cost.py computes it:
    month to date, the rate now, the month's forecast, what auto-pause saved)."""
    rows, missing, top = [], [], []
    docs = ctx.reader.documents("costs", ctx.team_ids)
    for t in ctx.team_ids:
        doc = docs.get(t)
        if doc is None:
            missing.append(t)
            continue
        compute, disk = doc.get("compute") or {}, doc.get("disk") or {}
        snaps, auto = doc.get("snapshots") or {}, doc.get("auto_pause") or {}
        total = doc.get("total") or {}
        rows.append({
            "team": t, "month": doc.get("month", ""),
            "computed": stats.ago(doc.get("computed_at"), ctx.now),
            "compute_hours": stats.number(compute.get("hours")),
            "gpu_hours": stats.number(compute.get("gpu_hours")),
            "running_now": compute.get("running_now", 0),
            "per_hour_now": stats.usd(compute.get("cost_per_hour_now")),
            "compute_cost": stats.usd(compute.get("cost")),
            "disk_cost": stats.usd(disk.get("cost")),
            "disk_now": stats.size(disk.get("bytes_now")),
            "snapshot_cost": stats.usd(snaps.get("cost")),
            "snapshot_now": stats.size(snaps.get("bytes_now")),
            "total_cost": stats.usd(total.get("cost")),
            "forecast": stats.usd(total.get("forecast_cost")),
            "gpu_hours_saved": stats.number(auto.get("gpu_hours_saved")),
            "hours_saved": stats.number(auto.get("hours_saved")),
            "cost_saved": stats.usd(auto.get("cost_saved")),
            "auto_pauses": auto.get("pauses", 0), "paused_now": auto.get("paused_now", 0),
            "parts": (float(compute.get("forecast_cost") or 0),
                      float(disk.get("forecast_cost") or 0),
                      float(snaps.get("forecast_cost") or 0)),
            "forecast_value": float(total.get("forecast_cost") or 0),
        })
        for ws in doc.get("workspaces") or []:
            if isinstance(ws, Mapping):
                top.append({**ws, "team": t})
    top.sort(key=lambda w: (-float(w.get("cost") or 0), str(w.get("id"))))
    chart = charts.stacked_bars(
        "Forecast for the month per team (USD)", ("compute", "disk", "snapshots"),
        [charts.Stack(r["team"], r["parts"], r["forecast"]) for r in rows],
        fmt=lambda v: f"${v:,.0f}")
    return {"title": "Cost", "rows": rows, "missing": missing, "chart": chart,
            "top": [{**w, "cost_text": stats.usd(w.get("cost")),
                     "gpu_hours_text": stats.number(w.get("gpu_hours")),
                     "hours_text": stats.number(w.get("compute_hours")),
                     "saved_text": stats.number(w.get("hours_saved"))} for w in top[:15]],
            "totals": {"forecast": stats.usd(sum(r["forecast_value"] for r in rows))},
            "every_team": ctx.visible is None}


# --------------------------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------------------------


def latency(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """p50 and p95 of first start, pause and resume per profile, from the timing fields of
    the latest :data:`LATENCY_SAMPLE` workspaces (by ``updated_at``) of each profile."""
    team = _text(params, "team")
    scope = _team_scope(ctx, team)
    fields = tuple(f for f, _ in TIMINGS)
    samples: dict[str, dict[str, list[float]]] = {}
    truncated = []
    for p in ctx.profile_ids:
        page = ctx.reader.page(PageQuery.of(LATENCY_SAMPLES, (*scope, ("profile", "==", p)),
                                            LATENCY_SAMPLE, fields=fields))
        if page.cursor is not None:
            truncated.append(p)
        samples[p] = {f: [float(d[f]) for d in page.docs
                          if isinstance(d.get(f), int | float) and not isinstance(d[f], bool)]
                      for f in fields}
    metrics = []
    for field_name, label in TIMINGS:
        rows: list[dict[str, Any]] = []
        for p in ctx.profile_ids:
            values = samples[p][field_name]
            rows.append({"profile": p, "n": len(values),
                         "p50": stats.percentile(values, 50), "p95": stats.percentile(values, 95),
                         "max": max(values) if values else None})
        chart = charts.distributions(
            f"{label} per profile (seconds)",
            [charts.Distribution(r["profile"], tuple(samples[r["profile"]][field_name]),
                                 r["p50"], r["p95"]) for r in rows],
            fmt=lambda v: f"{v / 1000:.1f} s" if v < 10_000 else f"{v / 1000:.0f} s")
        metrics.append({"field": field_name, "label": label, "chart": chart, "rows": [
            {**r, "p50_text": stats.seconds_ms(r["p50"]), "p95_text": stats.seconds_ms(r["p95"]),
             "max_text": stats.seconds_ms(r["max"])} for r in rows]})
    return {"title": "Latency", "team": team, "team_ids": ctx.team_ids, "metrics": metrics,
            "sample": LATENCY_SAMPLE, "truncated": truncated}


# --------------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------------


def links(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """Link counts per team (active, expired, revoked) and one page of links."""
    status = _choice(params, "status", LINK_STATUSES)
    team, workspace = _text(params, "team"), _text(params, "workspace")
    creator = _text(params, "creator")
    size, cursor = _size(params), _cursor(params)
    now = ctx.now
    aggs = []
    for t in ctx.team_ids:
        unrevoked: Where = (("team", "==", t), ("revoked_at", "==", None))
        aggs += [Aggregation.of(LINKS_UNREVOKED_COUNT, (*unrevoked, ("expires_at", ">", now))),
                 Aggregation.of(LINKS_UNREVOKED_COUNT, (*unrevoked, ("expires_at", "<=", now))),
                 Aggregation.of(LINKS_REVOKED_COUNT, (("team", "==", t),
                                                      ("revoked_at", "!=", None))),
                 Aggregation("links", (("team", "==", t),), sums=("uses",))]
    results = ctx.reader.aggregate(aggs)
    per_team = []
    for i, t in enumerate(ctx.team_ids):
        active, expired, revoked, every = results[4 * i: 4 * i + 4]
        per_team.append({"team": t, "active": _count(active), "expired": _count(expired),
                         "revoked": _count(revoked), "total": _count(every),
                         "uses": int(every.get("sum:uses", 0))})
    where: Where = (*_team_scope(ctx, team),
                    *((k, "==", v) for k, v in (("workspace", workspace), ("creator", creator))
                      if v))
    declared = LINKS_PAGE
    if status == "active":
        where, declared = (*where, ("revoked_at", "==", None), ("expires_at", ">", now)), \
            LINKS_ACTIVE
    elif status == "expired":
        where, declared = (*where, ("revoked_at", "==", None), ("expires_at", "<=", now)), \
            LINKS_EXPIRED
    elif status == "revoked":
        where, declared = (*where, ("revoked_at", "!=", None)), LINKS_REVOKED
    page = ctx.reader.page(PageQuery.of(declared, where, size, cursor))
    rows = [_link_row(d, now) for d in page.docs]
    return {"title": "Links", "per_team": per_team, "rows": rows, "status": status,
            "filters": {"team": team, "workspace": workspace, "creator": creator},
            "statuses": LINK_STATUSES, "team_ids": ctx.team_ids,
            "pager": _pager(ctx, "links", params, page,
                            ("status", "team", "workspace", "creator", "size"))}


def _link_row(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    expires = stats.aware(doc.get("expires_at"))
    if doc.get("revoked_at") is not None:
        status = "revoked"
    elif expires is not None and now >= expires:
        status = "expired"
    else:
        status = "active"
    return {"link_id": doc.get("link_id") or str(doc.get("id", ""))[:12],
            "workspace": doc.get("workspace"), "team": doc.get("team"),
            "creator": doc.get("creator"), "scope": doc.get("scope"), "status": status,
            "created": stats.when(doc.get("created_at")),
            "expires": stats.until(doc.get("expires_at"), now),
            "revoked": stats.when(doc.get("revoked_at")),
            "revoked_by": doc.get("revoked_by") or "", "uses": int(doc.get("uses") or 0),
            "last_used": stats.ago(doc.get("last_used_at"), now) or "never"}


# --------------------------------------------------------------------------------------------
# Sandboxes
# --------------------------------------------------------------------------------------------


SANDBOX_STATES = ("QUEUED", "RUNNING", "SUSPENDED", "SUCCEEDED", "FAILED", "TIMED_OUT",
                  "KILLED")


def sandboxes(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """``sandboxes/{id}`` documents (functions/domain/sandboxes.py), newest request first,
    with counts per state; an empty page until sandboxes exist."""
    team = _text(params, "team")
    state = _choice(params, "state", SANDBOX_STATES)
    size, cursor = _size(params), _cursor(params)
    scope = _team_scope(ctx, team)
    results = ctx.reader.aggregate([Aggregation("sandboxes", (*scope, ("state", "==", s)))
                                    for s in SANDBOX_STATES])
    counts: list[dict[str, Any]] = [{"state": s, "count": _count(r), "selected": state == s,
               "url": ctx.url("sandboxes", team=team, state=s)}
              for s, r in zip(SANDBOX_STATES, results, strict=True)]
    where: Where = (*scope, ("state", "==", state)) if state else scope
    page = ctx.reader.page(PageQuery.of(SANDBOXES_PAGE, where, size, cursor))
    rows = []
    for d in page.docs:
        limits = d.get("limits") or {}
        rows.append({
            "id": d.get("id"), "team": d.get("team"), "requester": d.get("requester") or "",
            "state": d.get("state") or "", "reason": d.get("termination") or "",
            "position": d.get("queue_position"), "command": redact(d.get("command")),
            "repository": redact(d.get("repository")), "base_ref": d.get("base_ref") or "",
            "requested": stats.ago(d.get("requested_at"), ctx.now),
            "duration": stats.seconds_ms(d.get("duration_ms")) if d.get("duration_ms") else "",
            "exit_status": "" if d.get("exit_status") is None else d.get("exit_status"),
            "patch": (f"{stats.size(d.get('patch_bytes') or 0)}, "
                      f"{len(d.get('files_changed') or [])} files"
                      if d.get("patch_uri") else ""),
            "limits": (f"{limits.get('cpu_seconds', '?')} CPU s, "
                       f"{stats.size(limits.get('memory_bytes'))}, "
                       f"{limits.get('wall_clock_seconds', '?')} s"
                       + (f", {stats.size(limits['disk_bytes'])} disk"
                          if limits.get("disk_bytes") else "") if limits else ""),
            "message": redact(d.get("message") or d.get("error")),
            "suspended": (stats.ago(d.get("suspended_at"), ctx.now)
                          if d.get("state") == "SUSPENDED" else "")})
    return {"title": "Sandboxes", "team": team, "state": state, "team_ids": ctx.team_ids,
            "states": SANDBOX_STATES, "counts": counts,
            "total": sum(int(c["count"]) for c in counts), "rows": rows,
            "pager": _pager(ctx, "sandboxes", params, page, ("team", "state", "size"))}


# --------------------------------------------------------------------------------------------
# Audit
# --------------------------------------------------------------------------------------------

def audit(ctx: Context, params: Mapping[str, str]) -> dict[str, Any]:
    """The audit log, newest first, filtered by actor, workspace (the entry's target),
    action and team (exact matches: Firestore has no substring search)."""
    chosen = {name: _text(params, name) for name, _ in AUDIT_FILTERS}
    size, cursor = _size(params), _cursor(params)
    where: Where = (*_team_scope(ctx, chosen["team"]),
                    *((field, "==", chosen[name]) for name, field in AUDIT_FILTERS
                      if chosen[name] and name != "team"))
    page = ctx.reader.page(PageQuery.of(AUDIT_PAGE, where, size, cursor))
    rows = [{"time": stats.when(d.get("time")), "ago": stats.ago(d.get("time"), ctx.now),
             "actor": d.get("actor") or "", "action": d.get("action") or "",
             "target": d.get("target") or "", "team": d.get("team") or "",
             "outcome": d.get("outcome") or "", "message": redact(d.get("message")),
             "event_id": d.get("event_id") or "", "requestid": d.get("requestid") or "",
             "actor_url": ctx.url("audit", actor=str(d.get("actor") or "")),
             "target_url": ctx.url("audit", workspace=str(d.get("target") or ""))}
            for d in page.docs]
    return {"title": "Audit log", "filters": chosen, "rows": rows, "team_ids": ctx.team_ids,
            "actions": sorted({*EVENT_CATALOG, "admin.apply"}),
            "pager": _pager(ctx, "audit", params, page,
                            (*(n for n, _ in AUDIT_FILTERS), "size"))}


PAGES: dict[str, Callable[[Context, Mapping[str, str]], dict[str, Any]]] = {
    "fleet": fleet, "snapshots": snapshots, "cost": cost, "latency": latency,
    "links": links, "sandboxes": sandboxes, "audit": audit,
}


def query_string(**params: str | None) -> str:
    """``?a=1&b=2`` of the non-empty parameters (empty string for none)."""
    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else ""
