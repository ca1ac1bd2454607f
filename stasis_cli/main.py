"""The `stasis` command, assembled: one ``add_command`` line per verb or verb group.

Each module of ``stasis_cli`` owns one group of verbs and exposes click commands; none of
them registers itself. Shared options (``--as``, ``--json``, ``--wait``, ``--team``) and
helpers are in ``stasis_cli.options``. A module imports only click, the standard library
and ``stasis_cli.options`` when it is loaded; whatever a verb needs (an SDK, the domain,
the local stack) is imported inside that verb, so ``stasis --help`` and each verb pay only
for their own imports (``tests/unit/test_cli.py`` checks it; ``bench/cli_latency.py`` times
them). A new verb is its module (or a function in one) plus one line here.
"""

from __future__ import annotations

import click

from deploy.cli import bundle
from stasis_cli import (
    admin,
    bus,
    chat,
    jobs,
    links,
    local_stack,
    monitoring,
    options,
    portal,
    sandboxes,
    upkeep,
    workspaces,
)


@click.group(epilog=options.EXIT_STATUSES)
def main() -> None:
    """Stasis: ML workspaces that pause with their live kernels and resume into them."""


main.add_command(local_stack.up)
main.add_command(local_stack.down)
main.add_command(local_stack.status)
main.add_command(workspaces.ws)
main.add_command(admin.admin)
main.add_command(bus.events)
bus.events.add_command(monitoring.events_monitoring)
main.add_command(bus.dlq)
main.add_command(chat.chat)
main.add_command(links.link)
main.add_command(links.exec_command)
main.add_command(sandboxes.sandbox)
main.add_command(jobs.jobs)
main.add_command(upkeep.idle)
main.add_command(upkeep.janitor)
main.add_command(upkeep.cost)
main.add_command(upkeep.reconcile)
main.add_command(portal.portal_command)
main.add_command(bundle)


def run() -> None:
    """The console script: :func:`main`. (What jsonschema would import and no verb uses,
    ``events.schemas`` keeps out of every process that validates events.)"""
    main()
