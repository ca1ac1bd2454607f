"""`stasis jobs list|show`: scale-out jobs submitted from notebooks (``jobs/{id}``).

Jobs are submitted from a kernel (``stasis.jobs.submit``); the CLI only reads what the
control plane recorded. Registered by one import at the end of ``stack/cli.py``.
"""

from __future__ import annotations

from typing import Any

import click

from stack.cli import _echo_json, _env, _json, _settings, main


def _db() -> Any:
    from google.cloud import firestore

    settings = _settings()
    _env(settings)
    return firestore.Client(project=settings.project)


@main.group()
def jobs() -> None:
    """Scale-out jobs submitted from notebooks (`stasis.jobs.submit`)."""


@jobs.command("list")
@click.option("--team", default=None, help="Only this team's jobs.")
@click.option("--limit", default=50, show_default=True)
@_json
def jobs_list(team: str | None, limit: int, as_json: bool) -> None:
    """The latest jobs: id, state, hosts x profile, accelerators held, message."""
    from google.cloud import firestore

    query: Any = _db().collection("jobs")
    if team:
        query = query.where(filter=firestore.FieldFilter("team", "==", team))
    docs = sorted((d.to_dict() for d in query.limit(500).stream()),
                  key=lambda d: str(d.get("submitted_at") or ""), reverse=True)[:limit]
    if as_json:
        _echo_json(docs)
        return
    for d in docs:
        chips = f"{d.get('tpus', 0)} TPU" if d.get("tpus") else f"{d.get('gpus', 0)} GPU"
        click.echo(f"{d['id']:<28} {d['state']:<10} {d['hosts']} x {d['profile']:<12} "
                   f"{chips:<7} {d.get('team', '')}: {d.get('message', '')}")


@jobs.command("show")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    """One job's document (state, timings, failed host, log URI)."""
    snap = _db().collection("jobs").document(job_id).get()
    if not snap.exists:
        raise click.ClickException(f"no job {job_id}")
    _echo_json(snap.to_dict())
