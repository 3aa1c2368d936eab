"""`walstream verify SINK`: compare what a sink holds with its source, table by table, while
`walstream run` goes on; `--repair` re-backfills the keys that differ (docs/verify.md).

Exit code 0: every table equal; 1: a difference was found (and, with --repair, is still
there after the repair); 2: the comparison could not be made (the error says why).
"""

from __future__ import annotations

import json
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
) -> None:
    """Compare each table a sink holds (a Postgres mirror, a Delta or Iceberg mirror or
    history) with its source while the stream flows, without locking anything: hashes of
    rows summed per key bucket on both sides, then the rows of differing buckets, then
    each differing key again at a later position, so a row that only changed meanwhile is
    not reported. Exit 0 equal, 1 different, 2 could not compare."""
    try:
        results = _verify(sink, config, table or [], repair, as_json, values, wait, chunk_size)
    except WalstreamError as exc:  # exit 2: could not compare, whoever invokes the command
        print_error(exc)
        raise typer.Exit(2) from None
    if as_json:
        json.dump({"sink": sink, "tables": [r.as_json() for r in results]}, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        _print(sink, results)
    raise typer.Exit(0 if all(r.equal for r in results) else 1)


def _verify(
    sink: str,
    config: Path,
    table: list[str],
    repair: bool,
    as_json: bool,
    values: bool,
    wait: float,
    chunk_size: int,
) -> list[Any]:
    from walstream.config import load_config
    from walstream.verify.run import Position, Verification
    from walstream.verify.sinks import pair, sink_kind, tables_of
    from walstream.verify.sinks import repair as repair_keys

    plan = load_config(config)
    sc = plan.sink(sink)
    sink_kind(sc)
    source = plan.source(sc.source)
    position = Position(
        source.dsn.get_secret_value(), [source.slot_name], source.name, wait, source.writes_dsn
    )
    quiet = as_json or not progress_console.is_terminal
    results = []
    with progress_console.status("verifying…") as status:

        def progress(text: str) -> None:
            if not quiet:
                status.update(escape(text))

        for schema, name in tables_of(plan, sc, table):
            p = pair(plan, sc, schema, name, chunk_size)
            check = Verification(p.source, p.sink, position, values=values, progress=progress)
            result = check.run(p.table, p.target, p.estimate)
            keys = [*result.missing, *result.different]
            if repair and keys:
                what = repair_keys(
                    plan, sc, schema, name, keys, p.source.shape.key, wait * 10, progress
                )
                progress(f"{p.table}: {what} delivered: checking the keys again")
                result.repaired = len(keys)
                _recheck(check, result, keys)
            results.append(result)
    return results


def _recheck(check: Any, result: Any, keys: list[Any]) -> None:
    """After a repair: the repaired keys that still differ (the others are equal now)."""
    still = check.differing(keys)
    result.missing = [k for k in result.missing if k in still]
    result.different = [k for k in result.different if k in still]


def _print(sink: str, results: list[Any]) -> None:
    out = Table(title=f"sink {sink}: verify", title_justify="left")
    for col in ("table", "sink table", "source rows", "sink rows", "buckets", "result"):
        out.add_column(col, justify="right" if col.endswith(("rows", "buckets")) else "left")
    for r in results:
        verdict = "[green]equal[/]" if r.equal else "[bold red]different[/]"
        counts = [f"{len(v):,} {k}" for k, v in _kinds(r) if v]
        if r.repaired is not None:
            counts.append(f"{r.repaired:,} re-backfilled")
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
    ]


def register(app: typer.Typer) -> None:
    app.command()(verify)
