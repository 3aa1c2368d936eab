"""The `walstream` command."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.errors import WalstreamError
from walstream.postgres.setup import Finding, check_database, has_errors

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
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

_STYLE = {"ok": "green", "warning": "yellow", "error": "bold red"}


def print_findings(findings: list[Finding]) -> None:
    table = Table(show_header=True, header_style="bold", expand=False)
    table.add_column("", width=7)
    table.add_column("check")
    table.add_column("result")
    table.add_column("fix")
    for f in findings:
        table.add_row(
            f"[{_STYLE[f.level]}]{f.level}[/]",
            escape(f.subject),
            escape(f.message),
            escape(f.fix or ""),
        )
    console.print(table)
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    verdict = "[bold red]not ready[/]" if errors else "[green]ready[/]"
    console.print(f"{verdict}: {errors} error(s), {warnings} warning(s)")


@app.command()
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
    from walstream.errors import ConfigError
    from walstream.runtime import build_spark, check_destinations
    from walstream.spark.pipeline import validate

    cfg = load_config(path)  # a ConfigError here ends the check with exit code 2
    findings = [
        Finding("ok", "config", f"{path}: {len(cfg.sources)} source(s), {len(cfg.sinks)} sink(s)")
    ]
    for src in cfg.sources:
        for f in check_database(
            src.dsn.get_secret_value(), src.slot_name, src.publication_name, src.tables
        ):
            findings.append(Finding(f.level, f"source {src.name}: {f.subject}", f.message, f.fix))
    for name, problem in check_destinations(cfg):
        if problem is None:
            findings.append(Finding("ok", f"sink {name}", "destination reachable"))
        else:
            findings.append(Finding("error", f"sink {name}", problem.problem, problem.fix))
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()  # inside a process that has one: use it, keep it
    owned = spark is None
    if spark is None:
        local = cfg.spark.model_copy(update={"master": "local[1]"})
        spark = build_spark(cfg.model_copy(update={"spark": local}))
    try:
        for sink in cfg.sinks:
            try:
                validate(spark, sink)
                findings.append(Finding("ok", f"sink {sink.name}", "expressions valid"))
            except ConfigError as exc:
                findings.append(Finding("error", f"sink {sink.name}", exc.problem, exc.fix))
    finally:
        if owned:
            spark.stop()
    return findings


@app.command()
def demo(
    home: Annotated[
        Path, typer.Option(help="Where the demo keeps its embedded server and output.")
    ] = Path(".walstream"),
) -> None:
    """Run the embedded demo: a private Postgres, a sample table, its changes decoded.

    Starts a PostgreSQL server of its own (initdb under HOME/postgres, a free
    loopback port), checks it, makes a few changes to public.orders and writes the
    decoded change rows to HOME/demo/changes.jsonl. Nothing outside HOME is touched.
    """
    from walstream.demo import row_to_json, run_demo

    result = run_demo(home, progress=lambda s: console.print(f"[dim]•[/] {s}"))
    print_findings(result.findings)
    table = Table(title=f"{len(result.changes)} changes decoded", title_justify="left")
    for col in ("lsn:seq", "action", "table", "pk", "record"):
        table.add_column(col, no_wrap=col != "record", overflow="ellipsis")
    for c in result.changes:
        record = json.dumps(row_to_json(c)["record"], separators=(",", ":"))
        if len(record) > 70:
            record = record[:67] + "..."
        pk = ",".join("null" if v is None else v for v in c.pk)
        table.add_row(str(c.cursor), c.action, f"{c.schema}.{c.table}", escape(pk), escape(record))
    console.print(table)
    console.print(f"full change rows (with old values and annotations): {result.output}")
    if has_errors(result.findings):
        raise typer.Exit(1)


def _progress_table(runtime: object) -> Table:
    from walstream.runtime import Runtime

    assert isinstance(runtime, Runtime)
    table = Table(title="walstream run — Ctrl-C stops", title_justify="left")
    for col in ("sink", "delivered", "rate/s", "replay-skipped", "batches", "commit → delivered"):
        table.add_column(col, justify="left" if col == "sink" else "right")
    for name, p in sorted(runtime.progress().items()):
        lag = f"{p.last_batch_at - p.last_committed_us / 1e6:.2f}s" if p.last_committed_us else "-"
        table.add_row(name, f"{p.delivered:,}", f"{runtime.rates.get(name, 0.0):,.0f}",
                      f"{p.skipped:,}", f"{p.batches:,}", lag)  # fmt: skip
    for sq in runtime.queries:
        if sq.last_error and sq.query is None:
            table.caption = f"[red]source {sq.source.name}: {escape(sq.last_error)}[/]"
    return table


@app.command()
def run(
    config: Annotated[
        Path,
        typer.Option(
            "--config", "-c", envvar="WALSTREAM_CONFIG", help="The walstream.yaml to run."
        ),
    ] = Path("walstream.yaml"),
    seconds: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds (default: run until stopped)."),
    ] = None,
) -> None:
    """Stream every change of the configured sources to their sinks until stopped.

    Validates the config, checks each source database (creating the slot and
    publication when missing), checks the sink expressions, then runs one Spark
    streaming query per source. Ctrl-C or SIGTERM stops cleanly; a batch in
    flight is replayed on the next start and the delivery ledger skips what was
    already delivered. A failed query (broker down, connection lost) is restarted
    from its checkpoint with backoff; a configuration error stops the run.
    """
    import signal
    import time

    from rich.live import Live

    from walstream.config import load_config
    from walstream.runtime import Runtime, check_destinations

    cfg = load_config(config)
    for name, problem in check_destinations(cfg):
        if problem is not None:
            err_console.print(f"[yellow]warning:[/] sink {name}: {escape(problem.problem)}")
            if problem.fix:
                err_console.print(f"  fix: {escape(problem.fix)}")
            if not problem.retryable:
                raise typer.Exit(2)
    runtime = Runtime(cfg)

    def on_signal(*_: object) -> None:  # first: finish the batch in flight; second: abandon it
        (runtime.abandon if runtime.stopping.is_set() else runtime.stopping).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    console.print(f"[dim]•[/] starting Spark ({cfg.spark.master}) and {len(cfg.sources)} source(s)")
    runtime.start()
    until = time.monotonic() + seconds if seconds is not None else None
    if console.is_terminal:
        with Live(_progress_table(runtime), console=console, refresh_per_second=2) as live:
            runtime.run(until, on_tick=lambda rt: live.update(_progress_table(rt)))
    else:
        runtime.run(until, on_tick=_log_progress)
    totals = {k: v.delivered for k, v in runtime.progress().items()}
    console.print(escape(f"stopped; delivered this run: {totals}"))


def _log_progress(runtime: object) -> None:
    from walstream.runtime import Runtime

    assert isinstance(runtime, Runtime)
    if int(time.monotonic()) % 10 == 0:
        for name, p in sorted(runtime.progress().items()):
            logging.getLogger("walstream.run").info(
                "sink %s: delivered %d (%.0f/s), replay-skipped %d, batches %d",
                name, p.delivered, runtime.rates.get(name, 0.0), p.skipped, p.batches,
            )  # fmt: skip


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
        err_console.print(f"[bold red]error:[/] {escape(exc.problem)}")
        if exc.fix:
            err_console.print(f"[yellow]fix:[/] {escape(exc.fix)}")
        sys.exit(2)


if __name__ == "__main__":
    main()
