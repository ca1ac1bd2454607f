"""The portal in memory: its pure rules (sign-in links, the idle outlook, progress, the form
as a team sees the catalog, the checks before publishing) and its HTTP edge driven with
werkzeug's test client over an in-memory store, the real link issuer and the null runtime.

Each refusal is compared with what the domain function itself says, never with a copy of
the text.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from link_fakes import Clock, MemoryLinkStore, RecordingBus
from portal_fakes import MemoryPortalStore, portal_app, replace
from werkzeug.test import Client

from events import WorkspaceRequested
from functions.adapters.iap import DevIdentity
from functions.adapters.null_runtime import NullRuntime
from functions.domain import frontdoor, idle, progress, quota
from functions.domain.catalog import Catalog, IdleEffect, IdlePolicy, IdleRule
from functions.domain.lifecycle import Reason, State, Workspace
from functions.domain.links import Target
from functions.portal import session, signin, views
from functions.portal.ports import PortalDeps
from functions.proxy.issuer import LinkIssuer

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 5, 14, 12, 0, tzinfo=UTC)
SECRET = "unit-secret"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))


def _ws(name: str = "nb", *, team: str = "ml-a", owner: str = "alice",
        state: State = State.RUNNING, **extra: Any) -> Workspace:
    fields: dict[str, Any] = {"profile": "cpu-small", "created_at": NOW - timedelta(hours=3),
                              "updated_at": NOW - timedelta(hours=1), "version": 3, **extra}
    return Workspace(id=f"{team}--{name}", team=team, owner=owner, name=name, state=state,
                     **fields)


# --- sign-in links -------------------------------------------------------------------------
def test_a_signin_link_works_once_within_its_ttl() -> None:
    doc = signin.record("alice", NOW)
    assert signin.consume(doc, NOW + timedelta(seconds=59)).user == "alice"
    assert signin.consume({**doc, "used_at": NOW}, NOW).outcome == signin.Outcome.USED
    late = signin.consume(doc, NOW + timedelta(seconds=signin.TTL_SECONDS))
    assert late.outcome == signin.Outcome.EXPIRED and "60 seconds" in late.message
    assert signin.consume(None, NOW).outcome == signin.Outcome.UNKNOWN
    token = signin.new_token()
    assert len(token) > 40 and signin.token_hash(token) != token


# --- the idle outlook ----------------------------------------------------------------------
POLICY = IdlePolicy((IdleRule(1800, 0, IdleEffect.PAUSE),), grace_after_resume_seconds=600,
                    max_age_seconds=12 * 3600)


def test_outlook_counts_down_from_the_last_activity() -> None:
    ws = _ws()
    signals = idle.Signals(observed_at=NOW, last_activity=NOW - timedelta(minutes=10))
    seen = idle.outlook(ws, POLICY, signals, NOW)
    assert seen.seconds_left == 20 * 60 and seen.message.startswith("pauses in 20m")


def test_outlook_says_why_it_will_not_pause() -> None:
    busy = idle.outlook(_ws(), POLICY, idle.Signals(observed_at=NOW, busy_kernels=1), NOW)
    assert busy.seconds_left is None and busy.reason == idle.IdleReason.BUSY
    assert "1 kernel is busy" in busy.message
    resumed = _ws(state_reason=str(Reason.RESUMED), updated_at=NOW - timedelta(minutes=2))
    grace = idle.outlook(resumed, IdlePolicy((IdleRule(60, 0, IdleEffect.PAUSE),), 600),
                         None, NOW)
    assert grace.reason == idle.IdleReason.GRACE and grace.seconds_left == 8 * 60
    assert "grace after resume, 8m left" in grace.message
    keep = IdlePolicy((IdleRule(60, 0, IdleEffect.NONE), IdleRule(120, 0, IdleEffect.PAUSE)))
    assert idle.outlook(_ws(), keep, idle.Signals(observed_at=NOW), NOW).seconds_left is None


def test_outlook_takes_the_maximum_age_when_it_comes_first() -> None:
    ws = _ws(updated_at=NOW - timedelta(hours=11, minutes=50))
    seen = idle.outlook(ws, POLICY, idle.Signals(observed_at=NOW, last_activity=NOW), NOW)
    assert seen.seconds_left == 600 and "runs at most 12h" in seen.message


# --- progress --------------------------------------------------------------------------------
def test_progress_rate_counts_from_the_first_byte() -> None:
    raw = {"phase": "snapshot", "started_at": 100.0, "first_byte_at": 104.0,
           "done_bytes": 200 * 2**20, "total_bytes": 400 * 2**20, "observed_at": 106.0}
    seen = progress.describe(raw)
    assert seen is not None
    assert seen.rate_bytes_per_second == 100 * 2**20 and seen.seconds_left == 2.0
    assert seen.elapsed_seconds == 6.0 and seen.fraction == 0.5
    assert seen.line == "saving kernels: 200Mi of 400Mi (50%), 100Mi/s, about 2s left"
    assert seen.bar(10) == "[#####.....]"
    assert progress.describe({"phase": None}) is None
    starting = progress.describe({"phase": "provision", "started_at": 1.0, "observed_at": 4.0})
    assert starting is not None and starting.line == "starting (3s)"


# --- the form as the team sees the catalog --------------------------------------------------
def test_form_options_follow_the_catalog(catalog: Catalog) -> None:
    team = catalog.teams["ml-b"]
    usage = {"workspaces": 1, "gpus": 1, "tpus": 0, "snapshot_bytes": 0}
    options = views.form_options(catalog, team, usage, {"jupyterlab"})
    envs = {e["id"]: e for e in options["environments"]}
    for env in catalog.environments.values():
        if env.redirect is not None:
            assert env.redirect in envs[env.id]["title"] or catalog.environments[
                env.redirect].title in envs[env.id]["title"]
        elif not env.usable:
            assert env.id not in envs  # hidden and unapproved are absent
        elif env.message and str(env.status) == "deprecated":
            assert env.message in envs[env.id]["note"]
    assert [p["id"] for p in options["profiles"]] == list(team.profiles)
    gpu = next(p for p in options["profiles"] if p["id"] == "gpu-small")
    refusal = quota.admit(team.quotas, quota.Usage.from_dict(usage),
                          quota.demand_of(catalog.profiles["gpu-small"]), team.id,
                          contact=team.who_to_ask)
    assert gpu["over_quota"] == refusal.message  # type: ignore[union-attr]
    assert options["quota"]["workspaces"] == f"3 of {team.quotas.workspaces}"
    vscode = next(i for i in options["ides"] if i["id"] == "vscode")
    assert vscode["note"] == catalog.resolve_ide("vscode", {"jupyterlab"}).message  # type: ignore[union-attr]


# --- the checks before publishing -------------------------------------------------------------
CAPS = NullRuntime(RecordingBus()).capabilities()


# --- the HTTP edge ---------------------------------------------------------------------------
class Portal:
    """The portal app over memory, and a browser-like client that keeps cookies."""

    def __init__(self, catalog: Catalog, *, applied: Catalog | None = None,
                 **environ: str) -> None:
        self.clock = Clock(NOW)
        self.bus = RecordingBus()
        self.store = MemoryPortalStore()
        self.links_store = MemoryLinkStore()
        for team in catalog.teams.values():
            self.links_store.teams[team.id] = [{"user": m.user, "role": str(m.role)}
                                               for m in team.members]
        self.issuer = LinkIssuer(self.links_store, self.bus, DevIdentity(), clock=self.clock,
                                 proxy_url=lambda _r: "http://portal.test/proxy")
        env = {"STASIS_IDENTITY": "dev", "STASIS_SESSION_SECRET": SECRET, **environ}
        self.deps = PortalDeps(store=self.store, bus=self.bus, runtime=NullRuntime(self.bus),
                               catalog=lambda: catalog, clock=self.clock,
                               links=lambda: self.issuer, iap=_no_iap, environ=lambda: env,
                               refresh_catalog=(lambda: applied) if applied else None)
        self.client = Client(portal_app(self.deps))

    def put(self, ws: Workspace) -> Workspace:
        self.store.put(ws)
        self.links_store.workspaces[ws.id] = Target(ws.id, ws.team, ws.owner, str(ws.state),
                                                    ws.version)
        return ws

    def sign_in(self, user: str) -> None:
        answer = self.client.post("/signin-links", json={}, headers={"X-Stasis-User": user})
        assert answer.status_code == 201, answer.get_data(as_text=True)
        url = answer.get_json()["url"]
        signed = self.client.get(url[url.index("/signin"):])
        assert signed.status_code == 200, signed.get_data(as_text=True)

    def csrf(self, path: str = "/") -> str:
        page = self.client.get(path).get_data(as_text=True)
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found, page
        return found.group(1)


def _no_iap(audience: str, certs: str) -> Any:
    raise AssertionError("no IAP in these tests")


def test_signin_link_sets_the_session_cookie_once(catalog: Catalog) -> None:
    portal = Portal(catalog)
    assert portal.client.get("/").status_code == 401
    answer = portal.client.post("/signin-links", json={}, headers={"X-Stasis-User": "alice"})
    url = answer.get_json()["url"]
    assert "token=" in url and signin.token_hash(url.split("token=")[1]) in portal.store.signins
    first = portal.client.get(url[url.index("/signin"):])
    cookie = first.headers["Set-Cookie"]
    assert "stasis_session=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Path=/" in cookie and "Secure" not in cookie
    assert portal.client.get("/").status_code == 200
    again = Portal(catalog)
    again.store.signins = portal.store.signins
    refused = again.client.get(url[url.index("/signin"):])
    assert refused.status_code == 401 and "already used" in refused.get_data(as_text=True)
    assert again.client.get("/").status_code == 401


def test_signin_links_need_a_member_and_the_cli_header(catalog: Catalog) -> None:
    portal = Portal(catalog)
    assert portal.client.post("/signin-links", json={},
                              headers={"X-Stasis-User": "mallory"}).status_code == 403
    assert portal.client.post("/signin-links", data={"x": "1"},
                              headers={"X-Stasis-User": "alice"}).status_code == 400
    iap = Portal(catalog, STASIS_IDENTITY="iap", STASIS_IAP_AUDIENCE="/projects/1/apps/p")
    assert iap.client.post("/signin-links", json={},
                           headers={"X-Stasis-User": "alice"}).status_code == 403


def test_a_member_and_a_profile_applied_since_the_cache_was_read_are_not_refused(
        catalog: Catalog) -> None:
    # The portal's instance holds the catalog read before the admin's apply (bootstrap
    # re-reads it every 10 s); dana and cpu-quick are in the applied one only.
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    config["profiles"].append({**config["profiles"][0], "id": "cpu-quick"})
    team = next(t for t in config["teams"] if t["id"] == "ml-b")
    team["members"].append({"user": "dana", "role": "member"})
    team["profiles"].append("cpu-quick")
    portal = Portal(catalog, applied=Catalog.from_config(config))
    portal.sign_in("dana")  # the sign-in link is not refused "not a member of any team"
    assert "ml-b" in portal.client.get("/new").get_data(as_text=True)
    fields = {"csrf": portal.csrf("/new"), "team": "ml-b", "name": "quick",
              "ide": "jupyterlab", "environment": "python-3-11", "profile": "cpu-quick"}
    answer = portal.client.post("/workspaces", data=fields)
    assert answer.status_code == 303, answer.get_data(as_text=True)
    [event] = portal.bus.events
    assert (event.payload.owner, event.payload.profile) == ("dana", "cpu-quick")
    # Without the re-read the same portal refuses dana.
    stale = Portal(catalog)
    assert stale.client.post("/signin-links", json={},
                             headers={"X-Stasis-User": "dana"}).status_code == 403


def test_without_a_session_secret_nothing_is_served(catalog: Catalog) -> None:
    portal = Portal(catalog, STASIS_SESSION_SECRET="")
    assert portal.client.get("/").status_code == 503


def test_create_publishes_one_workspace_requested(catalog: Catalog) -> None:
    portal = Portal(catalog)
    portal.sign_in("carol")
    form = portal.client.get("/new").get_data(as_text=True)
    for label in ("Name", "IDE", "Environment", "Hardware profile"):
        assert f">{label}</label>" in form
    requestid = re.search(r'name="requestid" value="([a-f0-9]+)"', form).group(1)  # type: ignore[union-attr]
    fields = {"csrf": portal.csrf("/new"), "requestid": requestid, "team": "ml-b",
              "name": "mynb", "ide": "jupyterlab", "environment": "python-3-11",
              "profile": "cpu-small"}
    answer = portal.client.post("/workspaces", data=fields)
    assert answer.status_code == 303 and answer.headers["Location"].startswith(
        "/workspaces/ml-b--mynb")
    [event] = portal.bus.events
    assert event.name == "workspace.requested" and event.requestid == requestid
    assert event.id == requestid and event.payload.owner == "carol"
    # The double submit: the ledger knows the request now, nothing is published again.
    portal.store.handled_requests.add((event.type, requestid))
    assert portal.client.post("/workspaces", data=fields).status_code == 303
    assert len(portal.bus.events) == 1


@pytest.mark.parametrize(("field", "value"), [
    ("name", "Bad Name"), ("profile", "tpu-v5e-8"), ("environment", "legacy-tf1"),
])
def test_a_refused_form_shows_the_domain_message_and_creates_nothing(
        catalog: Catalog, field: str, value: str) -> None:
    portal = Portal(catalog)
    portal.sign_in("carol")
    fields = {"csrf": portal.csrf("/new"), "team": "ml-b", "name": "mynb", "ide": "jupyterlab",
              "environment": "python-3-11", "profile": "cpu-small", field: value}
    answer = portal.client.post("/workspaces", data=fields)
    request = WorkspaceRequested(team="ml-b", owner="carol", name=fields["name"],
                                 profile=fields["profile"], ide="jupyterlab",
                                 environment=fields["environment"])
    expected = frontdoor.preview_create(catalog, request, None, {}, CAPS, NOW).refusal
    assert answer.status_code == 400 and expected
    shown = re.search(r'data-testid="refusal">(.*?)</div>', answer.get_data(as_text=True))
    assert shown and re.sub(r"</?code>", "`", shown.group(1)).replace(
        "&#39;", "'") == expected
    assert portal.bus.events == []


def test_post_without_or_with_a_forged_csrf_token_is_refused(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice"))
    portal.sign_in("alice")
    assert portal.client.post(f"/workspaces/{ws.id}/pause").status_code == 403
    forged = session.csrf_token(session.issue("alice", b"other", NOW.timestamp())[0], b"other")
    assert portal.client.post(f"/workspaces/{ws.id}/pause",
                              data={"csrf": forged}).status_code == 403
    assert portal.bus.events == []
    ok = portal.client.post(f"/workspaces/{ws.id}/pause",
                            data={"csrf": portal.csrf(f"/workspaces/{ws.id}")})
    assert ok.status_code == 303 and [e.name for e in portal.bus.events] == [
        "workspace.pause_requested"]


def test_another_team_sees_nothing_and_gets_403(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice"))
    portal.sign_in("carol")
    assert ws.id not in portal.client.get("/").get_data(as_text=True)
    assert portal.client.get(f"/workspaces/{ws.id}").status_code == 403
    csrf = portal.csrf()
    for action in ("pause", "resume", "delete", "links"):
        assert portal.client.post(f"/workspaces/{ws.id}/{action}",
                                  data={"csrf": csrf}).status_code == 403
    assert portal.client.get(f"/workspaces/{ws.id}/progress").status_code == 403
    assert portal.bus.events == []


def test_a_member_may_look_but_only_owner_or_admin_act(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice"))
    portal.sign_in("bob")
    page = portal.client.get(f"/workspaces/{ws.id}")
    assert page.status_code == 200 and ">Pause<" not in page.get_data(as_text=True)
    refused = portal.client.post(f"/workspaces/{ws.id}/pause", data={"csrf": portal.csrf()})
    assert refused.status_code == 403
    team = catalog.teams["ml-a"]
    from functions.domain.rights import change_refusal
    assert (change_refusal(team, "bob", owner="alice", name="nb", verb="pause") or "x")[:20] \
        in refused.get_data(as_text=True)


def test_a_pause_that_keeps_only_the_home_says_so() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    for environment in raw["environments"]:
        environment["memory_snapshots"] = False  # data that must never be copied
    catalog = Catalog.from_config(raw)
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice", environment="python-3-11"))
    portal.sign_in("alice")
    done = portal.client.post(f"/workspaces/{ws.id}/pause",
                              data={"csrf": portal.csrf(f"/workspaces/{ws.id}")})
    assert done.status_code in (302, 303) and "done=pause-home" in done.headers["Location"]
    [event] = portal.bus.events
    assert event.name == "workspace.pause_requested"
    page = portal.client.get(done.headers["Location"]).get_data(as_text=True)
    assert frontdoor.PAUSE_HOME_ONLY in page
    assert "its kernels' state goes to a snapshot" not in page  # no promise of its kernels
    assert "the first pause takes one" not in page and "memory snapshots are off" in page


def test_the_page_shows_cost_idle_snapshot_and_open(catalog: Catalog) -> None:
    portal = Portal(catalog, STASIS_IDE_PROXY_URL="http://ide.test")
    ws = portal.put(_ws(owner="alice", current_snapshot="snap-1",
                        last_activity=NOW - timedelta(minutes=5)))
    portal.store.docs["snapshots"] = {"snap-1": {
        "workspace": ws.id, "team": "ml-a", "bytes": 3 * 2**30, "status": "ready",
        "created_at": NOW - timedelta(hours=2), "expires_at": NOW + timedelta(days=9)}}
    portal.store.audit = [{"target": ws.id, "action": "workspace.ready", "time": NOW -
                           timedelta(hours=1), "outcome": "accepted: ready", "actor": "x"}]
    portal.sign_in("alice")
    html = portal.client.get("/").get_data(as_text=True)
    assert 'href="http://ide.test/w/ml-a--nb/"' in html and ">Open</a>" in html
    assert "3.0Gi" in html or "3Gi" in html
    expected = views.workspace_cost(ws, portal.store.audit, [], catalog, NOW)
    assert expected["per_hour_text"] in html and expected["per_hour"] > 0
    assert ">Pause<" in html and "pauses in" in html


def test_links_are_created_shown_once_listed_and_revoked(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice"))
    portal.sign_in("alice")
    created = portal.client.post(f"/workspaces/{ws.id}/links",
                                 data={"csrf": portal.csrf(), "ttl": "30m", "scope": "read"})
    html = created.get_data(as_text=True)
    assert created.status_code == 201
    url = re.search(r'id="link-url" readonly value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    assert url.startswith("http://portal.test/proxy/ml-a--nb#stasis_")
    [(digest, link)] = portal.links_store.links.items()
    assert link.scope == "read" and link.creator == "alice"
    again = portal.client.get(f"/workspaces/{ws.id}").get_data(as_text=True)
    assert url.split("#")[1] not in again and link.link_id in again
    revoked = portal.client.post(f"/links/{link.link_id}/revoke",
                                 data={"csrf": portal.csrf(), "workspace": ws.id})
    assert revoked.status_code == 303
    assert portal.links_store.links[digest].revoked_at is not None
    bad = portal.client.post(f"/workspaces/{ws.id}/links",
                             data={"csrf": portal.csrf(), "ttl": "forever"})
    assert bad.status_code == 400 and 'data-testid="refusal"' in bad.get_data(as_text=True)


def test_delete_asks_first_and_keeps_home_when_asked(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice", state=State.PAUSED, current_snapshot="s"))
    portal.sign_in("alice")
    confirm = portal.client.get(f"/workspaces/{ws.id}/delete?keep_home=yes")
    assert "is <b>kept</b>" in confirm.get_data(as_text=True) and portal.bus.events == []
    csrf = portal.csrf()
    done = portal.client.post(f"/workspaces/{ws.id}/delete",
                              data={"csrf": csrf, "confirm": "yes", "keep_home": "yes"})
    assert done.status_code == 303
    [event] = portal.bus.events
    assert event.name == "workspace.delete_requested" and event.payload.keep_home is True


def test_a_queued_workspace_shows_where_it_stands_and_can_be_cancelled(catalog: Catalog
                                                                        ) -> None:
    portal = Portal(catalog)
    portal.put(_ws("big", team="ml-b", owner="carol", profile="gpu-small",
                   state=State.RUNNING, priority=0))
    ws = portal.put(_ws("nb", team="ml-b", owner="carol", profile="gpu-small",
                        state=State.QUEUED, queued_for="create",
                        queued_at=NOW - timedelta(minutes=5),
                        state_message="queued: team ml-b uses 1/1 GPUs"))
    portal.store.docs["teams"] = {"ml-b": {"usage": {"workspaces": 2, "gpus": 1}}}
    portal.sign_in("carol")
    html = portal.client.get(f"/workspaces/{ws.id}").get_data(as_text=True)
    # big has been RUNNING an hour, idle: its profile's first idle rule pauses it any time
    assert "Queued at position 1, start within a minute: team ml-b uses 1/1 GPUs" in html
    assert ">Cancel<" in html and ">Pause<" not in html and ">Resume<" not in html
    done = portal.client.post(f"/workspaces/{ws.id}/cancel", data={"csrf": portal.csrf()})
    assert done.status_code == 303
    [event] = portal.bus.events
    assert event.name == "workspace.delete_requested" and event.payload.workspace_id == ws.id
    # a queued resume, cancelled, stays paused
    portal.bus.events.clear()
    portal.put(_ws("nb", team="ml-b", owner="carol", profile="gpu-small", state=State.QUEUED,
                   queued_for="resume", current_snapshot="s"))
    portal.client.post(f"/workspaces/{ws.id}/cancel", data={"csrf": portal.csrf()})
    [event] = portal.bus.events
    assert event.name == "workspace.pause_requested"


def test_resume_on_another_profile_is_checked_like_chat(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(team="ml-b", owner="carol", state=State.PAUSED, current_snapshot="s"))
    portal.sign_in("carol")
    refused = portal.client.post(f"/workspaces/{ws.id}/resume",
                                 data={"csrf": portal.csrf(), "profile": "tpu-v5e-8"})
    message = catalog.resolve_profile("ml-b", "tpu-v5e-8").message  # type: ignore[union-attr]
    assert refused.status_code == 409 and message[1:40] in refused.get_data(as_text=True)
    ok = portal.client.post(f"/workspaces/{ws.id}/resume",
                            data={"csrf": portal.csrf(), "profile": "cpu-large"})
    assert ok.status_code == 303
    [event] = portal.bus.events
    assert event.payload.profile == "cpu-large"


def test_progress_json_follows_the_runtime(catalog: Catalog) -> None:
    portal = Portal(catalog)
    ws = portal.put(_ws(owner="alice", state=State.PAUSING))
    raw = {"phase": "snapshot", "started_at": 1.0, "first_byte_at": 2.0, "done_bytes": 10,
           "total_bytes": 20, "observed_at": 3.0}
    portal.deps.runtime.progress = lambda _id: raw  # type: ignore[method-assign]
    portal.sign_in("alice")
    body = portal.client.get(f"/workspaces/{ws.id}/progress").get_json()
    assert body["state"] == "PAUSING"
    assert body["progress"]["line"] == progress.describe(raw).line  # type: ignore[union-attr]
    page = portal.client.get("/").get_data(as_text=True)
    assert 'data-progress-url="/workspaces/ml-a--nb/progress"' in page


def test_sandboxes_list_and_patch(catalog: Catalog) -> None:
    portal = Portal(catalog)
    portal.store.docs["sandboxes"] = {
        "sbx-1": {"id": "sbx-1", "team": "ml-a", "requester": "bob", "state": "SUCCEEDED",
                  "repository": "/src/x", "command": "make fix", "patch_uri": "gs://b/p",
                  "requested_at": NOW, "files_changed": ["a.py"]},
        "sbx-2": {"id": "sbx-2", "team": "ml-b", "requester": "carol", "state": "RUNNING"}}
    portal.store.objects["gs://b/p"] = b"diff --git a/a.py b/a.py\n+fixed\n"
    portal.sign_in("bob")
    listing = portal.client.get("/sandboxes").get_data(as_text=True)
    assert "sbx-1" in listing and "sbx-2" not in listing
    assert "+fixed" in portal.client.get("/sandboxes/sbx-1").get_data(as_text=True)
    assert portal.client.get("/sandboxes/sbx-2").status_code == 404


def test_iap_identity_gets_a_session_for_its_forms(catalog: Catalog) -> None:
    class Iap:
        def caller(self, headers: Any) -> Any:
            if headers.get("X-Goog-Iap-Jwt-Assertion") != "good":
                raise ValueError("invalid IAP assertion")
            return type("Caller", (), {"user": "alice@example.com"})()

    portal = Portal(catalog, STASIS_IDENTITY="iap", STASIS_IAP_AUDIENCE="/projects/1/apps/p",
                    STASIS_DASHBOARD_EMAIL_DOMAIN="example.com")
    portal.deps = PortalDeps(**{**portal.deps.__dict__, "iap": lambda a, c: Iap()})
    portal.client = Client(portal_app(portal.deps))
    assert portal.client.get("/").status_code == 401
    page = portal.client.get("/", headers={"X-Goog-Iap-Jwt-Assertion": "good"})
    assert page.status_code == 200 and "alice" in page.get_data(as_text=True)
    assert "stasis_session=" in page.headers.get("Set-Cookie", "")
    ws = portal.put(_ws(owner="alice"))
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.get_data(as_text=True)).group(1)  # type: ignore[union-attr]
    ok = portal.client.post(f"/workspaces/{ws.id}/pause", data={"csrf": csrf},
                            headers={"X-Goog-Iap-Jwt-Assertion": "good"})
    assert ok.status_code == 303


def test_replace_keeps_the_fake_honest() -> None:
    ws = _ws()
    assert replace(ws, state=State.PAUSED).state == State.PAUSED and ws.state == State.RUNNING
