"""`python -m stack` is the `stasis` command."""

from stack.cli import main

main()
