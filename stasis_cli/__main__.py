"""`python -m stasis_cli` is the `stasis` command."""

from stasis_cli.main import run

run()
