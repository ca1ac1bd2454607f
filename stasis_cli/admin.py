"""`stasis admin apply FILE`: the admin file (catalog, teams, quotas, policies), validated as
a whole and applied by ``stack.admin``."""

from __future__ import annotations

import sys

import click

from stasis_cli import options


@click.group()
def admin() -> None:
    """Catalog, teams and quotas."""


@admin.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@options.as_user
@options.json_output
def admin_apply(file: str, as_json: bool) -> None:
    """Validate FILE as a whole and apply it (nothing is written if anything is wrong)."""
    from pathlib import Path

    from stack import admin as applier

    settings = options.stack_settings()
    try:
        result = applier.apply_file(settings, Path(file), actor=options.acting_user())
    except applier.ConfigRejected as exc:
        if as_json:
            options.echo_json({"applied": False, "problems": [
                {"path": p.path or "/", "message": p.message} for p in exc.problems]})
        else:
            click.echo(f"{file} rejected, nothing applied:", err=True)
            for problem in exc.problems:
                click.echo(f"  {problem.path or '/'}: {problem.message}", err=True)
        sys.exit(2)
    if as_json:
        options.echo_json({"applied": True, **result})
    else:
        click.echo(f"applied revision {result['revision'][:12]}: {result['changes']}")
