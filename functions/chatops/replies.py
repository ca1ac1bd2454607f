"""Everything the bot says, and where it says it. Pure: data in, Slack message dicts out.

Messages are Slack message payloads (``text`` in Slack's mrkdwn, ``response_type``,
``metadata``). The metadata is Slack's own message-metadata feature; it carries the
request id and the workspace state so that tools reading the conversation (``stasis chat``)
can follow one request without parsing prose.

A reply target (:class:`ReplyTarget`) is where a request's outcome goes: the Slack user
(``chat.postMessage`` to their direct messages), and the request's ``response_url`` while
Slack accepts it (30 minutes, 5 messages). It travels as ``WorkspaceRequested.reply_to``
(``slack:{json}``) and in the chat record of each request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from events.payloads import SandboxStateChanged, WorkspaceStateChanged
from functions.domain import frontdoor
from functions.domain.catalog import Catalog, Team
from functions.domain.lifecycle import Workspace
from functions.domain.redaction import redact

REPLY_SCHEME = "slack:"
RESPONSE_URL_TTL = timedelta(minutes=30)
RESPONSE_URL_USES = 5
ACK_EVENT_TYPE = "stasis_request"
NOTE_EVENT_TYPE = "stasis_workspace_state"

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


# -- people's units --------------------------------------------------------------------------


def human_size(n: int) -> str:
    """``1288490189`` -> ``"1.2 GiB"``; at most one decimal, binary units."""
    for unit, size in _UNITS:
        if n >= size:
            return f"{_one_decimal(n / size)} {unit}"
    return f"{max(n, 0)} B"


def human_duration(ms: int | float) -> str:
    """``3400`` -> ``"3.4 s"``, ``850`` -> ``"850 ms"``, ``125000`` -> ``"2 min 5 s"``."""
    ms = max(0.0, float(ms))
    if ms < 1000:
        return f"{round(ms)} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{_one_decimal(seconds)} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")
    return f"{whole // 3600} h" + (f" {whole % 3600 // 60} min" if whole % 3600 // 60 else "")


def _one_decimal(x: float) -> str:
    return f"{math.floor(x * 10 + 0.5) / 10:g}"


# -- where replies go ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReplyTarget:
    """Where a chat request's outcome is told."""

    user: str
    channel: str | None = None
    team: str | None = None
    response_url: str | None = None
    issued_at: datetime | None = None

    def encode(self) -> str:
        data = {"user": self.user, "channel": self.channel, "team": self.team,
                "response_url": self.response_url,
                "issued_at": self.issued_at.isoformat() if self.issued_at else None}
        return REPLY_SCHEME + json.dumps({k: v for k, v in data.items() if v is not None},
                                         separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, text: str | None) -> ReplyTarget | None:
        """The target in ``text``, or None if it is not a Slack reply target (a CLI
        request) or is malformed: a notification is then simply not sent."""
        if not text or not text.startswith(REPLY_SCHEME):
            return None
        try:
            data = json.loads(text[len(REPLY_SCHEME):])
            issued = data.get("issued_at")
            user = data["user"]
            if not isinstance(user, str) or not user:
                return None
            return cls(user=user, channel=data.get("channel"), team=data.get("team"),
                       response_url=data.get("response_url"),
                       issued_at=datetime.fromisoformat(issued) if issued else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def response_url_valid(self, now: datetime) -> bool:
        """Whether Slack still takes messages on the response_url (by age; the use count
        is kept in the chat record, and Slack's answer is the last word)."""
        return bool(self.response_url and self.issued_at
                    and now - self.issued_at < RESPONSE_URL_TTL)


# -- messages ------------------------------------------------------------------------------


def ack(text: str, requestid: str, *, follow: bool = False,
        workspace_id: str | None = None) -> dict[str, Any]:
    """The immediate, ephemeral answer to a slash command; it names the request id."""
    return {
        "response_type": "ephemeral",
        "text": f"{text}\n_request `{requestid}`_",
        "metadata": {"event_type": ACK_EVENT_TYPE, "event_payload": {
            "requestid": requestid, "follow": follow, "workspace_id": workspace_id or ""}},
    }


@dataclass(frozen=True)
class Notification:
    text: str
    state: str

    def message(self, change: WorkspaceStateChanged, requestid: str) -> dict[str, Any]:
        return {
            "response_type": "ephemeral",
            "text": self.text,
            "metadata": {"event_type": NOTE_EVENT_TYPE, "event_payload": {
                "requestid": requestid, "workspace_id": change.workspace_id,
                "state": change.to_state, "reason": change.reason,
                "version": change.version}},
        }


def notification(change: WorkspaceStateChanged, workspace: Workspace | None,
                 snapshot: Mapping[str, Any] | None) -> Notification | None:
    """What to tell the requester about ``change``, or None for states the ack announced
    already (PROVISIONING, PAUSING, RESUMING, DELETING).

    ``workspace`` is the document as read now (timings, pause cause, keep_home) and
    ``snapshot`` the record of its current snapshot (bytes, skipped variables); either may
    be missing or newer than the change, and the text degrades instead of failing.
    """
    name, to, reason = change.name, change.to_state, change.reason
    ws = workspace if workspace is not None and workspace.version >= change.version else None
    message = change.message.rstrip(". ")
    if to == "QUEUED":
        return Notification(_queued(name, reason, for_chat(message)), to)
    if reason == "preemption_warning":
        return Notification(f"Heads-up: {for_chat(message)}. Save your work, or let its "
                            f"kernels go idle; `/ws pause {name}` pauses it now.", to)
    if to == "PAUSED" and reason == "queue_cancelled":
        return Notification(f"{name} stays PAUSED: its queued resume was cancelled.", to)
    if to == "RUNNING" and reason == "snapshot_failed":
        return Notification(f"pause of {name} failed: {message or 'the snapshot failed'}. "
                            f"It is still RUNNING, nothing was lost; try `/ws pause {name}` "
                            "again.", to)
    if to == "RUNNING":
        url = change.url or "(no URL reported)"
        if change.from_state == "RESUMING":
            took = _took(ws.last_resume_ms if ws else None)
            return Notification(f"{name} resumed: RUNNING again{took} with its kernels: {url}",
                                to)
        took = _took(ws.first_start_ms if ws else None)
        return Notification(f"{name} is RUNNING{took}: {url}", to)
    if to == "PAUSED" and reason == "snapshot_integrity":
        return Notification(f"resume of {name} refused: {message}. Its snapshot does not "
                            "match what was recorded when it was taken, so nothing of it was "
                            f"loaded; {name} stays PAUSED with the snapshot kept for your team "
                            "admin to inspect.", to)
    if to == "PAUSED" and reason == "resume_interrupted":
        return Notification(f"resume of {name} was interrupted: {for_chat(message)}. {name} "
                            f"stays PAUSED, nothing was lost: try `/ws resume {name}` again.", to)
    if to == "PAUSED" and reason == "restore_refused":
        return Notification(f"resume of {name} refused: {for_chat(message)}. {name} stays "
                            "PAUSED, nothing was lost.", to)
    if to == "PAUSED":
        return Notification(_paused(name, message, ws, snapshot), to)
    if to == "FAILED":
        return Notification(_failed(name, reason, message), to)
    if to == "DELETED":
        kept = " Its home directory was kept." if ws is not None and ws.keep_home else ""
        return Notification(f"{name} deleted.{kept}", to)
    return None


def _queued(name: str, reason: str, message: str) -> str:
    if reason == "requeued":
        return (f"{name} was {message or 'paused for a higher-priority request'}. Its live "
                "state is in its snapshot; the resume starts by itself (see `/ws status "
                f"{name}`), or `/ws pause {name}` keeps it paused.")
    return (f"{name} is QUEUED ({message.removeprefix('queued: ')}). It starts by itself; "
            f"`/ws status {name}` says where it stands, `/ws delete {name}` cancels it.")


def _took(ms: int | None) -> str:
    return f" in {human_duration(ms)}" if ms is not None else ""


def _paused(name: str, why: str, ws: Workspace | None,
            snapshot: Mapping[str, Any] | None) -> str:
    size = snapshot.get("bytes") if snapshot else None
    ms = ws.last_pause_ms if ws and ws.last_pause_ms is not None else (
        snapshot.get("duration_ms") if snapshot else None)
    what = f"{human_size(int(size))}" if isinstance(size, int) else ""
    when = f"in {human_duration(ms)}" if isinstance(ms, int | float) else ""
    detail = " ".join(p for p in (what, when) if p)
    # A pause the owner did not ask for (idle policy, schedule) carries why in its message.
    text = f"{name} paused" + (f" — {detail}" if detail else "") + (f" ({why})" if why else "")
    text += "."
    skipped = [s for s in (snapshot or {}).get("skipped") or [] if isinstance(s, Mapping)]
    if skipped:
        names = ", ".join(f"`{s.get('name', '?')}` ({s.get('reason', 'not capturable')})"
                          for s in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        text += f" Not kept: {names}{more}."
    return text + f" Hardware released; resume with `/ws resume {name}`."


def for_chat(message: str) -> str:
    """A domain message as chat says it: the CLI commands it suggests become /ws ones."""
    return frontdoor.for_door(message, frontdoor.Door.CHAT)


def _failed(name: str, reason: str, message: str) -> str:
    why = for_chat(message) or "no reason was given"
    if reason == "admission_refused":
        return f"{name} was not created: {why}."
    if reason == "queue_expired":
        return (f"{name} did not start: it {why}. Try again later, or another profile "
                "(see `/ws catalog`).")
    if reason == "resume_failed":
        return (f"resume of {name} failed: {why} — its snapshot is kept: try "
                f"`/ws resume {name}` again, or on another profile with "
                f"`/ws resume {name} --profile PROFILE` (see `/ws catalog`).")
    if reason == "provision_failed":
        return (f"{name} failed to start: {why} — try `/ws delete {name}` and create it "
                "again, or another profile (see `/ws catalog`).")
    return f"{name} FAILED: {why} — see `/ws status {name}`; `/ws delete {name}` cleans up."


# -- listings ------------------------------------------------------------------------------


def workspace_list(team: str, workspaces: Iterable[Workspace], *, include_deleted: bool) -> str:
    rows = sorted((w for w in workspaces if include_deleted or w.state != "DELETED"),
                  key=lambda w: w.name)
    if not rows:
        return f"Team {team} has no workspaces. Create one: `/ws create NAME --profile PROFILE`."
    lines = [f"Workspaces of team {team}:"]
    for w in rows:
        url = f"  {w.url}" if w.url and w.state == "RUNNING" else ""
        lines.append(f"• `{w.name}`  {w.state}  {w.profile}  ({w.owner}){url}")
    return "\n".join(lines)


def workspace_status(ws: Workspace, snapshot: Mapping[str, Any] | None) -> str:
    lines = [f"`{ws.name}` (team {ws.team}, owner {ws.owner}): *{ws.state}*"]
    if ws.state_message:
        lines.append(f"  {ws.state_message}")
    lines.append(f"  profile {ws.profile}, {ws.ide}, {ws.environment}")
    if ws.url and ws.state == "RUNNING":
        lines.append(f"  URL: {ws.url}")
    timings = [(label, ms) for label, ms in (("first start", ws.first_start_ms),
                                              ("last pause", ws.last_pause_ms),
                                              ("last resume", ws.last_resume_ms))
               if ms is not None]
    if timings:
        lines.append("  " + ", ".join(f"{label} {human_duration(ms)}" for label, ms in timings))
    if ws.current_snapshot:
        size = (snapshot or {}).get("bytes")
        shown = f" ({human_size(size)})" if isinstance(size, int) else ""
        lines.append(f"  snapshot `{ws.current_snapshot}`{shown}")
    return "\n".join(lines)


def snapshot_list(name: str, snapshots: Sequence[Mapping[str, Any]]) -> str:
    if not snapshots:
        return f"`{name}` has no snapshots; `/ws pause {name}` makes one."
    lines = [f"Snapshots of `{name}`:"]
    for s in snapshots:
        size = s.get("bytes")
        took = s.get("duration_ms")
        expires = s.get("expires_at")
        parts = [f"• `{s.get('id', '?')}`", str(s.get("status", "?")),
                 human_size(size) if isinstance(size, int) else "?",
                 f"in {human_duration(took)}" if isinstance(took, int | float) else ""]
        if isinstance(expires, datetime):
            parts.append(f"expires {expires:%Y-%m-%d}")
        lines.append("  ".join(p for p in parts if p))
    return "\n".join(lines)


def catalog_for(catalog: Catalog, team: Team) -> str:
    """What ``team`` may use: its profiles with costs and idle rules, environments, IDEs."""
    lines = [f"What team {team.id} may use:", "", "*Profiles* (hourly cost while running):"]
    for p in catalog.profiles_for(team.id):
        acc = f", {p.accelerator}" if p.accelerator else ""
        idle = (f", pauses after {human_duration(p.idle_policy.rules[0].idle_seconds * 1000)} "
                "idle" if p.idle_policy.rules else "")
        lines.append(f"• `{p.id}`  {p.title}{acc}, ${p.hourly_cost:.2f}/h, "
                     f"{p.provisioning}{idle}")
    lines += ["", "*Environments:*"]
    for e in catalog.listed_environments():
        note = f" (deprecated: {e.message})" if e.status == "deprecated" and e.message else ""
        lines.append(f"• `{e.id}`  {e.title}{note}")
    lines += ["", "*IDEs:* " + ", ".join(f"`{i.id}`" for i in catalog.ides.values())]
    pricing = catalog.pricing
    if pricing.disk_gb_month or pricing.snapshot_gb_month:
        lines += ["", f"Storage: home disks ${pricing.disk_gb_month:.2f} and snapshots "
                      f"${pricing.snapshot_gb_month:.2f} per GB-month, paused or not."]
    return "\n".join(lines)


def quota_for(team: Team, usage: Mapping[str, Any]) -> str:
    q = team.quotas

    def used(key: str) -> int:
        value = usage.get(key, 0)
        return value if isinstance(value, int) else 0

    return "\n".join([
        f"Team {team.id} uses:",
        f"• workspaces {used('workspaces')}/{q.workspaces} (paused ones count)",
        f"• GPUs {used('gpus')}/{q.gpus} (running workspaces only)",
        f"• TPU chips {used('tpus')}/{q.tpus}",
        f"• snapshots {human_size(used('snapshot_bytes'))}/{human_size(q.snapshot_bytes)}",
    ])


def who_to_ask(catalog: Catalog) -> str:
    """For a Slack user Stasis does not know: whom to ask, team by team."""
    return frontdoor.who_to_ask(catalog)


# -- agent sandboxes -----------------------------------------------------------------------

SANDBOX_NOTE_EVENT_TYPE = "stasis_sandbox_state"
SANDBOX_ENDED = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED"})
_SHOWN_FILES = 10


def _task(doc: Mapping[str, Any], width: int = 60) -> str:
    command = " ".join(redact(doc.get("command")).split())
    command = command if len(command) <= width else command[:width - 1] + "…"
    return command.replace("`", "'")


def _review(sandbox_id: str, patch_uri: Any) -> str:
    where = f" (patch: {patch_uri})" if patch_uri else ""
    return (f"Review: `/ws sandbox show {sandbox_id}` here, or `stasis sandbox show "
            f"{sandbox_id}` then `stasis sandbox apply {sandbox_id} --to CHECKOUT` on a "
            f"checkout{where}. Nothing is applied for you.")


def sandbox_ack(sandbox_id: str, doc: Mapping[str, Any] | None) -> str:
    """The ack of ``/ws sandbox``: the id and, from the admission's preview (or, on a Slack
    retry, the record), running or queued at which position."""
    head = f"Sandbox `{sandbox_id}`"
    if doc is None:
        return f"{head} requested. I'll tell you here when it ends, with its patch for review."
    what = f"`{_task(doc)}` on {redact(doc.get('repository'))}@{doc.get('base_ref') or 'HEAD'}"
    state = doc.get("state")
    if state == "QUEUED":
        return (f"{head} is queued at position {doc.get('queue_position')} ({what}): "
                f"{redact(doc.get('message'))}. It starts when a slot frees up; I'll tell you "
                "here when it ends, with its patch for review.")
    if state in SANDBOX_ENDED:
        return f"{head} already ended {state}: {redact(doc.get('message'))}."
    return (f"{head} is running {what}. I'll tell you here when it ends, with its patch for "
            "review.")


def sandbox_list(team: str, docs: Iterable[Mapping[str, Any]], *, include_old: bool,
                 now: datetime) -> str:
    """A team's sandboxes, newest first: waiting and running ones, and those that ended in
    the last day (all with ``include_old``)."""
    def recent(doc: Mapping[str, Any]) -> bool:
        finished = doc.get("finished_at")
        return (include_old or doc.get("state") not in SANDBOX_ENDED
                or (isinstance(finished, datetime) and now - finished < timedelta(days=1)))

    rows = sorted((d for d in docs if recent(d)),
                  key=lambda d: str(d.get("requested_at") or ""), reverse=True)
    if not rows:
        return (f"Team {team} has no sandboxes" + ("" if include_old else " from the last day")
                + ". Start one: `/ws sandbox REPOSITORY -- COMMAND`.")
    lines = [f"Sandboxes of team {team}:"]
    for d in rows[:20]:
        where = f" #{d['queue_position']}" if d.get("queue_position") else ""
        files = len(d.get("files_changed") or [])
        changed = f", {files} file{'s' if files != 1 else ''} changed" \
            if d.get("state") in SANDBOX_ENDED else ""
        lines.append(f"• `{d.get('id')}`  {d.get('state')}{where}  ({d.get('requester')})  "
                     f"`{_task(d, 40)}`{changed}")
    if len(rows) > 20:
        lines.append(f"… and {len(rows) - 20} more (`stasis sandbox list --team {team}`).")
    return "\n".join(lines)


def sandbox_status(doc: Mapping[str, Any]) -> str:
    """``/ws sandbox show ID``: state, exit status, files changed, how to review."""
    sandbox_id = str(doc.get("id"))
    lines = [f"`{sandbox_id}` (team {doc.get('team')}, requested by {doc.get('requester')}): "
             f"*{doc.get('state')}*"]
    if doc.get("message"):
        lines.append(f"  {redact(doc['message'])}")
    lines.append(f"  `{_task(doc, 200)}` on {redact(doc.get('repository'))}@"
                 f"{doc.get('base_ref') or 'HEAD'}")
    if doc.get("state") == "SUSPENDED":
        lines.append(f"  `/ws sandbox resume {sandbox_id}` brings it back (it waits for a slot "
                     "when none is free).")
    if doc.get("state") not in SANDBOX_ENDED:
        return "\n".join(lines)
    ended = [f"exit status {doc['exit_status']}" if doc.get("exit_status") is not None
             else f"ended: {doc.get('termination') or doc.get('reason')}"]
    if isinstance(doc.get("duration_ms"), int | float) and doc.get("duration_ms"):
        ended.append(f"ran {human_duration(doc['duration_ms'])}")
    if doc.get("network"):
        ended.append(f"network: {doc['network']}")
    lines.append("  " + ", ".join(ended))
    files = [str(f) for f in doc.get("files_changed") or []]
    if files:
        shown = ", ".join(f"`{f}`" for f in files[:_SHOWN_FILES])
        more = f" and {len(files) - _SHOWN_FILES} more" if len(files) > _SHOWN_FILES else ""
        lines.append(f"  {len(files)} file{'s' if len(files) != 1 else ''} changed "
                     f"({human_size(int(doc.get('patch_bytes') or 0))} patch): {shown}{more}")
    elif doc.get("patch_uri"):
        lines.append("  no files changed")
    lines.append("  " + _review(sandbox_id, doc.get("patch_uri")))
    return "\n".join(lines)


def sandbox_notification(doc: Mapping[str, Any], requestid: str) -> dict[str, Any]:
    """What the requester is told when their sandbox ended (``doc``: its ended record)."""
    sandbox_id = str(doc.get("id"))
    files = len(doc.get("files_changed") or [])
    text = (f"Sandbox `{sandbox_id}` (`{_task(doc)}`) ended *{doc.get('state')}*: "
            f"{redact(doc.get('message')).rstrip('. ')}.")
    if doc.get("patch_uri") and files:
        # The record's message already says how to review and apply; add where it is.
        text += (f" `/ws sandbox show {sandbox_id}` lists the files; the patch is at "
                 f"{doc['patch_uri']}.")
    return {
        "response_type": "ephemeral",
        "text": text,
        "metadata": {"event_type": SANDBOX_NOTE_EVENT_TYPE, "event_payload": {
            "requestid": requestid, "sandbox_id": sandbox_id, "state": doc.get("state"),
            "reason": doc.get("reason"), "files_changed": files}},
    }


def sandbox_suspended_notification(doc: Mapping[str, Any], held: SandboxStateChanged,
                                   requestid: str) -> dict[str, Any]:
    """A sandbox was suspended for being idle (``held``: its sandbox.state_changed)."""
    sandbox_id = str(doc.get("id"))
    files = held.checkpoint_files
    memory = "" if held.method != "freeze" else " (frozen: its memory stays held)"
    text = (f"Sandbox `{sandbox_id}` (`{_task(doc)}`) is *SUSPENDED*: it made no progress for "
            f"{human_duration(held.idle_seconds * 1000)}, so its slot was freed{memory}.")
    if held.checkpoint_uri:
        text += (f" The diff so far ({files} file{'s' if files != 1 else ''}) is at "
                 f"{held.checkpoint_uri}.")
    text += f" `/ws sandbox resume {sandbox_id}` brings it back."
    return {
        "response_type": "ephemeral",
        "text": text,
        "metadata": {"event_type": SANDBOX_NOTE_EVENT_TYPE, "event_payload": {
            "requestid": requestid, "sandbox_id": sandbox_id, "state": "SUSPENDED",
            "reason": "suspended_idle", "files_changed": files}},
    }
