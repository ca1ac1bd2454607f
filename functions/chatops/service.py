"""The ``/ws`` slash command: who is asking, which team, what they may do, then one event.

:func:`answer` turns a verified slash command into the ephemeral reply Slack shows at once
(the ack, within Slack's 3 seconds) and, for a change (create, pause, resume, delete),
publishes the event that does the work. It never raises: whatever happens, the user gets
a reply that names the request id.

What runs inside the request, and why it is cheap: the catalog (cached by bootstrap), one
to three plain document reads, one write (the request's reply record, so the notification
can find the response_url), one publish. No transaction, no runtime call.

Rules:

- Identity: the Slack user id maps to a Stasis user through the applied catalog
  (``slack_user_id`` of a team member). An unknown user is told whom to ask.
- Isolation: every name is resolved inside one team the user belongs to (``--team``, else
  their first); workspace ids are ``<team>--<name>``, so another team's workspace cannot
  even be named. Changing a workspace takes its owner or an admin of its team.
- Before publishing, the request is previewed by ``functions.domain.frontdoor``, the checks
  and words the CLI and the portal use too: the team, the workspace, the catalog, the
  lifecycle's own pure ``decide`` on the document as read now, and for create and resume
  the team's quota as the lifecycle will charge it. So "already paused", "no such
  workspace" or "team ml-b uses 1/1 GPUs" is answered at once instead of as a silent
  refusal later (the lifecycle's transaction stays the authority). Chat asks no runtime,
  so whether the IDE is installed there is the handler's to say.
- On a Slack retry (``X-Slack-Retry-Num``) the preview is skipped: the document may already
  show the first attempt's effect. The event (same ``requestid``, same event id) is
  published again, and the consumers' ledger drops it as a duplicate: one effect.
- A refusal the lifecycle makes later (a race the preview could not see) changes no state,
  so no notification follows it; ``/ws status`` shows where the workspace is.
- ``/ws sandbox``: the same shape for agent sandboxes. The requester is the mapped user,
  the team theirs (``--team``, else their first); the sandbox admission's own pure
  ``admit`` is previewed on the team's queue and policy as read now, so the ack says
  "running" or "queued at position N", or why it would be refused. The sandbox id derives
  from the request id (a Slack retry names the same sandbox); ``reply_to`` on
  sandbox.requested is where ``notify.handle_sandbox`` tells the requester how it ended.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from events import (
    InvalidEvent,
    SandboxRequested,
    SandboxResumeRequested,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    new_event,
)
from events.payloads import workspace_id
from functions.chatops import grammar, replies
from functions.chatops.grammar import Command, Help, ParseError, SandboxAction, Verb, show
from functions.chatops.ports import ChatDeps, SlashRequest
from functions.domain import frontdoor
from functions.domain.catalog import Catalog, Team
from functions.domain.frontdoor import Door
from functions.domain.lifecycle import Workspace
from functions.domain.rights import change_refusal
from functions.domain.sandboxes import Reason as SandboxReason
from functions.domain.sandboxes import Request as SandboxRequest
from functions.domain.sandboxes import (
    Sandbox,
    TeamQueue,
    admit,
    request_resume,
    resolve_policy,
)
from functions.ports import catalog_knowing

log = logging.getLogger(__name__)
SOURCE = "//stasis/chat"
RECORD_TTL = timedelta(days=7)
DEFAULT_IDE = "jupyterlab"
DEFAULT_ENVIRONMENT = "python-3-11"


class _Reply(Exception):
    """An early answer (a refusal, a listing): raised to keep the ladder flat."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def answer(req: SlashRequest, deps: ChatDeps) -> dict[str, Any]:
    """The ack for ``req``: a Slack message payload. Never raises."""
    try:
        return _answer(req, deps)
    except _Reply as reply:
        return replies.ack(reply.text, req.requestid)
    except Exception as exc:  # the user must always get an answer
        log.exception("chat request %s failed", req.requestid)
        return replies.ack(f"Something went wrong on our side ({type(exc).__name__}); "
                           "nothing was requested. Try again in a moment, and tell your "
                           "Stasis admin the request id if it keeps failing.", req.requestid)


def _answer(req: SlashRequest, deps: ChatDeps) -> dict[str, Any]:
    parsed = grammar.parse(req.text)
    if isinstance(parsed, Help):
        raise _Reply(grammar.help_text(parsed.topic))
    if isinstance(parsed, ParseError):
        raise _Reply(parsed.message)
    cmd = parsed
    catalog: Catalog = catalog_knowing(deps, lambda c: c.knows(
        slack_user=req.user, team=cmd.team, profile=cmd.profile, ide=cmd.ide,
        environment=cmd.environment))
    user = catalog.user_for_slack(req.user)
    if user is None:
        raise _Reply(f"I don't know you yet: Slack user `{show(req.user)}` is not mapped to a "
                     f"Stasis user. Ask {replies.who_to_ask(catalog)} to add "
                     f"`slack_user_id: {show(req.user)}` to your entry in the admin file.")
    team = _team(catalog, user, cmd.team, cmd.verb)
    if cmd.verb == Verb.LIST:
        raise _Reply(replies.workspace_list(team.id, deps.reads.list_workspaces(team=team.id),
                                            include_deleted=cmd.all))
    if cmd.verb == Verb.CATALOG:
        raise _Reply(replies.catalog_for(catalog, team))
    if cmd.verb == Verb.QUOTA:
        doc = deps.reads.get("teams", team.id) or {}
        raise _Reply(replies.quota_for(team, doc.get("usage") or {}))
    if cmd.verb in (Verb.LINK, Verb.REVOKE):
        raise _Reply("Agent links are not available on this deployment yet.")
    if cmd.verb == Verb.SANDBOX:
        return _sandbox(req, deps, catalog, team, user, cmd)
    if cmd.verb == Verb.CREATE:
        return _create(req, deps, catalog, team, user, cmd)
    ws = _find(deps, team, cmd)
    if cmd.verb == Verb.STATUS:
        snapshot = deps.reads.get("snapshots", ws.current_snapshot) if ws.current_snapshot \
            else None
        raise _Reply(replies.workspace_status(ws, snapshot))
    if cmd.verb == Verb.SNAPSHOTS:
        raise _Reply(replies.snapshot_list(ws.name, deps.reads.snapshots(ws.id)))
    _may_change(team, user, ws, cmd.verb)
    payload: Any
    if cmd.verb == Verb.PAUSE:
        payload = WorkspacePauseRequested(workspace_id=ws.id, actor=user)
        text = (f"Pausing {ws.name}: its kernels' state goes to a snapshot, then the hardware "
                "is released. I'll tell you here when it is paused.")
        if frontdoor.pauses_home_only(catalog, ws):
            text = (f"Pausing {ws.name}: {frontdoor.PAUSE_HOME_ONLY} I'll tell you here when "
                    "it is paused.")
    elif cmd.verb == Verb.RESUME:
        payload = WorkspaceResumeRequested(workspace_id=ws.id, actor=user, profile=cmd.profile,
                                           device_arrays_to_cpu=cmd.device_arrays_to_cpu)
        on = f" on {cmd.profile}" if cmd.profile and cmd.profile != ws.profile else ""
        text = f"Resuming {ws.name}{on} into its live kernels. I'll tell you when it is running."
    else:
        payload = WorkspaceDeleteRequested(workspace_id=ws.id, actor=user,
                                           keep_home=cmd.keep_home)
        kept = " Its home directory is kept." if cmd.keep_home else ""
        text = f"Deleting {ws.name}.{kept} I'll tell you when it is gone."
    if not req.retry:
        now = deps.clock()
        verdict = (frontdoor.preview_resume(catalog, ws, payload, _usage(deps, team), now)
                   if cmd.verb == Verb.RESUME
                   else frontdoor.preview_transition(catalog, ws, payload, {}, now))
        text += _queued(_refused(verdict))
    return _submit(req, deps, payload, user, team, cmd, text)


def _create(req: SlashRequest, deps: ChatDeps, catalog: Catalog, team: Team, user: str,
            cmd: Command) -> dict[str, Any]:
    assert cmd.name is not None
    if not team.profiles:
        raise _Reply(f"Team {team.id} has no hardware profiles yet; ask {team.who_to_ask}.")
    now = deps.clock()
    target = replies.ReplyTarget(user=req.user, channel=req.channel, team=req.team,
                                 response_url=req.response_url, issued_at=now)
    profile = cmd.profile or team.profiles[0]
    payload = WorkspaceRequested(team=team.id, owner=user, name=cmd.name, profile=profile,
                                 ide=cmd.ide or DEFAULT_IDE,
                                 environment=cmd.environment or DEFAULT_ENVIRONMENT,
                                 reply_to=target.encode())
    verdict = frontdoor.Preview(environment=payload.environment)
    if not req.retry:
        # Chat asks no runtime (its ack must be cheap): the handler checks the IDE there.
        verdict = _refused(frontdoor.preview_create(
            catalog, payload, deps.reads.get_workspace(payload.workspace_id),
            _usage(deps, team), None, now))
    notices = "".join(f"\nNote: {n}" for n in verdict.notices)
    default = "" if cmd.profile else " (the team's default; `--profile` picks another)"
    text = (f"Creating {cmd.name} for team {team.id}: {profile}{default}, {payload.ide}, "
            f"{verdict.environment}. I'll tell you here when it is running.{notices}"
            f"{_queued(verdict)}")
    return _submit(req, deps, payload, user, team, cmd, text)


def _usage(deps: ChatDeps, team: Team) -> dict[str, Any]:
    return dict((deps.reads.get("teams", team.id) or {}).get("usage") or {})


def _refused(verdict: frontdoor.Preview) -> frontdoor.Preview:
    if verdict.refusal:
        raise _Reply(frontdoor.refused(verdict.refusal, Door.CHAT))
    return verdict


def _queued(verdict: frontdoor.Preview) -> str:
    if not verdict.queued:
        return ""
    return (f"\nIt will wait in the queue: {replies.for_chat(verdict.queued).rstrip('. ')}. "
            "I'll tell you when it starts.")


def _submit(req: SlashRequest, deps: ChatDeps, payload: Any, user: str, team: Team,
            cmd: Command, text: str) -> dict[str, Any]:
    """Keep the reply record, publish, ack (the request passed its preview)."""
    now = deps.clock()
    ws_id = payload.workspace_id
    deps.records.remember(req.requestid, {
        "requestid": req.requestid, "slack_user": req.user, "slack_team": req.team,
        "channel": req.channel, "response_url": req.response_url, "issued_at": now,
        "response_url_uses": 0, "user": user, "team": team.id, "verb": str(cmd.verb),
        "workspace_id": ws_id, "text": req.text[:500], "created_at": now,
        "expire_at": now + RECORD_TTL,
    })
    event = new_event(payload, source=SOURCE, requestid=req.requestid, id=req.requestid)
    try:
        deps.bus.publish(event)
    except Exception as exc:
        log.exception("publishing %s for chat request %s failed", event.name, req.requestid)
        raise _Reply(f"I could not queue that ({type(exc).__name__}); nothing was changed. "
                     "Please try again.") from exc
    return replies.ack(text, req.requestid, follow=True, workspace_id=ws_id)


def sandbox_id_for(requestid: str) -> str:
    """The sandbox a chat request names: the same for a Slack retry of it."""
    return "sbx-" + hashlib.sha256(requestid.encode()).hexdigest()[:16]


def _sandbox(req: SlashRequest, deps: ChatDeps, catalog: Catalog, team: Team, user: str,
             cmd: Command) -> dict[str, Any]:
    args = cmd.sandbox
    assert args is not None  # the grammar fills it for Verb.SANDBOX
    if args.action == SandboxAction.LIST:
        raise _Reply(replies.sandbox_list(team.id, deps.reads.list_sandboxes(team.id),
                                          include_old=args.all, now=deps.clock()))
    now = deps.clock()
    target = replies.ReplyTarget(user=req.user, channel=req.channel, team=req.team,
                                 response_url=req.response_url, issued_at=now)
    if args.action in (SandboxAction.SHOW, SandboxAction.RESUME):
        assert args.sandbox_id is not None
        doc = deps.reads.get("sandboxes", args.sandbox_id)
        mine = [t.id for t in catalog.teams_of(user)]
        if doc is None or doc.get("team") not in mine:
            # Another team's sandbox is answered like a missing one: ids say nothing.
            raise _Reply(f"There is no sandbox {show(args.sandbox_id)} in your teams "
                         f"({', '.join(mine)}). See `/ws sandbox list`.")
        if args.action == SandboxAction.SHOW:
            raise _Reply(replies.sandbox_status(doc))
        return _sandbox_resume(req, deps, catalog, user, doc, target)
    payload = SandboxRequested(
        sandbox_id=sandbox_id_for(req.requestid), team=team.id, requester=user,
        repository=args.repository or "", command=args.task or "",
        base_ref=args.ref or "HEAD", limits=dict(args.limits),
        allowed_network=list(args.allow), reply_to=target.encode())
    try:
        event = new_event(payload, source=SOURCE, requestid=req.requestid, id=req.requestid)
    except InvalidEvent as exc:
        raise _Reply(f"Nothing done: {exc.reason}.\nUsage: "
                     f"`{grammar.usage(Verb.SANDBOX)}`.") from exc
    preview: Mapping[str, Any] | None = None
    if req.retry:
        preview = deps.reads.get("sandboxes", payload.sandbox_id)
    else:
        section = (deps.reads.get("catalog", "current") or {}).get("sandboxes")
        decision = admit(
            SandboxRequest(payload.sandbox_id, team.id, user, payload.repository,
                           payload.command, payload.base_ref, payload.limits,
                           tuple(payload.allowed_network), req.requestid),
            team=catalog.teams.get(team.id),
            policy=resolve_policy(section if isinstance(section, Mapping) else None, team.id),
            queue=TeamQueue.from_doc(deps.reads.get("sandbox_queues", team.id)),
            existing=None, now=now)
        if not decision.accepted or decision.subject is None:
            why = decision.message.removeprefix("refused: ").rstrip(". ")
            raise _Reply(f"Nothing done: {replies.for_chat(why)}.")
        preview = decision.subject.to_doc()
    deps.records.remember(req.requestid, {
        "requestid": req.requestid, "slack_user": req.user, "slack_team": req.team,
        "channel": req.channel, "response_url": req.response_url, "issued_at": now,
        "response_url_uses": 0, "user": user, "team": team.id, "verb": str(cmd.verb),
        "sandbox_id": payload.sandbox_id, "text": req.text[:500], "created_at": now,
        "expire_at": now + RECORD_TTL,
    })
    try:
        deps.bus.publish(event)
    except Exception as exc:
        log.exception("publishing %s for chat request %s failed", event.name, req.requestid)
        raise _Reply(f"I could not queue that ({type(exc).__name__}); nothing was requested. "
                     "Please try again.") from exc
    return replies.ack(replies.sandbox_ack(payload.sandbox_id, preview), req.requestid,
                       follow=True)


def _sandbox_resume(req: SlashRequest, deps: ChatDeps, catalog: Catalog, user: str,
                    doc: Mapping[str, Any], target: replies.ReplyTarget) -> dict[str, Any]:
    """``/ws sandbox resume ID``: the handler's own ``request_resume`` previewed, then
    sandbox.resume_requested; its end is told to whoever asked for the sandbox."""
    sandbox_id = str(doc["id"])
    text = (f"Resuming sandbox `{sandbox_id}`. Its end is told to whoever asked for it "
            f"(`/ws sandbox show {sandbox_id}` meanwhile).")
    if not req.retry:
        sandbox = Sandbox.from_doc(doc)
        section = (deps.reads.get("catalog", "current") or {}).get("sandboxes")
        decision = request_resume(
            sandbox, sandbox_id, user, team=catalog.teams.get(sandbox.team),
            policy=resolve_policy(section if isinstance(section, Mapping) else None,
                                  sandbox.team),
            queue=TeamQueue.from_doc(deps.reads.get("sandbox_queues", sandbox.team)),
            now=deps.clock())
        if not decision.accepted:
            raise _Reply(f"Nothing done: {replies.for_chat(decision.message.rstrip('. '))}.")
        if decision.reason == SandboxReason.RESUME_QUEUED:
            text = (f"Sandbox `{sandbox_id}` will resume when a slot frees up: "
                    f"{decision.message}.")
        else:
            text = f"Resuming sandbox `{sandbox_id}` now: {decision.message}."
    deps.records.remember(req.requestid, {
        "requestid": req.requestid, "slack_user": req.user, "slack_team": req.team,
        "channel": req.channel, "response_url": req.response_url, "issued_at": target.issued_at,
        "response_url_uses": 0, "user": user, "team": doc.get("team"), "verb": "sandbox resume",
        "sandbox_id": sandbox_id, "text": req.text[:500], "created_at": target.issued_at,
        "expire_at": deps.clock() + RECORD_TTL,
    })
    event = new_event(SandboxResumeRequested(sandbox_id=sandbox_id, requester=user,
                                             reply_to=target.encode()),
                      source=SOURCE, requestid=req.requestid, id=req.requestid)
    try:
        deps.bus.publish(event)
    except Exception as exc:
        log.exception("publishing %s for chat request %s failed", event.name, req.requestid)
        raise _Reply(f"I could not queue that ({type(exc).__name__}); nothing was changed. "
                     "Please try again.") from exc
    return replies.ack(text, req.requestid)


def _team(catalog: Catalog, user: str, wanted: str | None, verb: Verb) -> Team:
    team = frontdoor.choose_team(catalog, user, wanted)
    if isinstance(team, str):
        raise _Reply(_said(team, verb))
    return team


def _find(deps: ChatDeps, team: Team, cmd: Command) -> Workspace:
    assert cmd.name is not None  # the grammar requires NAME for the verbs that find one
    ws = frontdoor.find_workspace(
        team, cmd.name, deps.reads.get_workspace(workspace_id(team.id, cmd.name)),
        lambda: deps.reads.list_workspaces(team=team.id))
    if isinstance(ws, str):
        raise _Reply(_said(ws, cmd.verb))
    return ws


def _said(text: str, verb: Verb) -> str:
    """A front door's refusal as chat says it: "Nothing done" where a change was asked."""
    if verb in grammar.ACTIONS:
        return frontdoor.refused(text, Door.CHAT)
    return frontdoor.for_door(text, Door.CHAT)


def _may_change(team: Team, user: str, ws: Workspace, verb: Verb) -> None:
    refusal = change_refusal(team, user, owner=ws.owner, name=ws.name, verb=str(verb))
    if refusal:
        raise _Reply(frontdoor.refused(refusal, Door.CHAT))
