"""The dashboard without Firestore: pages over an in-memory reader, access rules, charts,
percentiles, the HTTP edge (identity, 403, 404, 400, headers) and the package's purity."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from functions.dashboard import access, charts, pages, stats
from functions.dashboard.reads import (
    MAX_PAGE,
    Aggregation,
    CursorGone,
    Page,
    PageQuery,
    ReadStats,
)
from functions.dashboard.web import CSP, STYLESHEET, WebDeps, handle

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


class FakeReader:
    """The Reader port over dicts, with Firestore's semantics for what the pages use:
    ``== None`` matches a present null, ranges and orders skip missing fields, a cursor
    starts after a document id (ties broken by id)."""

    def __init__(self, collections: Mapping[str, Mapping[str, dict[str, Any]]]) -> None:
        self.collections = collections
        self.stats = ReadStats()
        self.pages: list[PageQuery] = []
        self.aggregations: list[Aggregation] = []

    def _matches(self, doc: Mapping[str, Any], where: Sequence[tuple[str, str, Any]]) -> bool:
        for name, op, value in where:
            if name not in doc:
                return False
            actual = doc[name]
            if op == "==":
                ok = actual is None if value is None else actual == value
            elif op == "!=":
                ok = actual is not None if value is None else actual != value
            elif op == "in":
                ok = actual in value
            else:
                ok = actual is not None and value is not None and _OPS[op](actual, value)
            if not ok:
                return False
        return True

    def _select(self, collection: str, where: Sequence[tuple[str, str, Any]]
                ) -> list[dict[str, Any]]:
        return [{**doc, "id": doc_id} for doc_id, doc in self.collections.get(collection,
                                                                                {}).items()
                if self._matches(doc, where)]

    def document(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        self.stats.add_query(collection, 1)
        doc = self.collections.get(collection, {}).get(doc_id)
        return {**doc, "id": doc_id} if doc is not None else None

    def documents(self, collection: str, doc_ids: Sequence[str]
                  ) -> dict[str, dict[str, Any] | None]:
        return {i: self.document(collection, i) for i in doc_ids}

    def page(self, query: PageQuery) -> Page:
        self.pages.append(query)
        docs = self._select(query.collection, query.where)
        for name, _ in query.order_by:
            docs = [d for d in docs if d.get(name) is not None]
        docs.sort(key=lambda d: d["id"])
        for name, direction in reversed(query.order_by):
            docs.sort(key=lambda d, n=name: d[n], reverse=direction == "desc")
        if query.after is not None:
            ids = [d["id"] for d in docs]
            if query.after not in self.collections.get(query.collection, {}):
                raise CursorGone(query.after)
            docs = docs[ids.index(query.after) + 1:] if query.after in ids else []
        chunk = docs[:query.limit + 1]
        self.stats.add_query(query.collection, len(chunk))
        more = len(chunk) > query.limit
        chunk = chunk[:query.limit]
        if query.fields:
            chunk = [{k: v for k, v in d.items() if k in (*query.fields, "id")} for d in chunk]
        return Page(chunk, chunk[-1]["id"] if more and chunk else None)

    def aggregate(self, queries: Sequence[Aggregation]) -> list[Mapping[str, float]]:
        self.stats.aggregations += len(queries)
        self.aggregations.extend(queries)
        out = []
        for q in queries:
            docs = self._select(q.collection, q.where)
            result: dict[str, float] = {"count": len(docs)}
            for name in q.sums:
                result[f"sum:{name}"] = sum(d.get(name) or 0 for d in docs)
            out.append(result)
        return out


CATALOG = {
    "teams": [
        {"id": "ml-a", "title": "A", "quotas": {"workspaces": 10, "gpus": 4, "tpus": 8,
                                              "snapshot_bytes": "50Gi"},
         "members": [{"user": "alice", "role": "admin"}, {"user": "bob", "role": "member"},
                     {"user": "dev", "role": "admin"}]},
        {"id": "ml-b", "title": "B", "quotas": {"workspaces": 4, "gpus": 1, "tpus": 0,
                                              "snapshot_bytes": "20Gi"},
         "members": [{"user": "carol", "role": "admin"}, {"user": "vic", "role": "viewer"}]},
    ],
    "profiles": [{"id": "cpu-small"}, {"id": "gpu-small"}],
}


def _ws(team: str, name: str, state: str, profile: str, minutes: int, **extra: Any
        ) -> tuple[str, dict[str, Any]]:
    ws_id = f"{team}--{name}"
    return ws_id, {"id": ws_id, "team": team, "name": name, "owner": "alice",
                   "profile": profile, "state": state,
                   "created_at": NOW - timedelta(minutes=minutes),
                   "updated_at": NOW - timedelta(minutes=minutes // 2), **extra}


def _fleet_data() -> dict[str, dict[str, dict[str, Any]]]:
    workspaces = dict([
        _ws("ml-a", "one", "RUNNING", "cpu-small", 10, first_start_ms=1000),
        _ws("ml-a", "two", "PAUSED", "gpu-small", 20, first_start_ms=3000, last_pause_ms=500),
        _ws("ml-a", "three", "RUNNING", "gpu-small", 30, first_start_ms=5000),
        _ws("ml-b", "four", "FAILED", "cpu-small", 40),
        _ws("ml-b", "five", "RUNNING", "cpu-small", 50, first_start_ms=2000,
            last_resume_ms=700),
    ])
    snapshots = {
        "s1": {"team": "ml-a", "workspace": "ml-a--two", "status": "ready", "bytes": 2**30,
               "created_at": NOW - timedelta(days=3), "expires_at": NOW + timedelta(days=2)},
        "s2": {"team": "ml-a", "workspace": "ml-a--one", "status": "ready", "bytes": 2**29,
               "created_at": NOW - timedelta(days=1), "expires_at": NOW + timedelta(days=20)},
        "s3": {"team": "ml-b", "workspace": "ml-b--x", "status": "expired", "bytes": 10,
               "expired_reason": "objects_missing", "expired_at": NOW - timedelta(hours=1),
               "created_at": NOW - timedelta(days=9), "expires_at": NOW + timedelta(days=1)},
    }
    links = {
        "h1": {"link_id": "lnk-1", "team": "ml-a", "workspace": "ml-a--one", "creator": "alice",
               "scope": "exec", "created_at": NOW - timedelta(hours=1),
               "expires_at": NOW + timedelta(hours=1), "revoked_at": None, "uses": 5,
               "last_used_at": NOW - timedelta(minutes=3)},
        "h2": {"link_id": "lnk-2", "team": "ml-a", "workspace": "ml-a--one", "creator": "alice",
               "scope": "read", "created_at": NOW - timedelta(hours=3),
               "expires_at": NOW - timedelta(hours=1), "revoked_at": None, "uses": 0},
        "h3": {"link_id": "lnk-3", "team": "ml-b", "workspace": "ml-b--five", "creator": "carol",
               "scope": "exec", "created_at": NOW - timedelta(hours=2),
               "expires_at": NOW + timedelta(hours=1), "revoked_at": NOW - timedelta(hours=1),
               "revoked_by": "carol", "uses": 2},
    }
    audit = {f"a{i}": {"actor": "alice" if i % 2 else "carol", "action": "workspace.requested",
                       "target": "ml-a--one" if i % 3 else "ml-b--five", "team": "ml-a",
                       "outcome": "accepted: created", "time": NOW - timedelta(minutes=i)}
             for i in range(60)}
    return {"catalog": {"current": CATALOG}, "workspaces": workspaces, "snapshots": snapshots,
            "links": links, "audit": audit,
            "teams": {"ml-a": {"usage": {"workspaces": 3, "gpus": 1}}, "ml-b": {}}}


def _ctx(data: Mapping[str, Any] | None = None, visible: frozenset[str] | None = None
         ) -> tuple[pages.Context, FakeReader]:
    """A page's context as a platform admin sees it (``visible``: a team admin's teams)."""
    reader = FakeReader(data or _fleet_data())

    def url(target: str, /, **params: str | None) -> str:
        return f"/d/{target}" + pages.query_string(**params)

    return pages.Context(reader, CATALOG, NOW, url, visible), reader


# --- pages ---------------------------------------------------------------------------------


def test_fleet_counts_facets_under_the_other_filters() -> None:
    ctx, reader = _ctx()
    data = pages.fleet(ctx, {"team": "ml-a"})
    assert data["total"] == 3
    states = {f["value"]: f["count"] for f in data["facets"]["state"][1:]}
    assert states["RUNNING"] == 2 and states["PAUSED"] == 1 and states["FAILED"] == 0
    # The team facet ignores the team filter itself: it says what choosing another gives.
    assert {f["value"]: f["count"] for f in data["facets"]["team"][1:]} == {"ml-a": 3,
                                                                             "ml-b": 2}
    assert [r["id"] for r in data["rows"]] == ["ml-a--one", "ml-a--two", "ml-a--three"]
    assert data["rows"][0]["first_start"] == "1.0 s" and data["rows"][0]["age"] == "10m 0s"
    # Every page query is bounded and every count is an aggregation.
    assert all(q.limit <= MAX_PAGE for q in reader.pages)
    assert len(reader.aggregations) == 1 + 10 + 2 + 2  # total, per state, team, profile


def test_fleet_paginates_with_a_cursor() -> None:
    ctx, _ = _ctx()
    first = pages.fleet(ctx, {"size": "25"})
    assert first["pager"]["next"] is None
    small = dict(_fleet_data())
    small["workspaces"] = dict(_ws("ml-a", f"w{i:03}", "RUNNING", "cpu-small", i)
                               for i in range(60))
    ctx, _ = _ctx(small)
    one = pages.fleet(ctx, {"size": "25"})
    assert len(one["rows"]) == 25 and "cursor=ml-a--w024" in one["pager"]["next"]
    two = pages.fleet(ctx, {"size": "25", "cursor": "ml-a--w024", "page": "2"})
    three = pages.fleet(ctx, {"size": "25", "cursor": "ml-a--w049", "page": "3"})
    seen = [r["id"] for r in one["rows"] + two["rows"] + three["rows"]]
    assert len(seen) == len(set(seen)) == 60 and three["pager"]["next"] is None


@pytest.mark.parametrize("params", [{"state": "SLEEPING"}, {"size": "7"}, {"cursor": "a/b"},
                                    {"owner": "x" * 300}])
def test_fleet_refuses_bad_parameters(params: dict[str, str]) -> None:
    ctx, _ = _ctx()
    with pytest.raises(pages.BadRequest):
        pages.fleet(ctx, params)


def test_snapshots_per_team_and_orphans() -> None:
    ctx, _ = _ctx()
    data = pages.snapshots(ctx, {})
    a, b = data["per_team"]
    assert (a["count"], a["bytes"], a["expiring"], a["orphans"]) == (2, 3 * 2**29, 1, 0)
    assert a["size"] == "1.5Gi" and a["oldest_id"] == "s1"
    assert (b["count"], b["orphans"]) == (0, 1)
    assert [s["id"] for s in data["expiring"]] == ["s1"]
    assert [s["id"] for s in data["orphans"]] == ["s3"]
    assert [s["id"] for s in pages.snapshots(ctx, {"days": "30"})["expiring"]] == ["s1", "s2"]


def test_links_counts_and_status_filter() -> None:
    ctx, _ = _ctx()
    data = pages.links(ctx, {})
    a, b = data["per_team"]
    assert (a["active"], a["expired"], a["revoked"], a["total"], a["uses"]) == (1, 1, 0, 2, 5)
    assert (b["active"], b["revoked"]) == (0, 1)
    assert [r["link_id"] for r in pages.links(ctx, {"status": "revoked"})["rows"]] == ["lnk-3"]
    active = pages.links(ctx, {"status": "active"})["rows"]
    assert [(r["link_id"], r["last_used"]) for r in active] == [("lnk-1", "3m 0s ago")]


def test_audit_filters_are_exact_and_paginated() -> None:
    ctx, _ = _ctx()
    data = pages.audit(ctx, {"actor": "alice", "workspace": "ml-a--one"})
    assert all(r["actor"] == "alice" and r["target"] == "ml-a--one" for r in data["rows"])
    expected = [i for i in range(60) if i % 2 and i % 3]
    assert len(data["rows"]) == len(expected) and data["pager"]["next"] is None
    everything = pages.audit(ctx, {})
    assert len(everything["rows"]) == 50 and everything["pager"]["next"]


def test_latency_percentiles_per_profile() -> None:
    ctx, _ = _ctx()
    data = pages.latency(ctx, {})
    first = next(m for m in data["metrics"] if m["field"] == "first_start_ms")
    rows = {r["profile"]: r for r in first["rows"]}
    assert (rows["cpu-small"]["n"], rows["cpu-small"]["p50"], rows["cpu-small"]["p95"]) == (
        2, 1000, 2000)
    assert (rows["gpu-small"]["p50"], rows["gpu-small"]["p95"]) == (3000, 5000)
    assert 'data-p95="2000.0"' in first["chart"]


def test_cost_reads_the_rollups_and_says_which_are_missing() -> None:
    data = _fleet_data()
    data["costs"] = {"ml-a": {"month": "2025-06", "computed_at": NOW,
                              "compute": {"hours": 10.0, "gpu_hours": 4.0, "cost": 12.5,
                                          "forecast_cost": 40.0, "running_now": 2,
                                          "cost_per_hour_now": 0.75},
                              "disk": {"cost": 1.0, "forecast_cost": 3.0, "bytes_now": 2**34},
                              "snapshots": {"cost": 0.25, "forecast_cost": 1.0},
                              "auto_pause": {"gpu_hours_saved": 6.5, "cost_saved": 4.55},
                              "total": {"cost": 13.75, "forecast_cost": 44.0},
                              "workspaces": [{"id": "ml-a--one", "cost": 9.0}]}}
    ctx, _ = _ctx(data)
    out = pages.cost(ctx, {})
    assert out["missing"] == ["ml-b"]
    (row,) = out["rows"]
    assert (row["forecast"], row["gpu_hours_saved"], row["compute_cost"]) == (
        "$44.00", "6.5", "$12.50")
    assert out["top"][0]["id"] == "ml-a--one"


def test_sandboxes_page_is_empty_without_documents() -> None:
    ctx, _ = _ctx()
    data = pages.sandboxes(ctx, {})
    assert data["rows"] == [] and data["total"] == 0


def test_sandboxes_counts_per_state_and_filters() -> None:
    fleet = _fleet_data()
    fleet["sandboxes"] = {
        f"sbx-{i}": {"team": "ml-a" if i % 2 else "ml-b", "state": ("QUEUED", "RUNNING")[i % 2],
                     "requester": "alice", "command": "pytest", "queue_position": 1,
                     "requested_at": NOW - timedelta(minutes=i),
                     "limits": {"cpu_seconds": 60, "memory_bytes": 2**30,
                                "wall_clock_seconds": 90}} for i in range(5)}
    ctx, _ = _ctx(fleet)
    data = pages.sandboxes(ctx, {})
    assert {c["state"]: c["count"] for c in data["counts"] if c["count"]} == {"QUEUED": 3,
                                                                              "RUNNING": 2}
    assert [r["id"] for r in data["rows"]] == [f"sbx-{i}" for i in range(5)]
    assert data["rows"][0]["limits"] == "60 CPU s, 1Gi, 90 s"
    assert [r["id"] for r in pages.sandboxes(ctx, {"team": "ml-a"})["rows"]] == ["sbx-1",
                                                                                 "sbx-3"]


# --- stats and charts --------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert stats.percentile(values, 50) == 50 and stats.percentile(values, 95) == 95
    assert stats.percentile([7], 95) == 7 and stats.percentile([], 50) is None
    assert stats.percentile([3, 1, 2], 50) == 2


def test_formatting() -> None:
    assert stats.span(timedelta(days=3, hours=4, minutes=5)) == "3d 4h"
    assert stats.seconds_ms(12345) == "12.3 s" and stats.seconds_ms(None) == ""
    assert stats.usd(1234.5) == "$1,234.50" and stats.size(3 * 2**29) == "1.5Gi"
    assert stats.ago(NOW - timedelta(hours=2), NOW) == "2h 0m ago"


def test_charts_escape_labels_and_carry_the_numbers() -> None:
    svg = charts.bars("t<", [charts.Bar("<b>", 3, "3")])
    assert "<b>" not in svg.replace("<title>", "") or "&lt;b&gt;" in svg
    assert 'data-value="3"' in svg and svg.startswith("<svg")
    assert charts.nice_max(7) == 10 and charts.nice_max(0.3) == 0.5 and charts.nice_max(0) == 1


# --- access --------------------------------------------------------------------------------


def test_access_modes_fail_closed() -> None:
    assert access.access_config({}).mode == access.Mode.UNCONFIGURED
    assert access.access_config({"FIRESTORE_EMULATOR_HOST": "x"}).mode == access.Mode.DEV
    iap = access.access_config({"STASIS_IAP_AUDIENCE": "/projects/1/apps/p",
                                "FIRESTORE_EMULATOR_HOST": "x"})
    assert iap.mode == access.Mode.IAP and iap.audience == "/projects/1/apps/p"
    assert access.access_config({"STASIS_IDENTITY": "iap"}).mode == access.Mode.UNCONFIGURED
    assert access.access_config({"STASIS_IDENTITY": "dev",
                                 "STASIS_DASHBOARD_DEV_USER": "carol"}).dev_user == "carol"


def test_admin_rule() -> None:
    config = access.access_config({"STASIS_PLATFORM_ADMINS": "ops@example.com, root"})
    dev = access.decide("dev", email=None, config=config, catalog=CATALOG)
    assert dev.allowed and dev.teams == {"ml-a"}  # a team admin: their own teams only
    assert not access.decide("bob", email=None, config=config, catalog=CATALOG).allowed
    assert not access.decide("vic", email=None, config=config, catalog=CATALOG).allowed
    ops = access.decide("ops@example.com", email="ops@example.com", config=config,
                        catalog=CATALOG)
    assert ops.allowed and ops.teams is None  # a platform admin: every team
    assert not access.decide(None, email=None, config=config, catalog=CATALOG).allowed
    assert access.user_for_email("Alice@Example.com", "example.com") == "alice"
    assert access.user_for_email("alice@evil.com", "example.com") == "alice@evil.com"


# --- the HTTP edge -----------------------------------------------------------------------


class _Caller:
    def __init__(self, user: str) -> None:
        self.user = user


class _Iap:
    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users

    def caller(self, headers: Mapping[str, str]) -> _Caller:
        token = {k.lower(): v for k, v in headers.items()}.get("x-goog-iap-jwt-assertion")
        if token not in self.users:
            raise ValueError("invalid IAP assertion")
        return _Caller(self.users[token])


def _call(path: str, env: Mapping[str, str], method: str = "GET",
          headers: Mapping[str, str] | None = None) -> tuple[str, int, dict[str, str]]:
    builder = EnvironBuilder(path=path, method=method, headers=dict(headers or {}))
    environ = builder.get_environ()
    environ["SCRIPT_NAME"] = "/dashboard"
    reader = FakeReader(_fleet_data())
    deps = WebDeps(reader=lambda: reader, clock=lambda: NOW,
                   iap=lambda audience, url: _Iap({"good": "alice@example.com",
                                                   "member": "bob@example.com"}),
                   environ=lambda: env)
    return handle(Request(environ), deps)


DEV = {"FIRESTORE_EMULATOR_HOST": "127.0.0.1:1", "STASIS_PROJECT": "p"}


@pytest.mark.parametrize("path", ["/", "/fleet", "/snapshots", "/cost", "/latency", "/links",
                                  "/sandboxes", "/audit"])
def test_every_page_renders_for_the_dev_admin(path: str) -> None:
    html, status, headers = _call(path, DEV)
    assert status == 200, html
    assert headers["Content-Security-Policy"] == CSP and "script-src" not in CSP
    assert "<script" not in html and 'href="/dashboard/fleet"' in html
    assert re.search(r"documents=\d+; queries=\d+; aggregations=\d+", headers["X-Stasis-Reads"])


def test_the_stylesheet_hash_matches_what_is_served() -> None:
    html, _, _ = _call("/", DEV)
    assert f"<style>{STYLESHEET}</style>" in html


def test_non_admins_unknown_pages_bad_parameters_and_writes() -> None:
    assert _call("/", {**DEV, "STASIS_DASHBOARD_DEV_USER": "bob"})[1] == 403
    assert _call("/nope", DEV)[1] == 404
    assert _call("/fleet?size=3", DEV)[1] == 400
    assert _call("/fleet?cursor=gone", DEV)[1] == 400
    assert _call("/", DEV, method="POST")[1] == 405
    assert _call("/", {})[1] == 403  # no identity source configured: closed


def test_iap_mode_needs_a_verified_admin() -> None:
    env = {"STASIS_IAP_AUDIENCE": "/projects/1/apps/p", "STASIS_DASHBOARD_EMAIL_DOMAIN":
           "example.com", "FIRESTORE_EMULATOR_HOST": "x"}
    assert _call("/", env)[1] == 401
    assert _call("/", env, headers={"x-goog-iap-jwt-assertion": "forged"})[1] == 401
    assert _call("/", env, headers={"x-goog-iap-jwt-assertion": "member"})[1] == 403
    html, status, _ = _call("/", env, headers={"x-goog-iap-jwt-assertion": "good"})
    assert status == 200 and "signed in as <b>alice</b>" in html
    # A dev identity header means nothing behind IAP.
    assert _call("/", env, headers={"X-Stasis-User": "dev"})[1] == 401


# --- purity --------------------------------------------------------------------------------


def test_the_dashboard_package_imports_no_sdk() -> None:
    forbidden = ("google", "kubernetes", "slack_bolt", "slack_sdk", "requests",
                 "functions.adapters", "functions.bootstrap")
    for path in (ROOT / "functions" / "dashboard").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"


# --- wiring ----------------------------------------------------------------------------------


def test_the_dashboard_is_an_http_function_of_the_host() -> None:
    import functions.main
    from functions.routes import HTTP_FUNCTIONS

    assert "dashboard" in HTTP_FUNCTIONS and callable(functions.main.dashboard)


def test_stasis_up_prints_the_dashboard_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from stack import local
    from stasis_cli.main import main

    monkeypatch.setattr(local, "up", lambda settings, **_kw: local.UpReport({"all": 1.0}))
    monkeypatch.setattr(local, "status", lambda settings: [])
    monkeypatch.setenv("STASIS_FUNCTIONS_PORT", "18713")
    monkeypatch.delenv("STASIS_DASHBOARD_DEV_USER", raising=False)
    result = CliRunner().invoke(main, ["up"])
    assert result.exit_code == 0, result.output
    assert "admin dashboard http://127.0.0.1:18713/dashboard/ (dev identity dev)" in \
        result.output


# --- a team admin sees their own teams (issue 18 §3) ----------------------------------------
_TEAM_SCOPED = ("workspaces", "snapshots", "links", "sandboxes", "audit")


@pytest.mark.parametrize("name", sorted(pages.PAGES))
def test_every_read_of_a_team_admin_is_confined_to_their_teams(name: str) -> None:
    ctx, reader = _ctx(visible=frozenset({"ml-a"}))
    data = pages.PAGES[name](ctx, {})
    reads = [(q.collection, q.where) for q in (*reader.pages, *reader.aggregations)]
    assert all(c not in _TEAM_SCOPED or any(
        (f, op, v) in (("team", "==", "ml-a"), ("team", "in", ["ml-a"])) for f, op, v in where)
               for c, where in reads), reads
    assert "ml-b" not in data.get("team_ids", [])
    assert all(row.get("team") in (None, "ml-a") for row in data.get("rows") or [])


def test_a_team_admin_sees_no_other_teams_fleet_or_links() -> None:
    ctx, _ = _ctx(visible=frozenset({"ml-a"}))
    fleet = pages.fleet(ctx, {})
    assert fleet["total"] == 3 and {r["team"] for r in fleet["rows"]} == {"ml-a"}
    assert [t["id"] for t in fleet["teams"]] == ["ml-a"]
    assert {r["team"] for r in pages.links(ctx, {})["rows"]} == {"ml-a"}
    assert [t["team"] for t in pages.links(ctx, {})["per_team"]] == ["ml-a"]


@pytest.mark.parametrize("name", ["fleet", "snapshots", "latency", "links", "sandboxes",
                                  "audit"])
def test_asking_for_another_team_by_name_is_refused(name: str) -> None:
    ctx, _ = _ctx(visible=frozenset({"ml-a"}))
    with pytest.raises(pages.NotYours, match="ml-b is not one of yours"):
        pages.PAGES[name](ctx, {"team": "ml-b"})


def test_sandbox_commands_and_repositories_are_shown_redacted() -> None:
    data = _fleet_data()
    data["sandboxes"] = {"sb-1": {
        "team": "ml-a", "state": "FAILED", "requested_at": NOW,
        "repository": "https://alice:ghp_s3cret@github.com/org/repo.git",
        "command": "make test --token=s3cret", "message": "clone of "
        "https://alice:ghp_s3cret@github.com/org/repo.git failed"}}
    ctx, _ = _ctx(data)
    row = pages.sandboxes(ctx, {})["rows"][0]
    assert "s3cret" not in str(row)
    assert row["repository"] == "https://***@github.com/org/repo.git"
    assert row["command"] == "make test --token=***"
