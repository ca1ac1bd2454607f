"""The ``cli`` function: the `stasis` CLI's front door, JSON over HTTP.

The CLI sends a workspace request here instead of publishing it itself, so that a command
imports no Google SDK (a `stasis ws create` is a click parse and one HTTP call) and is
answered with the same preview, in the same words, as chat and the portal
(``functions.domain.frontdoor``): a refusal comes back at once and nothing is published;
what passes is published as the CLI's event (source ``//stasis/cli``, the CLI's request id
as event id and requestid, so a retried call has one effect). The handler still decides.

- ``POST /`` ``{"verb": "create|pause|resume|delete", "name", "team"?, "profile"?, "ide"?,
  "environment"?, "keep_home"?, "device_arrays_to_cpu"?, "requestid"}``: 202 with the
  published event (``id``, ``type``, ``requestid``, ``workspace_id``), the id of the
  ledger entry that will hold its verdict (``verdict``: a follower reads it without
  knowing the routes) and what the preview said (``queued``, ``notices``); 400
  ``{"refusal"}`` for bad input or a preview's refusal; 503 when the runtime or the bus did
  not answer.
- ``GET /workspaces?team=&all=``: the workspaces of the caller's teams (one team with
  ``team``), as the CLI lists them.

Who calls: behind Identity-Aware Proxy the verified email (``dashboard.access``), on a
local stack the explicit ``X-Stasis-User`` (the CLI's ``--as``); anything else is refused.
No SDK here: the portal's ports (``PortalDeps``) do the reads, the bus and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from werkzeug.wrappers import Response

from events import (
    InvalidEvent,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import workspace_id
from functions.dashboard import access
from functions.domain import frontdoor, rights
from functions.domain.frontdoor import Door, Preview
from functions.portal.ports import PortalDeps
from functions.ports import RuntimeRefused, RuntimeUnavailable, catalog_knowing

SOURCE = "//stasis/cli"
DEV_HEADER = "X-Stasis-User"
VERBS = ("create", "pause", "resume", "delete")
_LISTED = 500


class _Answer(Exception):
    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        super().__init__(status)
        self.status, self.body = status, dict(body)


def serve(request: Any, deps: PortalDeps) -> Response:
    """Answer one call of the CLI (``request``: a werkzeug request)."""
    try:
        user = _caller(request, deps)
        path = (request.path or "/").rstrip("/") or "/"
        if request.method == "GET" and path == "/workspaces":
            raise _Answer(200, {"workspaces": _listed(deps, user, request.args)})
        if request.method == "POST" and path == "/":
            body = request.get_json(silent=True)
            if not isinstance(body, dict):
                raise _Answer(400, {"refusal": "The request is not a JSON object."})
            raise _Answer(202, _submit(deps, user, body))
        raise _Answer(404, {"refusal": f"No such call: {request.method} {path}."})
    except _Answer as answer:
        return Response(_json(answer.body), status=answer.status, mimetype="application/json")


def _caller(request: Any, deps: PortalDeps) -> str:
    config = access.access_config(deps.environ())
    if config.mode == access.Mode.IAP:
        assert config.audience is not None
        try:
            caller = deps.iap(config.audience, config.certs_url).caller(dict(request.headers))
        except Exception as exc:  # the verifier's own errors: all mean "no identity"
            raise _Answer(401, {"refusal": f"Not signed in ({exc})."}) from exc
        return access.user_for_email(str(caller.user), config.email_domain)
    if config.mode == access.Mode.DEV:
        user = request.headers.get(DEV_HEADER)
        if not user:
            raise _Answer(401, {"refusal": f"Who is asking? Send {DEV_HEADER} (`--as`)."})
        return str(user)
    raise _Answer(403, {"refusal": "The cli function has no identity source: set "
                                   "STASIS_IAP_AUDIENCE behind Identity-Aware Proxy, or "
                                   "STASIS_IDENTITY=dev on a local stack."})


def _refuse(text: str) -> _Answer:
    return _Answer(400, {"refusal": frontdoor.refused(text, Door.CLI)})


def _submit(deps: PortalDeps, user: str, body: dict[str, Any]) -> dict[str, Any]:
    verb, name = body.get("verb"), body.get("name")
    if verb not in VERBS or not isinstance(name, str):
        raise _Answer(400, {"refusal": f"A request takes a verb ({', '.join(VERBS)}) and a "
                                       "name."})
    now = deps.clock()
    catalog = catalog_knowing(deps, lambda c: c.knows(
        member=user, team=_text(body, "team"), profile=_text(body, "profile"),
        ide=_text(body, "ide"), environment=_text(body, "environment")))
    if verb == "create" and (problem := frontdoor.name_refusal(name)):
        raise _refuse(problem)  # before the team: what was typed wrong comes first
    team = frontdoor.choose_team(catalog, user, _text(body, "team"))
    if isinstance(team, str):
        raise _refuse(team)
    ws_id = workspace_id(team.id, name)
    # A name that is no slug names no workspace (and no document path is built from it).
    existing = deps.store.get_workspace(ws_id) if frontdoor.NAME_PATTERN.fullmatch(name) else None

    def usage() -> dict[str, Any]:
        return dict((deps.store.get("teams", team.id) or {}).get("usage") or {})

    payload: Any
    verdict: Preview
    if verb == "create":
        payload = WorkspaceRequested(
            team=team.id, owner=user, name=name,
            profile=_text(body, "profile") or (team.profiles[0] if team.profiles else ""),
            ide=_text(body, "ide") or "jupyterlab",
            environment=_text(body, "environment") or "python-3-11")
        verdict = frontdoor.preview_create(catalog, payload, existing, usage(),
                                           _capabilities(deps), now)
    else:
        found = frontdoor.find_workspace(
            team, name, existing, lambda: deps.store.team_page(team.id, _LISTED, None)[0])
        if isinstance(found, str):
            raise _refuse(found)
        refusal = rights.change_refusal(team, user, owner=found.owner, name=found.name,
                                        verb=verb)
        if refusal:
            raise _refuse(refusal)
        if verb == "pause":
            payload = WorkspacePauseRequested(workspace_id=ws_id, actor=user)
        elif verb == "delete":
            payload = WorkspaceDeleteRequested(workspace_id=ws_id, actor=user,
                                               keep_home=bool(body.get("keep_home")))
        else:
            payload = WorkspaceResumeRequested(
                workspace_id=ws_id, actor=user, profile=_text(body, "profile"),
                device_arrays_to_cpu=bool(body.get("device_arrays_to_cpu")))
        verdict = (frontdoor.preview_resume(catalog, found, payload, usage(), now)
                   if verb == "resume"
                   else frontdoor.preview_transition(catalog, found, payload, {}, now))
    if verdict.refusal:
        raise _refuse(verdict.refusal)
    requestid = _text(body, "requestid")
    try:
        event = new_event(payload, source=SOURCE, requestid=requestid, id=requestid)
    except InvalidEvent as exc:
        raise _Answer(400, {"refusal": f"Nothing done: {exc.reason}."}) from exc
    try:
        deps.bus.publish(event)
    except Exception as exc:
        raise _Answer(503, {"refusal": f"The request could not be queued "
                                       f"({type(exc).__name__}); nothing was changed."}) from exc
    return {"id": event.id, "type": event.type, "name": event.name,
            "requestid": event.requestid, "workspace_id": event.subject, "team": team.id,
            "verdict": deps.store.verdict_key(event),
            "queued": verdict.queued, "notices": list(verdict.notices)}


def _capabilities(deps: PortalDeps) -> Mapping[str, Any]:
    try:
        return deps.runtime.capabilities()
    except (RuntimeUnavailable, RuntimeRefused) as exc:
        raise _Answer(503, {"refusal": f"The runtime did not answer ({exc}); nothing was "
                                       "requested."}) from exc


def _listed(deps: PortalDeps, user: str, args: Mapping[str, str]) -> list[dict[str, Any]]:
    catalog = deps.catalog()
    wanted = args.get("team") or None
    if wanted is not None:
        team = frontdoor.choose_team(catalog, user, wanted)
        if isinstance(team, str):
            raise _Answer(400, {"refusal": team})
        teams = [team]
    else:
        teams = list(catalog.teams_of(user))
    rows = []
    for team in teams:
        for ws in deps.store.team_page(team.id, _LISTED, None)[0]:
            if ws.state != "DELETED" or args.get("all"):
                rows.append({"team": ws.team, "name": ws.name, "state": str(ws.state),
                             "profile": ws.profile, "owner": ws.owner, "url": ws.url})
    return sorted(rows, key=lambda r: (r["team"], r["name"]))


def _text(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) and value else None


def _json(body: Mapping[str, Any]) -> str:
    import json

    return json.dumps(body, default=str)
