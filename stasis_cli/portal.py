"""`stasis portal [--as USER]`: a one-time sign-in URL for the local portal.

The URL works once, within 60 seconds, and sets the browser's session cookie; it is opened
in a browser where one can be (a terminal with a display), and always printed.
"""

from __future__ import annotations

import sys

import click

from stasis_cli import options


@click.command("portal")
@options.as_user
@click.option("--no-open", is_flag=True, help="Only print the URL; do not open a browser.")
@options.json_output
def portal_command(no_open: bool, as_json: bool) -> None:
    """Print (and open) a sign-in URL for the portal that works once, for 60 seconds."""
    import webbrowser

    from stack import portal

    user = options.acting_user()
    try:
        answer = portal.signin_link(options.stack_settings(), user)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        options.echo_json({"user": user, **answer})
    else:
        click.echo(f"Sign in to the portal as {user} (works once, within "
                   f"{answer['expires_in']} s):\n  {answer['url']}")
    if not no_open and not as_json and sys.stdout.isatty():
        webbrowser.open(answer["url"])
