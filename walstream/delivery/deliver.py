"""Deliver one partition of one micro-batch to one sink, on an executor, in WAL order.

Rows arrive sorted by (lsn, seq), grouped so that every message of a group key is
in this partition. For each chunk of `batch_size` messages: skip what the ledger
says a previous run of this batch already delivered, hand the rest to the sink,
retry retryable failures inline with backoff for up to `retry_timeout` (only the
messages not yet delivered, in order), then record the chunk in the ledger.

When retries run out: a sink that accepted nothing of the chunk is down, and the
task fails (the batch is replayed after the runtime restarts the query; nothing
after it is confirmed to Postgres). Otherwise the failed messages are parked or
become dead letters (`decide.py`), durably and in the same transaction as the
ledger's record, and the batch goes on. Sinks that replace batches (files, streams)
keep no dead letters: any failure fails the batch.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from walstream.backoff import INLINE, Backoff
from walstream.change import ChangeRow, idempotency_key, read_idempotency_key
from walstream.delivery.decide import ParkEntry, outcomes, within_room
from walstream.delivery.ledger import Ledger
from walstream.delivery.parking import DEAD, PARKED, ParkingLot
from walstream.delivery.route import Route
from walstream.errors import ConfigError, SinkError
from walstream.formats import formatter
from walstream.formats.debezium import DebeziumSettings, Records, UnknownTable
from walstream.formats.debezium_types import PgColumn, load_columns, load_key
from walstream.secrets import scrubbed, secret_values
from walstream.sinks.base import BatchInfo, Message, TaskSink
from walstream.sinks.clients import on_source
from walstream.sinks.registry import capabilities, task_sink_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryPlan:
    """Everything an executor needs to deliver a partition (pickled into the task)."""

    sink: str
    destination: Any
    format: str
    db: str
    batch_size: int
    retry_timeout: float
    ledger: Ledger
    query_id: str
    batch_id: int
    partitions: int
    transform_function: str | None = None  # "module:function"
    tombstones: bool = False  # a null-value message after each delete (same key and cursor)
    parking: ParkingLot | None = None  # None: failures fail the batch (sinks that replace batches)
    max_attempts: int = 10
    backoff: Backoff = field(default_factory=Backoff)
    max_parked: int = 100_000
    on_full: str = "pause"  # "discard": past max_parked, what would be parked is dropped
    sink_config: dict[str, Any] | None = None  # snapshot for dead letters, secrets removed
    route: Route = Route.ROWS  # how the tasks deliver (delivery/route.py); per batch
    worker_format: str | None = (
        None  # the worker makes `_message` in this format (formats/, its `arrow` rendering)
    )
    fresh: bool = False  # the ledger holds nothing of this batch: no need to ask it
    unblocked: bool = False  # the sink has nothing parked: no group is blocked
    #: `format: debezium`: the sink's Debezium settings and where its tables' column
    #: types are read (the source; formats/debezium.py).
    debezium: DebeziumSettings | None = None
    source_dsn: SecretStr | None = None


@dataclass
class Stats:
    partition: int
    delivered: int = 0
    skipped: int = 0
    last_lsn: int = -1
    last_seq: int = -1
    max_committed_us: int = 0
    parked: int = 0  # parked by this task (failed, or behind a parked message of the group)
    dead: int = 0  # dead letters at once (not retryable)
    discarded: int = 0  # on_full: discard, past max_parked


def load_function(spec: str) -> Callable[[Any], Any]:
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"transform function {spec!r} cannot be loaded: {exc}",
            "make the module importable on the driver and on every executor (PYTHONPATH)",
        ) from exc
    if not callable(fn):
        raise ConfigError(f"transform {spec!r} is not a function", "point it at a function")
    return fn


#: A change and the pipeline's columns: group key, Kafka key, route, the message when
#: SQL made it (a SQL transform or format), its idempotency key when SQL made it.
Row = tuple[ChangeRow, str | None, str | None, str | None, str | None, str | None]


def messages(plan: DeliveryPlan, rows: Iterable[Row]) -> Iterator[Message]:
    """Change rows (with the pipeline's _group/_key/_route/_message columns) as Messages."""
    fmt = formatter(plan.format, sink=plan.sink, db=plan.db)
    fn = load_function(plan.transform_function) if plan.transform_function else None
    records = _FormatRecords(plan) if fmt is None else None
    for change, group, key, route, message, sql_key in rows:
        message_key = key.encode() if key is not None else None
        table = f"{change.schema}.{change.table}"
        ikey = (
            None
            if change.backfill is None
            else (sql_key or read_idempotency_key(change.backfill, change.pk))
        )
        if records is not None:  # no SQL rendering, no transform (config/sink.py)
            yield from records(change, group or "", message_key, route, ikey)
            continue
        error = None
        if message is not None:
            value: str | None = message
        else:
            assert fmt is not None, f"format {plan.format} makes records, not one message"
            value = fmt(change)
            if fn is not None:
                try:
                    value = json.dumps(fn(json.loads(value)), ensure_ascii=False, default=str)
                except Exception as exc:  # a poison row for this transform: a dead letter
                    error = (
                        f"transform {plan.transform_function} raised {type(exc).__name__}: {exc}"
                    )
        yield Message(
            change.lsn,
            change.seq,
            value.encode() if value is not None else None,
            message_key,
            route,
            table=table,
            action=change.action,
            group=group or "",
            error=error,
            idempotency_override=ikey,
        )
        if plan.tombstones and change.action == "delete":
            # Shares the delete's cursor: delivery never splits the pair across chunks.
            yield Message(
                change.lsn,
                change.seq,
                None,
                message_key,
                route,
                table=table,
                action="tombstone",
                group=group or "",
                part=1,
            )


class _FormatRecords:
    """A format made as records (debezium) as a task's Messages. From the destination:
    whether the format's record key replaces the sink's default key, whether it names each
    record's topic (Kafka with no `topic`), whether the sink takes its tombstones."""

    def __init__(self, plan: DeliveryPlan) -> None:
        assert plan.source_dsn is not None, f"format {plan.format} needs the source's catalog"
        dsn = plan.source_dsn.get_secret_value()

        def catalog(oid: int) -> tuple[list[PgColumn], list[str]]:
            return on_source(dsn, lambda conn: (load_columns(conn, oid), load_key(conn, oid)))

        dest = plan.destination
        self.format = plan.format
        self.records = Records(plan.debezium or DebeziumSettings(), plan.db, catalog)
        self.keys = dest.default_key()
        self.topics = dest.format_routes()
        self.tombstones = capabilities(dest).tombstones

    def __call__(
        self, change: ChangeRow, group: str, key: bytes | None, route: str | None, ikey: str | None
    ) -> Iterator[Message]:
        """A change's records: they share its cursor and (the first) its idempotency key; a
        table gone from the catalog makes the change a dead letter."""
        table = f"{change.schema}.{change.table}"
        try:
            made = self.records(change)
        except UnknownTable as exc:
            yield Message(
                change.lsn,
                change.seq,
                None,
                key,
                route,
                table=table,
                action=change.action,
                group=group,
                error=f"format {self.format}: {exc}",
                idempotency_override=ikey,
            )
            return
        for part, (topic, record) in enumerate(made):
            if record.value is None and not self.tombstones:
                continue
            yield Message(
                change.lsn,
                change.seq,
                record.value,
                record.key if self.keys else key,
                route or (topic if self.topics else None),
                table=table,
                action=change.action if record.value is not None else "tombstone",
                group=group,
                idempotency_override=ikey
                if part == 0
                else idempotency_key(change.lsn, change.seq, part),
                part=part,
            )


def send(sink: TaskSink, chunk: Sequence[Message], plan: DeliveryPlan) -> None:
    """Deliver a chunk, retrying what was not delivered while the error is retryable."""
    _, exc = attempt(sink, chunk, plan)
    if exc is not None:
        raise exc


def attempt(
    sink: TaskSink, chunk: Sequence[Message], plan: DeliveryPlan
) -> tuple[list[int], SinkError | None]:
    """Deliver a chunk with inline retries (retryable errors, up to `retry_timeout`).

    Returns the indices still undelivered, in order, and the last error (None when
    everything was delivered). Only undelivered messages are resent, in order.
    """
    pending = list(range(len(chunk)))
    deadline = time.monotonic() + plan.retry_timeout
    tries = 0
    while True:
        try:
            sink.deliver([chunk[i] for i in pending])
            return [], None
        except SinkError as raw:
            exc = scrubbed(raw, secret_values(plan.destination))  # before it is logged or kept
            pending = [p for k, p in enumerate(pending) if k not in exc.delivered]
            tries += 1
            left = deadline - time.monotonic()
            if not exc.retryable or exc.pause:
                return pending, exc
            if left <= 0:
                return pending, SinkError(
                    f"sink {plan.sink}: still failing after {plan.retry_timeout:g}s and "
                    f"{tries} attempt{'s' if tries > 1 else ''}: {exc.problem}",
                    exc.fix,
                    retryable=True,
                    retry_after=exc.retry_after,
                )
            wait = exc.retry_after or INLINE.delay(tries + 1)
            log.warning(
                "sink %s: %s; %d message(s) pending, retry %d in %.1fs",
                plan.sink,
                exc.problem,
                len(pending),
                tries,
                min(wait, left),
            )
            time.sleep(min(wait, left))


def deliver_partition(
    plan: DeliveryPlan, partition: int, rows: Iterable[Row], sink: TaskSink | None = None
) -> Stats:
    sink = sink or task_sink_for(plan.destination)
    stats = Stats(partition)
    use_ledger = sink.capabilities.ledger
    through = (
        plan.ledger.delivered_through(
            plan.sink, plan.query_id, plan.batch_id, partition, plan.partitions
        )
        if use_ledger and not plan.fresh
        else None
    )
    parking = plan.parking if use_ledger else None
    blocked, parked_before = (
        parking.blocked(plan.sink) if parking and not plan.unblocked else (set(), 0)
    )
    settle = Settle(plan, partition, stats, parking, parked_before, ledger=use_ledger)
    sink.begin(BatchInfo(plan.sink, plan.batch_id, partition, plan.partitions))
    try:
        chunk: list[Message] = []

        def flush() -> None:
            settle(chunk, deliver_chunk(sink, chunk, plan, blocked, stats))
            chunk.clear()

        for m in messages(plan, _track(rows, stats)):
            if through is not None and m.cursor <= through:
                stats.skipped += 1
                continue
            # A full chunk is sent before the next change, never between a delete and its
            # tombstone: the ledger records cursors, and both share one.
            if len(chunk) >= plan.batch_size and chunk[-1].cursor != m.cursor:
                flush()
            chunk.append(m)
        if chunk:
            flush()
        sink.finish()
    finally:
        sink.close()
    return stats


class Settle:
    """After a chunk was delivered: count it, park what failed (within `max_parked`) and
    record the chunk in the ledger — in one transaction when something was parked, so
    that parked rows are durable before a replay's ledger skips them."""

    def __init__(
        self,
        plan: DeliveryPlan,
        partition: int,
        stats: Stats,
        parking: ParkingLot | None,
        parked_before: int,
        ledger: bool,
    ) -> None:
        self.plan, self.partition, self.stats = plan, partition, stats
        self.parking, self.parked_before, self.ledger = parking, parked_before, ledger

    def __call__(self, chunk: Sequence[Message], to_park: list[ParkEntry]) -> None:
        plan, stats = self.plan, self.stats
        stats.delivered += len(chunk) - len(to_park)
        if to_park:
            room = plan.max_parked - self.parked_before - stats.parked
            to_park, dropped = within_room(to_park, room, plan.on_full)
            if dropped:
                stats.discarded += dropped
                log.warning(
                    "sink %s: %d message(s) discarded: max_parked (%d) reached, on_full: discard",
                    plan.sink,
                    dropped,
                    plan.max_parked,
                )
            stats.parked += sum(1 for e in to_park if e[1] == PARKED)
            stats.dead += sum(1 for e in to_park if e[1] == DEAD)
        self.record(chunk[-1].cursor, to_park)

    def record(self, last: tuple[int, int], to_park: list[ParkEntry] | None = None) -> None:
        plan, stats = self.plan, self.stats
        stats.last_lsn, stats.last_seq = last
        if not self.ledger:  # a sink that replaces batches keeps none
            return
        handled = stats.delivered + stats.skipped + stats.parked + stats.dead + stats.discarded
        args = (plan.sink, plan.query_id, plan.batch_id, self.partition, plan.partitions)
        if to_park:
            assert self.parking is not None
            with self.parking.transaction():
                self.parking.park(plan.sink, to_park, plan.sink_config)
                plan.ledger.record(*args, last, handled)
        else:
            plan.ledger.record(*args, last, handled)


def deliver_chunk(
    sink: TaskSink, chunk: list[Message], plan: DeliveryPlan, blocked: set[str], stats: Stats
) -> list[ParkEntry]:
    """Deliver what is not blocked; return what to park, in cursor order.

    Without parking, any failure fails the batch. With it: a sink that accepted none
    of the chunk with a retryable error is down — the batch fails and is retried from
    the slot (nothing is parked for an outage). Otherwise each failed message is
    parked (retryable: its group is blocked from then on) or becomes a dead letter at
    once (not retryable).
    """
    poison = {id(m) for m in chunk if m.error is not None}
    if plan.parking is None or not sink.capabilities.ledger:
        if poison:
            bad = next(m for m in chunk if m.error is not None)
            raise SinkError(
                f"sink {plan.sink}: {bad.error} (change {bad.lsn}:{bad.seq} of {bad.table})",
                "fix the transform; this sink cannot keep dead letters, so the batch fails "
                "until then",
                retryable=False,
            )
        send(sink, chunk, plan)
        return []
    go = [m for m in chunk if m.group not in blocked and id(m) not in poison]
    failed, exc = attempt(sink, go, plan) if go else ([], None)
    if exc is not None and exc.pause:  # the destination said to stop: pause, park nothing
        plan.parking.set_paused(plan.sink, True, exc.problem)
        log.error(
            "sink %s is paused: %s; after fixing it, `walstream resume %s`",
            plan.sink,
            exc.problem,
            plan.sink,
        )
        raise exc  # the batch is replayed after resume; the ledger skips what was sent
    if exc is not None and exc.retryable and len(failed) == len(go):
        raise exc  # the sink accepted nothing: it is down, not this message
    failed_ids = {id(go[i]) for i in failed}
    out = outcomes(chunk, blocked, poison, failed_ids, exc, plan.backoff)
    if out:
        log.warning(
            "sink %s: %d message(s) parked or dead-lettered in batch %d: %s",
            plan.sink,
            len(out),
            plan.batch_id,
            exc.problem if exc else "a transform failed, or their group is blocked",
        )
    return out


def _track(rows: Iterable[Row], stats: Stats) -> Iterator[Row]:
    for r in rows:
        if r[0].committed_at_us > stats.max_committed_us:
            stats.max_committed_us = r[0].committed_at_us
        yield r
