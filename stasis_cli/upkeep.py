"""`stasis idle sweep`, `stasis janitor`, `stasis cost` and `stasis reconcile`: the
scheduled jobs, on demand.

Each calls the same HTTP function Cloud Scheduler calls (``idle_sweep``, ``janitor``,
``cost_rollup`` on the function host), so what the CLI shows is what the schedule does. They
act as the scheduler does, as no user: they take no ``--as``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from stasis_cli import options

_TIMEOUT = 600


def _call(function: str, **params: str) -> Any:
    import requests

    settings = options.stack_settings()
    url = f"{settings.functions_url}/{function}/"
    try:
        response = requests.post(url, params=params, timeout=_TIMEOUT)
    except requests.RequestException as exc:
        raise click.ClickException(
            f"the function host at {settings.functions_url} did not answer ({exc}); "
            "is the stack up (`stasis up`)?") from None
    if not response.ok:
        try:
            detail = response.json().get("error") or response.text
        except ValueError:
            detail = response.text
        raise click.ClickException(f"{function} answered {response.status_code}: "
                                   f"{str(detail)[:500]}")
    return response.json()


@click.group()
def idle() -> None:
    """Idle auto-pause (the profiles' idle policies)."""


@idle.command("sweep")
@click.option("--dry-run", is_flag=True, help="Say which workspaces would pause; pause none.")
@click.option("--every", type=click.IntRange(min=10), default=None, metavar="SECONDS",
              help="Keep sweeping every SECONDS (the local stack's scheduler already sweeps "
                   "every 5 minutes).")
@options.json_output
def idle_sweep(dry_run: bool, every: int | None, as_json: bool) -> None:
    """Check every RUNNING workspace against its idle policy now; pause the idle ones."""
    while True:
        _sweep_once(dry_run, as_json)
        if every is None:
            return
        try:
            time.sleep(every)
        except KeyboardInterrupt:
            return


def _sweep_once(dry_run: bool, as_json: bool) -> None:
    report = _call("idle_sweep", **({"dry_run": "1"} if dry_run else {}))
    if as_json:
        options.echo_json(report)
        return
    verdicts = ", ".join(f"{k} {v}" for k, v in report["verdicts"].items()) or "none"
    click.echo(f"checked {report['checked']} running workspaces in {report['seconds']}s "
               f"(asked the runtime about {report['asked_runtime']}): {verdicts}")
    verb = "would pause" if dry_run else "pausing"
    for row in report["idle"]:
        click.echo(f"  {verb} {row['workspace_id']}: {row['message']}")
    for row in report["errors"]:
        click.echo(f"  no signals for {row['workspace_id']}: {row['error']}", err=True)


@click.command()
@click.option("--fix", is_flag=True,
              help="Expire what retention says, delete orphan objects, expire records whose "
                   "objects are gone, release servers without a live workspace.")
@options.json_output
def janitor(fix: bool, as_json: bool) -> None:
    """Snapshot retention and orphans both ways; changes nothing without --fix."""
    report = _call("janitor", mode="fix" if fix else "report")
    if as_json:
        options.echo_json(report)
    else:
        _print_janitor(report, fix)
    sys.exit(1 if report["errors"] else 0)


def _print_janitor(report: dict[str, Any], fix: bool) -> None:
    verb = "expiring" if fix else "would expire"
    sections = (
        ("expire", f"{verb} (retention)",
         lambda r: f"{r['snapshot_id']} ({r['bytes']} B): {r['reason']}, {r['why']}"),
        ("kept", "kept although retention says otherwise",
         lambda r: f"{r['snapshot_id']}: {r['would_be']}, but {r['why']}"),
        ("orphan_objects", "objects without a snapshot record" + (" (deleted)" if fix else ""),
         lambda r: f"{r['prefix']} ({r['objects']} objects, {r['bytes']} B)"),
        ("orphan_records", "snapshot records whose objects are gone"
         + (" (expired)" if fix else ""),
         lambda r: f"{r['snapshot_id']} of {r['workspace_id']} ({r['bytes']} B)"),
        ("unresumable", "workspaces whose current snapshot's objects are gone (cannot resume; "
                        "delete them or restore the objects)",
         lambda r: f"{r['workspace_id']}: {r['snapshot_id']}"),
        ("orphan_processes", "servers without a live workspace" + (" (released)" if fix else ""),
         lambda r: f"{r['workspace_id']}: {r['why']}"),
    )
    found = False
    for key, title, line in sections:
        rows = report.get(key) or []
        if rows:
            found = True
            click.echo(f"{title}:")
            for row in rows:
                click.echo(f"  {line(row)}")
    for team, over in (report.get("over_cap") or {}).items():
        found = True
        click.echo(f"team {team} is {over} B over its snapshot bytes with only snapshots that "
                   "workspaces still resume from")
    for team, counts in (report.get("usage_drift") or {}).items():
        click.echo(f"team {team}: usage counter says {counts['usage']} B of snapshots, the "
                   f"records {counts['records']} B")
    for error in report.get("errors") or []:
        click.echo(f"error: {error}", err=True)
    if not found:
        click.echo("nothing to clean up")
    elif not fix:
        click.echo("(nothing changed; run `stasis janitor --fix` to apply)")


@click.command()
@click.option("--team", default=None, help="One team (default: every team).")
@options.json_output
def cost(team: str | None, as_json: bool) -> None:
    """This month's cost per team: compute, disk, snapshots, forecast, saved by auto-pause."""
    docs = _call("cost_rollup", **({"team": team} if team else {}))["teams"]
    if as_json:
        options.echo_json(docs if team is None else docs[0])
        return
    for doc in docs:
        compute, disk, snaps = doc["compute"], doc["disk"], doc["snapshots"]
        saved, total = doc["auto_pause"], doc["total"]
        click.echo(f"team {doc['team']}, {doc['month']} ({doc['hours_elapsed']:.0f} of "
                   f"{doc['hours_in_month']:.0f} h), USD")
        click.echo(f"  compute    {compute['cost']:>10.2f}  {compute['hours']:.1f} h "
                   f"({compute['gpu_hours']:.1f} GPU-h); {compute['running_now']} running now "
                   f"at {compute['cost_per_hour_now']:.2f}/h; forecast "
                   f"{compute['forecast_cost']:.2f}")
        click.echo(f"  disk       {disk['cost']:>10.2f}  {_gib(disk['bytes_now'])} now; "
                   f"forecast {disk['forecast_cost']:.2f}")
        click.echo(f"  snapshots  {snaps['cost']:>10.2f}  {_gib(snaps['bytes_now'])} now; "
                   f"forecast {snaps['forecast_cost']:.2f}")
        click.echo(f"  total      {total['cost']:>10.2f}  forecast for the month "
                   f"{total['forecast_cost']:.2f}")
        click.echo(f"  auto-pause saved {saved['cost_saved']:.2f} ({saved['hours_saved']:.1f} h, "
                   f"{saved['gpu_hours_saved']:.1f} GPU-h) with {saved['pauses']} pauses; "
                   f"{saved['paused_now']} paused by policy now")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@click.command()
@click.option("--dry-run", is_flag=True, help="Report what would be repaired, change nothing.")
@options.json_output
def reconcile(dry_run: bool, as_json: bool) -> None:
    """Repair stuck transitions, orphan servers, and sandboxes and jobs whose runtime went
    silent, now."""
    repairs = _call("reconcile", **({"dry_run": "1"} if dry_run else {}))["repairs"]
    if as_json:
        options.echo_json(repairs)
        return
    click.echo("nothing to repair" if not repairs else "\n".join(
        # a workspace's, a sandbox's or a job's repair
        f"{r.get('workspace_id') or r.get('sandbox_id') or r.get('job_id')}: {r['why']} -> "
        f"{r['action']}" for r in repairs))
