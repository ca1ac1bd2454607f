"""`stasis jobs list|show`: scale-out jobs submitted from notebooks (``jobs/{id}``).

Jobs are submitted from a kernel (``stasis.jobs.submit``); the CLI only reads what the
control plane recorded.
"""

from __future__ import annotations

from typing import Any

import click

from stasis_cli import options


def _db() -> Any:
    from google.cloud import firestore

    return firestore.Client(project=options.stack_settings().project)


@click.group()
def jobs() -> None:
    """Scale-out jobs submitted from notebooks (`stasis.jobs.submit`)."""


@jobs.command("list")
@click.option("--team", default=None, help="Only this team's jobs.")
@click.option("--limit", default=50, show_default=True)
@options.as_user
@options.json_output
def jobs_list(team: str | None, limit: int, as_json: bool) -> None:
    """The latest jobs: id, state, hosts x profile, accelerators held, message."""
    from google.cloud import firestore

    query: Any = _db().collection("jobs")
    if team:
        query = query.where(filter=firestore.FieldFilter("team", "==", team))
    docs = sorted((d.to_dict() for d in query.limit(500).stream()),
                  key=lambda d: str(d.get("submitted_at") or ""), reverse=True)[:limit]
    if as_json:
        options.echo_json(docs)
        return
    for d in docs:
        chips = f"{d.get('tpus', 0)} TPU" if d.get("tpus") else f"{d.get('gpus', 0)} GPU"
        click.echo(f"{d['id']:<28} {d['state']:<10} {d['hosts']} x {d['profile']:<12} "
                   f"{chips:<7} {d.get('team', '')}: {d.get('message', '')}")


@jobs.command("show")
@click.argument("job_id")
@options.as_user
@options.json_output
def jobs_show(job_id: str, as_json: bool) -> None:
    """One job's document (state, timings, failed host, log URI), as JSON with or without
    --json."""
    del as_json  # the output is JSON either way
    snap = _db().collection("jobs").document(job_id).get()
    if not snap.exists:
        raise click.ClickException(f"no job {job_id}")
    options.echo_json(snap.to_dict())
