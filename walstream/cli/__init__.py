"""The `walstream` command: one module per command group, each with `register(app)`."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from walstream.cli import (
    backfill,
    check,
    demo,
    imports,
    lake,
    operations,
    recover,
    run,
    status,
    verify,
)
from walstream.cli.output import print_error
from walstream.errors import WalstreamError

app = typer.Typer(
    name="walstream",
    help=(
        "Change data capture for PostgreSQL on Spark Structured Streaming.\n\n"
        "walstream reads a database's write-ahead log through logical replication (pgoutput) "
        "and delivers every insert, update, delete and truncate to Kafka and other sinks, "
        "with nothing lost across crashes."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for part in (
    check,
    demo,
    run,
    status,
    operations,
    backfill,
    recover,
    lake,
    imports,
    verify,
):  # --help lists them so
    part.register(app)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug output.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:  # py4j repeats every batch failure the runtime already reported
        logging.getLogger("py4j").setLevel(logging.CRITICAL)


def main() -> None:
    try:
        app()
    except WalstreamError as exc:
        print_error(exc)
        sys.exit(2)
