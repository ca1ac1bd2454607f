"""The ``workspace_api`` function: a workspace's kernel reaches the control plane here, as
its workspace, and only here (issue 17 §3).

The caller is the workspace its ``Authorization: Bearer <STASIS_WORKSPACE_TOKEN>`` names
(``events.identity``: an HMAC of the workspace id and incarnation under the control plane's
workspace key), checked against the workspace's own document; a deleted workspace's token,
or one of another incarnation, is refused. Team and owner come from that document, never
from the request.

- ``POST /events`` ``{"type": "job.submitted" | "job.finished", "payload": {...},
  "requestid"}``: published as the workspace's event. A job.submitted is the workspace's
  team's and owner's (a payload naming another team is refused, 403); a job.finished only
  for a job this workspace submitted. 202 ``{"id"}``.
- ``GET /jobs/<id>``: the job's document, for a job of this workspace's team (404 else).

On Kubernetes the kernel sends its pod's projected service-account token instead (audience
``stasis-workspace``) and ``X-Stasis-Workspace: <id>``: ``deps.workspace_tokens`` verifies
it against the cluster's keys, and ``functions.domain.workspace_identity`` checks that its
``kubernetes.io`` claims name the namespace and the KSA that workspace's document says its
pod runs as (``objects.workspace.service_account_name``: id and incarnation).

401 without a valid token (the reason named); 400 for a malformed body. No SDK: the
store, the jobs' reads, the token verifier and the bus are the control plane's ports.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from werkzeug.wrappers import Response

from events import InvalidEvent, new_event
from events.identity import KEY_VAR, claimed_workspace, verify
from events.payloads import JobFinished, JobSubmitted
from functions.domain.lifecycle import State, Workspace
from functions.domain.workspace_identity import kubernetes_refusal
from functions.handlers.deps import Deps
from functions.kubernetes.objects.settings import ClusterSettings
from functions.kubernetes.objects.team import team_namespace_name
from functions.kubernetes.objects.workspace import service_account_name
from functions.ports import InvalidWorkspaceToken

SOURCE = "//stasis/workspace"
#: On Kubernetes the token (a JWT) does not name the workspace: this header does, and the
#: token must be of that workspace's own service account.
WORKSPACE_HEADER = "X-Stasis-Workspace"
_GONE = (State.DELETING, State.DELETED)


class _Answer(Exception):
    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        super().__init__(status)
        self.status, self.body = status, dict(body)


def serve(request: Any, deps: Deps) -> Response:
    """Answer one call of a workspace's kernel (``request``: a werkzeug request)."""
    try:
        ws = _caller(request, deps, os.environ.get(KEY_VAR) or "")
        path = (request.path or "/").rstrip("/") or "/"
        if request.method == "POST" and path == "/events":
            body = request.get_json(silent=True)
            if not isinstance(body, dict):
                raise _Answer(400, {"refusal": "The request is not a JSON object."})
            raise _Answer(202, _publish(deps, ws, body))
        if request.method == "GET" and path.startswith("/jobs/"):
            raise _Answer(200, _job(deps, ws, path.removeprefix("/jobs/")))
        raise _Answer(404, {"refusal": f"No such call: {request.method} {path}."})
    except _Answer as answer:
        return Response(json.dumps(answer.body, default=str), status=answer.status,
                        mimetype="application/json")


def _caller(request: Any, deps: Deps, key: str) -> Workspace:
    header = str(request.headers.get("Authorization") or "")
    token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
    named = str(request.headers.get(WORKSPACE_HEADER) or "")
    if token and named and deps.workspace_tokens is not None:
        return _kubernetes_caller(deps, token, named)
    claimed = claimed_workspace(token) if token and key else None
    ws = deps.store.get_workspace(claimed) if claimed else None
    if ws is None or ws.state in _GONE or not verify(key, token, ws.id, ws.incarnation):
        raise _Answer(401, {"refusal": "Not a workspace of this control plane (send "
                                       "Authorization: Bearer $STASIS_WORKSPACE_TOKEN)."})
    return ws


def _kubernetes_caller(deps: Deps, token: str, workspace_id: str) -> Workspace:
    """The workspace whose pod holds ``token`` (its projected KSA token, GKE)."""
    try:
        claims = deps.workspace_tokens.verify(token)
    except InvalidWorkspaceToken as exc:
        raise _Answer(503 if exc.temporary else 401,
                      {"refusal": f"Not a workspace token: {exc.reason}."}) from exc
    ws = deps.store.get_workspace(workspace_id)
    refusal = kubernetes_refusal(
        claims, ws, namespace=team_namespace_name(ws.team, ClusterSettings.from_env(
            os.environ)) if ws else "",
        service_account=service_account_name(ws.id, ws.incarnation) if ws else "")
    if refusal is not None or ws is None:
        raise _Answer(401, {"refusal": f"Not workspace {workspace_id}: {refusal}."})
    return ws


def _publish(deps: Deps, ws: Workspace, body: Mapping[str, Any]) -> dict[str, Any]:
    kind, raw = body.get("type"), body.get("payload")
    if not isinstance(raw, dict):
        raise _Answer(400, {"refusal": "payload must be an object."})
    payload: JobSubmitted | JobFinished
    try:
        if kind == "job.submitted":
            team = raw.get("team")
            if team not in (None, ws.team):
                raise _Answer(403, {"refusal": f"Workspace {ws.id} submits jobs for its own "
                                               f"team ({ws.team}) only, not {team}."})
            fields = {k: v for k, v in raw.items()
                      if k in {f.name for f in dataclasses.fields(JobSubmitted)}}
            payload = JobSubmitted(**{**fields, "team": ws.team, "owner": ws.owner,
                                      "workspace_id": ws.id})
        elif kind == "job.finished":
            job = deps.jobs.get(str(raw.get("job_id") or "")) if deps.jobs else None
            if job is None or job.workspace_id != ws.id:
                raise _Answer(403, {"refusal": f"Workspace {ws.id} did not submit job "
                                               f"{raw.get('job_id')}."})
            payload = JobFinished(**raw)
        else:
            raise _Answer(400, {"refusal": f"A workspace publishes job.submitted or "
                                           f"job.finished, not {kind!r}."})
        event = new_event(payload, source=SOURCE, subject=ws.id,
                          requestid=str(body.get("requestid") or "") or None)
    except (TypeError, ValueError, InvalidEvent) as exc:
        raise _Answer(400, {"refusal": f"Not a valid {kind}: {exc}"}) from exc
    deps.bus.publish(event)
    return {"id": event.id, "type": kind}


def _job(deps: Deps, ws: Workspace, job_id: str) -> dict[str, Any]:
    job = deps.jobs.get(job_id) if deps.jobs else None
    if job is None or job.team != ws.team:
        raise _Answer(404, {"refusal": f"No job {job_id} of team {ws.team}."})
    return dict(job.to_doc())
