"""What every verb of the `stasis` command shares: its options and the few helpers behind them.

- ``--as USER`` (:data:`as_user`): who acts. Every verb that acts as a user or prints data
  accepts it; :func:`acting_user` answers ``--as``, else ``STASIS_USER``, else ``dev`` (the
  local dev identity). Verbs read it through :func:`acting_user`, so one that does not
  need it yet carries no unused parameter.
- ``--json`` (:data:`json_output`): print the result as JSON (:func:`echo_json`,
  :func:`echo_rows`) instead of text.
- ``--wait`` (:data:`wait`) and ``--team`` (:data:`team`).
- :func:`stack_settings`: where the local stack is (``STASIS_*``), with the emulator
  variables set for the SDK clients this process builds.
- :func:`team_of`, :func:`target`: which team and workspace a NAME means for the acting user.
- :func:`publish`: a request published as the CLI publishes one (a new requestid; an invalid
  payload is a usage error that names the field).
- The exit statuses every verb keeps (:data:`EXIT_STATUSES`, in `stasis --help`): 0 done,
  1 refused by the control plane (the handler's verdict under ``--wait``), 2 bad input or
  refused by the preview (:class:`Refused`; click's usage errors), 3 link refused, 4
  unavailable (:class:`Unavailable`: the stack or a function did not answer), 5 a sandbox
  suspended (``--wait``).

Imports only click and the standard library at import time: everything else is imported by
the function that needs it, so ``stasis --help`` imports no SDK.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import click

from stack.settings import Settings

EXIT_DONE, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_LINK_REFUSED, EXIT_UNAVAILABLE, EXIT_SUSPENDED = \
    0, 1, 2, 3, 4, 5
EXIT_STATUSES = (
    "Exit status: 0 done; 1 refused by the control plane (the handler's reason, with "
    "--wait); 2 bad input or refused at once by the preview (nothing was requested); "
    "3 link refused; 4 unavailable (the stack or a function did not answer, or a "
    "rate limit: retry); "
    "5 a sandbox suspended (--wait).")


class Refused(click.ClickException):
    """Bad input, or a request the preview refused: nothing was requested (exit 2)."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: Any = None) -> None:
        click.echo(self.format_message(), err=True, file=file)


class Unavailable(click.ClickException):
    """The stack, or a function of it, did not answer (exit 4)."""

    exit_code = EXIT_UNAVAILABLE


#: The acting user of this invocation, as ``--as`` gave it (``click.Context.meta`` key).
_ACTING = "stasis.acting_user"
DEFAULT_USER = "dev"


def _remember_user(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[_ACTING] = value


as_user = click.option(
    "--as", "as_user", metavar="USER", default=None, expose_value=False,
    callback=_remember_user,
    help=f"Act as USER (default: STASIS_USER, else {DEFAULT_USER}).")
json_output = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
wait = click.option("--wait", is_flag=True, help="Follow the request to its outcome.")
team = click.option("--team", default=None, help="Team (default: your first team).")


def acting_user() -> str:
    """``--as`` of the running command, else ``STASIS_USER``, else ``dev``."""
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(_ACTING) if ctx is not None else None
    return str(given or os.environ.get("STASIS_USER") or DEFAULT_USER)


def stack_settings() -> Settings:
    """The local stack's settings (``STASIS_*``); its emulators' variables are set for this
    process's clients unless they are set already."""
    settings = Settings.from_env()
    for key, value in settings.emulator_env().items():
        os.environ.setdefault(key, value)
    return settings


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def echo_rows(rows: list[dict[str, Any]], *, as_json: bool, empty: str,
              line: Callable[[dict[str, Any]], str]) -> None:
    """A listing: the rows as JSON with --json, else one ``line`` each (``empty`` if none)."""
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(empty)
    for row in rows:
        click.echo(line(row))


def team_of(user: str, team: str | None) -> str:
    """``team`` if given, else the user's first team (a usage error when they have none)."""
    if team:
        return team
    from stasis_cli import client

    teams = client.teams_of(user)
    if not teams:
        raise click.UsageError(
            f"{user} is not a member of any team; pass --team or ask an "
            "admin to add you (stasis admin apply)"
        )
    return teams[0]


def target(name: str, team: str | None) -> tuple[Settings, str, str]:
    """(settings, workspace id, acting user) for workspace NAME of ``team`` (default: the
    acting user's first team)."""
    from events.payloads import workspace_id

    user = acting_user()
    settings = stack_settings()
    return settings, workspace_id(team_of(user, team), name), user


def publish(settings: Settings, payload: Any) -> Any:
    """Publish ``payload`` as a new request from the CLI; an invalid one is a usage error
    that names the field. Returns the event (its requestid is the request's)."""
    from events import InvalidEvent, new_event

    try:
        event = new_event(payload, source="//stasis/cli", requestid=uuid.uuid4().hex)
    except InvalidEvent as exc:
        raise click.UsageError(exc.reason) from None
    bus(settings).publish(event)
    return event


def bus(settings: Settings, origin: str | None = None) -> Any:
    """The Pub/Sub bus of the stack's project, publishing as the operator (or as ``origin``)."""
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import OPERATOR

    return PubSubBus(settings.project, origin=origin or OPERATOR)
