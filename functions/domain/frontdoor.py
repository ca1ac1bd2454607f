"""What every front door (the `stasis` CLI, chat's ``/ws``, the portal) answers before it
publishes a workspace request: the same checks, in the same words. Pure.

A door reads its inputs (the catalog, the team's usage counters, the workspace document,
the runtime's capabilities when it can ask) and asks here, in this order:

1. the name (:func:`check_name`: a slug, and the nearest one that is, as a fix);
2. the team (:func:`choose_team`: it exists and the user is a member);
3. the workspace (:func:`find_workspace`: it exists in that team) and the right to change
   it (``rights.change_refusal``);
4. the request itself (:func:`preview_create`, :func:`preview_transition`): the catalog as
   the lifecycle checks it (``admission.check_request``: profile, environment and IDE
   offered to the team, the IDE available on the runtime, the host's hardware), the
   lifecycle's own ``decide`` on the document as read now (already paused, name taken),
   and for what takes hardware the team's quota (``admission.preview``, on a copy).

A refusal is returned as text and the door publishes nothing. The preview is advice: the
handler's transaction is the truth, and a race the preview could not see (the last quota
slot taken meanwhile) is refused there, with its reason in the request's ledger entry.

Each refusal is one or more sentences naming CLI commands (`stasis ws list`), as the
domain's other messages do; :func:`refused` is how each door says it: the CLI and chat
after "Nothing done: ", chat with its own `/ws` commands, the portal as the sentence itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from events.payloads import WorkspacePauseRequested, WorkspaceRequested, WorkspaceResumeRequested
from functions.domain import admission, scheduling
from functions.domain.catalog import Catalog, Refusal, Team
from functions.domain.lifecycle import HOME_ONLY, Signal, State, Workspace, decide

#: A workspace, team or catalog id: what ``schemas/`` accept for a name.
NAME_PATTERN = re.compile(r"[a-z](-?[a-z0-9]){1,39}")
NAME_MAX = 40
_SHOWN_MAX = 40


class Door(StrEnum):
    CLI = "cli"
    CHAT = "chat"
    PORTAL = "portal"


def for_door(text: str, door: Door) -> str:
    """``text`` as ``door`` says it: chat suggests its own `/ws` commands for the CLI's."""
    if door == Door.CHAT:
        return text.replace("`stasis ws ", "`/ws ")
    return text


def refused(text: str, door: Door) -> str:
    """A refusal as ``door`` shows it; the CLI and chat say that nothing was requested."""
    text = for_door(text, door)
    if door == Door.PORTAL:
        return text
    if text[1:2].islower():  # an ordinary first word, not an acronym or a name
        text = text[:1].lower() + text[1:]
    return f"Nothing done: {text}"


def plain(token: str) -> str:
    """A user's token, safe to echo inside a code span: no control characters, no backticks,
    at most a few dozen characters."""
    clean = "".join(c if c.isprintable() else "?" for c in token).replace("`", "'")
    return clean[:_SHOWN_MAX - 1] + "…" if len(clean) > _SHOWN_MAX else clean


# -- names --------------------------------------------------------------------------------


def check_name(value: str, what: str = "name", shown: Callable[[str], str] = plain
               ) -> str | None:
    """None if ``value`` is a valid slug, else why not and, when one exists, a fix.
    ``shown`` makes the user's text safe for the door (chat escapes Slack's markup)."""
    if NAME_PATTERN.fullmatch(value):
        return None
    fix = suggest_name(value)
    hint = f" Try `{fix}`." if fix and fix != value else ""
    text = shown(value)
    if "--" in value:
        why = f"{what} `{text}` has a double dash, which separates team and name in ids."
    elif len(value) > NAME_MAX:
        why = f"{what} `{text}` is longer than {NAME_MAX} characters."
    elif value.lower() != value and NAME_PATTERN.fullmatch(value.lower()):
        why = f"{what}s are lowercase."
    elif len(value) < 2:
        why = f"{what} `{text}` is too short: at least 2 characters."
    else:
        why = (f"{what} `{text}` is not valid: use a-z, 0-9 and single dashes, start with a "
               "letter, do not end with a dash.")
    return why + hint


def name_refusal(name: str) -> str | None:
    """A new workspace's name as a refusal sentence (:func:`check_name`), or None."""
    problem = check_name(name)
    return _sentence(problem) if problem else None


def suggest_name(value: str) -> str | None:
    """The nearest valid slug (lowercase ASCII, single dashes), or None if there is none."""
    ascii_ = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_)
    slug = re.sub(r"^[^a-z]+", "", slug)[:NAME_MAX].strip("-")
    return slug if NAME_PATTERN.fullmatch(slug) else None


# -- who and where ------------------------------------------------------------------------


def who_to_ask(catalog: Catalog) -> str:
    """For a user in no team: whom to ask, team by team."""
    contacts = [f"{t.who_to_ask} (team {t.id})" for t in catalog.teams.values()]
    return "; ".join(contacts) if contacts else "a Stasis admin"


def choose_team(catalog: Catalog, user: str, wanted: str | None) -> Team | str:
    """The team a request of ``user`` is for (``wanted``, else their first), or why none."""
    mine = catalog.teams_of(user)
    if wanted is None:
        if not mine:
            return f"You ({user}) are not in any team yet; ask {who_to_ask(catalog)}."
        return mine[0]
    yours = f"Your teams: {', '.join(t.id for t in mine) or 'none'}."
    team = catalog.teams.get(wanted)
    if team is None:
        return f"There is no team {wanted}.{_did_you_mean(wanted, [t.id for t in mine])} {yours}"
    if team.member(user) is None:
        return (f"You are not a member of team {team.id}, so you cannot see or change its "
                f"workspaces; ask {team.who_to_ask} to add you. {yours}")
    return team


def find_workspace(team: Team, name: str, ws: Workspace | None,
                   others: Callable[[], Iterable[Workspace]]) -> Workspace | str:
    """``ws`` (the document of ``team``'s workspace ``name``, as read) if it exists, else why
    not, with the nearest of the team's other workspaces (``others``, asked only then) and
    where to look."""
    if ws is not None and ws.state != State.DELETED:
        return ws
    names = [w.name for w in others() if w.state != State.DELETED and w.name != name]
    return (f"There is no workspace {name} in team {team.id}.{_did_you_mean(name, names)} "
            "See `stasis ws list`.")


# -- the request --------------------------------------------------------------------------


@dataclass(frozen=True)
class Preview:
    """What a door may say of a request before publishing it."""

    refusal: str | None = None
    #: Why it will wait QUEUED (the team's accelerators in use), when it will.
    queued: str | None = None
    #: The environment it resolves to and notices about it (deprecated, replaced).
    environment: str | None = None
    notices: tuple[str, ...] = ()


def preview_create(catalog: Catalog, request: WorkspaceRequested, existing: Workspace | None,
                   usage: Mapping[str, Any], capabilities: Mapping[str, Any] | None,
                   now: datetime) -> Preview:
    """A new workspace: its name, the team's membership and catalog (``capabilities``: the
    runtime's IDEs and hardware, with its node's declared accelerators as the handler counts
    them; None when the door cannot ask: then every catalog IDE counts as available and the
    hardware is the handler's to check), the name free, the team's quota."""
    problem = name_refusal(request.name)
    if problem:
        return Preview(problem)
    caps = (scheduling.with_declared(capabilities, catalog.scheduling.nodes)
            if capabilities is not None else {"ides": list(catalog.ides)})
    check = admission.check_request(catalog, request, caps)
    if check.refusal:
        return Preview(_sentence(check.refusal))
    verdict = preview_transition(catalog, existing, request, usage, now)
    return Preview(verdict.refusal, verdict.queued, check.environment, check.notices)


def preview_resume(catalog: Catalog, ws: Workspace, request: WorkspaceResumeRequested,
                   usage: Mapping[str, Any], now: datetime) -> Preview:
    """A resume, maybe on another profile the team may use, within the team's quota."""
    if request.profile and request.profile != ws.profile:
        resolved = catalog.resolve_profile(ws.team, request.profile)
        if isinstance(resolved, Refusal):
            return Preview(_sentence(resolved.message))
    return preview_transition(catalog, ws, request, usage, now)


#: Every door's pause answer where memory snapshots are off (``lifecycle.HOME_ONLY``).
PAUSE_HOME_ONLY = f"Memory snapshots are off for it, so the pause {HOME_ONLY}."


def pauses_home_only(catalog: Catalog, ws: Workspace) -> bool:
    """Whether a pause of ``ws`` keeps only its home (its team or environment turned
    memory snapshots off): the doors say so instead of promising its kernels."""
    return not catalog.memory_snapshots_for(ws.team, ws.environment)


def preview_transition(catalog: Catalog, ws: Workspace | None, signal: Signal,
                       usage: Mapping[str, Any], now: datetime) -> Preview:
    """The lifecycle's own verdict on ``signal`` now and, for what takes hardware, the quota
    it would charge (what the profile queues when full is not refused: it waits QUEUED).
    A pause that keeps only the home says so (:data:`PAUSE_HOME_ONLY`)."""
    if ws is not None and pauses_home_only(catalog, ws):
        ws = dataclasses.replace(ws, memory_snapshots=False)
    verdict = decide(ws, signal, now)
    if not verdict.accepted:
        state = f" is {ws.state}" if ws is not None and ws.state != State.DELETED else ""
        name = ws.name if ws is not None else getattr(signal, "name", "the workspace")
        return Preview(f"{name}{state}: {_sentence(verdict.message, capital=False)}")
    if verdict.workspace is not None and isinstance(signal, WorkspaceRequested |
                                                    WorkspaceResumeRequested):
        refusal, queued = admission.preview(catalog, verdict.previous_state, ws,
                                            verdict.workspace, dict(usage))
        if refusal:
            return Preview(_sentence(refusal))
        return Preview(queued=queued)
    if isinstance(signal, WorkspacePauseRequested) and ws is not None and \
            not ws.memory_snapshots:
        return Preview(notices=(PAUSE_HOME_ONLY,))
    return Preview()


def _sentence(message: str, *, capital: bool = True) -> str:
    message = message.strip()
    if capital:
        message = message[:1].upper() + message[1:]
    return message if message.endswith((".", "!", "?")) else message + "."


def _did_you_mean(wrong: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(wrong, candidates, n=2, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""
