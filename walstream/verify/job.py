"""One verification of one sink, table after table, kept in the state database: what
`walstream verify SINK` and a sink's `verify: {every: ...}` in `walstream run` both run.

It resumes a verification of the same sink that was cut short (the tables already compared
are not compared again, the table being compared goes on after its last key range), beats
a heartbeat while it runs (a cancel is seen there), and leaves its result for `/health`,
`/metrics` and the console. Stopped (Ctrl-C, `walstream run` stopping) it lets go of the
verification, to be resumed; an error that makes the comparison impossible fails it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walstream.config import Plan
from walstream.errors import ConfigError, WalstreamError
from walstream.secrets import scrub, secret_values
from walstream.verify.run import Checkpoint, Position, State, TableResult, Verification
from walstream.verify.sinks import Pair, pair, remove_extra, repair, sink_kind, tables_of
from walstream.verify.store import DONE, FAILED, Cancelled, VerificationStore

log = logging.getLogger(__name__)

#: Seconds between heartbeats (each writes where the comparison has got to).
BEAT_SECONDS = 5.0
#: Keys of each kind a table's result keeps in the state database (the report lists all).
KEPT_KEYS = 1_000


@dataclass(frozen=True)
class Options:
    """What to compare and how (the flags of `walstream verify`, a sink's `verify:`)."""

    tables: list[str] = field(default_factory=list)  # schema.table; empty: every one
    where: str | None = None  # a backfill predicate restricting both sides
    repair: bool = False
    values: bool = False
    wait: float = 120.0
    chunk_size: int = 100_000


@dataclass
class Outcome:
    id: int  # the verification's id in the state database
    results: list[TableResult]
    resumed: bool  # it went on from one cut short

    @property
    def equal(self) -> bool:
        return all(r.equal for r in self.results)


class Stopped(Exception):
    """The process is stopping: the verification is let go of, to be resumed."""


class Kept(Checkpoint):
    """The checkpoint kept in the state database, written with the heartbeat."""

    def __init__(
        self, store: VerificationStore, id_: int, state: State | None, stopping: Any
    ) -> None:
        self.store, self.id, self.state, self.stopping = store, id_, state, stopping
        self.last = time.monotonic()

    def load(self, table: str) -> State | None:
        return self.state if self.state and self.state.get("table") == table else None

    def save(self, state: State, force: bool = False) -> None:
        self.state = state
        self.tick(force)

    def tick(self, force: bool = False) -> None:
        """A heartbeat when one is due (Cancelled if the verification was); Stopped when
        the process is stopping."""
        if self.stopping is not None and self.stopping.is_set():
            raise Stopped
        if force or time.monotonic() - self.last >= BEAT_SECONDS:
            self.store.beat(self.id, self.state)
            self.last = time.monotonic()


def verify_sink(
    plan: Plan,
    sink: str,
    options: Options,
    trigger: str = "command",
    progress: Callable[[str], None] = lambda _: None,
    stopping: threading.Event | None = None,
) -> Outcome:
    """Compare each table of `sink` with its source (see the module docstring)."""
    from walstream.backfill.predicate import parse

    sc = plan.sink(sink)
    kind = sink_kind(sc)
    if kind == "kafka" and options.where:
        raise ConfigError(
            f"--where: the messages of sink {sink}'s topic are not selected by a predicate yet",
            "verify the whole topic (leave out --where)",
        )
    where = parse(options.where) if options.where else None
    names = tables_of(plan, sc, options.tables)
    every = tables_of(plan, sc, []) if options.tables else names
    if kind == "kafka" and sc.format == "record" and len(every) > 1:
        raise ConfigError(
            f"sink {sink} cannot be verified: a format record message does not say its table, "
            "and the sink sends several tables to one topic",
            "use format sequin, or a sink (and topic) per table",
        )
    _not_backfilling(plan, sink, names)
    source = plan.source(sc.source)
    store = VerificationStore(plan.state_dsn, plan.state.schema_)
    store.ensure()
    record = store.begin(sink, options.tables, options.where, trigger)
    kept = Kept(store, record.id, record.progress, stopping)
    earlier = {r["table"]: TableResult.from_json(r) for r in record.results}
    resumed = bool(earlier) or record.progress is not None
    if resumed:
        progress(f"resuming verification {record.id} ({len(earlier)} table(s) compared before)")
    dsn = source.dsn.get_secret_value()
    slots = [source.slot_name]
    position = Position(dsn, slots, source.name, options.wait, source.writes_dsn, kept.tick)

    def say(text: str) -> None:
        kept.tick()
        progress(text)

    results = []
    shared: dict[str, Any] = {}  # a topic is read once for all its tables
    try:
        for schema, name in names:
            if f"{schema}.{name}" in earlier:
                results.append(earlier[f"{schema}.{name}"])
                continue
            p = pair(plan, sc, schema, name, options.chunk_size, where, shared)
            check = Verification(
                p.source, p.sink, position, values=options.values, progress=say, checkpoint=kept
            )
            check.equivalent = p.equivalent
            result = check.run(p.table, p.target, p.estimate)
            if options.repair:
                _repair(plan, sc, p, check, result, options, say)
            store.table_done(record.id, result.as_json(KEPT_KEYS), result.rows_different)
            kept.state = None
            results.append(result)
    except (Stopped, KeyboardInterrupt):
        store.release(record.id, kept.state)
        raise
    except Cancelled:
        raise WalstreamError(
            f"verification {record.id} of sink {sink} was cancelled",
            f"run `walstream verify {sink}` again to compare from the start",
        ) from None
    except WalstreamError as exc:
        error = f"{exc.problem}" + (f" ({exc.fix})" if exc.fix else "")
        store.finish(record.id, FAILED, scrub(error, secret_values(plan)))
        raise
    except Exception as exc:  # kept for /api/sinks: with no secret of the config in it
        store.finish(record.id, FAILED, scrub(f"{type(exc).__name__}: {exc}", secret_values(plan)))
        raise
    store.finish(record.id, DONE)
    return Outcome(record.id, results, resumed)


def _not_backfilling(plan: Plan, sink: str, names: list[tuple[str, str]]) -> None:
    """A table being backfilled into the sink does not hold its rows yet: no comparison."""
    from walstream.backfill.store import BackfillStore

    wanted = {f"{s}.{t}" for s, t in names}
    store = BackfillStore(plan.state_dsn, plan.state.schema_)
    store.ensure()
    busy = [b for b in store.find(sink, active_only=True) if b.qualified in wanted]
    if busy:
        raise WalstreamError(
            f"backfill {busy[0].id} of {busy[0].qualified} into sink {sink} is not finished: "
            "the sink does not hold all of the table's rows yet",
            "verify once it is done (`walstream backfill status`), or leave the table out "
            "(--table)",
        )


def _repair(
    plan: Plan,
    sink: Any,
    p: Pair,
    check: Verification,
    result: TableResult,
    options: Options,
    say: Callable[[str], None],
) -> None:
    """Re-backfill the keys missing or different in the sink (keyed as `p` says), delete
    a Postgres mirror's rows the source does not have, then keep those still so."""
    schema, _, name = result.table.partition(".")
    if result.extra and sink_kind(sink) == "postgres":
        result.removed = remove_extra(plan, sink, schema, name, result.extra)
        say(f"{result.table}: {result.removed} row(s) only in the sink deleted")
        gone = check.differing(result.extra)
        result.extra = [k for k in result.extra if k in gone]
    keys = [*result.missing, *result.different]
    if not keys:
        return
    joined = p.joined
    asked = keys if joined is None else [(joined(k[0]),) for k in keys]
    what = repair(plan, sink, schema, name, asked, p.key, options.wait * 10, say)
    say(f"{result.table}: {what} delivered: checking the keys again")
    result.repaired = len(keys)
    still = check.differing(keys)
    result.missing = [k for k in result.missing if k in still]
    result.different = [k for k in result.different if k in still]
