"""`walstream verify SINK`: compare what a sink holds with its source, table by table, while
`walstream run` goes on; `--repair` re-backfills the keys that differ (docs/verify.md).

Exit code 0: every table equal; 1: a difference was found (and, with --repair, is still
there after the repair); 2: the comparison could not be made (the error says why).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.cli.operations import ConfigOption
from walstream.cli.output import print_error
from walstream.errors import WalstreamError

log = logging.getLogger(__name__)
console = Console(soft_wrap=True)
progress_console = Console(stderr=True, soft_wrap=True)

#: Keys the text report lists per kind and table (--json lists every one).
SHOWN = 20


def verify(
    sink: Annotated[str, typer.Argument(help="The sink to compare with its source.")],
    config: ConfigOption = Path("walstream.yaml"),
    table: Annotated[
        list[str] | None,
        typer.Option("--table", "-t", help="Only this source table (schema.table); repeatable."),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="Only the rows this predicate selects (a backfill's: columns, constants, "
            "comparisons, AND/OR; evaluated by Postgres on a Postgres side, by DuckDB on a "
            "lake table), e.g. \"region = 'eu' AND id > 1000\".",
        ),
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Re-backfill the keys missing or different in the sink (through the running "
            "`walstream run`), then check them again. Rows only the sink has are reported.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    values: Annotated[
        bool,
        typer.Option(
            "--values",
            help="Show the source's and the sink's row of each differing key (off by "
            "default: rows may hold personal data).",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(help="Seconds to wait for the sink to apply the source up to a read."),
    ] = 120.0,
    chunk_size: Annotated[
        int, typer.Option(help="Rows per key-range read of a Postgres table.", min=1)
    ] = 100_000,
    cancel: Annotated[
        bool,
        typer.Option(
            "--cancel",
            help="Cancel the sink's running verification (a command's or a schedule's) and "
            "compare nothing.",
        ),
    ] = False,
) -> None:
    """Compare each table a sink holds (a Postgres mirror, a Delta or Iceberg mirror or
    history) with its source while the stream flows, without locking anything: hashes of
    rows summed per key bucket on both sides, then the rows of differing buckets, then
    each differing key again at a later position, so a row that only changed meanwhile is
    not reported. A verification cut short (Ctrl-C, kill) is resumed by the next one of
    the same sink. Exit 0 equal, 1 different, 2 could not compare (130: interrupted)."""
    from walstream.verify.job import Options

    options = Options(table or [], where, repair, values, wait, chunk_size)
    outcome = _outcome(sink, config, options, as_json, cancel)
    if outcome is None:
        return
    if as_json:
        body = {"sink": sink, "verification": outcome.id, "resumed": outcome.resumed}
        body["tables"] = [r.as_json() for r in outcome.results]
        json.dump(body, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        _print(sink, outcome)
    raise typer.Exit(0 if outcome.equal else 1)


def _outcome(sink: str, config: Path, options: Any, as_json: bool, cancel: bool) -> Any:
    """The verification's outcome (None: one was cancelled); without a verdict, the exit
    code that says so."""
    try:
        if cancel:
            _cancel(sink, config)
            return None
        return _verify(sink, config, options, as_json)
    except WalstreamError as exc:  # exit 2: could not compare, whoever invokes the command
        print_error(exc)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:  # no verdict either: the shell's code for Ctrl-C
        progress_console.print(f"interrupted: `walstream verify {escape(sink)}` resumes it")
        raise typer.Exit(130) from None
    except Exception as exc:  # a failure is no verdict: exit 2, not 1
        log.debug("verify failed", exc_info=True)
        print_error(
            WalstreamError(
                f"the comparison failed: {type(exc).__name__}: {exc}",
                "verify again; if it fails the same way, please report it with the output "
                "of `walstream -v verify ...`",
            )
        )
        raise typer.Exit(2) from None


def _verify(sink: str, config: Path, options: Any, as_json: bool) -> Any:
    from walstream.config import load_config
    from walstream.verify.job import verify_sink

    plan = load_config(config)
    quiet = as_json or not progress_console.is_terminal
    with progress_console.status("verifying…") as status:

        def progress(text: str) -> None:
            if not quiet:
                status.update(escape(text))

        return verify_sink(plan, sink, options, "command", progress)


def _cancel(sink: str, config: Path) -> None:
    from walstream.config import load_config
    from walstream.verify.store import VerificationStore

    plan = load_config(config)
    plan.sink(sink)
    store = VerificationStore(plan.state_dsn, plan.state.schema_)
    store.ensure()
    ids = store.cancel(sink)
    console.print(
        f"cancelled verification {', '.join(map(str, ids))} of sink {escape(sink)}"
        if ids
        else f"sink {escape(sink)} has no running verification"
    )


def _print(sink: str, outcome: Any) -> None:
    results = outcome.results
    resumed = " (resumed)" if outcome.resumed else ""
    out = Table(title=f"sink {sink}: verification {outcome.id}{resumed}", title_justify="left")
    for col in ("table", "sink table", "source rows", "sink rows", "buckets", "result"):
        out.add_column(col, justify="right" if col.endswith(("rows", "buckets")) else "left")
    for r in results:
        verdict = "[green]equal[/]" if r.equal else "[bold red]different[/]"
        counts = [f"{len(v):,} {k}" for k, v in _kinds(r) if v]
        if r.repaired is not None:
            counts.append(f"{r.repaired:,} re-backfilled")
        if r.removed:
            counts.append(f"{r.removed:,} only in the sink deleted")
        out.add_row(
            escape(r.table),
            escape(r.target),
            f"{r.source_rows:,}",
            f"{r.sink_rows:,}",
            f"{r.buckets_different:,} of {r.buckets:,} differ" if r.buckets else "row by row",
            verdict + (" (" + escape(", ".join(counts)) + ")" if counts else ""),
        )
    console.print(out)
    for r in results:
        for kind, keys in _kinds(r):
            if keys:
                shown = ", ".join(escape(repr(k)) for k in keys[:SHOWN])
                more = (
                    f" and {len(keys) - SHOWN:,} more (--json lists all)"
                    if len(keys) > SHOWN
                    else ""
                )
                console.print(f"{escape(r.table)} {kind}: {shown}{more}")
        for key, rows in r.values.items():
            console.print(
                f"{escape(r.table)} {escape(key)}: {escape(json.dumps(rows, default=str))}"
            )


def _kinds(r: Any) -> list[tuple[str, list[Any]]]:
    return [
        ("missing in the sink", r.missing),
        ("only in the sink", r.extra),
        ("different", r.different),
        ("still changing (not compared)", r.unsettled),
        ("without unchanged TOASTed values (the latest message leaves them out)", r.incomplete),
    ]


def register(app: typer.Typer) -> None:
    app.command()(verify)
