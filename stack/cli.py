"""The `stasis` command: the local stack, workspaces, events, dead letters, admin.

Acting user: `--as USER` or STASIS_USER (default `dev`, the local dev identity). Every
command that changes something publishes an event (as chat would) and, with `--wait`,
follows the request to its outcome: the ledger entry of the consuming function says
whether it was accepted or refused and why, the workspace document says where it got.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import click

from stack.settings import Settings

TERMINAL = {"RUNNING", "PAUSED", "DELETED", "FAILED"}


def _settings() -> Settings:
    return Settings.from_env()


def _env(settings: Settings) -> None:
    for key, value in settings.emulator_env().items():
        os.environ.setdefault(key, value)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group()
def main() -> None:
    """Stasis: ML workspaces that pause with their live kernels and resume into them."""


# --- the stack ---------------------------------------------------------------------------
@main.command()
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C stops the stack.")
@click.option(
    "--runtime",
    type=click.Choice(["local", "null"]),
    default="local",
    show_default=True,
    help="null: no workspaces, for control-plane tests.",
)
@click.option("--fresh", is_flag=True,
              help="Forget the workspaces and catalog the last `stasis down` saved.")
def up(foreground: bool, runtime: str, fresh: bool) -> None:
    """Start the local stack on 127.0.0.1 and return once every part is ready; the
    control-plane state the last `stasis down` saved comes back (paused workspaces stay
    resumable)."""
    from stack import local

    settings = _settings()
    report = local.up(settings, runtime=runtime, fresh=fresh)
    for row in local.status(settings):
        click.echo(
            f"  {row['name']:<11} {row['address'] or '':<22} "
            f"{'ready' if row['healthy'] else row['state']}"
        )
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items())
    click.echo(
        f"stack up in {report.total:.1f}s ({steps})"
        + ("; example catalog applied" if report.seeded else "")
        + ("; state of the last `stasis down` restored" if report.restored else "")
    )
    click.echo(f"data dir {settings.data_dir}; stop with `stasis down`")
    click.echo(f"admin dashboard {settings.functions_url}/dashboard/ (dev identity "
               f"{os.environ.get('STASIS_DASHBOARD_DEV_USER') or 'dev'})")
    if foreground:
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            click.echo("stopping")
            local.down(settings, say=click.echo)


@main.command()
@click.option("--no-pause", is_flag=True,
              help="Do not pause running workspaces first (their kernels are lost).")
@click.option("--pause-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the pauses before stopping anyway.")
def down(no_pause: bool, pause_timeout: float) -> None:
    """Stop every process of the local stack. Running workspaces are paused first (their
    kernels go to the snapshot bucket) and the control plane's state is saved, so the next
    `stasis up` has them back, PAUSED; homes are always kept."""
    from stack import local

    stopped = local.down(_settings(), pause=not no_pause, pause_timeout=pause_timeout,
                         say=click.echo)
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@main.command()
@click.option("--json", "as_json", is_flag=True)
def status(as_json: bool) -> None:
    """Each component of the local stack, its address and health."""
    from stack import local

    rows = local.status(_settings())
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("the local stack is not running (start it with `stasis up`)")
    for row in rows:
        click.echo(
            f"{row['name']:<11} {row['address'] or '':<22} {row['state']:<8} "
            f"{'healthy' if row['healthy'] else 'NOT ANSWERING'}"
        )
    sys.exit(0 if rows and all(r["healthy"] for r in rows) else 1)


# --- events and dead letters ---------------------------------------------------------------
@main.group()
def events() -> None:
    """Publish events the way chat, the CLI or cluster monitoring would."""


@events.command("publish")
@click.argument("event_type")
@click.option("--data", required=True, help="The payload as JSON.")
@click.option("--requestid", default=None, help="Same id for retries of one request.")
@click.option("--unchecked", is_flag=True,
              help="Publish even if the payload breaks its schema (to exercise the "
                   "dead-letter path); the consumer rejects it.")
def events_publish(event_type: str, data: str, requestid: str | None, unchecked: bool) -> None:
    """Publish EVENT_TYPE (e.g. workspace.requested) with the JSON payload --data."""
    from events import InvalidEvent, new_event, spec_for

    settings = _settings()
    _env(settings)
    if unchecked:
        message_id = _bus(settings).publish_unchecked(event_type, data.encode(), requestid)
        click.echo(json.dumps({"type": event_type, "message_id": message_id}))
        return
    try:
        spec = spec_for(event_type)
    except KeyError:
        from events import CATALOG

        raise click.UsageError(
            f"unknown event type {event_type!r}; one of: " + ", ".join(CATALOG)
        ) from None
    try:
        payload = spec.payload(**json.loads(data))
        event = new_event(payload, source="//stasis/cli", requestid=requestid)
    except (TypeError, ValueError, InvalidEvent) as exc:
        raise click.UsageError(f"invalid {spec.name} payload: {exc}") from None
    message_id = _bus(settings).publish(event)
    click.echo(
        json.dumps(
            {
                "type": event.type,
                "id": event.id,
                "requestid": event.requestid,
                "message_id": message_id,
            }
        )
    )


@main.command()
@click.option("--json", "as_json", is_flag=True)
def dlq(as_json: bool) -> None:
    """Dead-lettered messages, each with its type, id and why it failed (left in place)."""
    from stack import deadletters

    settings = _settings()
    _env(settings)
    rows = deadletters.peek(settings.project)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("no dead-lettered messages")
    for row in rows:
        click.echo(
            f"{row['consumer']}: {row['type'] or '?'} id={row['id'] or '?'} "
            f"attempts={row['attempts']}\n    reason: {row['reason']}"
        )


# --- workspaces --------------------------------------------------------------------------
@main.group()
def ws() -> None:
    """Create, inspect, pause, resume and delete workspaces."""


def _user(as_user: str | None) -> str:
    return as_user or os.environ.get("STASIS_USER") or "dev"


def _team_of(user: str, team: str | None) -> str:
    if team:
        return team
    from stack import client

    teams = client.teams_of(user)
    if not teams:
        raise click.UsageError(
            f"{user} is not a member of any team; pass --team or ask an "
            "admin to add you (stasis admin apply)"
        )
    return teams[0]


_as = click.option("--as", "as_user", default=None, help="Act as this user (STASIS_USER).")
_team = click.option("--team", default=None, help="Team (default: your first team).")
_wait = click.option("--wait", is_flag=True, help="Follow the request to its outcome.")
_json = click.option("--json", "as_json", is_flag=True)


@ws.command("create")
@click.argument("name")
@_team
@click.option("--profile", default="cpu-small", show_default=True)
@click.option("--ide", default="jupyterlab", show_default=True)
@click.option("--env", "environment", default="python-3-11", show_default=True)
@_as
@_wait
@_json
def ws_create(
    name: str,
    team: str | None,
    profile: str,
    ide: str,
    environment: str,
    as_user: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Request a new workspace NAME."""
    from events import WorkspaceRequested

    user = _user(as_user)
    settings = _settings()
    _env(settings)
    team = _team_of(user, team)
    payload = _payload(
        WorkspaceRequested,
        team=team,
        owner=user,
        name=name,
        profile=profile,
        ide=ide,
        environment=environment,
    )
    _publish_and_follow(settings, payload, wait, as_json, until={"RUNNING"})


@ws.command("pause")
@click.argument("name")
@_team
@_as
@_wait
@_json
def ws_pause(name: str, team: str | None, as_user: str | None, wait: bool, as_json: bool) -> None:
    """Pause NAME with its running state (kernels snapshotted, hardware released)."""
    from events import WorkspacePauseRequested

    settings, ws_id, user = _target(name, team, as_user)
    _publish_and_follow(
        settings,
        WorkspacePauseRequested(workspace_id=ws_id, actor=user),
        wait,
        as_json,
        until={"PAUSED"},
    )


@ws.command("resume")
@click.argument("name")
@_team
@click.option("--profile", default=None, help="Resume on another hardware profile.")
@_as
@_wait
@_json
def ws_resume(
    name: str, team: str | None, profile: str | None, as_user: str | None, wait: bool, as_json: bool
) -> None:
    """Resume NAME into its live kernels."""
    from events import WorkspaceResumeRequested

    settings, ws_id, user = _target(name, team, as_user)
    _publish_and_follow(
        settings,
        WorkspaceResumeRequested(workspace_id=ws_id, actor=user, profile=profile),
        wait,
        as_json,
        until={"RUNNING"},
    )


@ws.command("delete")
@click.argument("name")
@_team
@click.option("--keep-home", is_flag=True, help="Keep the home directory.")
@_as
@_wait
@_json
def ws_delete(
    name: str, team: str | None, keep_home: bool, as_user: str | None, wait: bool, as_json: bool
) -> None:
    """Delete NAME (and its snapshots); --keep-home keeps its files."""
    from events import WorkspaceDeleteRequested

    settings, ws_id, user = _target(name, team, as_user)
    _publish_and_follow(
        settings,
        WorkspaceDeleteRequested(workspace_id=ws_id, actor=user, keep_home=keep_home),
        wait,
        as_json,
        until={"DELETED"},
    )


@ws.command("list")
@_team
@_as
@click.option("--all", "all_", is_flag=True, help="Include deleted workspaces.")
@_json
def ws_list(team: str | None, as_user: str | None, all_: bool, as_json: bool) -> None:
    """Workspaces of your teams, with their state."""
    from stack import client

    settings = _settings()
    _env(settings)
    rows = client.list_workspaces(team=team, include_deleted=all_)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("no workspaces")
    for row in rows:
        click.echo(
            f"{row['team']:<8} {row['name']:<16} {row['state']:<12} "
            f"{row['profile']:<10} {row['owner']:<8} {row.get('url') or ''}"
        )


@ws.command("status")
@click.argument("name")
@_team
@_as
@_json
def ws_status(name: str, team: str | None, as_user: str | None, as_json: bool) -> None:
    """State, URL (with the local owner's token), timings and current snapshot of NAME."""
    from stack import client

    settings, ws_id, _ = _target(name, team, as_user)
    info = client.workspace_status(settings, ws_id)
    if info is None:
        raise click.ClickException(f"no workspace {ws_id}")
    if as_json:
        _echo_json(info)
        return
    for key in (
        "id",
        "state",
        "state_reason",
        "state_message",
        "profile",
        "environment",
        "url",
        "token",
        "current_snapshot",
        "first_start_ms",
        "last_pause_ms",
        "last_resume_ms",
        "snapshot_bytes",
    ):
        if info.get(key) not in (None, ""):
            click.echo(f"{key:<17} {info[key]}")


@ws.command("snapshots")
@click.argument("name")
@_team
@_as
@_json
def ws_snapshots(name: str, team: str | None, as_user: str | None, as_json: bool) -> None:
    """The snapshots of NAME."""
    from stack import client

    _, ws_id, _ = _target(name, team, as_user)
    rows = client.snapshots(ws_id)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("no snapshots")
    for row in rows:
        click.echo(
            f"{row['id']:<40} {row['status']:<8} {row['bytes']:>12} B "
            f"{row.get('duration_ms', 0):>7} ms  expires {row.get('expires_at')}"
        )


def _target(name: str, team: str | None, as_user: str | None) -> tuple[Settings, str, str]:
    from events.payloads import workspace_id

    user = _user(as_user)
    settings = _settings()
    _env(settings)
    return settings, workspace_id(_team_of(user, team), name), user


def _payload(cls: type, **fields: Any) -> Any:
    try:
        from events import new_event

        payload = cls(**fields)
        new_event(payload)  # validates
        return payload
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _publish_and_follow(
    settings: Settings, payload: Any, wait: bool, as_json: bool, until: set[str]
) -> None:
    from stack import client

    event = _publish(settings, payload)
    if not wait:
        out = {"requestid": event.requestid, "workspace_id": event.subject}
        click.echo(
            json.dumps(out)
            if as_json
            else f"requested {event.name} for {event.subject} (request {event.requestid})"
        )
        return
    outcome = client.follow(settings, event, until=until, progress=None if as_json else click.echo)
    if as_json:
        _echo_json(outcome)
    sys.exit(0 if outcome.get("ok") else 1)


def _publish(settings: Settings, payload: Any) -> Any:
    """Publish ``payload`` as a new request from the CLI; an invalid one is a usage error
    that names the field. Returns the event (its requestid is the request's)."""
    from events import InvalidEvent, new_event

    try:
        event = new_event(payload, source="//stasis/cli", requestid=uuid.uuid4().hex)
    except InvalidEvent as exc:
        raise click.UsageError(exc.reason) from None
    _bus(settings).publish(event)
    return event


def _bus(settings: Settings) -> Any:
    from functions.adapters.pubsub_bus import PubSubBus

    return PubSubBus(settings.project)


# --- admin ---------------------------------------------------------------------------------
@main.group()
def admin() -> None:
    """Catalog, teams and quotas."""


@admin.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_as
def admin_apply(file: str, as_user: str | None) -> None:
    """Validate FILE as a whole and apply it (nothing is written if anything is wrong)."""
    from pathlib import Path

    from stack import admin as admin_mod

    settings = _settings()
    _env(settings)
    try:
        result = admin_mod.apply_file(settings, Path(file), actor=_user(as_user))
    except admin_mod.ConfigRejected as exc:
        click.echo(f"{file} rejected, nothing applied:", err=True)
        for problem in exc.problems:
            click.echo(f"  {problem.path or '/'}: {problem.message}", err=True)
        sys.exit(2)
    click.echo(f"applied revision {result['revision'][:12]}: {result['changes']}")


from stack import cli_chat  # noqa: E402, F401, I001  (registers `stasis chat`)
from stack import cli_links  # noqa: E402, F401  (registers `stasis link`, `stasis exec`)
from stack import cli_upkeep  # noqa: E402, F401  (registers `stasis idle`, `janitor`, `cost`)
from stack import cli_bundle  # noqa: E402, F401  (registers `stasis bundle`)
from stack import cli_sandbox  # noqa: E402, F401  (registers `stasis sandbox`)
from stack import cli_jobs  # noqa: E402, F401  (registers `stasis jobs`)
