"""Slack: the ``/ws`` command's bolt app (Cloud Functions adapter) and the notifier.

Configuration (environment; the local stack sets all of them, see ``stack/chat.py``):

- ``STASIS_SLACK_SIGNING_SECRET``: verifies every request (bolt's RequestVerification: a bad
  signature, or a timestamp more than five minutes away, is answered 401). Without it the
  chat function refuses to serve (503): it never accepts unsigned requests.
- ``STASIS_SLACK_TEAM_ID`` (``T…``): the Slack workspace Stasis serves; a signed request
  from any other one (another install of the app, a Slack Connect channel) is refused before
  its user id is looked at (``signing.foreign_workspace``). Without it the chat function
  refuses to serve (503), as without the secret. ``STASIS_SLACK_ENTERPRISE_ID`` (``E…``,
  optional): the Enterprise Grid org, checked as well when set.
- ``STASIS_SLACK_BOT_TOKEN``: for ``chat.postMessage``.
- ``STASIS_SLACK_API_URL``: the Web API base URL (default ``https://slack.com/api/``; the
  local stack points it at its Slack sink). response_urls are only followed to Slack's
  hooks host or to the origin of that base URL, so a stored URL can never aim the
  notifier elsewhere.

SDK imports happen on first use, not at import time: every function of the host builds its
dependencies in the same process, and only the chat functions need Slack's SDKs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from functions.chatops import grammar, signing
from functions.chatops.ports import NotifyRefused, SlashRequest

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://slack.com/api/"
SLACK_HOOKS = "https://hooks.slack.com/"
TIMEOUT_SECONDS = 10
# Web API errors worth retrying; any other error is Slack's final word.
_TEMPORARY = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                        "request_timeout"})


class ChatNotConfigured(RuntimeError):
    """No signing secret: the chat function must not serve requests it cannot verify."""


@dataclass(frozen=True)
class SlackSettings:
    signing_secret: str | None
    bot_token: str | None
    api_url: str = DEFAULT_API_URL
    team_id: str | None = None
    enterprise_id: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SlackSettings:
        api = environ.get("STASIS_SLACK_API_URL") or DEFAULT_API_URL
        return cls(environ.get("STASIS_SLACK_SIGNING_SECRET") or None,
                   environ.get("STASIS_SLACK_BOT_TOKEN") or None,
                   api if api.endswith("/") else api + "/",
                   (environ.get("STASIS_SLACK_TEAM_ID") or "").strip() or None,
                   (environ.get("STASIS_SLACK_ENTERPRISE_ID") or "").strip() or None)


class ChatFunction:
    """The ``chat`` HTTP function: bolt verifies, the ``/ws`` listener acks ``answer(req)``.

    ``process_before_response``: on Cloud Functions nothing may run after the response,
    so the listener does its (short) work and the ack is sent when it returns.
    """

    def __init__(self, settings: SlackSettings,
                 answer: Callable[[SlashRequest], dict[str, Any]]) -> None:
        if not settings.signing_secret:
            raise ChatNotConfigured("chat is not configured: set STASIS_SLACK_SIGNING_SECRET")
        if not settings.team_id:
            raise ChatNotConfigured("chat is not configured: set STASIS_SLACK_TEAM_ID (the "
                                    "Slack workspace it serves)")
        from slack_bolt import App, BoltResponse
        from slack_bolt.adapter.google_cloud_functions import SlackRequestHandler
        from slack_bolt.authorization import AuthorizeResult
        from slack_sdk import WebClient

        self.settings = settings
        token = settings.bot_token

        # bolt injects listener arguments by parameter name, so these are plain functions.
        def authorize(enterprise_id: str | None, team_id: str | None,
                      user_id: str | None) -> AuthorizeResult:
            # One Slack workspace, one bot token: nothing to look up, and no auth.test
            # call in the request path (bolt's default makes one per cold start).
            return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id,
                                   bot_token=token, user_id=user_id)

        def on_command(ack: Any, body: dict[str, Any], request: Any) -> None:
            ack(answer(slash_request(body, request.raw_body, request.headers)))

        team_id, enterprise_id = settings.team_id, settings.enterprise_id

        def only_our_workspace(body: dict[str, Any], next: Callable[[], Any]) -> Any:
            # After bolt's signature check, before any listener: every request.
            why = signing.foreign_workspace(body, team_id=team_id,
                                            enterprise_id=enterprise_id)
            if why is None:
                return next()
            log.warning("refused a request from Slack team %s (enterprise %s): Stasis serves "
                        "%s", body.get("team_id"), body.get("enterprise_id"), team_id)
            # 200 with an ephemeral text: Slack shows the person why (a 4xx shows nothing).
            return BoltResponse(status=200, body=json.dumps(
                {"response_type": "ephemeral", "text": why}),
                headers={"content-type": "application/json"})

        self.app = App(
            signing_secret=settings.signing_secret,
            authorize=authorize,
            process_before_response=True,
            # The token comes with each request's AuthorizeResult (above).
            client=WebClient(base_url=settings.api_url, timeout=TIMEOUT_SECONDS),
            logger=log,
        )
        self.app.use(only_our_workspace)
        self.app.command(grammar.COMMAND)(on_command)
        self.handler = SlackRequestHandler(self.app)

    def handle(self, request: Any) -> Any:
        """Serve one Flask request (what functions-framework hands an HTTP function)."""
        if request.method != "POST":
            return self.handler.handle(request)
        from slack_bolt.adapter.flask.handler import to_flask_response

        return to_flask_response(self.app.dispatch(_bolt_request(
            request.get_data(as_text=True), request.headers,
            request.query_string.decode("utf-8"))))

    def dispatch(self, body: str, headers: Mapping[str, str]) -> Any:
        """Serve a raw request without Flask (tests, benchmarks): a BoltResponse."""
        return self.app.dispatch(_bolt_request(body, headers))


def _bolt_request(body: str, headers: Mapping[str, Any], query: str | None = None) -> Any:
    """bolt's request, with the form parsed right when the word "payload" is in it.

    bolt (``slack_bolt.request.internals.parse_body``) takes any form body that merely
    contains "payload" for an interactivity payload and finds none: ``/ws sandbox /r --
    pytest test_payload.py`` would be unhandled (404). A slash command has no ``payload``
    field, so the form's own fields are put back (the raw body, which the signature covers,
    is untouched).
    """
    from urllib.parse import parse_qsl

    from slack_bolt.context import BoltContext
    from slack_bolt.request import BoltRequest
    from slack_bolt.request.internals import build_context

    request = BoltRequest(body=body, query=query, headers=dict(headers))
    if "payload" in body and not request.body and not body.lstrip().startswith("{"):
        form = dict(parse_qsl(body, keep_blank_values=True))
        if "payload" not in form:
            request.body = form
            request.context = build_context(BoltContext({}), form)
    return request


def slash_request(body: Mapping[str, Any], raw_body: str,
                  headers: Mapping[str, Any]) -> SlashRequest:
    """The verified slash command bolt parsed, with its deterministic request id."""

    def field(name: str) -> str | None:
        value = body.get(name)
        return str(value) if value else None

    retry = any(k.lower() == signing.RETRY_HEADER.lower() for k in headers)
    return SlashRequest(
        text=str(body.get("text") or ""), user=str(body.get("user_id") or ""),
        requestid=signing.request_id(field("trigger_id"), raw_body),
        team=field("team_id"), channel=field("channel_id"),
        response_url=field("response_url"), retry=retry)


class SlackNotifier:
    """Speaks after the ack: response_url (WebhookClient) or chat.postMessage (WebClient)."""

    def __init__(self, settings: SlackSettings) -> None:
        self.settings = settings
        self._client: Any = None

    def respond(self, response_url: str, message: Mapping[str, Any]) -> bool:
        if not self._allowed(response_url):
            log.warning("not following a response_url outside Slack: %s", response_url[:80])
            return False
        from slack_sdk.webhook import WebhookClient

        response = WebhookClient(response_url, timeout=TIMEOUT_SECONDS).send_dict(dict(message))
        if response.status_code == 200:
            return True
        if response.status_code == 429 or response.status_code >= 500:
            raise ConnectionError(f"response_url answered {response.status_code}: "
                                  f"{response.body[:200]}")
        # 404 expired_url / used_url, 400 ...: this URL is done; the caller posts instead.
        log.info("response_url refused (%s %s); falling back to chat.postMessage",
                 response.status_code, response.body[:200])
        return False

    def post(self, channel: str, message: Mapping[str, Any]) -> None:
        if not self.settings.bot_token:
            raise NotifyRefused("no bot token: set STASIS_SLACK_BOT_TOKEN")
        from slack_sdk.errors import SlackApiError

        try:
            self._web().chat_postMessage(channel=channel, text=message.get("text", ""),
                                         metadata=message.get("metadata"))
        except SlackApiError as exc:
            error = str(exc.response.get("error") or exc.response.status_code)
            if exc.response.status_code == 429 or error in _TEMPORARY:
                raise ConnectionError(f"chat.postMessage: {error}") from exc
            raise NotifyRefused(f"chat.postMessage: {error}") from exc

    def _web(self) -> Any:
        if self._client is None:
            from slack_sdk import WebClient

            self._client = WebClient(token=self.settings.bot_token,
                                     base_url=self.settings.api_url, timeout=TIMEOUT_SECONDS)
        return self._client

    def _allowed(self, url: str) -> bool:
        if url.startswith(SLACK_HOOKS):
            return True
        api, target = urlsplit(self.settings.api_url), urlsplit(url)
        return api.netloc != "slack.com" and (target.scheme, target.netloc) == (
            api.scheme, api.netloc)
