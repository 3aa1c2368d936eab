"""`walstream run`: stream until stopped, showing progress."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from walstream.cli.output import console, err_console
from walstream.cli.progress import log_progress, progress_table

if TYPE_CHECKING:
    from walstream.config.plan import Plan
    from walstream.runtime import Runtime


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
    until_caught_up: Annotated[
        bool,
        typer.Option(
            "--until-caught-up",
            help="Deliver what each slot holds when the run starts (every change committed "
            "before it), then stop: for a scheduled job. Changes committed later wait for "
            "the next run; a backfill in progress goes on in the next run too.",
        ),
    ] = False,
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

    from walstream.config import load_config
    from walstream.engine.session import find_java
    from walstream.runtime import Runtime
    from walstream.secrets import guard_logs, secret_values

    cfg = load_config(config)
    guard_logs(secret_values(cfg))  # no secret in any log line from here on
    find_java()  # Spark's Java, before anything is created (a SetupError names the fix)
    if port is not None:
        cfg = dataclasses.replace(cfg, server=cfg.server.model_copy(update={"port": port}))
    _check_destinations(cfg)
    started = time.monotonic()
    runtime = Runtime(
        cfg,
        until_caught_up=until_caught_up,
        say=lambda text: console.print(f"[dim]•[/] {escape(text)}"),
    )

    def on_signal(*_: object) -> None:  # first: finish the batch in flight; second: abandon it
        (runtime.abandon if runtime.stopping.is_set() else runtime.stopping).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    if until_caught_up:
        console.print("[dim]•[/] delivering what the slots hold now, then stopping")
    runtime.start()
    if runtime.server is not None:
        console.print(f"[dim]•[/] health, metrics, API and console at {runtime.server.url}")
    _stream(runtime, started, time.monotonic() + seconds if seconds is not None else None)
    progress = runtime.progress()
    totals = {k: v.delivered for k, v in progress.items()}
    skipped = {k: v.skipped for k, v in progress.items() if v.skipped}
    console.print(
        escape(f"{'caught up' if runtime.caught_up else 'stopped'}; delivered this run: {totals}")
        + (escape(f"; skipped as delivered before a restart: {skipped}") if skipped else "")
    )


def _check_destinations(cfg: Plan) -> None:
    """Each sink's destination, before anything starts: one that cannot work stops the
    run (exit 2); one unreachable now is a warning (the run retries it)."""
    from walstream.runtime import check_destinations

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


def _stream(runtime: Runtime, started: float, until: float | None) -> None:
    """Run until `until` (or a stop), showing progress live on a terminal, in log lines
    otherwise, and when the first changes were delivered."""
    from rich.live import Live

    first: list[float] = []

    def first_delivery(rt: Runtime) -> None:
        if not first and any(p.delivered for p in rt.progress().values()):
            first.append(time.monotonic() - started)
            console.print(f"[dim]•[/] first changes delivered {first[0]:.1f}s after start")

    if console.is_interactive:
        with Live(progress_table(runtime), console=console, refresh_per_second=2) as live:

            def tick(rt: Runtime) -> None:
                first_delivery(rt)
                live.update(progress_table(rt))

            runtime.run(until, on_tick=tick)
    else:

        def log_tick(rt: Runtime) -> None:
            first_delivery(rt)
            log_progress(rt)

        runtime.run(until, on_tick=log_tick)


def register(app: typer.Typer) -> None:
    app.command()(run)
