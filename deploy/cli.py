"""`stasis bundle`: the source zip and Terraform's generated variables (registered by
``stack/cli.py`` with ``add_command``). Imports nothing heavy until it runs (the CLI's
start-up)."""

from __future__ import annotations

from pathlib import Path

import click

from deploy.bundle import DEFAULT_ZIP
from deploy.tfvars import DEFAULT_CONFIG, ENVIRONMENTS, TFVARS_NAME


@click.command("bundle")
@click.option(
    "--out",
    default=DEFAULT_ZIP,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the source zip.",
)
@click.option(
    "--env",
    "envs",
    multiple=True,
    help="Write terraform/environments/ENV/stasis.auto.tfvars.json (repeatable; "
    "default: every environment there).",
)
@click.option(
    "--tfvars",
    "extra",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Also write the generated variables to this file.",
)
@click.option(
    "--config",
    default=str(DEFAULT_CONFIG),
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Admin configuration whose teams get namespaces and Pod Snapshot storage "
    "configurations, whose profiles' storage classes are created, and whose GPU profiles "
    "give the GPU-idle alert its window.",
)
@click.option("--check", is_flag=True,
              help="Only derive the deployment and print its summary; write nothing.")
def bundle(
    out: str, envs: tuple[str, ...], extra: tuple[str, ...], config: str, check: bool
) -> None:
    """Build the Cloud Functions source zip and the Terraform variables derived from the code
    (functions, triggers, exposure, schedules, topics, dead-letter topics, indexes)."""
    from deploy import bundle as zipped
    from deploy import tfvars
    from functions.routes import Exposure

    plan = tfvars.deployment(config=Path(config))
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    access = [f["access"] for f in (*plan.event_functions.values(),
                                    *plan.http_functions.values())]
    kinds = ", ".join(f"{access.count(k)} {k}" for k in ("event", *map(str, Exposure)))
    teams = ", ".join(plan.kubernetes["teams"]) or "none"
    click.echo(
        f"{len(access)} functions ({kinds}), {len(plan.topics)} topics, "
        f"{len(plan.firestore_indexes)} composite indexes; teams from {config}: {teams}"
    )
    if check:
        return
    try:
        reqs = zipped.requirements()
    except zipped.BundleError as exc:
        raise click.ClickException(str(exc)) from None
    archive = Path(out)
    sha = zipped.build_zip(archive, [*plan.event_functions, *plan.http_functions], reqs)
    click.echo(
        f"{archive} ({archive.stat().st_size / 1024:.0f} KiB, sha256 {sha[:12]}, "
        f"{len(reqs)} requirements)"
    )
    targets = [ENVIRONMENTS / env / TFVARS_NAME for env in envs] or [
        d / TFVARS_NAME for d in sorted(ENVIRONMENTS.iterdir()) if d.is_dir()
    ]
    for target in [*targets, *map(Path, extra)]:
        if not target.parent.is_dir() and target.parent.parent == ENVIRONMENTS:
            raise click.ClickException(f"no environment {target.parent.name} under {ENVIRONMENTS}")
        tfvars.write(target, plan, archive, sha)
        click.echo(f"wrote {target}")
