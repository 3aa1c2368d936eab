"""What `walstream run` and `walstream demo` show while they stream: a live table or log lines."""

from __future__ import annotations

import logging
import time

from rich.markup import escape
from rich.table import Table


def progress_table(runtime: object) -> Table:
    from walstream.runtime import Runtime

    assert isinstance(runtime, Runtime)
    table = Table(title="walstream run — Ctrl-C stops", title_justify="left")
    for col in (
        "sink",
        "delivered",
        "rate/s",
        "replay-skipped",
        "parked",
        "retried",
        "dead",
        "batches",
        "commit → delivered",
    ):
        table.add_column(col, justify="left" if col == "sink" else "right")
    for name, p in sorted(runtime.progress().items()):
        lag = f"{p.last_batch_at - p.last_committed_us / 1e6:.2f}s" if p.last_committed_us else "-"
        table.add_row(
            name,
            f"{p.delivered:,}",
            f"{runtime.rates.get(name, 0.0):,.0f}",
            f"{p.skipped:,}",
            f"{p.parked:,}",
            f"{p.retried:,}",
            f"{p.dead:,}",
            f"{p.batches:,}",
            lag,
        )
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


_last_logged = [0.0]


def log_progress(runtime: object, every: float = 10.0) -> None:
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
            name,
            p.delivered,
            runtime.rates.get(name, 0.0),
            p.skipped,
            p.parked,
            p.retried,
            p.dead,
            p.batches,
        )
