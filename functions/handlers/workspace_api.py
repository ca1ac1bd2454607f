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

401 without a valid token; 400 for a malformed body. No SDK: the store, the jobs' reads
and the bus are the control plane's ports.
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
from functions.handlers.deps import Deps

SOURCE = "//stasis/workspace"
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
    claimed = claimed_workspace(token) if token and key else None
    ws = deps.store.get_workspace(claimed) if claimed else None
    if ws is None or ws.state in _GONE or not verify(key, token, ws.id, ws.incarnation):
        raise _Answer(401, {"refusal": "Not a workspace of this control plane (send "
                                       "Authorization: Bearer $STASIS_WORKSPACE_TOKEN)."})
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
