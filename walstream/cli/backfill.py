"""`walstream backfill SINK`, `backfill status`, `backfill cancel`.

A backfill is requested in the state database; the running `walstream run` that
has the sink carries it out (and picks it up again after a restart). These
commands work whether or not it runs, and say so when nothing takes a request.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.backfill.store import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    PENDING,
    Backfill,
    BackfillStore,
)
from walstream.cli.operations import ConfigOption

console = Console(soft_wrap=True)


class _DefaultStart(typer.core.TyperGroup):
    """`walstream backfill SINK ...` means `walstream backfill start SINK ...`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["start", *args]
        return super().resolve_command(ctx, args)


backfill = typer.Typer(
    cls=_DefaultStart,
    help="Backfills: the rows a table already has, delivered to a sink as action `read` "
    "while the stream goes on. `walstream backfill SINK` starts one; `status`, `cancel`.",
    no_args_is_help=True,
)


def _store(config: Path) -> tuple[Any, BackfillStore]:
    from walstream.config import load_config

    cfg = load_config(config)
    store = BackfillStore(cfg.state_dsn, cfg.state.schema_)
    store.ensure()
    return cfg, store


def _rows(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def summary(b: Backfill) -> str:
    """One line: where a backfill is."""
    pct = ""
    if b.rows_estimated:
        pct = f" ({min(100.0, 100.0 * b.rows_read / b.rows_estimated):.0f}%)"
    rate = f", {b.rate:,.0f} rows/s" if b.rate else ""
    eta = f", ETA {_duration(b.eta)}" if b.eta is not None else ""
    line = (
        f"backfill {b.id} {b.qualified} → {b.sink}: {b.status}, {b.rows_read:,} of ~"
        f"{_rows(b.rows_estimated)} rows read{pct}{rate}{eta}; chunks {b.chunks_emitted}/"
        f"{b.chunks}{'' if b.planned_all or b.status != 'running' else '+'} delivered"
    )
    if b.error:
        line += f"; error: {b.error}"
    return line


def status_table(rows: list[Backfill]) -> Table:
    t = Table(title="backfills", title_justify="left")
    for col in (
        "id",
        "sink",
        "table",
        "status",
        "rows read",
        "of ~",
        "rate/s",
        "ETA",
        "chunks",
        "where / error",
    ):
        t.add_column(col, justify="right" if col in ("rows read", "of ~", "rate/s") else "left")
    style = {DONE: "green", FAILED: "bold red", CANCELLED: "yellow"}
    for b in rows:
        t.add_row(
            str(b.id),
            escape(b.sink),
            escape(b.qualified),
            f"[{style.get(b.status, 'cyan')}]{b.status}[/]",
            f"{b.rows_read:,}",
            _rows(b.rows_estimated),
            f"{b.rate:,.0f}" if b.rate else "",
            _duration(b.eta),
            f"{b.chunks_emitted}/{b.chunks}{'+' if b.status == 'running' and not b.planned_all else ''}",
            escape(b.error or b.where or ""),
        )
    return t


def follow(store: BackfillStore, ids: list[int], interval: float = 1.0) -> list[Backfill]:
    """Show progress until the backfills end (a bar on a terminal, lines otherwise)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    def current() -> list[Backfill]:
        return [b for b in (store.get(i) for i in ids) if b is not None]

    started = time.monotonic()
    hinted = False
    if not console.is_interactive:
        last = 0.0
        while True:
            now = current()
            if time.monotonic() - last >= 10 or all(b.status not in ACTIVE for b in now):
                for b in now:
                    console.print(escape(summary(b)))
                last = time.monotonic()
            if all(b.status not in ACTIVE for b in now):
                return now
            hinted = _hint(now, started, hinted)
            time.sleep(interval)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        tasks = {
            b.id: progress.add_task(
                escape(f"{b.id} {b.qualified}"), total=b.rows_estimated or None, rate=""
            )
            for b in current()
        }
        while True:
            now = current()
            for b in now:
                total = max(b.rows_estimated or 0, b.rows_read) or None
                if b.status == DONE:
                    total = b.rows_read
                progress.update(
                    tasks[b.id],
                    completed=b.rows_read,
                    total=total,
                    rate=f"{b.rate:,.0f} rows/s" if b.rate else b.status,
                )
            if all(b.status not in ACTIVE for b in now):
                return now
            hinted = _hint(now, started, hinted)
            time.sleep(interval)


def _hint(now: list[Backfill], started: float, hinted: bool) -> bool:
    if not hinted and time.monotonic() - started > 15 and any(b.status == PENDING for b in now):
        console.print(
            "[yellow]still pending:[/] no `walstream run` with this sink has taken it yet; it "
            "starts when one runs (Ctrl-C leaves it queued)"
        )
        return True
    return hinted


@backfill.command()
def start(
    sink: Annotated[str, typer.Argument(help="The sink that gets the rows.")],
    table: Annotated[
        list[str] | None,
        typer.Option(
            "--table",
            "-t",
            help="schema.table (repeat for several). Default: every "
            "table of the source the sink selects.",
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Only rows matching this SQL predicate, e.g. \"created_at >= '2024-01-01'\"."
        ),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1_000_000,
            help="Rows per chunk to start with (default 20,000; 250,000 into a lake table).",
        ),
    ] = None,
    target_seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds a chunk read should take; the size adapts toward "
            "it (default 2; 0 keeps --chunk-size).",
        ),
    ] = None,
    wait: Annotated[
        bool | None,
        typer.Option(
            "--follow/--no-follow", help="Show progress until done (default: on a terminal)."
        ),
    ] = None,
    config: ConfigOption = Path("walstream.yaml"),
) -> None:
    """Backfill a sink: the rows its tables hold now, as action `read` (Debezium op `r`).

    Tables are read in primary-key chunks by Spark tasks of the running `walstream run`,
    between watermarks in the WAL, so a row changed while its chunk is read arrives as
    the stream's newer version, never as a stale read. A stop or crash resumes from
    the chunks not yet delivered. Ctrl-C here only stops watching.
    """
    from walstream.backfill.requests import request

    cfg, store = _store(config)
    created = request(cfg, store, sink, table or [], where, chunk_size, target_seconds)
    for b in created:
        console.print(
            f"backfill {b.id}: {escape(b.qualified)} → sink {escape(b.sink)}, about "
            f"{_rows(b.rows_estimated)} rows" + (f" where {escape(b.where)}" if b.where else "")
        )
    if wait is None:
        wait = console.is_interactive
    if not wait:
        console.print("`walstream run` carries it out; `walstream backfill status` shows progress")
        return
    try:
        final = follow(store, [b.id for b in created])
    except KeyboardInterrupt:
        console.print("stopped watching; the backfill goes on (`walstream backfill status`)")
        return
    failed = [b for b in final if b.status == FAILED]
    for b in failed:
        console.print(f"[bold red]backfill {b.id} failed:[/] {escape(b.error or '')}")
    if failed:
        raise typer.Exit(1)


@backfill.command()
def status(
    ids: Annotated[list[int] | None, typer.Argument(help="Only these backfills.")] = None,
    sink: Annotated[str | None, typer.Option(help="Only this sink's backfills.")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Follow until they end.")] = False,
    config: ConfigOption = Path("walstream.yaml"),
) -> None:
    """Backfills with rows read / estimated, rate, ETA and chunks delivered."""
    _, store = _store(config)
    rows = store.find(sink=sink)
    if ids:
        rows = [b for b in rows if b.id in ids]
    if not rows:
        console.print("no backfills" + (f" of sink {escape(sink)}" if sink else ""))
        return
    if watch:
        active = [b.id for b in rows if b.status in ACTIVE]
        if active:
            try:
                follow(store, active)
            except KeyboardInterrupt:
                return
        rows = [store.get(b.id) or b for b in rows]
    if console.is_interactive:
        console.print(status_table(rows))
    else:  # one line each, for scripts and logs
        for b in rows:
            console.print(escape(summary(b)))


@backfill.command()
def cancel(
    ids: Annotated[list[int] | None, typer.Argument(help="The backfills to cancel.")] = None,
    sink: Annotated[
        str | None, typer.Option(help="Every unfinished backfill of this sink.")
    ] = None,
    config: ConfigOption = Path("walstream.yaml"),
) -> None:
    """Stop backfills: no more chunks are read or delivered (rows delivered stay delivered)."""
    _, store = _store(config)
    targets = list(ids or [])
    if sink is not None:
        targets += [b.id for b in store.find(sink=sink, active_only=True)]
    if not targets:
        console.print("name backfill ids or --sink; `walstream backfill status` lists them")
        raise typer.Exit(2)
    done = store.cancel(targets)
    for id_ in done:
        console.print(f"backfill {id_} cancelled")
    for id_ in sorted(set(targets) - set(done)):
        b = store.get(id_)
        why = "no such backfill" if b is None else f"it is {b.status} already"
        console.print(f"backfill {id_} not cancelled: {why}")


def register(app: typer.Typer) -> None:
    app.add_typer(backfill, name="backfill")
