"""`walstream check`: is a database ready for change capture, and can every destination be reached."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from walstream.cli.output import STYLE, console, err_console
from walstream.postgres.setup import Finding, check_database, has_errors


def print_findings(findings: list[Finding]) -> None:
    table = Table(show_header=True, header_style="bold", expand=False)
    table.add_column("", width=7)
    table.add_column("check")
    table.add_column("result")
    table.add_column("fix")
    for f in findings:
        table.add_row(
            f"[{STYLE[f.level]}]{f.level}[/]",
            escape(f.subject),
            escape(f.message),
            escape(f.fix or ""),
        )
    console.print(table)
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    verdict = "[bold red]not ready[/]" if errors else "[green]ready[/]"
    console.print(f"{verdict}: {errors} error(s), {warnings} warning(s)")


def check(
    dsn: Annotated[
        str | None,
        typer.Option(
            envvar="WALSTREAM_DSN",
            help="Postgres connection string of the source database, e.g. postgresql://user@host:5432/app",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Check a whole walstream.yaml instead: the file, every source database, "
            "every sink's expressions and destination.",
        ),
    ] = None,
    slot: Annotated[str | None, typer.Option(help="Replication slot walstream will use.")] = None,
    publication: Annotated[
        str | None, typer.Option(help="Publication walstream will read.")
    ] = None,
    tables: Annotated[
        list[str] | None,
        typer.Option(
            "--table",
            "-t",
            help="Table to capture (schema.table, globs like public.* allowed); repeat for several. "
            "Default: the tables of the publication.",
        ),
    ] = None,
) -> None:
    """Check that a database is ready for change capture.

    Checks the server version, wal_level, the role's REPLICATION permission,
    free slots and WAL senders, the slot's plugin, whether the publication
    covers the tables, and each table's primary key and replica identity.
    Every problem comes with the statement that fixes it. Exits 1 on errors.

    With --config: validates walstream.yaml, checks every source database as
    above, analyses every sink's SQL expressions with Spark and connects to every
    destination.
    """
    if config is not None:
        findings = check_config(config)
    elif dsn is None:
        raise typer.BadParameter("give --dsn (or WALSTREAM_DSN), or --config walstream.yaml")
    else:
        findings = check_database(dsn, slot, publication, tables or [])
    print_findings(findings)
    raise typer.Exit(1 if has_errors(findings) else 0)


def check_config(path: Path) -> list[Finding]:
    """Findings for a whole config: the file, each source, each sink (expressions, destination)."""
    from walstream.config import load_config
    from walstream.engine.session import build_spark
    from walstream.errors import ConfigError
    from walstream.pipeline.batches import validate
    from walstream.pipeline.expressions import expressions
    from walstream.runtime import check_destinations
    from walstream.sinks.registry import preflight

    cfg = load_config(path)  # a ConfigError here ends the check with exit code 2
    findings = [
        Finding("ok", "config", f"{path}: {len(cfg.sources)} source(s), {len(cfg.sinks)} sink(s)")
    ]
    for src in cfg.sources:
        for f in check_database(
            src.dsn.get_secret_value(),
            src.slot_name,
            src.publication_name,
            src.tables,
            src.primary,
            src.publication_options,
            src.streaming,
        ):
            findings.append(Finding(f.level, f"source {src.name}: {f.subject}", f.message, f.fix))
    for name, problem in check_destinations(cfg):
        if problem is None:
            findings.append(Finding("ok", f"sink {name}", "destination reachable"))
        else:
            findings.append(Finding("error", f"sink {name}", problem.problem, problem.fix))
    try:
        preflight(cfg)
    except ConfigError as exc:
        findings.append(Finding("error", "sinks", exc.problem, exc.fix))
    checked = [s for s in cfg.sinks if expressions(s)]
    for sink in cfg.sinks:
        if sink not in checked:
            findings.append(Finding("ok", f"sink {sink.name}", "no SQL expressions to check"))
    if not checked:
        return findings
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()  # inside a process that has one: use it, keep it
    owned = spark is None
    if spark is None:
        err_console.print(
            f"[dim]•[/] starting Spark (local[1], ~10 s) to check the SQL expressions of "
            f"{', '.join(escape(s.name) for s in checked)}"
        )
        local = cfg.spark.model_copy(update={"master": "local[1]"})
        spark = build_spark(dataclasses.replace(cfg, spark=local))
    try:
        for sink in checked:
            try:
                validate(spark, sink)
                findings.append(Finding("ok", f"sink {sink.name}", "expressions valid"))
            except ConfigError as exc:
                findings.append(Finding("error", f"sink {sink.name}", exc.problem, exc.fix))
    finally:
        if owned:
            spark.stop()
    return findings


def register(app: typer.Typer) -> None:
    app.command()(check)
