"""`stasis ws create|pause|resume|delete|cancel|list|status|snapshots`: workspaces.

Every verb that changes something sends its request to the control plane's ``cli``
function (``stasis_cli.door``), which previews it with the checks and words chat and the
portal use: a refusal is answered at once (exit 2) and nothing is published. What passes is
published; without ``--wait`` the verb says how to follow it (`stasis ws status NAME`),
with ``--wait`` it follows the request to its outcome: the ledger entry of the consuming
function says whether the handler accepted or refused it and why (exit 1), the workspace
document says where it got (``stasis_cli.client.follow``).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from stasis_cli import options


@click.group()
def ws() -> None:
    """Create, inspect, pause, resume and delete workspaces."""


@ws.command("create")
@click.argument("name")
@options.team
@click.option("--profile", default=None, help="Hardware profile (default: the team's first).")
@click.option("--ide", default="jupyterlab", show_default=True)
@click.option("--env", "environment", default="python-3-11", show_default=True)
@options.as_user
@options.wait
@options.json_output
def ws_create(name: str, team: str | None, profile: str | None, ide: str, environment: str,
              wait: bool, as_json: bool) -> None:
    """Request a new workspace NAME."""
    _request(dict(verb="create", name=name, team=team, profile=profile, ide=ide,
                  environment=environment), wait, as_json, until={"RUNNING"})


@ws.command("pause")
@click.argument("name")
@options.team
@options.as_user
@options.wait
@options.json_output
def ws_pause(name: str, team: str | None, wait: bool, as_json: bool) -> None:
    """Pause NAME with its running state (kernels snapshotted, hardware released; only the
    home is kept where its environment or team says memory_snapshots: false)."""
    _request(dict(verb="pause", name=name, team=team), wait, as_json, until={"PAUSED"})


@ws.command("resume")
@click.argument("name")
@options.team
@click.option("--profile", default=None, help="Resume on another hardware profile.")
@click.option("--device-arrays-to-cpu", is_flag=True,
              help="Restore GPU tensors and arrays onto CPU (a profile without the GPU).")
@options.as_user
@options.wait
@options.json_output
def ws_resume(name: str, team: str | None, profile: str | None, device_arrays_to_cpu: bool,
              wait: bool, as_json: bool) -> None:
    """Resume NAME into its live kernels (fresh ones where its environment or team keeps
    memory_snapshots: false)."""
    _request(dict(verb="resume", name=name, team=team, profile=profile,
                  device_arrays_to_cpu=device_arrays_to_cpu), wait, as_json,
             until={"RUNNING"})


@ws.command("delete")
@click.argument("name")
@options.team
@click.option("--keep-home", is_flag=True, help="Keep the home directory.")
@options.as_user
@options.wait
@options.json_output
def ws_delete(name: str, team: str | None, keep_home: bool, wait: bool, as_json: bool) -> None:
    """Delete NAME (and its snapshots); --keep-home keeps its files."""
    _request(dict(verb="delete", name=name, team=team, keep_home=keep_home), wait, as_json,
             until={"DELETED"})


@ws.command("cancel")
@click.argument("name")
@options.team
@options.as_user
@options.wait
@options.json_output
def ws_cancel(name: str, team: str | None, wait: bool, as_json: bool) -> None:
    """Cancel the QUEUED request of NAME: a queued create is deleted (nothing stays behind),
    a queued resume stays PAUSED."""
    from stasis_cli import client

    _, ws_id, _ = options.target(name, team)
    doc = client.workspace(ws_id) or {}
    if doc.get("state") != "QUEUED":
        raise options.Refused(f"Nothing done: {ws_id} is {doc.get('state') or 'unknown'}, "
                              "not QUEUED: nothing to cancel.")
    resume = doc.get("queued_for") == "resume"
    _request(dict(verb="pause" if resume else "delete", name=name, team=team), wait, as_json,
             until={"PAUSED"} if resume else {"DELETED"})


@ws.command("list")
@options.team
@options.as_user
@click.option("--all", "all_", is_flag=True, help="Include deleted workspaces.")
@options.json_output
def ws_list(team: str | None, all_: bool, as_json: bool) -> None:
    """Workspaces of your teams, with their state."""
    from stasis_cli import door

    rows = door.workspaces(options.stack_settings(), options.acting_user(), team=team,
                           include_deleted=all_)
    options.echo_rows(
        rows, as_json=as_json,
        empty="no workspaces",
        line=lambda row: f"{row['team']:<8} {row['name']:<16} {row['state']:<12} "
                         f"{row['profile']:<10} {row['owner']:<8} {row.get('url') or ''}")


_STATUS_FIELDS = ("id", "state", "state_reason", "state_message", "queue", "profile",
                  "priority_class", "node", "devices", "declared", "environment", "url",
                  "direct_url", "token", "current_snapshot", "first_start_ms",
                  "last_pause_ms", "last_resume_ms", "last_checkpoint_at",
                  "lost_work_seconds", "snapshot_bytes")


@ws.command("status")
@click.argument("name")
@options.team
@options.as_user
@options.json_output
def ws_status(name: str, team: str | None, as_json: bool) -> None:
    """State, URL (the IDE through the access proxy; the server's own URL and token for the
    local owner), timings and current snapshot of NAME."""
    from stasis_cli import client

    settings, ws_id, _ = options.target(name, team)
    info = client.workspace_status(settings, ws_id)
    if info is None:
        raise options.Refused(f"There is no workspace {ws_id}. See `stasis ws list`.")
    if as_json:
        options.echo_json(info)
        return
    for key in _STATUS_FIELDS:
        if info.get(key) not in (None, ""):
            click.echo(f"{key:<17} {info[key]}")


@ws.command("snapshots")
@click.argument("name")
@options.team
@options.as_user
@options.json_output
def ws_snapshots(name: str, team: str | None, as_json: bool) -> None:
    """The snapshots of NAME."""
    from stasis_cli import client

    _, ws_id, _ = options.target(name, team)
    options.echo_rows(
        client.snapshots(ws_id), as_json=as_json, empty="no snapshots",
        line=lambda row: f"{row['id']:<40} {row['status']:<8} {row['bytes']:>12} B "
                         f"{row.get('duration_ms', 0):>7} ms  expires {row.get('expires_at')}")


def _request(body: dict[str, Any], wait: bool, as_json: bool, until: set[str]) -> None:
    """Send the request to the control plane's ``cli`` function, which previews it (a
    refusal exits 2, nothing published) and publishes it; then say how to follow it, or
    with ``--wait`` follow it to the handler's verdict and the workspace's new state."""
    from stasis_cli import door

    settings = options.stack_settings()
    requested = door.request(settings, options.acting_user(), body)
    if not wait:
        follow = f"stasis ws status {body['name']}" + (
            f" --team {body['team']}" if body.get("team") else "")
        if as_json:
            options.echo_json({"requestid": requested.requestid,
                               "workspace_id": requested.subject, "queued": requested.queued,
                               "notices": list(requested.notices), "follow": follow})
            return
        for notice in requested.notices:
            click.echo(f"note: {notice}")
        if requested.queued:
            click.echo(f"it will wait in the queue: {requested.queued}")
        click.echo(f"requested {requested.name} for {requested.subject} (request "
                   f"{requested.requestid}); follow it with `{follow}`")
        return
    from stasis_cli import client

    outcome = client.follow(settings, requested, until=until,
                            progress=None if as_json else click.echo)
    if as_json:
        options.echo_json(outcome)
    sys.exit(options.EXIT_DONE if outcome.get("ok") else
             options.EXIT_UNAVAILABLE if outcome.get("unavailable") else options.EXIT_REFUSED)
