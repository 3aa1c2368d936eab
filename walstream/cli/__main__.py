"""`python -m walstream.cli`: the `walstream` command."""

from walstream.cli import main

main()
