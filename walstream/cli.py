"""The `walstream` command."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.backfill.commands import register as register_backfill
from walstream.errors import WalstreamError
from walstream.ops import register as register_ops
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
    from walstream.runtime import check_destinations
    from walstream.sinks.postgres_targets import check_targets
    from walstream.spark.pipeline import expressions, validate
    from walstream.spark.session import build_spark

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
    try:
        check_targets(cfg)
    except ConfigError as exc:
        findings.append(Finding("error", "mirror targets", exc.problem, exc.fix))
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
        spark = build_spark(cfg.model_copy(update={"spark": local}))
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


@app.command()
def demo(
    home: Annotated[
        Path, typer.Option(help="Where the demo keeps its embedded server, config and output.")
    ] = Path(".walstream"),
    seconds: Annotated[
        float, typer.Option(help="How long to write changes; 0 runs until Ctrl-C.")
    ] = 60.0,
    rate: Annotated[
        float, typer.Option(help="Changes per second the sample writer makes.")
    ] = 200.0,
) -> None:
    """Run walstream on its embedded default: a private Postgres, a live workload, files.

    Starts a PostgreSQL server of its own (initdb under HOME/postgres on first use, a
    free loopback port), creates the database walstream_demo with public.orders, writes
    HOME/demo/walstream.yaml and runs `walstream run` on it with Spark local[*] while a
    sample writer changes orders at RATE per second. The changes arrive as sequin
    messages in HOME/demo/out. At the end it checks that every change arrived once.
    Ctrl-C stops writing early; a second Ctrl-C stops at once. Nothing outside HOME is
    touched; a second run continues where the first stopped.
    """
    import signal
    import threading

    from rich.live import Live

    from walstream.demo import command, run_demo

    stop = threading.Event()
    state: dict[str, object] = {}

    def on_signal(*_: object) -> None:
        rt = state.get("runtime")
        if stop.is_set() and rt is not None:
            rt.abandon.set()  # type: ignore[attr-defined]
            rt.stopping.set()  # type: ignore[attr-defined]
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    live: Live | None = None

    def on_tick(runtime: object) -> None:
        state["runtime"] = runtime
        if live is not None:
            live.update(_progress_table(runtime))
        elif getattr(runtime, "queries", None):
            _log_progress(runtime)

    say = lambda s: console.print(f"[dim]•[/] {escape(s)}")  # noqa: E731
    if console.is_interactive:
        live = Live(console=console, refresh_per_second=2, transient=False)
    try:
        if live is not None:
            say("Ctrl-C stops writing early; a second Ctrl-C stops at once")
            live.start()
        result = run_demo(home, seconds, rate, progress=say, on_tick=on_tick, stop=stop)
    finally:
        if live is not None:
            live.stop()
    # >=: changes left undelivered by an earlier, abandoned run arrive in this one
    ok = result.delivered >= result.written
    console.print(
        f"{'[green]ok[/]' if ok else '[bold red]incomplete[/]'}: {result.written:,} changes "
        f"written, {result.delivered:,} delivered this run; {result.total_files_messages:,} "
        f"messages in {escape(str(result.output))}"
    )
    if result.sample:
        console.print("the last message:")
        console.print_json(result.sample)
    console.print(
        f"next: `{escape(command())} run -c {escape(str(result.config_path))}` streams the same "
        "database; copy that file, set the source dsn to your database and add a Kafka sink "
        "(README: Configuration)."
    )
    if not ok:
        raise typer.Exit(1)


def _progress_table(runtime: object) -> Table:
    from walstream.runtime import Runtime

    assert isinstance(runtime, Runtime)
    table = Table(title="walstream run — Ctrl-C stops", title_justify="left")
    for col in ("sink", "delivered", "rate/s", "replay-skipped", "parked", "retried", "dead",
                "batches", "commit → delivered"):  # fmt: skip
        table.add_column(col, justify="left" if col == "sink" else "right")
    for name, p in sorted(runtime.progress().items()):
        lag = f"{p.last_batch_at - p.last_committed_us / 1e6:.2f}s" if p.last_committed_us else "-"
        table.add_row(name, f"{p.delivered:,}", f"{runtime.rates.get(name, 0.0):,.0f}",
                      f"{p.skipped:,}", f"{p.parked:,}", f"{p.retried:,}", f"{p.dead:,}",
                      f"{p.batches:,}", lag)  # fmt: skip
    held = [why for sq in runtime.queries for why in sq.pipeline.holding.values()]
    if held:
        table.caption = f"[yellow]{escape('; '.join(held))}[/]"
    for sq in runtime.queries:
        if not sq.leader:
            table.caption = (
                f"[dim]source {escape(sq.source.name)}: standby — another walstream leads it; "
                "this one takes over when it stops[/]"
            )
        elif sq.last_error and sq.query is None:
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
    port: Annotated[
        int | None,
        typer.Option(
            help="Serve /health, /metrics, /api and the console on this port instead of "
            "server.port (0: any free port)."
        ),
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
    from walstream.secrets import guard_logs, secret_values
    from walstream.spark.session import find_java

    cfg = load_config(config)
    guard_logs(secret_values(cfg))  # no secret in any log line from here on
    find_java()  # Spark's Java, before anything is created (a SetupError names the fix)
    if port is not None:
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"port": port})})
    console.print(f"[dim]•[/] checking {len(cfg.sinks)} destination(s)")
    for name, problem in check_destinations(cfg):
        if problem is None:
            continue
        if problem.retryable:  # unreachable now: the run retries it
            err_console.print(
                f"[yellow]warning:[/] sink {name}: {escape(problem.problem)} "
                "(walstream retries it while it runs)"
            )
            if problem.fix:
                err_console.print(f"  [yellow]fix:[/] {escape(problem.fix)}")
            continue
        err_console.print(f"[bold red]error:[/] sink {name}: {escape(problem.problem)}")
        if problem.fix:
            err_console.print(f"  [yellow]fix:[/] {escape(problem.fix)}")
        err_console.print("nothing was started: fix the sink, then run again")
        raise typer.Exit(2)
    runtime = Runtime(cfg)

    def on_signal(*_: object) -> None:  # first: finish the batch in flight; second: abandon it
        (runtime.abandon if runtime.stopping.is_set() else runtime.stopping).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    console.print(f"[dim]•[/] starting Spark ({cfg.spark.master}) and {len(cfg.sources)} source(s)")
    runtime.start()
    if runtime.server is not None:
        console.print(f"[dim]•[/] health, metrics, API and console at {runtime.server.url}")
    until = time.monotonic() + seconds if seconds is not None else None
    if console.is_interactive:
        with Live(_progress_table(runtime), console=console, refresh_per_second=2) as live:
            runtime.run(until, on_tick=lambda rt: live.update(_progress_table(rt)))
    else:
        runtime.run(until, on_tick=_log_progress)
    progress = runtime.progress()
    totals = {k: v.delivered for k, v in progress.items()}
    skipped = {k: v.skipped for k, v in progress.items() if v.skipped}
    console.print(
        escape(f"stopped; delivered this run: {totals}")
        + (escape(f"; skipped as delivered before a restart: {skipped}") if skipped else "")
    )


_last_logged = [0.0]


def _log_progress(runtime: object, every: float = 10.0) -> None:
    """One log line per sink every `every` seconds (when the output is not a terminal)."""
    from walstream.runtime import Runtime

    assert isinstance(runtime, Runtime)
    now = time.monotonic()
    progress = runtime.progress()
    if not progress or now - _last_logged[0] < every:
        return
    _last_logged[0] = now
    for name, p in sorted(progress.items()):
        logging.getLogger("walstream.run").info(
            "sink %s: delivered %d (%.0f/s), replay-skipped %d, parked %d, retried %d, dead %d, "
            "batches %d",
            name, p.delivered, runtime.rates.get(name, 0.0), p.skipped, p.parked, p.retried,
            p.dead, p.batches,
        )  # fmt: skip


@app.command()
def status(
    config: Annotated[
        Path,
        typer.Option(
            "--config", "-c", envvar="WALSTREAM_CONFIG", help="The walstream.yaml of the run."
        ),
    ] = Path("walstream.yaml"),
    url: Annotated[
        str | None,
        typer.Option(help="The server's address (default: server.host and server.port)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print /health's JSON as it is.")] = False,
) -> None:
    """What a running `walstream run` reports at /health: each source and sink, its
    status (ok, warning, error, paused, standby) and why. Exits 1 when something is in
    error, 2 when the server cannot be reached."""
    import json

    import httpx

    if url is None:
        from walstream.config import load_config

        server = load_config(config).server
        host = "127.0.0.1" if server.host in ("0.0.0.0", "::") else server.host
        url = f"http://{host}:{server.port}"
    try:
        r = httpx.get(f"{url.rstrip('/')}/health", timeout=10)
        data = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        err_console.print(
            f"[bold red]error:[/] cannot read {escape(url)}/health: {escape(str(exc))}"
        )
        err_console.print(
            "[yellow]fix:[/] start `walstream run` with this config (it serves /health on "
            "server.port, 8376 by default), or pass --url"
        )
        raise typer.Exit(2) from None
    if as_json:
        console.print_json(json.dumps(data))
    else:
        style = {"ok": "green", "warning": "yellow", "error": "bold red", "paused": "blue",
                 "standby": "dim"}  # fmt: skip

        def badge(s: str) -> str:
            return f"[{style.get(s, 'white')}]{s}[/]"

        console.print(f"walstream at {escape(url)}: {badge(data['status'])}")
        t = Table(title="sources", title_justify="left")
        for col in ("source", "status", "role", "slot lag", "WAL kept", "last report", "ingested",
                    "why"):  # fmt: skip
            t.add_column(col)
        for src in data["sources"]:
            t.add_row(
                escape(src["name"]), badge(src["status"]), src["role"], _bytes(src["lag_bytes"]),
                _bytes(src["retained_wal_bytes"]), _seconds(src["last_report_age_seconds"]),
                f"{src['ingested']:,}", escape("; ".join(src["reasons"])),
            )  # fmt: skip
        console.print(t)
        t = Table(title="sinks", title_justify="left")
        for col in ("sink", "type", "status", "delivered", "rate/s", "parked", "dead letters",
                    "why"):  # fmt: skip
            t.add_column(col)
        for k in data["sinks"]:
            t.add_row(
                escape(k["name"]), k["type"], badge(k["status"]), f"{k['delivered']:,}",
                f"{k['rate_per_second']:,.0f}", f"{k['parked']:,}", f"{k['dead_letters']:,}",
                escape("; ".join(k["reasons"])),
            )  # fmt: skip
        console.print(t)
    if data["status"] == "error":
        raise typer.Exit(1)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}s"


register_ops(app)
register_backfill(app)


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
