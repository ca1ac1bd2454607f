"""The ``chat`` function's HTTP face: Slack's ``/ws`` command in, the ack out.

The Slack app itself (bolt: the signature check, the 3-second ack) is an adapter
(``functions/adapters/slack.py``); ``bootstrap`` builds it and hands it over as a
:class:`ChatFront`, or says why it could not (no signing secret: every request is refused
with 503, never served unverified).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatFront:
    """What the chat function is given."""

    #: Serves one request through the Slack app (None: chat is not configured).
    slack: Callable[[Any], Any] | None
    #: Builds the clients and makes one Firestore read (the warm-up).
    warm_up: Callable[[], Any]
    #: Why there is no Slack app.
    problem: str = ""


def serve(request: Any, front: ChatFront) -> Any:
    """The Slack ``/ws`` command (HTTP). Refuses to serve (503) without a signing secret.

    ``GET`` builds the app and its clients and makes one Firestore read, then answers 200:
    a warm-up (`stasis up`, a scheduler or min-instance probe) so that the first slash
    command after a cold start still acks within Slack's 3 seconds.
    """
    if front.slack is None:
        return {"error": front.problem}, 503
    if request.method == "GET":
        front.warm_up()
        return {"ok": True}
    return front.slack(request)
