"""The admin dashboard in headless Chromium, over a realistic fleet in the Firestore emulator.

One seeded project per module (300 workspaces in 3 teams, their snapshots, links, audit
entries, sandboxes and the cost rollups of functions/domain/cost.py), the dashboard
function served in-process exactly as the local function host mounts it (functions-
framework app under ``/dashboard``), and Chromium driving it as an admin would: each page
loaded, the numbers shown compared with the seeded data, filters used through the forms
and the facet links, pagination followed to the end, the browser console checked for
errors, a non-admin refused with 403. Screenshots land in test-artifacts/dashboard/.

Needs the Debian package ``chromium`` (/usr/bin/chromium) and the ``playwright`` Python
package; Playwright never downloads a browser here.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from chromium_support import CHROMIUM, launched
from json_server import serving_json

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="the dashboard tests need the Debian package chromium at /usr/bin/chromium "
           "(apt-get install -y chromium)")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the dashboard tests need playwright (pip install playwright)")

import functions_framework  # noqa: E402
from dashboard_fleet import (  # noqa: E402
    PROFILE_WEIGHTS,
    TEAMS,
    VISION_TOKEN,
    Fleet,
    build_fleet,
    config,
    write_fleet,
)
from werkzeug.exceptions import NotFound  # noqa: E402
from werkzeug.middleware.dispatcher import DispatcherMiddleware  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

from functions.dashboard.stats import percentile, usd  # noqa: E402
from functions.domain.catalog import human_bytes  # noqa: E402
from functions.domain.idle import ACTOR as IDLE_ACTOR  # noqa: E402
from stack import admin  # noqa: E402
from stack.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "functions" / "main.py"
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"

# --------------------------------------------------------------------------------------------
# Fixtures: the seeded project, the function, the browser
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(emulators: Any) -> Iterator[Fleet]:
    """The seeded project; the emulator variables point at it for the whole module (what
    ``emulator_env`` does per test, once for the module: seeding takes a few seconds)."""
    project = f"dash-{uuid.uuid4().hex[:12]}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in emulators.env(project).items():
            mp.setenv(name, value)
        for name in ("STASIS_IAP_AUDIENCE", "STASIS_IDENTITY", "STASIS_DASHBOARD_DEV_USER"):
            mp.delenv(name, raising=False)
        # dev (a team admin of ml-a in the catalog) is a platform admin here: it sees all.
        mp.setenv("STASIS_PLATFORM_ADMINS", "dev")
        seeded = build_fleet(project, datetime.now(UTC))
        write_fleet(seeded)
        yield seeded


@pytest.fixture(scope="module")
def base_url(fleet: Fleet) -> Iterator[str]:
    """The dashboard function served as the local function host mounts it."""
    app = functions_framework.create_app(target="dashboard", source=str(MAIN),
                                         signature_type="http")
    server = make_server("127.0.0.1", 0, DispatcherMiddleware(NotFound(), {"/dashboard": app}),
                         threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/dashboard"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launched()


@dataclass
class Tab:
    """A page and everything the browser complained about while it was open."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)

    def open(self, path: str, status: int = 200) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == status, (path, response)
        return response

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def attr(self, selector: str, name: str) -> str:
        value = self.page.locator(selector).get_attribute(name)
        assert value is not None, (selector, name)
        return str(value)

    def attrs(self, selector: str, name: str) -> list[str]:
        return [str(v) for v in self.page.locator(selector).evaluate_all(
            f"els => els.map(e => e.getAttribute({name!r}))")]

    def params(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.page.url).query).items()}

    def clean(self) -> None:
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser: Any, base_url: str) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    found = Tab(page, base_url)
    page.on("console", lambda m: found.errors.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: found.errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: found.errors.append(f"request failed: {r.url}"))
    try:
        yield found
    finally:
        context.close()


def _reads(tab: Tab) -> dict[str, int]:
    text = tab.page.locator("[data-testid=reads]").inner_text()
    words = text.replace(",", "").split()
    return {"documents": int(words[words.index("documents") - 1]),
            "queries": int(words[words.index("queries") - 1])}


# --------------------------------------------------------------------------------------------
# Pages
# --------------------------------------------------------------------------------------------


def test_fleet_shows_the_seeded_counts(tab: Tab, fleet: Fleet) -> None:
    tab.open("/")
    assert tab.page.locator("[data-testid=total]").inner_text() == "300"
    assert "signed in as dev" in tab.page.locator("[data-testid=identity]").inner_text()
    for dim, key in (("state", "state"), ("team", "team"), ("profile", "profile")):
        expected = Counter(w[key] for w in fleet.workspaces)
        shown = dict(zip(tab.attrs(f"a[data-facet={dim}][data-count]", "data-value"),
                         map(int, tab.attrs(f"a[data-facet={dim}][data-count]", "data-count")),
                         strict=True))
        assert shown == {v: expected.get(v, 0) for v in shown}, dim
        assert sum(shown.values()) == 300
    newest = sorted(fleet.workspaces, key=lambda w: w["created_at"], reverse=True)
    assert tab.attrs("[data-testid=workspaces] tbody tr", "data-row-id") == [
        w["id"] for w in newest[:50]]
    quotas = {t["id"]: t["quotas"] for t in config()["teams"]}
    for team, usage in fleet.usage.items():
        cells = tab.page.locator(f"[data-testid=teams] tr[data-team={team}] td").all_inner_texts()
        q = quotas[team]
        assert cells[1:] == [f"{usage.workspaces} / {q['workspaces']}",
                             f"{usage.gpus} / {q['gpus']}", f"{usage.tpus} / {q['tpus']}",
                             f"{human_bytes(usage.snapshot_bytes)} / {q['snapshot_bytes']}"]
    # Bounded: one page of workspaces, the catalog, the team documents; counts aggregated.
    assert _reads(tab)["documents"] <= 51 + 1 + 3
    assert "<svg" in tab.page.content()
    tab.shot("fleet")
    tab.clean()


def test_fleet_filters_facets_and_pagination(tab: Tab, fleet: Fleet) -> None:
    tab.open("/fleet")
    form = tab.page.locator("[data-testid=filters]")
    form.locator("select[name=team]").select_option("ml-b")
    form.locator("select[name=state]").select_option("PAUSED")
    form.locator("button[type=submit]").click()
    tab.page.wait_for_load_state()
    assert tab.params() == {"team": "ml-b", "state": "PAUSED", "size": "50"}
    expected = fleet.ws(team="ml-b", state="PAUSED")
    assert tab.page.locator("[data-testid=total]").inner_text() == str(len(expected))
    assert sorted(tab.attrs("[data-testid=workspaces] tbody tr", "data-row-id")) == sorted(
        w["id"] for w in expected)
    # A profile facet keeps the other filters and shows the count it leads to.
    gpu = tab.page.locator("a[data-facet=profile][data-value=gpu-small]")
    assert int(gpu.get_attribute("data-count") or -1) == len(
        fleet.ws(team="ml-b", state="PAUSED", profile="gpu-small"))
    gpu.click()
    tab.page.wait_for_load_state()
    assert tab.params() == {"team": "ml-b", "state": "PAUSED", "profile": "gpu-small",
                            "size": "50"}
    assert set(tab.attrs("[data-testid=workspaces] tbody tr", "data-profile")) <= {"gpu-small"}
    # Owner filter (a text field).
    tab.open("/fleet")
    tab.page.fill("input[name=owner]", "carol")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    assert tab.page.locator("[data-testid=total]").inner_text() == str(len(fleet.ws(
        owner="carol")))
    # Every ml-a workspace, page after page, each exactly once, newest first.
    tab.open("/fleet?team=ml-a&size=50")
    seen: list[str] = []
    while True:
        seen += tab.attrs("[data-testid=workspaces] tbody tr", "data-row-id")
        # The page (and one more to know there is a next), its cursor, catalog, teams.
        assert _reads(tab)["documents"] <= 50 + 1 + 1 + 1 + 3
        nxt = tab.page.locator("[data-testid=next-page]")
        if nxt.count() == 0:
            break
        nxt.click()
        tab.page.wait_for_load_state()
    ml_a = sorted(fleet.ws(team="ml-a"), key=lambda w: w["created_at"], reverse=True)
    assert seen == [w["id"] for w in ml_a]
    tab.shot("fleet-filtered")
    tab.clean()


def test_snapshots_per_team(tab: Tab, fleet: Fleet) -> None:
    tab.open("/snapshots")
    horizon = fleet.now + timedelta(days=7)
    for team in TEAMS:
        live = [(k, s) for k, s in fleet.snapshots.items()
                if s["team"] == team and s["status"] == "ready"]
        row = f"[data-testid=per-team] tr[data-team={team}]"
        assert int(tab.attr(row, "data-count")) == len(live)
        assert int(tab.attr(row, "data-bytes")) == sum(s["bytes"] for _, s in live)
        assert int(tab.attr(row, "data-expiring")) == sum(
            1 for _, s in live if s["expires_at"] <= horizon)
        assert int(tab.attr(row, "data-orphans")) == sum(
            1 for s in fleet.snapshots.values()
            if s["team"] == team and s.get("expired_reason") == "objects_missing")
        assert tab.attr(row, "data-oldest") == min(live, key=lambda kv: kv[1]["created_at"])[0]
    soonest = sorted(((k, s) for k, s in fleet.snapshots.items()
                      if s["status"] == "ready" and s["expires_at"] <= horizon),
                     key=lambda kv: (kv[1]["expires_at"], kv[0]))
    assert tab.attrs("[data-testid=expiring] tbody tr", "data-row-id") == [
        k for k, _ in soonest[:50]]
    orphans = {k for k, s in fleet.snapshots.items() if s.get("expired_reason") ==
               "objects_missing"}
    assert set(tab.attrs("[data-testid=orphans] tbody tr", "data-row-id")) == orphans
    tab.shot("snapshots")
    tab.page.locator("[data-testid=filters] select[name=team]").select_option("vision")
    tab.page.fill("[data-testid=filters] input[name=days]", "30")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    assert tab.params() == {"team": "vision", "days": "30"}
    assert set(tab.attrs("[data-testid=expiring] tbody tr", "data-team")) == {"vision"}
    tab.clean()


def test_cost_shows_the_rollups(tab: Tab, fleet: Fleet) -> None:
    tab.open("/cost")
    for team, doc in fleet.costs.items():
        row = tab.page.locator(f"[data-testid=cost] tr[data-team={team}]")
        assert row.locator("[data-col=forecast]").inner_text() == usd(
            doc["total"]["forecast_cost"])
        assert row.locator("[data-col=compute]").inner_text() == usd(doc["compute"]["cost"])
        saved = doc["auto_pause"]["gpu_hours_saved"]
        assert row.locator("[data-col=gpu-saved]").inner_text() == f"{saved:,.1f}"
    total = sum(d["total"]["forecast_cost"] for d in fleet.costs.values())
    assert tab.page.locator("[data-testid=forecast-total]").inner_text() == usd(total)
    assert any(d["auto_pause"]["gpu_hours_saved"] > 0 for d in fleet.costs.values())
    assert tab.page.locator("[data-testid=cost-missing]").count() == 0
    tab.shot("cost")
    tab.clean()


def test_latency_percentiles_per_profile(tab: Tab, fleet: Fleet) -> None:
    tab.open("/latency")
    for name in ("first_start_ms", "last_pause_ms", "last_resume_ms"):
        section = f"[data-testid=metric-{name}]"
        for profile in PROFILE_WEIGHTS:
            values = [w[name] for w in fleet.ws(profile=profile) if w.get(name) is not None]
            row = f"{section} tr[data-profile={profile}]"
            assert int(tab.attr(row, "data-n")) == len(values)
            assert float(tab.attr(row, "data-p50")) == percentile(values, 50)
            assert float(tab.attr(row, "data-p95")) == percentile(values, 95)
            # The chart draws the same percentiles.
            drawn = f"{section} svg g[data-label={profile}]"
            assert float(tab.attr(drawn, "data-p95")) == percentile(values, 95)
    tab.shot("latency")
    tab.page.locator("[data-testid=filters] select[name=team]").select_option("ml-b")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    row = "[data-testid=metric-first_start_ms] tr[data-profile=cpu-small]"
    assert int(tab.attr(row, "data-n")) == sum(
        1 for w in fleet.ws(team="ml-b", profile="cpu-small") if w.get("first_start_ms"))
    tab.clean()


def test_links_active_revoked_last_used(tab: Tab, fleet: Fleet) -> None:
    tab.open("/links")
    for team in TEAMS:
        mine = [d for d in fleet.links if d["team"] == team]
        row = f"[data-testid=per-team] tr[data-team={team}]"
        for kind in ("active", "expired", "revoked"):
            assert int(tab.attr(row, f"data-{kind}")) == sum(1 for d in mine
                                                              if d["kind"] == kind), kind
        assert int(tab.attr(row, "data-uses")) == sum(d["uses"] for d in mine)
    assert len(tab.attrs("[data-testid=links] tbody tr", "data-row-id")) == 50
    tab.shot("links")
    tab.page.locator("[data-testid=filters] select[name=status]").select_option("revoked")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    revoked = sorted((d for d in fleet.links if d["kind"] == "revoked"),
                     key=lambda d: d["revoked_at"], reverse=True)
    assert tab.attrs("[data-testid=links] tbody tr", "data-row-id") == [
        d["link_id"] for d in revoked]
    used = next(d for d in revoked if d["uses"])
    cells = tab.page.locator(f"tr[data-row-id={used['link_id']}]").inner_text()
    assert "ago" in cells and str(used["uses"]) in cells
    tab.clean()


def test_sandboxes(tab: Tab, fleet: Fleet) -> None:
    tab.open("/sandboxes")
    newest = sorted(fleet.sandboxes, key=lambda s: s["requested_at"], reverse=True)
    assert tab.attrs("[data-testid=sandboxes] tbody tr", "data-row-id") == [
        s["id"] for s in newest]
    shown = dict(zip(tab.attrs("a[data-facet=state]", "data-value"),
                     map(int, tab.attrs("a[data-facet=state]", "data-count")), strict=True))
    assert {k: v for k, v in shown.items() if v} == Counter(s["state"] for s in fleet.sandboxes)
    tab.shot("sandboxes")
    tab.page.locator("[data-testid=filters] select[name=team]").select_option("vision")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    assert tab.page.locator("[data-testid=total]").inner_text() == "4"
    assert set(tab.attrs("[data-testid=sandboxes] tbody tr", "data-team")) == {"vision"}
    tab.clean()


def test_audit_search_by_actor_workspace_and_action(tab: Tab, fleet: Fleet) -> None:
    target = next(w["id"] for w in fleet.workspaces if w["state"] == "PAUSED")
    tab.open("/audit")
    tab.page.fill("input[name=workspace]", target)
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    mine = sorted((e for e in fleet.audit if e["target"] == target), key=lambda e: e["time"],
                  reverse=True)
    assert tab.attrs("[data-testid=audit] tbody tr", "data-event") == [
        e["event_id"] for e in mine]
    tab.shot("audit")
    # By action and actor, through the form, then page by page to the end.
    tab.open("/audit")
    tab.page.fill("input[name=actor]", IDLE_ACTOR)
    tab.page.fill("input[name=action]", "workspace.pause_requested")
    tab.page.locator("[data-testid=filters] button[type=submit]").click()
    tab.page.wait_for_load_state()
    assert tab.params() == {"actor": IDLE_ACTOR, "action": "workspace.pause_requested"}
    seen: list[str] = []
    while True:
        seen += tab.attrs("[data-testid=audit] tbody tr", "data-event")
        nxt = tab.page.locator("[data-testid=next-page]")
        if nxt.count() == 0:
            break
        nxt.click()
        tab.page.wait_for_load_state()
    idle = sorted((e for e in fleet.audit if e["actor"] == IDLE_ACTOR), key=lambda e: e["time"],
                  reverse=True)
    assert seen == [e["event_id"] for e in idle] and len(idle) > 0
    # Clicking an actor searches for that actor.
    tab.open("/audit?action=link.created")
    first = tab.page.locator("[data-testid=audit] tbody tr").first
    actor = first.get_attribute("data-actor")
    first.locator("td").nth(1).locator("a").click()
    tab.page.wait_for_load_state()
    assert tab.params() == {"actor": actor}
    assert set(tab.attrs("[data-testid=audit] tbody tr", "data-actor")) == {actor}
    tab.clean()


def test_a_non_admin_gets_403(tab: Tab, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    for user in ("bob", "vic", "nobody"):  # a member, a viewer, a stranger
        monkeypatch.setenv("STASIS_DASHBOARD_DEV_USER", user)
        for path in ("/", "/audit", "/cost"):
            tab.open(path, status=403)
            assert "Admins only" in tab.page.locator("[data-testid=error]").inner_text()
    tab.shot("forbidden")
    monkeypatch.setenv("STASIS_DASHBOARD_DEV_USER", "grace")  # admin of vision
    tab.open("/sandboxes")
    # The only complaints are the refused documents themselves.
    assert all("403" in e for e in tab.errors), tab.errors


def test_a_team_admin_sees_only_their_own_team(tab: Tab, fleet: Fleet,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """grace is an admin of vision only: no page shows her ml-a's or ml-b's fleet, links,
    sandboxes or audit entries, and asking for one of them by name is refused."""
    monkeypatch.setenv("STASIS_DASHBOARD_DEV_USER", "grace")
    tab.open("/")
    nav = tab.page.get_by_role("navigation")
    assert tab.page.locator("[data-testid=total]").inner_text() == str(
        len(fleet.ws(team="vision")))
    assert set(tab.attrs("[data-testid=workspaces] tbody tr", "data-team")) == {"vision"}
    assert tab.attrs("[data-testid=teams] tr[data-team]", "data-team") == ["vision"]
    assert tab.attrs("a[data-facet=team][data-count]", "data-value") == ["vision"]
    nav.get_by_role("link", name="Links", exact=True).click()
    tab.page.wait_for_load_state()
    assert tab.attrs("[data-testid=per-team] tr[data-team]", "data-team") == ["vision"]
    assert set(tab.attrs("[data-testid=links] tbody tr", "data-team")) == {"vision"}
    nav.get_by_role("link", name="Sandboxes", exact=True).click()
    tab.page.wait_for_load_state()
    assert set(tab.attrs("[data-testid=sandboxes] tbody tr", "data-team")) == {"vision"}
    assert VISION_TOKEN not in tab.page.content()  # her own team's credentials, redacted
    assert "https://***@git.example/trainer.git" in tab.page.content()
    nav.get_by_role("link", name="Audit log", exact=True).click()
    tab.page.wait_for_load_state()
    audit = tab.page.locator("[data-testid=audit]").inner_text()
    assert "vision" in audit and "ml-a" not in audit and "ml-b" not in audit
    nav.get_by_role("link", name="Cost", exact=True).click()
    tab.page.wait_for_load_state()
    assert tab.attrs("[data-testid=cost] tr[data-team]", "data-team") == ["vision"]
    assert tab.page.get_by_text("forecast, your teams").count() == 1
    tab.shot("team-admin")
    for path in ("/fleet?team=ml-a", "/links?team=ml-b", "/audit?team=ml-a",
                 "/sandboxes?team=ml-b"):
        tab.open(path, status=403)
        assert "is not one of yours" in tab.page.locator("[data-testid=error]").inner_text()
    # The only complaints are the refused documents themselves.
    assert all("403" in e for e in tab.errors), tab.errors


def test_an_empty_project_shows_empty_pages(tab: Tab, fleet: Fleet,
                                            emulator_env: dict[str, str]) -> None:
    admin.apply(Settings(project=emulator_env["STASIS_PROJECT"]), config(), actor="seed")
    tab.open("/sandboxes")
    assert "No sandboxes" in tab.page.locator("[data-testid=empty]").inner_text()
    tab.open("/")
    assert tab.page.locator("[data-testid=total]").inner_text() == "0"
    tab.open("/cost")
    assert "No cost rollup yet" in tab.page.locator("[data-testid=cost-missing]").inner_text()
    tab.open("/links")
    assert tab.page.locator("[data-testid=empty]").count() == 1
    tab.open("/snapshots")
    assert tab.page.locator("[data-testid=orphans-empty]").count() == 1
    tab.clean()



# --------------------------------------------------------------------------------------------
# Behind IAP: a real ES256 assertion, verified with IAP's key format served on loopback
# --------------------------------------------------------------------------------------------


@pytest.fixture
def iap(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """IAP's signing key, its public keys served as IAP serves them ({kid: PEM}), and the
    dashboard configured for IAP with that key URL and an audience."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def pem_pair() -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        private = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        return private, public

    private, public = pem_pair()
    keys = contextlib.ExitStack()
    keys_url = keys.enter_context(serving_json(json.dumps({"iap-key-1": public.decode()})
                                               .encode()))
    audience = "/projects/123456/global/backendServices/7890"
    monkeypatch.setenv("STASIS_IAP_AUDIENCE", audience)
    monkeypatch.setenv("STASIS_IAP_CERTS_URL", f"{keys_url}/keys")
    monkeypatch.setenv("STASIS_DASHBOARD_EMAIL_DOMAIN", "example.com")
    monkeypatch.setenv("STASIS_PLATFORM_ADMINS", "ops@corp.example")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    def assertion(email: str, *, aud: str = audience, key: bytes = private) -> str:
        from google.auth import jwt
        from google.auth.crypt import es256

        now = int(datetime.now(UTC).timestamp())
        signer = es256.ES256Signer.from_string(key, "iap-key-1")
        claims = {"iss": "https://cloud.google.com/iap", "aud": aud, "email": email,
                  "sub": f"accounts.google.com:{email}", "iat": now, "exp": now + 600}
        return jwt.encode(signer, claims).decode()

    with keys:
        yield assertion, pem_pair()[0]


def test_behind_iap_only_verified_admins_get_in(browser: Any, base_url: str, fleet: Fleet,
                                                iap: Any) -> None:
    assertion, other_key = iap

    context = browser.new_context()
    page = context.new_page()

    def load(token: str | None, **headers: str) -> tuple[int, str]:
        page.set_extra_http_headers(
            {**headers, **({"x-goog-iap-jwt-assertion": token} if token else {})})
        response = page.goto(base_url + "/sandboxes")
        assert response is not None
        return response.status, page.locator("body").inner_text()

    status, text = load(assertion("grace@example.com"))  # admin of vision, in the domain
    assert status == 200 and "signed in as grace" in text
    assert load(assertion("ops@corp.example"))[0] == 200  # a platform admin
    assert load(assertion("heidi@example.com"))[0] == 403  # a member
    assert load(assertion("grace@elsewhere.example"))[0] == 403  # not our grace
    assert load(assertion("grace@example.com", aud="/projects/1/apps/other"))[0] == 401
    assert load(assertion("grace@example.com", key=other_key))[0] == 401  # forged
    assert load(None)[0] == 401
    # Headers IAP would add are worthless without the signed assertion.
    assert load(None, **{"x-goog-authenticated-user-email": "accounts.google.com:grace@"
                         "example.com", "X-Stasis-User": "dev"})[0] == 401
    context.close()
