"""`stasis events publish` and `stasis dlq`: the event bus, as a publisher and as the reader
of what it dead-lettered (``stasis_cli.deadletters``)."""

from __future__ import annotations

import json

import click

from stasis_cli import options


@click.group()
def events() -> None:
    """Publish events the way chat, the CLI or cluster monitoring would."""


@events.command("publish")
@click.argument("event_type")
@click.option("--data", required=True, help="The payload as JSON.")
@click.option("--requestid", default=None, help="Same id for retries of one request.")
@click.option("--unchecked", is_flag=True,
              help="Publish even if the payload breaks its schema (to exercise the "
                   "dead-letter path); the consumer rejects it.")
@click.option("--origin", default=None, metavar="COMPONENT",
              help="Publish as this component (default: `operator`, which sends requests "
                   "only), e.g. `monitor` to stand in for cluster monitoring on the local "
                   "stack. Consumers refuse an event its origin may not send; in a "
                   "deployment IAM lets the operators publish the requests only.")
@options.json_output
def events_publish(event_type: str, data: str, requestid: str | None, unchecked: bool,
                   origin: str | None, as_json: bool) -> None:
    """Publish EVENT_TYPE (e.g. workspace.requested) with the JSON payload --data; prints
    the published event's ids as JSON (with or without --json)."""
    del as_json  # the output is JSON either way
    from events import InvalidEvent, new_event, spec_for

    settings = options.stack_settings()
    if unchecked:
        message_id = options.bus(settings, origin).publish_unchecked(
            event_type, data.encode(), requestid)
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
    message_id = options.bus(settings, origin).publish(event)
    click.echo(json.dumps({"type": event.type, "id": event.id, "requestid": event.requestid,
                           "message_id": message_id}))


@click.command()
@options.json_output
def dlq(as_json: bool) -> None:
    """Dead-lettered messages, each with its type, id and why it failed (left in place)."""
    settings = options.stack_settings()
    from stasis_cli import deadletters

    options.echo_rows(
        deadletters.peek(settings.project), as_json=as_json, empty="no dead-lettered messages",
        line=lambda row: f"{row['consumer']}: {row['type'] or '?'} id={row['id'] or '?'} "
                         f"attempts={row['attempts']}\n    reason: {row['reason']}")
