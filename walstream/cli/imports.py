"""`walstream import debezium|sequin FILE`: another tool's configuration as walstream.yaml,
with a line for every setting saying where it went or why it could not be carried."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from walstream.cli.output import console, err_console
from walstream.errors import ConfigError
from walstream.importers import Imported

importer = typer.Typer(
    help="Turn another CDC tool's configuration into walstream.yaml.", no_args_is_help=True
)

OutOption = Annotated[
    Path,
    typer.Option("--out", "-o", help="Where to write walstream.yaml ('-': print it)."),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")]


@importer.command("debezium")
def debezium(
    connector: Annotated[
        Path,
        typer.Argument(
            help='The connector\'s config: Kafka Connect JSON ({"config": {...}}), a '
            ".properties file, or Debezium Server's application.properties.",
            exists=True,
            dir_okay=False,
        ),
    ],
    offsets: Annotated[
        Path | None,
        typer.Option(
            help="Debezium's offsets: its offset file (offset.storage.file.filename), or the "
            "offset's JSON from the Connect offsets topic. With it, walstream starts where "
            "Debezium left the slot: nothing sent twice, nothing missed.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option(help="The Kafka brokers Debezium wrote to (a Connect worker's setting)."),
    ] = None,
    out: OutOption = Path("walstream.yaml"),
    force: ForceOption = False,
) -> None:
    """Turn a Debezium PostgreSQL connector's config into walstream.yaml.

    The source continues on the connector's slot and publication; the sink sends
    Debezium's records (format: debezium) with the connector's topic prefix and value
    settings, so its consumers keep working. To switch with no gap and no duplicate:
    stop Debezium, import with --offsets, then `walstream run` (docs/from-debezium.md).
    """
    from walstream.importers.debezium import import_debezium

    write(import_debezium(connector, offsets, bootstrap_servers), out, force)


@importer.command("sequin")
def sequin(
    config: Annotated[
        Path, typer.Argument(help="Sequin's sequin.yaml.", exists=True, dir_okay=False)
    ],
    out: OutOption = Path("walstream.yaml"),
    force: ForceOption = False,
) -> None:
    """Turn a Sequin sequin.yaml into walstream.yaml.

    Databases become sources on the same slots and publications, sinks keep Sequin's
    message format (walstream's default) and what walstream has of their settings
    (tables, actions, column filters, group columns, backfills, destinations). Sequin's
    Elixir functions are reported, not carried (docs/from-sequin.md).
    """
    from walstream.importers.sequin import import_sequin

    write(import_sequin(config), out, force)


def write(imported: Imported, out: Path, force: bool) -> None:
    """Check the config, write it (or print it) and report every setting."""
    import yaml

    from walstream.config import parse_config

    text = yaml.safe_dump(imported.config, sort_keys=False, allow_unicode=True)
    checked = re.sub(r"\$\{[^}]*\}", "stand-in", text)  # the variables, not exported yet
    parse_config(yaml.safe_load(checked), origin="the imported config")  # valid as written
    if str(out) == "-":
        console.print(text, markup=False, highlight=False, end="")
    else:
        if out.exists() and not force:
            raise ConfigError(f"{out} exists", "choose another --out, or add --force")
        out.write_text(text)
    report = console if str(out) != "-" else err_console
    for line in imported.lines:
        mark = "[green]✓[/]" if line.carried else "[yellow]✗[/]"
        report.print(f"{mark} {escape(line.key)}: {escape(line.note)}")
    for name, what in imported.variables.items():
        report.print(f"[bold]export {escape(name)}[/]=... ({escape(what)})")
    if str(out) != "-":
        left = sum(not line.carried for line in imported.lines)
        report.print(
            f"wrote {escape(str(out))}: {len(imported.lines) - left} setting(s) carried, "
            f"{left} not (see above)"
        )


def register(app: typer.Typer) -> None:
    app.add_typer(importer, name="import")
