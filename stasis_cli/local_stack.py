"""`stasis up`, `stasis down` and `stasis status`: the local stack (``stack.local``).

`status` answers "where is everything": the project id, the data dir, every service of the
stack with its address and health, and every HTTP function of ``functions/routes.py`` with
its URL on the function host and who may call it when deployed (chat, dashboard, portal,
proxy, links, the scheduled jobs, and whatever routes.py gains), so nobody has to guess a
port or a path.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from stack.settings import Settings
from stasis_cli import options


@click.command()
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
@options.json_output
def up(foreground: bool, runtime: str, fresh: bool, as_json: bool) -> None:
    """Start the local stack on 127.0.0.1 and return once every part is ready; the
    control-plane state the last `stasis down` saved comes back (paused workspaces stay
    resumable)."""
    from stack import local

    settings = options.stack_settings()
    report = local.up(settings, runtime=runtime, fresh=fresh)
    if as_json:
        options.echo_json({"seconds": report.seconds, "total": report.total,
                           "seeded": report.seeded, "restored": report.restored,
                           **_view(settings)})
    else:
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
        click.echo(f"portal {settings.functions_url}/portal/ (sign in: "
                   "`stasis portal --as USER`)")
        if runtime == "local":
            click.echo(f"IDE proxy {settings.ide_proxy_url}/w/<workspace id>/ (the portal's "
                       "Open leads there)")
    if foreground:
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            click.echo("stopping")
            local.down(settings, say=click.echo)


@click.command()
@click.option("--no-pause", is_flag=True,
              help="Do not pause running workspaces first (their kernels are lost).")
@click.option("--pause-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the pauses before stopping anyway.")
@options.json_output
def down(no_pause: bool, pause_timeout: float, as_json: bool) -> None:
    """Stop every process of the local stack. Running workspaces are paused first (their
    kernels go to the snapshot bucket) and the control plane's state is saved, so the next
    `stasis up` has them back, PAUSED; homes are always kept."""
    from stack import local

    said: list[str] = []
    say = said.append if as_json else click.echo
    stopped = local.down(options.stack_settings(), pause=not no_pause,
                         pause_timeout=pause_timeout, say=say)
    if as_json:
        options.echo_json({"stopped": stopped, "messages": said})
    else:
        click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@click.command()
@options.json_output
def status(as_json: bool) -> None:
    """The project, each service of the local stack with its address and health (the node
    agent's with its tenancy: per-workspace users, or single-tenant and why), and the URL
    of every HTTP function. Exit status 1 unless every service answers."""
    settings = options.stack_settings()
    view = _view(settings)
    rows = view["services"]
    if as_json:
        options.echo_json(view)
    else:
        click.echo(f"project {view['project']}, data dir {view['data_dir']}")
        if not rows:
            click.echo("the local stack is not running (start it with `stasis up`)")
        for row in rows:
            click.echo(
                f"{row['name']:<11} {row['address'] or '':<22} {row['state']:<8} "
                f"{'healthy' if row['healthy'] else 'NOT ANSWERING'}"
            )
            if row["name"] == "ide-proxy" and row["address"]:
                click.echo(f"{'':<11} IDEs at http://{row['address']}/w/<workspace id>/")
            if row["name"] == "node-agent" and view["tenancy"] is not None:
                mode = view["tenancy"]
                click.echo(f"{'':<11} runtime: {mode['mode']}"
                           + (f" ({mode['reason']})" if mode.get("reason") else ""))
                for python, why in (mode.get("single_tenant") or {}).items():
                    click.echo(f"{'':<11} single-tenant on {python}: {why}")
            if row["name"] == "node-agent" and view["warm_pools"] is not None:
                pools = view["warm_pools"]["environments"]
                click.echo(f"{'':<11} warm pool: " + (", ".join(
                    f"{env} {p['waiting']}/{p['size']}" for env, p in pools.items()
                ) or "none (environments[].warm_pool is 0)"))
                kernels = (view["warm_pools"].get("kernels") or {}).get("environments") or {}
                if any(p["size"] for p in kernels.values()):
                    click.echo(f"{'':<11} warm kernels: " + ", ".join(
                        f"{env} {p['waiting']}/{p['size']}" for env, p in kernels.items()))
        click.echo(f"HTTP functions on {settings.functions_url} (exposure when deployed):")
        for name, http in view["endpoints"].items():
            click.echo(f"  {name:<12} {http['url']:<42} {http['exposure']}"
                       + (f" {http['schedule']}" if http["schedule"] else ""))
    sys.exit(0 if rows and all(r["healthy"] for r in rows) else 1)


def _view(settings: Settings) -> dict[str, Any]:
    """What `status` shows, and `up --json` after its own report."""
    from stack import local

    return {"project": settings.project, "data_dir": str(settings.data_dir),
            "services": local.status(settings), "endpoints": local.endpoints(settings),
            "warm_pools": local.warm_pools(settings), "tenancy": local.tenancy(settings)}
