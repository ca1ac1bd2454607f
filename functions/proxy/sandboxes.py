"""Agent sandboxes through a link: ``<link base>/stasis/sandboxes``.

A coding agent holding a link (scope ``exec`` or ``sandbox``) hands a task to a sandbox of
the link's team, as the link's creator, and reads the result back. The link was checked by
the proxy on this very request (revoked, expired, creator no longer a member: refused
before this module is reached); admission itself stays with the sandbox handler, which
applies the team's policy, limits and queue exactly as for ``stasis sandbox run`` or
``/ws sandbox``.

=================================== ======================================================
``POST stasis/sandboxes``           ``{"repository", "command", "base_ref"?, "limits"?,
                                    "allowed_network"?, "sandbox_id"?}`` -> 201 with the
                                    state (RUNNING, or QUEUED with its position), a 4xx
                                    with the handler's reason, or 202 if it has not decided
                                    within ``answer_seconds`` (then poll the URL)
``GET  stasis/sandboxes``           the creator's sandboxes in the team, newest first
``GET  stasis/sandboxes/<id>``      state, exit status, files changed, and when it ended
                                    the patch text and the end of the log
``GET  stasis/sandboxes/<id>/patch`` the patch alone (``text/x-diff``), for ``git apply``
``POST stasis/sandboxes/<id>/resume`` bring back a SUSPENDED one (idle): RUNNING, or its
                                    resume waits for a slot with a position
=================================== ======================================================

One effect per request: the request id is ``link-<link id>-<sandbox id>``, so an agent
that retries a POST with the same ``sandbox_id`` gets the first answer again, and another
link reusing the id is refused (409). A sandbox is visible only through links of the
creator who requested it, in its team; anything else is answered 404, as if it did not
exist. Patches are never applied here: the agent (or ``stasis sandbox apply``) does.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from events import InvalidEvent, SandboxRequested, SandboxResumeRequested, new_event
from functions.domain.links import SANDBOX_ID, Link
from functions.domain.redaction import redact
from functions.domain.sandboxes import TERMINAL
from functions.domain.sandboxes import Reason as SandboxReason
from functions.ports import Bus
from functions.proxy.ports import SandboxResults

log = logging.getLogger(__name__)
SOURCE = "//stasis/functions/proxy"
#: How long a POST waits for the handler's admission before answering 202.
ANSWER_SECONDS = 10.0
MAX_PATCH_BYTES = 4 << 20
LOG_TAIL_BYTES = 16 << 10
_FIELDS = ("repository", "command", "base_ref", "limits", "allowed_network", "sandbox_id")
#: The handler's refusals, as HTTP statuses.
REFUSAL_STATUS: Mapping[str, int] = {
    SandboxReason.UNKNOWN_TEAM: 403,
    SandboxReason.NOT_A_MEMBER: 403,
    SandboxReason.READ_ONLY_MEMBER: 403,
    SandboxReason.NETWORK_NOT_PERMITTED: 403,
    SandboxReason.INVALID_LIMITS: 400,
    SandboxReason.LIMIT_ABOVE_MAXIMUM: 400,
    SandboxReason.SANDBOX_ID_IN_USE: 409,
    SandboxReason.QUEUE_FULL: 429,
    SandboxReason.INVALID_POLICY: 503,
    SandboxReason.NOT_SUSPENDED: 409,
    SandboxReason.ALREADY_FINISHED: 409,
    SandboxReason.RESUME_ALREADY_QUEUED: 409,
}
_SHOWN = ("id", "team", "requester", "state", "reason", "message", "queue_position",
          "repository", "base_ref", "command", "limits", "allowed_network", "requested_at",
          "started_at", "finished_at", "exit_status", "termination", "error", "base_sha",
          "files_changed", "patch_bytes", "patch_uri", "log_uri", "duration_ms",
          "cpu_seconds", "peak_memory_bytes", "network")
#: What people type, which may carry credentials: shown redacted (even to the requester:
#: an agent's transcript is read by others).
_TYPED = frozenset({"repository", "command", "message", "error"})
_BODY_HELP = ('send JSON {"repository": PATH_OR_GIT_URL, "command": "...", "base_ref"?: REF, '
              '"limits"?: {"cpu_seconds", "memory", "wall_clock_seconds", "processes", "disk"}, '
              '"allowed_network"?: [HOST, ...], "sandbox_id"?: ID}')


def new_sandbox_id(now: datetime, random_hex: str) -> str:
    """``sbx-YYYYmmdd-HHMMSS-xxxxxx``, the shape ``stasis sandbox run`` uses."""
    return f"sbx-{now:%Y%m%d-%H%M%S}-{random_hex}"


class SandboxDesk:
    """The ``stasis/sandboxes`` paths of the proxy, for a request whose link was allowed."""

    def __init__(self, results: SandboxResults, bus: Bus, *, clock: Callable[[], datetime],
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll_seconds: float = 0.1,
                 answer_seconds: float = ANSWER_SECONDS) -> None:
        self.results = results
        self.bus = bus
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.poll_seconds = poll_seconds
        self.answer_seconds = answer_seconds

    def __call__(self, request: Request, link: Link, rest: list[str],
                 headers: Mapping[str, str]) -> Response:
        """``rest``: the path after ``stasis/sandboxes``."""
        if not rest:
            if request.method == "POST":
                return self._request(request, link, headers)
            return self._list(link, headers)
        doc = self.results.sandbox(rest[0])
        if doc is None or doc.get("team") != link.team or doc.get("requester") != link.creator:
            return _json({"error": "unknown_sandbox", "message": f"no sandbox {rest[0]} "
                          f"requested by {link.creator} in team {link.team}"}, 404, headers)
        if rest[1:] == ["patch"]:
            return self._patch(doc, headers)
        if rest[1:] == ["resume"]:
            return self._resume(link, doc, headers)
        return _json(self._view(doc), 200, headers)

    # --- POST -----------------------------------------------------------------------------
    def _request(self, request: Request, link: Link, headers: Mapping[str, str]) -> Response:
        body = request.get_json(silent=True)
        problem = _body_problem(body)
        if problem:
            return _json({"error": "bad_request", "message": f"{problem}; {_BODY_HELP}"}, 400,
                         headers)
        assert isinstance(body, dict)
        now = self.clock()
        sandbox_id = body.get("sandbox_id") or new_sandbox_id(now, secrets.token_hex(3))
        requestid = f"link-{link.link_id}-{sandbox_id}"
        try:
            payload = SandboxRequested(
                sandbox_id=sandbox_id, team=link.team, requester=link.creator,
                repository=body["repository"], command=body["command"],
                base_ref=body.get("base_ref") or "HEAD", limits=dict(body.get("limits") or {}),
                allowed_network=list(body.get("allowed_network") or []))
            event = new_event(payload, source=SOURCE, requestid=requestid, id=requestid)
        except InvalidEvent as exc:
            return _json({"error": "bad_request", "message": exc.reason}, 400, headers)
        try:
            self.bus.publish(event)
        except Exception as exc:
            log.exception("publishing sandbox.requested for link %s failed", link.link_id)
            return _json({"error": "unavailable", "message": f"could not queue the request "
                          f"({type(exc).__name__}); nothing was requested: try again"}, 503,
                         {**headers, "Retry-After": "5"})
        log.info("link %s requested sandbox %s for %s in team %s", link.link_id, sandbox_id,
                 link.creator, link.team)
        url = f"{request.script_root}{request.path.rstrip('/')}/{sandbox_id}"
        answer: dict[str, Any] = {"sandbox_id": sandbox_id, "requestid": requestid, "url": url}
        outcome = self._outcome(event)
        if outcome is None:
            return _json({**answer, "state": "REQUESTED", "message": "requested; the "
                          f"admission has not answered yet: poll {url}"}, 202,
                         {**headers, "Location": url})
        answer.update(state=outcome.get("state"), reason=outcome.get("reason"),
                      message=outcome.get("message"),
                      queue_position=outcome.get("queue_position"))
        if outcome.get("accepted"):
            return _json(answer, 201, {**headers, "Location": url})
        status = REFUSAL_STATUS.get(str(outcome.get("reason")), 409)
        return _json({**answer, "error": outcome.get("reason")}, status, headers)

    def _resume(self, link: Link, doc: Mapping[str, Any],
                headers: Mapping[str, str]) -> Response:
        sandbox_id = str(doc.get("id"))
        if doc.get("state") != "SUSPENDED":
            return _json({"error": str(SandboxReason.NOT_SUSPENDED), "state": doc.get("state"),
                          "message": f"sandbox {sandbox_id} is {doc.get('state')}, not "
                                     "suspended: nothing to resume"}, 409, headers)
        # One request per suspended period: a retried POST is the same request.
        requestid = f"link-{link.link_id}-resume-{sandbox_id}-v{doc.get('version')}"
        event = new_event(SandboxResumeRequested(sandbox_id=sandbox_id,
                                                 requester=link.creator),
                          source=SOURCE, requestid=requestid, id=requestid)
        try:
            self.bus.publish(event)
        except Exception as exc:
            log.exception("publishing sandbox.resume_requested for link %s failed",
                          link.link_id)
            return _json({"error": "unavailable", "message": f"could not ask for the resume "
                          f"({type(exc).__name__}): try again"}, 503,
                         {**headers, "Retry-After": "5"})
        answer: dict[str, Any] = {"sandbox_id": sandbox_id, "requestid": requestid}
        outcome = self._outcome(event)
        if outcome is None:
            return _json({**answer, "state": "SUSPENDED", "message": "resume requested; "
                          "not answered yet: poll the sandbox"}, 202, headers)
        answer.update(state=outcome.get("state"), reason=outcome.get("reason"),
                      message=outcome.get("message"),
                      queue_position=outcome.get("queue_position"))
        if outcome.get("accepted"):
            return _json(answer, 200, headers)
        return _json({**answer, "error": outcome.get("reason")},
                     REFUSAL_STATUS.get(str(outcome.get("reason")), 409), headers)

    def _outcome(self, event: Any) -> Mapping[str, Any] | None:
        deadline = self.monotonic() + self.answer_seconds
        while True:
            outcome = self.results.request_outcome(event)
            if outcome is not None or self.monotonic() >= deadline:
                return outcome
            self.sleep(self.poll_seconds)

    # --- GET --------------------------------------------------------------------------------
    def _list(self, link: Link, headers: Mapping[str, str]) -> Response:
        rows = sorted(self.results.list_sandboxes(link.team, link.creator),
                      key=lambda d: str(_iso(d.get("requested_at")) or ""), reverse=True)
        return _json({"team": link.team, "requester": link.creator, "sandboxes": [
            {k: _iso(d.get(k)) for k in ("id", "state", "queue_position", "message",
                                         "requested_at", "finished_at", "patch_bytes")}
            for d in rows]}, 200, headers)

    def _view(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        view = {k: redact(doc[k]) if k in _TYPED and doc[k] is not None else _iso(doc.get(k))
                for k in _SHOWN if k in doc}
        if doc.get("state") not in TERMINAL:
            return view
        view["review"] = (f"stasis sandbox show {doc['id']}; stasis sandbox apply {doc['id']} "
                          "--to CHECKOUT (patches are never applied automatically)")
        for key, uri, limit, tail in (("patch", doc.get("patch_uri"), MAX_PATCH_BYTES, False),
                                      ("log_tail", doc.get("log_uri"), LOG_TAIL_BYTES, True)):
            if not uri:
                continue
            try:
                data, more = self.results.read_object(str(uri), limit=limit, tail=tail)
            except Exception as exc:  # the record still answers; say what is missing
                view[f"{key}_error"] = f"cannot read {uri}: {type(exc).__name__}: {exc}"
                continue
            text = data.decode("utf-8", errors="replace")
            # The log repeats the command as typed; a patch is the work itself, kept whole.
            view[key] = redact(text) if tail else text
            view[f"{key}_truncated"] = more
        return view

    def _patch(self, doc: Mapping[str, Any], headers: Mapping[str, str]) -> Response:
        if doc.get("state") not in TERMINAL:
            return _json({"error": "not_finished", "message": f"sandbox {doc.get('id')} is "
                          f"{doc.get('state')}: no patch yet"}, 409, headers)
        if not doc.get("patch_uri"):
            return _json({"error": "no_patch", "message": f"sandbox {doc.get('id')} has no "
                          f"patch ({doc.get('message')})"}, 404, headers)
        try:
            data, more = self.results.read_object(str(doc["patch_uri"]), limit=MAX_PATCH_BYTES)
        except Exception as exc:
            return _json({"error": "unavailable", "message": f"cannot read the patch: {exc}"},
                         503, headers)
        if more:
            return _json({"error": "too_large", "message": f"the patch is over "
                          f"{MAX_PATCH_BYTES} bytes: `stasis sandbox show {doc.get('id')}` "
                          "prints it"}, 413, headers)
        return Response(data, status=200, content_type="text/x-diff; charset=utf-8",
                        headers={**headers, "Cache-Control": "no-store"})


def _body_problem(body: Any) -> str | None:
    """What is wrong with a POST body's shape (the event schema checks the rest)."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        return f"unknown fields {', '.join(unknown)}"
    for key in ("repository", "command"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            return f"{key} is missing"
    if body.get("base_ref") is not None and not isinstance(body["base_ref"], str):
        return "base_ref is a string"
    if body.get("limits") is not None and not isinstance(body["limits"], dict):
        return "limits is an object"
    network = body.get("allowed_network")
    if network is not None and (not isinstance(network, list)
                                or not all(isinstance(n, str) for n in network)):
        return "allowed_network is a list of host names or CIDRs"
    sandbox_id = body.get("sandbox_id")
    if sandbox_id is not None and (not isinstance(sandbox_id, str)
                                   or not SANDBOX_ID.fullmatch(sandbox_id)):
        return "sandbox_id takes 3-63 lowercase letters, digits and dashes"
    return None


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _json(body: Mapping[str, Any], status: int,
          headers: Mapping[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str), status=status, mimetype="application/json",
                    headers={"Cache-Control": "no-store", **(headers or {})})
