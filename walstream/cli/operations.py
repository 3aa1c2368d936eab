"""Operator commands on a sink's parked messages and dead letters, and pause / resume.

They work on the state database named by walstream.yaml (`state.dsn`, default:
the first source's database), whether or not `walstream run` is running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from walstream.delivery.parking import DEAD, PARKED, Parked, ParkingLot
from walstream.secrets import scrub

console = Console(soft_wrap=True)

ConfigOption = Annotated[
    Path,
    typer.Option("--config", "-c", envvar="WALSTREAM_CONFIG", help="The walstream.yaml to use."),
]
SinkOption = Annotated[str | None, typer.Option("--sink", help="Only this sink.")]
GroupOption = Annotated[str | None, typer.Option("--group", help="Only this group key.")]

dead_letters = typer.Typer(
    help="Messages a sink refused for good (non-retryable, or out of attempts): "
    "list, show, retry, discard.",
    no_args_is_help=True,
)
parked = typer.Typer(help="Messages waiting for their next delivery attempt.", no_args_is_help=True)


def _lot(config: Path, sink: str | None = None) -> ParkingLot:
    from walstream.config import load_config

    cfg = load_config(config)
    if sink is not None and sink not in {s.name for s in cfg.sinks}:
        from walstream.errors import ConfigError

        raise ConfigError(
            f"no sink named {sink!r} in {config}",
            f"use one of: {', '.join(s.name for s in cfg.sinks)}",
        )
    lot = ParkingLot(cfg.state_dsn, cfg.state.schema_)
    lot.ensure()
    return lot


def _table(rows: list[Parked], title: str, secrets: list[str]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in (
        "id",
        "sink",
        "group",
        "lsn:seq",
        "table",
        "action",
        "attempts",
        "next attempt",
        "last error",
    ):
        t.add_column(col)
    for p in rows:
        last = p.errors[-1]["error"] if p.errors else "(behind its group's head)"
        last = scrub(last, secrets)
        t.add_row(
            str(p.id),
            escape(p.sink),
            escape(p.group),
            f"{p.lsn}:{p.seq}",
            escape(p.message.table),
            p.message.action,
            str(p.attempts),
            p.next_attempt_at.strftime("%Y-%m-%d %H:%M:%S") if p.next_attempt_at else "-",
            escape(last[:80]),
        )
    return t


def _list(status: str, config: Path, sink: str | None, group: str | None, limit: int) -> None:
    from walstream.config import load_config
    from walstream.secrets import secret_values

    lot = _lot(config, sink)
    rows = lot.list(status, sink, group, limit)
    counts = lot.counts()
    total = sum(c.get(status, 0) for s, c in counts.items() if sink is None or s == sink)
    word = "dead letters" if status == DEAD else "parked messages"
    if not rows:
        console.print(f"no {word}" + (f" for sink {escape(sink)}" if sink else ""))
        return
    console.print(
        _table(
            rows,
            f"{total:,} {word}" + (f" (first {len(rows)})" if total > len(rows) else ""),
            sorted(secret_values(load_config(config))),
        )
    )


@dead_letters.command("list")
def dead_list(
    config: ConfigOption = Path("walstream.yaml"),
    sink: SinkOption = None,
    group: GroupOption = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 100,
) -> None:
    """List dead letters, oldest change first."""
    _list(DEAD, config, sink, group, limit)


@dead_letters.command("show")
def dead_show(
    id: Annotated[int, typer.Argument(help="The dead letter's id (from `list`).")],
    config: ConfigOption = Path("walstream.yaml"),
) -> None:
    """Everything about one dead letter: the message, its error history, the sink's settings."""
    from walstream.config import load_config
    from walstream.secrets import scrub_json, secret_values
    from walstream.server.answers import parked_json

    lot = _lot(config)
    p = lot.get(id)
    if p is None:
        console.print(f"no parked message or dead letter with id {id}")
        raise typer.Exit(1)
    secrets = secret_values(load_config(config))
    out = {
        **parked_json(p, secrets, full=True),
        "sink_config": scrub_json(lot.sink_config(p.id), secrets),
    }
    console.print_json(json.dumps(out, default=str))


def _selection(ids: list[int] | None, sink: str | None, group: str | None, all_: bool) -> None:
    if not ids and sink is None and group is None and not all_:
        console.print("say which: IDS, --sink, --group, or --all")
        raise typer.Exit(2)


@dead_letters.command("retry")
def dead_retry(
    ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    config: ConfigOption = Path("walstream.yaml"),
    sink: SinkOption = None,
    group: GroupOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter.")] = False,
) -> None:
    """Park dead letters again, due now: a running `walstream run` delivers them in order
    (per group, after anything still parked before them)."""
    _selection(ids, sink, group, all_)
    n = _lot(config, sink).retry_dead(ids, sink, group)
    console.print(f"{n:,} dead letter(s) parked for a new attempt")


@dead_letters.command("discard")
def dead_discard(
    ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    config: ConfigOption = Path("walstream.yaml"),
    sink: SinkOption = None,
    group: GroupOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete dead letters for good (they will never be delivered)."""
    _selection(ids, sink, group, all_)
    if not yes and not typer.confirm("Discard these dead letters for good?"):
        raise typer.Exit(1)
    n = _lot(config, sink).discard_dead(ids, sink, group)
    console.print(f"{n:,} dead letter(s) discarded")


@parked.command("list")
def parked_list(
    config: ConfigOption = Path("walstream.yaml"),
    sink: SinkOption = None,
    group: GroupOption = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 100,
) -> None:
    """List parked messages (waiting for a retry, or behind their group's head)."""
    _list(PARKED, config, sink, group, limit)


def pause(
    sink: Annotated[str, typer.Argument(help="The sink to pause.")],
    config: ConfigOption = Path("walstream.yaml"),
    reason: Annotated[str | None, typer.Option(help="Shown while paused.")] = None,
) -> None:
    """Pause a sink until `walstream resume SINK`.

    Its source's next batch waits before delivering anything: nothing is delivered or
    parked and the slot stays where it is. The source's other sinks wait too, since
    they share its slot (give a sink its own source to pause it alone).
    """
    _lot(config, sink).set_paused(sink, True, reason)
    console.print(f"sink {escape(sink)} paused; `walstream resume {escape(sink)}` to go on")


def resume(
    sink: Annotated[str, typer.Argument(help="The sink to resume.")],
    config: ConfigOption = Path("walstream.yaml"),
) -> None:
    """Resume a paused sink."""
    _lot(config, sink).set_paused(sink, False)
    console.print(f"sink {escape(sink)} resumed")


def reset(
    sink: Annotated[str, typer.Argument(help="The sink to reset.")],
    to: Annotated[
        str,
        typer.Option(
            "--to", help="'now' (the source's current WAL position) or an LSN like 0/16B3748."
        ),
    ],
    config: ConfigOption = Path("walstream.yaml"),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Make a sink skip every change committed before a WAL position.

    Its parked messages and dead letters before that position are discarded, so a
    sink stuck behind a broken destination can start over from now. The slot is
    shared by the source's sinks and never rewinds: changes before the slot's
    position cannot be read again (take a backfill for that).
    """
    from walstream.change import format_lsn, parse_lsn
    from walstream.config import load_config
    from walstream.postgres.replication import WAL_POSITION, connect

    lot = _lot(config, sink)
    cfg = load_config(config)
    sc = next(s for s in cfg.sinks if s.name == sink)
    source = next(s for s in cfg.sources if s.name == sc.source)
    with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
        row = conn.execute(f"SELECT {WAL_POSITION}::text").fetchone()
        assert row is not None
        now = str(row[0])
        slot = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (source.slot_name,),
        ).fetchone()
    target = parse_lsn(now if to == "now" else to)
    counts = lot.counts().get(sink, {})
    console.print(
        f"sink {escape(sink)} will skip every change committed before {format_lsn(target)}"
        f" (the source is at {now}"
        + (f", its slot confirmed through {slot[0]}" if slot and slot[0] else "")
        + f"); {counts.get(PARKED, 0):,} parked message(s) and {counts.get(DEAD, 0):,} dead "
        "letter(s) of it before that are discarded"
    )
    if slot and slot[0] and target < parse_lsn(slot[0]):
        console.print(
            "[yellow]note:[/] that is before the slot's position: changes already read are "
            "not read again; only parked messages and dead letters before it are discarded"
        )
    if not yes and not typer.confirm("Reset?"):
        raise typer.Exit(1)
    parked_n, dead_n = lot.reset(sink, target)
    console.print(
        f"sink {escape(sink)} reset to {format_lsn(target)}: discarded {parked_n:,} parked "
        f"message(s) and {dead_n:,} dead letter(s); a running walstream applies it from its "
        "next batch"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(dead_letters, name="dead-letters")
    app.add_typer(parked, name="parked")
    app.command()(pause)
    app.command()(resume)
    app.command()(reset)
