"""`walstream recover SOURCE`: after PostgreSQL invalidated a source's slot, or it was dropped.

The changes committed while the slot was gone cannot be read again (see
`postgres/slots.py`). Recovering makes a new slot and requests a backfill of every
table of the source into each of its sinks: the next `walstream run` streams from the
new slot and delivers the backfills, so the sinks converge with the database.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from walstream.cli.operations import ConfigOption
from walstream.errors import ConfigError

if TYPE_CHECKING:
    from walstream.config.plan import Plan

console = Console(soft_wrap=True)


def recover(
    source: Annotated[str, typer.Argument(help="The source whose slot was lost.")],
    config: ConfigOption = Path("walstream.yaml"),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Replace a source's lost replication slot and backfill its tables into its sinks.

    Use it when `walstream run` stops because PostgreSQL invalidated the slot
    (max_slot_wal_keep_size exceeded) or someone dropped it: the changes committed in
    between are gone from the WAL. It creates a new slot and requests a backfill of
    each table of the source for each of its sinks; start `walstream run` afterwards
    to carry them out. Rows changed in between arrive as reads (action `read`), rows
    deleted in between stay in the sinks. Run it while `walstream run` is stopped.
    """
    from walstream.change import format_lsn
    from walstream.config import load_config
    from walstream.postgres.prepare import prepare_capture
    from walstream.postgres.replication import connect, drop_slot
    from walstream.postgres.slots import slot_info

    cfg = load_config(config)
    if source not in {s.name for s in cfg.sources}:
        raise ConfigError(
            f"no source named {source!r} in {config}",
            f"use one of: {', '.join(s.name for s in cfg.sources)}",
        )
    src = cfg.source(source)
    dsn = src.dsn.get_secret_value()
    with connect(dsn, autocommit=True) as conn:
        info = slot_info(conn, src.slot_name)
    if info is not None and info.active:
        raise ConfigError(
            f"slot {src.slot_name} of source {source} is in use right now",
            "stop the walstream (or other client) reading it first, then run this again",
        )
    if info is not None and not info.lost:
        console.print(
            f"slot {escape(src.slot_name)} of source {escape(source)} is healthy "
            f"({info.wal_status}): nothing to recover"
        )
        raise typer.Exit(1)
    sinks = [s for s in cfg.sinks if s.source == source]
    state = "was invalidated" if info is not None else "does not exist"
    console.print(
        f"slot {escape(src.slot_name)} of source {escape(source)} {state}. walstream will "
        f"{'drop it and ' if info is not None else ''}create a new one, and backfill the "
        f"source's tables into {len(sinks)} sink(s): {escape(', '.join(s.name for s in sinks))}"
    )
    if not yes and not typer.confirm("Recover?"):
        raise typer.Exit(1)
    if info is not None:
        with connect(dsn, autocommit=True) as conn:
            drop_slot(conn, src.slot_name)
    at = prepare_capture(
        dsn,
        src.slot_name,
        src.publication_name,
        src.tables,
        source,
        primary=src.primary,
        options=src.publication_options,
    )
    console.print(f"created slot {escape(src.slot_name)} at {format_lsn(at)}")
    failed = _request_backfills(cfg, [s.name for s in sinks])
    console.print(
        "start `walstream run`: it streams from the new slot and carries out the "
        "backfills (`walstream backfill status` shows them)"
    )
    if failed:
        raise typer.Exit(1)


def _request_backfills(cfg: Plan, sinks: list[str]) -> list[str]:
    """A backfill of every table of each sink, said as it is made; the sinks that got none
    (their config refused it: the others still get theirs)."""
    from walstream.backfill.requests import request
    from walstream.backfill.store import BackfillStore

    store = BackfillStore(cfg.state_dsn, cfg.state.schema_)
    store.ensure()
    failed = []
    for sink in sinks:
        try:
            made = request(cfg, store, sink)
        except ConfigError as exc:
            failed.append(sink)
            console.print(f"[bold red]sink {escape(sink)}: no backfill:[/] {escape(str(exc))}")
            continue
        for b in made:
            console.print(f"backfill {b.id}: {escape(b.qualified)} → sink {escape(b.sink)}")
    return failed


def register(app: typer.Typer) -> None:
    app.command()(recover)
