"""`stasis chat "/ws ..."`: talk to the chat function exactly as Slack would.

The command is posted as Slack's form body, signed with the signing secret (v0 HMAC over
``v0:{timestamp}:{body}``, ``X-Slack-Request-Timestamp``), with a response_url on the local
Slack sink. The ack is printed as soon as it comes back, then the notification that reports
the outcome, read from the sink as it arrives.

Its ``--as`` is its own: a Stasis user mapped to a Slack user id through the catalog, or a
Slack user id itself (``STASIS_SLACK_USER`` before ``STASIS_USER``).
"""

from __future__ import annotations

import json
import os
import sys

import click

from stasis_cli import options


@click.command("chat")
@click.argument("command_line")
@click.option("--as", "as_user", default=None,
              help="A Stasis user (mapped to Slack through the catalog) or a Slack user id. "
                   "Default: STASIS_SLACK_USER, else STASIS_USER, else dev.")
@click.option("--timeout", default=300.0, show_default=True,
              help="Seconds to wait for the notification.")
@click.option("--no-follow", is_flag=True, help="Print the ack only.")
@options.json_output
def chat(command_line: str, as_user: str | None, timeout: float, no_follow: bool,
         as_json: bool) -> None:
    """Send COMMAND_LINE (e.g. "/ws create mynb --profile cpu-small") as a signed Slack
    slash command; print the ack, then the notification."""
    from stack import chat as local_chat

    settings = options.stack_settings()
    text = _text_of(command_line)
    who = as_user or os.environ.get("STASIS_SLACK_USER") or os.environ.get("STASIS_USER") \
        or "dev"
    try:
        slack_user = local_chat.slack_user_for(who, settings.project)
    except LookupError as exc:
        raise click.UsageError(str(exc)) from None
    client = local_chat.ChatClient(settings)
    try:
        sent = client.send(text, user=slack_user)
    except OSError as exc:
        raise click.ClickException(f"the chat function at {client.chat_url} does not answer "
                                   f"({exc}); is the stack up (`stasis status`)?") from None
    report: dict[str, object] = {"status": sent.status, "requestid": sent.requestid,
                                 "ack": sent.body, "ack_ms": round(sent.seconds * 1000, 1)}
    if sent.status != 200:
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            click.echo(f"rejected: HTTP {sent.status} {sent.text}", err=True)
        sys.exit(1)
    if not as_json:
        click.echo(sent.text)
    failed = False
    if sent.follow and not no_follow:
        try:
            note = client.outcome(sent, timeout=timeout)
        except TimeoutError as exc:
            report["error"] = str(exc)
            click.echo(json.dumps(report, indent=2) if as_json else str(exc), err=not as_json)
            sys.exit(1)
        state, reason = local_chat.state_of(note)
        failed = state == "FAILED" or reason == "snapshot_failed"
        report["notification"] = note
        if not as_json:
            click.echo(note.get("text", ""))
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    sys.exit(1 if failed else 0)


def _text_of(command_line: str) -> str:
    line = command_line.strip()
    if not line.startswith("/"):
        return line
    command, _, text = line.partition(" ")
    if command != "/ws":
        raise click.UsageError(f"only /ws is served here, not {command}")
    return text.strip()
