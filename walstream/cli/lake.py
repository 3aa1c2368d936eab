"""`walstream lake optimize SINK`: compact a lake sink's tables and expire old snapshots now.

`walstream run` does the same on the schedule `destination.optimize.every` sets, between
batches; this command runs it at once (e.g. from cron, or after a large backfill). It
may run while `walstream run` writes: a commit that conflicts is retried by the writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.cli.operations import ConfigOption
from walstream.errors import ConfigError

console = Console(soft_wrap=True)

lake = typer.Typer(
    help="Lake sinks (type: delta, type: iceberg): table maintenance.", no_args_is_help=True
)


@lake.command()
def optimize(
    sink: Annotated[str, typer.Argument(help="A sink whose destination is delta or iceberg.")],
    config: ConfigOption = Path("walstream.yaml"),
    table: Annotated[
        list[str] | None,
        typer.Option("--table", "-t", help="Only this source table (schema.table); repeatable."),
    ] = None,
) -> None:
    """Compact small files into files of `optimize.target_file_size` and remove what is
    older than `optimize.retain`, for every table the sink writes."""
    import psycopg

    from walstream.config import load_config
    from walstream.decode.table_shape import publication_tables
    from walstream.lake.contract import TableSink
    from walstream.sinks.registry import sink_for

    plan = load_config(config)
    sc = plan.sink(sink)
    target = sink_for(sc.destination)
    if not isinstance(target, TableSink):
        raise ConfigError(
            f"sink {sink} writes to {sc.destination.type}, not to lake tables",
            "name a sink whose destination type is delta or iceberg",
        )
    source = plan.source(sc.source)
    with psycopg.connect(source.dsn.get_secret_value(), connect_timeout=10) as conn:
        tables = [
            t for t in publication_tables(conn, source.publication_name) if sc.wants_table(*t)
        ]
    if table:
        unknown = sorted(set(table) - {f"{s}.{t}" for s, t in tables})
        if unknown:
            raise ConfigError(
                f"sink {sink} does not write {', '.join(unknown)}",
                f"name one of: {', '.join(f'{s}.{t}' for s, t in tables) or '(none)'}",
            )
        tables = [t for t in tables if f"{t[0]}.{t[1]}" in table]
    out = Table(title=f"sink {sink}: optimize", title_justify="left")
    for col in ("table", "lake table", "result"):
        out.add_column(col)
    with console.status("optimizing…"):
        for schema, name in tables:
            result = target.optimize(schema, name)
            where = str(result.pop("table"))
            text = (
                "not written yet"
                if result.pop("missing", False)
                else ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in result.items())
            )
            out.add_row(escape(f"{schema}.{name}"), escape(where), escape(text))
    console.print(out)


def register(app: typer.Typer) -> None:
    app.add_typer(lake, name="lake")
