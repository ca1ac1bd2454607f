"""The CLI's calls to the control plane's ``cli`` function (``functions/portal/api.py``).

A workspace request goes there, not to Pub/Sub: the function previews it with the words
chat and the portal use (``functions.domain.frontdoor``) and publishes what passes. So a
verb that only asks or lists imports neither a Google SDK nor the event schemas: the
standard library's HTTP client and JSON are all it needs (``bench/cli_latency.py``).

:func:`request` answers the published event (:class:`Requested`) or raises
``options.Refused`` (exit 2) with the preview's words, or ``options.Unavailable`` (exit 4)
when the function does not answer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from stack.settings import Settings
from stasis_cli import options

_TIMEOUT = 30


@dataclass(frozen=True)
class Requested:
    """A request the control plane accepted and published (what ``client.follow`` needs)."""

    id: str
    type: str
    name: str
    requestid: str
    subject: str
    team: str
    #: The ledger entry that will hold the verdict (``client.outcome`` reads it).
    verdict: str | None = None
    queued: str | None = None
    notices: tuple[str, ...] = ()


def request(settings: Settings, user: str, body: dict[str, Any]) -> Requested:
    """POST a workspace request (``body``: verb, name, team, ...) with a new request id."""
    import uuid

    answer = _call(settings, user, "POST", "", {**body, "requestid": uuid.uuid4().hex})
    return Requested(id=answer["id"], type=answer["type"], name=answer["name"],
                     requestid=answer["requestid"], subject=answer["workspace_id"],
                     team=answer["team"], verdict=answer.get("verdict"),
                     queued=answer.get("queued"),
                     notices=tuple(answer.get("notices") or ()))


def workspaces(settings: Settings, user: str, *, team: str | None,
               include_deleted: bool) -> list[dict[str, Any]]:
    """The workspaces of ``user``'s teams (of ``team`` only, if given)."""
    query = urllib.parse.urlencode({k: v for k, v in (("team", team),
                                                      ("all", "1" if include_deleted else ""))
                                    if v})
    rows: list[dict[str, Any]] = _call(settings, user, "GET", f"workspaces?{query}",
                                       None)["workspaces"]
    return rows


def _call(settings: Settings, user: str, method: str, path: str,
          body: dict[str, Any] | None) -> dict[str, Any]:
    url = f"{settings.functions_url}/cli/{path}"
    data = json.dumps(body).encode() if body is not None else None
    sent = urllib.request.Request(url, data=data, method=method, headers={
        "X-Stasis-User": user, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(sent, timeout=_TIMEOUT) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            answer = {}
        refusal = answer.get("refusal") or f"HTTP {exc.code} from the cli function"
        if exc.code >= 500:
            raise options.Unavailable(refusal) from None
        raise options.Refused(refusal) from None
    except (OSError, ValueError) as exc:
        raise options.Unavailable(f"the control plane did not answer ({exc}); is the stack "
                                  "up (`stasis status`)?") from None
