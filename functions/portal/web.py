"""The portal's HTTP edge: identity, the session and its CSRF token, routing, rendering.

``handle(request, deps)`` takes the request functions-framework passes and returns a
werkzeug ``Response``. Pages live under the function's root (``/portal/`` on the local
function host, the service's root behind IAP); links are built from the request's script
root, so the same code works mounted anywhere.

Identity, decided per request like the dashboard's (``functions/dashboard/access.py``):

- behind IAP (``STASIS_IAP_AUDIENCE``) the verified ``x-goog-iap-jwt-assertion`` says who
  it is on every request; the portal also keeps a session cookie for that user, whose CSRF
  token its forms carry (a cookie of another user is replaced);
- locally (``STASIS_IDENTITY=dev`` or the Firestore emulator) the browser signs in once with
  a one-time URL from ``stasis portal [--as USER]`` (``POST /signin-links`` with the CLI's
  ``X-Stasis-User``, JSON; ``GET /signin?token=``), which sets the session cookie;
- otherwise every request is refused.

The session cookie is ``functions/portal/session.py``'s ``stasis_session`` (HttpOnly,
SameSite=Strict, Secure over https, path ``/`` so the IDE access proxy on the same host
sees it), signed with ``STASIS_SESSION_SECRET``; without that secret the portal refuses to
serve. Every POST carries the session's CSRF token (``csrf`` field) or is refused with 403.

What a user sees and does is what the domain allows: the workspaces of their teams (their
own; an admin also gets the team's list), changes by the owner or a team admin
(``functions/domain/rights.py``), checked with the CLI's and chat's rules before anything
is published (``functions.domain.frontdoor``: the same checks and words as the CLI and
chat; a team that is not the user's is refused on the form, as a bad request). Every
change is the event the CLI and chat publish, with the form's request id as event id and
requestid, so a double submit or a refresh has one effect; links go through the links
function's own issuer.

The page's Content-Security-Policy allows only its own stylesheet (by hash) and its own
script (``/static/portal.js``: the progress line's refresh and the copy button; every
page works without it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import markupsafe
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Response

from events import (
    InvalidEvent,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import WORKSPACE_SEPARATOR
from functions.dashboard import access
from functions.dashboard.web import TEMPLATES as DASHBOARD_TEMPLATES
from functions.domain import cost, frontdoor, idle, rights, scheduling
from functions.domain.catalog import Catalog, Role, Team
from functions.domain.frontdoor import Door
from functions.domain.lifecycle import HOLDS_HARDWARE, State, Workspace
from functions.domain.progress import describe
from functions.domain.retention import SnapshotRecord
from functions.portal import session, signin, views
from functions.portal.ports import PortalDeps
from functions.ports import RuntimeRefused, RuntimeUnavailable, catalog_knowing

log = logging.getLogger(__name__)
SOURCE = "//stasis/portal"
TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"
STYLESHEET = ((DASHBOARD_TEMPLATES / "dashboard.css").read_text()
              + (TEMPLATES / "portal.css").read_text())
SCRIPT = (STATIC / "portal.js").read_text()
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLESHEET.encode()).digest()).decode()
CSP = ("default-src 'none'; "
       f"style-src 'sha256-{_STYLE_HASH}'; script-src 'self'; connect-src 'self'; "
       "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
NAV = (("home", "My workspaces"), ("new", "New workspace"), ("sandboxes", "Sandboxes"))
TEAM_PAGE = 50
PATCH_LIMIT = 512 * 1024
_REQUEST_ID = re.compile(r"[a-f0-9]{32}")
_LINK_ID = re.compile(r"lnk-[a-z0-9]{1,64}")
_DONE = {
    "create": "Requested: it starts in a moment (this page follows it).",
    "pause": "Pausing: its kernels' state goes to a snapshot, then the hardware is released.",
    "pause-home": f"Pausing: {frontdoor.PAUSE_HOME_ONLY}",
    "resume": "Resuming into its live kernels.",
    "delete": "Deleting.",
    "revoke": "Link revoked: it stops working within a second.",
}

_env = jinja2.Environment(
    loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(TEMPLATES),
                                jinja2.FileSystemLoader(DASHBOARD_TEMPLATES)]),
    autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined,
    trim_blocks=True, lstrip_blocks=True)
#: A domain message's `code spans` (chat's markup) as <code>, everything else escaped.
_env.filters["code"] = lambda text: markupsafe.Markup(re.sub(
    r"`([^`]+)`", r"<code>\1</code>", str(markupsafe.escape(text))))

_MAP = Map([
    Rule("/", endpoint="home", methods=["GET"]),
    Rule("/new", endpoint="new", methods=["GET"]),
    Rule("/workspaces", endpoint="create", methods=["POST"]),
    Rule("/workspaces/<ws_id>", endpoint="workspace", methods=["GET"]),
    Rule("/workspaces/<ws_id>/progress", endpoint="progress", methods=["GET"]),
    Rule("/workspaces/<ws_id>/pause", endpoint="pause", methods=["POST"]),
    Rule("/workspaces/<ws_id>/resume", endpoint="resume", methods=["POST"]),
    Rule("/workspaces/<ws_id>/cancel", endpoint="cancel", methods=["POST"]),
    Rule("/workspaces/<ws_id>/delete", endpoint="confirm_delete", methods=["GET"]),
    Rule("/workspaces/<ws_id>/delete", endpoint="delete", methods=["POST"]),
    Rule("/workspaces/<ws_id>/links", endpoint="create_link", methods=["POST"]),
    Rule("/links/<link_id>/revoke", endpoint="revoke_link", methods=["POST"]),
    Rule("/sandboxes", endpoint="sandboxes", methods=["GET"]),
    Rule("/sandboxes/<sandbox_id>", endpoint="sandbox", methods=["GET"]),
    Rule("/signin", endpoint="signin", methods=["GET"]),
    Rule("/signin-links", endpoint="signin_links", methods=["POST"]),
    Rule("/signout", endpoint="signout", methods=["POST"]),
    Rule("/static/portal.js", endpoint="script", methods=["GET"]),
], strict_slashes=False)


class _Stop(Exception):
    """An early answer: an error page (or JSON for the API)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


@dataclass
class _Ctx:
    request: Any
    deps: PortalDeps
    now: datetime
    environ: Mapping[str, str]
    base: str
    catalog: Catalog
    user: str | None = None
    via: str = ""
    csrf: str = ""
    new_cookie: str | None = None

    def url(self, endpoint: str, /, **params: Any) -> str:
        query = {k: v for k, v in params.items() if v not in (None, "") and k not in (
            "ws_id", "link_id", "sandbox_id")}
        path = _MAP.bind("", script_name=self.base or "/").build(
            endpoint, {k: v for k, v in params.items() if k in ("ws_id", "link_id",
                                                              "sandbox_id")})
        return path + ("?" + urlencode(query) if query else "")

    @property
    def teams(self) -> tuple[Team, ...]:
        if not self.user:
            return ()
        user = self.user
        # a member added since this instance's copy was read is not shown "no team"
        self.catalog = catalog_knowing(self.deps, lambda c: c.knows(member=user))
        return self.catalog.teams_of(user)


def handle(request: Any, deps: PortalDeps) -> Response:
    environ = deps.environ()
    ctx = _Ctx(request, deps, deps.clock(), environ, (request.script_root or "").rstrip("/"),
               deps.catalog())
    try:
        endpoint, args = _MAP.bind("").match(request.path or "/", method=request.method)
    except (NotFound, MethodNotAllowed) as exc:
        return _error(ctx, exc.code or 404, "No such page", exc.description or "")
    try:
        if endpoint == "script":
            return Response(SCRIPT, mimetype="text/javascript",
                            headers={"Cache-Control": "max-age=300",
                                     "X-Content-Type-Options": "nosniff"})
        if endpoint == "signin_links":
            return _signin_links(ctx)
        secret = _secret(environ)
        if endpoint == "signin":
            response = _signin(ctx, secret)
        else:
            _identify(ctx, secret)
            if request.method == "POST" and not _csrf_ok(ctx, secret):
                raise _Stop(403, "Refused", "this form's CSRF token is missing or wrong: "
                                            "reload the page and try again")
            response = _PAGES[endpoint](ctx, **args)
    except _Stop as stop:
        response = _error(ctx, stop.status, stop.title, stop.message)
    except HTTPException as exc:
        response = _error(ctx, exc.code or 500, exc.name, exc.description or "")
    if ctx.new_cookie:
        _set_cookie(ctx, response, ctx.new_cookie)
    return response


# --- identity and the session ------------------------------------------------------------
def _secret(environ: Mapping[str, str]) -> bytes:
    value = environ.get("STASIS_SESSION_SECRET", "")
    if not value:
        raise _Stop(503, "Not configured", "the portal has no session secret: set "
                                           "STASIS_SESSION_SECRET (`stasis up` does locally)")
    return value.encode()


def _identify(ctx: _Ctx, secret: bytes) -> None:
    config = access.access_config(ctx.environ)
    current = session.verify(ctx.request.cookies.get(session.COOKIE), secret,
                             ctx.now.timestamp())
    if config.mode == access.Mode.IAP:
        assert config.audience is not None
        try:
            caller = ctx.deps.iap(config.audience, config.certs_url).caller(
                dict(ctx.request.headers))
        except Exception as exc:  # the verifier's own errors: all mean "no identity"
            raise _Stop(401, "Not signed in", f"{exc}: sign in through the Identity-Aware "
                                              "Proxy") from exc
        ctx.user, ctx.via = access.user_for_email(str(caller.user), config.email_domain), "iap"
        if current is None or current.user != ctx.user:
            current, ctx.new_cookie = session.issue(ctx.user, secret, ctx.now.timestamp())
    elif config.mode == access.Mode.DEV:
        if current is None:
            raise _Stop(401, "Not signed in", "open the one-time sign-in link that `stasis "
                                              "portal --as USER` prints")
        ctx.user, ctx.via = current.user, "dev"
    else:
        raise _Stop(403, "Not configured", "the portal has no identity source: set "
                                           "STASIS_IAP_AUDIENCE behind Identity-Aware Proxy, "
                                           "or STASIS_IDENTITY=dev on a local stack")
    ctx.csrf = session.csrf_token(current, secret)


def _csrf_ok(ctx: _Ctx, secret: bytes) -> bool:
    current = session.verify(ctx.new_cookie or ctx.request.cookies.get(session.COOKIE),
                             secret, ctx.now.timestamp())
    return current is not None and current.user == ctx.user and session.csrf_ok(
        current, secret, ctx.request.form.get("csrf"))


def _set_cookie(ctx: _Ctx, response: Response, value: str) -> None:
    https = ctx.request.scheme == "https" or ctx.request.headers.get(
        "X-Forwarded-Proto", "").lower() == "https"
    response.set_cookie(session.COOKIE, value, max_age=session.MAX_AGE_SECONDS, path="/",
                        httponly=True, samesite="Strict", secure=https)


def _signin_links(ctx: _Ctx) -> Response:
    """``POST /signin-links`` (JSON, local identity only): a one-time sign-in URL for the
    CLI's user. A browser cannot send this request from another site: it needs the
    ``X-Stasis-User`` header and a JSON body."""
    if access.access_config(ctx.environ).mode != access.Mode.DEV:
        return _json({"error": "not_local", "message": "sign in through the Identity-Aware "
                                                       "Proxy: this portal is not local"}, 403)
    user = (ctx.request.headers.get("X-Stasis-User") or "").strip()
    if not user or not ctx.request.is_json:
        return _json({"error": "bad_request", "message": "send X-Stasis-User and a JSON "
                                                         "body"}, 400)
    if not catalog_knowing(ctx.deps, lambda c: c.knows(member=user)).teams_of(user):
        return _json({"error": "no_team", "message": f"{user} is not a member of any team: "
                                                     "ask an admin to add you"}, 403)
    _secret(ctx.environ)
    token = signin.new_token()
    ctx.deps.store.create_signin(signin.token_hash(token), signin.record(user, ctx.now))
    url = ctx.request.host_url.rstrip("/") + ctx.url("signin", token=token)
    return _json({"url": url, "user": user, "expires_in": signin.TTL_SECONDS}, 201)


def _signin(ctx: _Ctx, secret: bytes) -> Response:
    token = ctx.request.args.get("token") or ""
    verdict = ctx.deps.store.consume_signin(
        signin.token_hash(token), lambda doc: signin.consume(doc, ctx.now))
    if not verdict.ok or verdict.user is None:
        raise _Stop(401, "Sign-in refused", verdict.message)
    _, ctx.new_cookie = session.issue(verdict.user, secret, ctx.now.timestamp())
    ctx.user = verdict.user
    # A page, not a redirect: a SameSite=Strict cookie set during a navigation from
    # another application is not sent on the redirect that follows it.
    return _render(ctx, "signed_in.html", title="Signed in", home=ctx.url("home"))


def _signout(ctx: _Ctx) -> Response:
    response = _render(ctx, "signed_out.html", title="Signed out", user=None)
    response.delete_cookie(session.COOKIE, path="/")
    return response


# --- workspaces ---------------------------------------------------------------------------
def _home(ctx: _Ctx) -> Response:
    """My workspaces (in every team of mine); an admin may open their team's whole list."""
    view = ctx.request.args.get("view") or ""
    team = _admin_team(ctx, view.removeprefix("team:")) if view.startswith("team:") else None
    cursor, next_cursor = ctx.request.args.get("cursor") or None, None
    if team is not None:
        workspaces, next_cursor = ctx.deps.store.team_page(team.id, TEAM_PAGE, cursor)
    else:
        workspaces = [w for t in ctx.teams for w in ctx.deps.store.owned(t.id, str(ctx.user))]
        workspaces.sort(key=lambda w: (w.team, w.name))
    rows = _rows(ctx, [w for w in workspaces if w.state != State.DELETED])
    admin_of = [t.id for t in ctx.teams if _is_admin(t, ctx.user)]
    return _render(ctx, "workspaces.html", title="My workspaces" if team is None
                   else f"Team {team.id}", rows=rows, team=team.id if team else None,
                   admin_of=admin_of, notice=_DONE.get(ctx.request.args.get("done") or ""),
                   next_url=ctx.url("home", view=view, cursor=next_cursor) if next_cursor
                   else None, followed=any(r["followed"] for r in rows))


def _workspace_page(ctx: _Ctx, ws_id: str, *, status: int = 200, refusal: str = "",
                    created_link: Mapping[str, Any] | None = None) -> Response:
    try:
        ws, _ = _find(ctx, ws_id)
    except _Stop as stop:
        if stop.status != 404 or ctx.request.args.get("done") != "create":
            raise
        # Just requested: the lifecycle has not written the document yet.
        return _render(ctx, "pending.html", title=ws_id, ws_id=ws_id)
    row = _rows(ctx, [ws])[0]
    row["followed"] = row["followed"] or views.awaiting(ws, ctx.request.args.get("done"))
    snapshots = views.newest_first(ctx.deps.store.snapshots_of([ws.id]), "created_at")
    links = _links_call(ctx, "list", str(ctx.user), {"workspace": ws.id, "all": "1"})
    return _render(
        ctx, "workspace.html", status=status, title=ws.name, ws=row, refusal=refusal,
        notice=_DONE.get(ctx.request.args.get("done") or ""),
        snapshots=[views.snapshot_row(s, ctx.now) for s in snapshots],
        links=[views.link_row(r, ctx.now) for r in (links.get("links") or [])][::-1],
        profiles=views.resume_profiles(ctx.catalog, ws), created_link=created_link,
        request_id=_new_request_id(), followed=row["followed"],
        home_only=frontdoor.pauses_home_only(ctx.catalog, ws))


def _progress(ctx: _Ctx, ws_id: str) -> Response:
    """The progress line's JSON, for the page's script: the state and, while the runtime
    works, the domain's description of how far it got."""
    ws, _ = _find(ctx, ws_id)
    if ws.state == State.QUEUED:  # no runtime work yet: what it waits for
        return _json({"state": str(ws.state), "message": ws.state_message or "",
                      "progress": {"line": ws.state_message or "queued",
                                   "total_bytes": 0}}, 200)
    progress = _runtime_progress(ctx, ws)
    return _json({"state": str(ws.state), "message": ws.state_message or "",
                  "progress": progress.as_dict() if progress else None}, 200)


def _rows(ctx: _Ctx, workspaces: list[Workspace]) -> list[dict[str, Any]]:
    """Workspaces as the pages show them, with a fixed number of reads for the whole
    list (snapshots and this month's audit entries in batched ``in`` queries), plus the
    runtime asked only about those in transition (progress) or running (idle signals)."""
    if not workspaces:
        return []
    store, catalog, now = ctx.deps.store, ctx.catalog, ctx.now
    ids = [w.id for w in workspaces]
    snapshots = store.snapshots_of(ids)
    by_id = {s["id"]: s for s in snapshots}
    records = [SnapshotRecord.from_doc(s["id"], s) for s in snapshots]
    audit = store.audit_of(workspaces, cost.month_of(now).start)
    queue = _queue(ctx, [w.id for w in workspaces if w.state == State.QUEUED])
    rows = []
    for ws in workspaces:
        team = catalog.teams.get(ws.team)
        before = (store.audit_before(ws.id, cost.month_of(now).start)
                  if views.needs_lookback(ws, audit, now) else [])
        may_change = team is not None and rights.change_refusal(
            team, str(ctx.user), owner=ws.owner, name=ws.name, verb="change") is None
        rows.append(views.workspace_row(
            ws, catalog=catalog, now=now, snapshot=by_id.get(ws.current_snapshot or ""),
            progress=_runtime_progress(ctx, ws) if ws.state in views.FOLLOWED else None,
            cost_now=views.workspace_cost(ws, audit, records, catalog, now, before),
            idle=_idle(ctx, ws), open_url=_open_url(ctx, ws), may_change=may_change,
            queue=queue.get(ws.id)))
    return rows


def _queue(ctx: _Ctx, queued: list[str]) -> dict[str, scheduling.Outlook]:
    """Where the page's QUEUED workspaces stand; three more reads (the queue, what holds
    hardware, the teams' counters) only when the page has one."""
    if not queued:
        return {}
    store = ctx.deps.store
    try:
        capabilities = ctx.deps.runtime.capabilities()
    except (RuntimeRefused, RuntimeUnavailable):
        capabilities = {}
    return scheduling.outlook_of(
        ctx.catalog, store.workspaces_in([str(State.QUEUED)]),
        store.workspaces_in(sorted(str(s) for s in HOLDS_HARDWARE)), store.teams(),
        capabilities, set(queued), ctx.now)


def _runtime_progress(ctx: _Ctx, ws: Workspace) -> Any:
    if ws.state not in views.FOLLOWED:
        return None
    try:
        return describe(ctx.deps.runtime.progress(ws.id))
    except (RuntimeUnavailable, RuntimeRefused) as exc:
        log.info("progress of %s: %s", ws.id, exc)
        return None


def _idle(ctx: _Ctx, ws: Workspace) -> idle.IdleOutlook | None:
    profile = ctx.catalog.profiles.get(ws.profile)
    if ws.state != State.RUNNING or profile is None:
        return None
    signals = None
    source = getattr(ctx.deps.runtime, "activity", None)
    if source is not None and idle.needs_signals(ws, profile.idle_policy, ctx.now):
        try:
            found = source(ws.id)
        except (RuntimeUnavailable, RuntimeRefused):
            found = None
        signals = idle.Signals.from_activity(found, ctx.now) if found else None
    return idle.outlook(ws, profile.idle_policy, signals, ctx.now)


def _open_url(ctx: _Ctx, ws: Workspace) -> str | None:
    proxy = (ctx.environ.get("STASIS_IDE_PROXY_URL") or "").rstrip("/")
    return f"{proxy}/w/{ws.id}/" if proxy else ws.url


# --- the new-workspace form ---------------------------------------------------------------
def _new(ctx: _Ctx, *, status: int = 200, refusal: str = "",
         values: Mapping[str, str] | None = None) -> Response:
    if not ctx.teams:
        raise _Stop(403, "No team", f"you ({ctx.user}) are not a member of any team yet")
    values = dict(values or {})
    team = _my_team(ctx, values.get("team") or ctx.request.args.get("team") or
                    ctx.teams[0].id)
    usage = (ctx.deps.store.get("teams", team.id) or {}).get("usage") or {}
    options = views.form_options(ctx.catalog, team, usage, _available_ides(ctx))
    return _render(ctx, "new.html", status=status, title="New workspace", options=options,
                   teams=[t.id for t in ctx.teams], refusal=refusal, values=values,
                   request_id=values.get("requestid") or _new_request_id())


def _create(ctx: _Ctx) -> Response:
    form = ctx.request.form
    values = {k: (form.get(k) or "").strip() for k in
              ("name", "team", "ide", "environment", "profile", "requestid")}
    ctx.catalog = catalog_knowing(ctx.deps, lambda c: c.knows(
        member=str(ctx.user), team=values["team"] or None, profile=values["profile"] or None,
        ide=values["ide"] or None, environment=values["environment"] or None))
    team = frontdoor.choose_team(ctx.catalog, str(ctx.user), values["team"] or None)
    if isinstance(team, str):
        return _new(ctx, status=400, values={**values, "team": ""},
                    refusal=frontdoor.refused(team, Door.PORTAL))
    requestid = _request_id(values["requestid"])
    payload = WorkspaceRequested(team=team.id, owner=str(ctx.user), name=values["name"],
                                 profile=values["profile"], ide=values["ide"] or "jupyterlab",
                                 environment=values["environment"] or "python-3-11")
    event = _event(payload, requestid)
    if event is not None and ctx.deps.store.handled(event):
        return _redirect(ctx.url("workspace", ws_id=payload.workspace_id, done="create"))
    try:
        capabilities = ctx.deps.runtime.capabilities()
    except RuntimeUnavailable as exc:
        return _new(ctx, status=503, values=values, refusal=f"The runtime did not answer "
                                                            f"({exc}); nothing was created.")
    usage = (ctx.deps.store.get("teams", team.id) or {}).get("usage") or {}
    refusal = frontdoor.preview_create(ctx.catalog, payload,
                                       ctx.deps.store.get_workspace(payload.workspace_id)
                                       if event is not None else None,
                                       usage, capabilities, ctx.now).refusal
    if refusal is None and event is None:
        refusal = "The request is not valid; nothing was created."
    if refusal is not None:
        return _new(ctx, status=400, values=values,
                    refusal=frontdoor.refused(refusal, Door.PORTAL))
    assert event is not None
    _publish(ctx, event)
    return _redirect(ctx.url("workspace", ws_id=payload.workspace_id, done="create"))


# --- actions on a workspace ---------------------------------------------------------------
def _pause(ctx: _Ctx, ws_id: str) -> Response:
    return _act(ctx, ws_id, "pause", lambda ws: WorkspacePauseRequested(
        workspace_id=ws.id, actor=str(ctx.user)))


def _resume(ctx: _Ctx, ws_id: str) -> Response:
    profile = (ctx.request.form.get("profile") or "").strip() or None
    return _act(ctx, ws_id, "resume", lambda ws: WorkspaceResumeRequested(
        workspace_id=ws.id, actor=str(ctx.user),
        profile=profile if profile and profile != ws.profile else None))


def _cancel(ctx: _Ctx, ws_id: str) -> Response:
    """A QUEUED request withdrawn: a queued create is deleted (nothing stays behind), a
    queued resume stays PAUSED."""
    ws, _ = _find(ctx, ws_id)
    if ws.state == State.QUEUED and ws.queued_for == "resume":
        return _act(ctx, ws_id, "pause", lambda w: WorkspacePauseRequested(
            workspace_id=w.id, actor=str(ctx.user)))
    return _act(ctx, ws_id, "delete", lambda w: WorkspaceDeleteRequested(
        workspace_id=w.id, actor=str(ctx.user)))


def _delete(ctx: _Ctx, ws_id: str) -> Response:
    if ctx.request.form.get("confirm") != "yes":
        return _confirm_delete(ctx, ws_id)
    keep = ctx.request.form.get("keep_home") == "yes"
    return _act(ctx, ws_id, "delete", lambda ws: WorkspaceDeleteRequested(
        workspace_id=ws.id, actor=str(ctx.user), keep_home=keep))


def _confirm_delete(ctx: _Ctx, ws_id: str) -> Response:
    ws, team = _find(ctx, ws_id)
    _may_change(ctx, ws, team, "delete")
    return _render(ctx, "delete.html", title=f"Delete {ws.name}", ws=ws,
                   keep_home=(ctx.request.values.get("keep_home") == "yes"),
                   request_id=_new_request_id())


def _act(ctx: _Ctx, ws_id: str, verb: str, make: Callable[[Workspace], Any]) -> Response:
    ws, team = _find(ctx, ws_id)
    _may_change(ctx, ws, team, verb)
    payload = make(ws)
    event = _event(payload, _request_id(ctx.request.form.get("requestid")))
    if event is None:
        return _workspace_page(ctx, ws_id, status=400, refusal="The request is not valid.")
    if not ctx.deps.store.handled(event):
        usage = (ctx.deps.store.get("teams", ws.team) or {}).get("usage") or {}
        refusal = (frontdoor.preview_resume(ctx.catalog, ws, payload, usage, ctx.now)
                   if isinstance(payload, WorkspaceResumeRequested)
                   else frontdoor.preview_transition(ctx.catalog, ws, payload, usage,
                                                     ctx.now)).refusal
        if refusal:
            return _workspace_page(ctx, ws_id, status=409,
                                   refusal=frontdoor.refused(refusal, Door.PORTAL))
        _publish(ctx, event)
    if verb == "delete":
        return _redirect(ctx.url("home", done=verb))
    if verb == "pause" and frontdoor.pauses_home_only(ctx.catalog, ws):
        verb = "pause-home"
    return _redirect(ctx.url("workspace", ws_id=ws_id, done=verb))


# --- agent links --------------------------------------------------------------------------
def _create_link(ctx: _Ctx, ws_id: str) -> Response:
    ws, _ = _find(ctx, ws_id)
    body = {"workspace_id": ws.id, "scope": ctx.request.form.get("scope") or "exec",
            "ttl": (ctx.request.form.get("ttl") or "").strip() or None}
    answer = _links_call(ctx, "create", str(ctx.user), body)
    if answer.get("_status", 500) >= 400:
        return _workspace_page(ctx, ws_id, status=answer["_status"],
                               refusal=_sentence(answer.get("message") or "refused"))
    return _workspace_page(ctx, ws_id, status=201, created_link=answer)


def _revoke_link(ctx: _Ctx, link_id: str) -> Response:
    if not _LINK_ID.fullmatch(link_id):
        raise _Stop(404, "No such link", f"{link_id!r} is not a link id")
    answer = _links_call(ctx, "revoke", str(ctx.user), link_id)
    back = ctx.request.form.get("workspace") or answer.get("workspace_id") or ""
    if answer.get("_status", 500) >= 400:
        raise _Stop(answer["_status"], "Refused", _sentence(answer.get("message") or
                                                            "refused"))
    if back:
        return _redirect(ctx.url("workspace", ws_id=back, done="revoke"))
    return _redirect(ctx.url("home", done="revoke"))


def _links_call(ctx: _Ctx, what: str, user: str, arg: Any) -> dict[str, Any]:
    """The links function's issuer, in this process: the same checks, the same documents
    and events as ``stasis link create|list|revoke``."""
    issuer = ctx.deps.links()
    if what == "create":
        response = issuer.create(user, arg, ctx.request)
    elif what == "list":
        response = issuer.list(user, arg)
    else:
        response = issuer.revoke(user, arg)
    body: dict[str, Any] = json.loads(response.get_data())
    body["_status"] = response.status_code
    return body


# --- sandboxes ----------------------------------------------------------------------------
def _sandboxes(ctx: _Ctx) -> Response:
    found: list[dict[str, Any]] = []
    for team in ctx.teams:
        mine = None if _is_admin(team, ctx.user) else str(ctx.user)
        found += ctx.deps.store.sandboxes(team.id, mine)
    return _render(ctx, "sandboxes.html", title="Sandboxes",
                   rows=[views.sandbox_row(r, ctx.now)
                         for r in views.newest_first(found, "requested_at")])


def _sandbox(ctx: _Ctx, sandbox_id: str) -> Response:
    doc = ctx.deps.store.get("sandboxes", sandbox_id)
    team = ctx.catalog.teams.get(str((doc or {}).get("team")))
    if doc is None or team is None or not rights.may_see(team, str(ctx.user)) or (
            doc.get("requester") != ctx.user and not _is_admin(team, ctx.user)):
        raise _Stop(404, "No such sandbox", f"there is no sandbox {sandbox_id} of yours")
    patch, truncated = "", False
    uri = doc.get("patch_uri") or doc.get("checkpoint_uri")
    if uri:
        try:
            data, truncated = ctx.deps.store.read_object(str(uri), limit=PATCH_LIMIT)
            patch = data.decode("utf-8", errors="replace")
        except Exception as exc:  # the storage client's errors: the page still shows
            log.warning("sandbox %s: reading %s failed: %s", sandbox_id, uri, exc)
            patch = f"(the patch could not be read: {type(exc).__name__})"
    return _render(ctx, "sandbox.html", title=f"Sandbox {sandbox_id}",
                   sandbox=views.sandbox_row(doc, ctx.now), patch=patch, truncated=truncated,
                   checkpoint=not doc.get("patch_uri") and bool(uri))


# --- helpers ------------------------------------------------------------------------------
def _find(ctx: _Ctx, ws_id: str) -> tuple[Workspace, Team]:
    """The workspace, if the user is in its team (403 otherwise, whether or not it exists:
    an id names its team, so nothing is learnt from the refusal)."""
    team = ctx.catalog.teams.get(ws_id.split(WORKSPACE_SEPARATOR)[0])
    if team is None or not rights.may_see(team, str(ctx.user)):
        raise _Stop(403, "Not your team", f"{ws_id} belongs to a team you ({ctx.user}) are "
                                          "not a member of")
    ws = ctx.deps.store.get_workspace(ws_id)
    if ws is None or ws.state == State.DELETED:
        raise _Stop(404, "No such workspace", f"there is no workspace {ws_id}")
    return ws, team


def _may_change(ctx: _Ctx, ws: Workspace, team: Team, verb: str) -> None:
    refusal = rights.change_refusal(team, str(ctx.user), owner=ws.owner, name=ws.name,
                                    verb=verb)
    if refusal:
        raise _Stop(403, "Not yours", refusal)


def _my_team(ctx: _Ctx, team_id: str) -> Team:
    team = next((t for t in ctx.teams if t.id == team_id), None)
    if team is None:
        raise _Stop(403, "Not your team", f"you ({ctx.user}) are not a member of team "
                                          f"{team_id}")
    return team


def _admin_team(ctx: _Ctx, team_id: str) -> Team:
    team = _my_team(ctx, team_id)
    if not _is_admin(team, ctx.user):
        raise _Stop(403, "Admins only", f"only admins of team {team.id} see all its "
                                        "workspaces")
    return team


def _is_admin(team: Team, user: str | None) -> bool:
    member = team.member(str(user))
    return member is not None and member.role == Role.ADMIN


def _available_ides(ctx: _Ctx) -> set[str]:
    try:
        return set(ctx.deps.runtime.capabilities().get("ides") or ())
    except RuntimeUnavailable:
        return set(ctx.catalog.ides)


def _event(payload: Any, requestid: str) -> Any:
    try:
        return new_event(payload, source=SOURCE, requestid=requestid, id=requestid)
    except InvalidEvent:
        return None


def _publish(ctx: _Ctx, event: Any) -> None:
    try:
        ctx.deps.bus.publish(event)
    except Exception as exc:
        log.exception("publishing %s from the portal failed", event.name)
        raise _Stop(503, "Not sent", f"the request could not be queued "
                                     f"({type(exc).__name__}); nothing was changed: try "
                                     "again") from exc


def _request_id(value: str | None) -> str:
    """The form's request id (the same for a double submit), or a new one."""
    return value if value and _REQUEST_ID.fullmatch(value) else _new_request_id()


def _new_request_id() -> str:
    return uuid.uuid4().hex


def _sentence(message: str) -> str:
    message = message.strip()
    return message[:1].upper() + message[1:]


def _redirect(location: str) -> Response:
    return Response("", status=303, headers={"Location": location, **_headers()})


def _json(body: Mapping[str, Any], status: int) -> Response:
    return Response(json.dumps(body, default=str), status=status, mimetype="application/json",
                    headers={"Cache-Control": "no-store"})


def _headers() -> dict[str, str]:
    return {"Cache-Control": "no-store", "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY"}


def _render(ctx: _Ctx, template: str, *, status: int = 200, **data: Any) -> Response:
    data.setdefault("user", ctx.user)
    html = _env.get_template(template).render(
        **data, nav=NAV, url=ctx.url, csrf=ctx.csrf, stylesheet=STYLESHEET,
        script=ctx.url("script"), via=ctx.via, now=ctx.now)
    return Response(html, status=status, mimetype="text/html", headers=_headers())


def _error(ctx: _Ctx, status: int, title: str, message: str) -> Response:
    if ctx.request.path.endswith(("/progress", "/signin-links")):
        return _json({"error": title, "message": message}, status)
    return _render(ctx, "error.html", status=status, title=title, message=message,
                   code=status, user=ctx.user)


_PAGES: dict[str, Callable[..., Response]] = {
    "home": _home, "new": _new, "create": _create, "workspace": _workspace_page,
    "progress": _progress, "pause": _pause, "resume": _resume, "cancel": _cancel,
    "confirm_delete": _confirm_delete, "delete": _delete, "create_link": _create_link,
    "revoke_link": _revoke_link, "sandboxes": _sandboxes, "sandbox": _sandbox,
    "signout": _signout,
}
