"""`stasis events monitoring FILE.json`: replay a saved monitoring notification (a Cloud
Monitoring incident, a Cloud Logging entry, an Alertmanager webhook body) through the same
topic, function and rules a deployment uses (``stack/monitoring.py``).

It first prints what the notification says (``functions.domain.monitoring.read``: its
signals, or why it is refused), then publishes it unless ``--dry-run``; the outcome shows
in `stasis ws status` (a pause, a preemption, a noted alert) or `stasis dlq` (a refusal,
with its reason). It acts as the monitoring system does, as no user: it takes no ``--as``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from stasis_cli import options


@click.command("monitoring")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--restamp", is_flag=True,
              help="Move the notification's times to now and give it a new id (a saved "
                   "one is otherwise refused as stale, or changes nothing a second time).")
@click.option("--dry-run", is_flag=True, help="Only say what the notification carries.")
@options.json_output
def events_monitoring(file: Path, restamp: bool, dry_run: bool, as_json: bool) -> None:
    """Replay the monitoring notification in FILE (JSON) onto the monitoring topic."""
    from functions.domain import monitoring as rules
    from functions.handlers.monitoring import TOPIC
    from stack import monitoring

    try:
        payload = json.loads(file.read_text())
    except ValueError as exc:
        raise click.UsageError(f"{file} is not JSON: {exc}") from None
    now = datetime.now(UTC)
    if restamp:
        payload = monitoring.restamp(payload, now)
    reading = rules.read(payload, now)
    said: dict[str, Any] = {"source": reading.source, "signals": [], "refused": []}
    for signal in reading.signals:
        target = signal.workspace.describe() if signal.workspace else f"node {signal.node}"
        said["signals"].append({"kind": signal.kind, "target": target, "detail": signal.detail})
        if not as_json:
            click.echo(f"{reading.source}: {signal.kind} for {target}: {signal.detail}")
    for refused in reading.refused:
        said["refused"].append({"reason": refused.reason, "message": refused.message})
        if not as_json:
            click.echo(f"{reading.source}: refused ({refused.reason}): {refused.message}")
    if not dry_run:
        settings = options.stack_settings()
        message_id = options.bus(settings).publish_raw(TOPIC, json.dumps(payload).encode(), {})
        said["published"] = {"topic": TOPIC, "message_id": message_id}
        if not as_json:
            click.echo(json.dumps(said["published"]))
    if as_json:
        options.echo_json(said)
