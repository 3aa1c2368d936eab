"""Deliver one partition of one micro-batch to one sink, on an executor, in WAL order.

Rows arrive sorted by (lsn, seq), grouped so that every message of a group key is
in this partition. For each chunk of `batch_size` messages: skip what the ledger
says a previous run of this batch already delivered, hand the rest to the sink,
retry retryable failures inline with backoff for up to `retry_timeout` (only the
messages not yet delivered, in order), then record the chunk in the ledger.
When retries run out, or the error is not retryable, the task fails with that
error: the micro-batch fails, nothing after it is confirmed to Postgres, and the
runtime restarts the query, which replays the batch.
"""

from __future__ import annotations

import importlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from walstream.change import ChangeRow
from walstream.delivery.ledger import Ledger
from walstream.errors import ConfigError, SinkError
from walstream.formats import formatter
from walstream.sinks.base import BatchInfo, Message, Sink
from walstream.sinks.registry import sink_for

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


@dataclass
class Stats:
    partition: int
    delivered: int = 0
    skipped: int = 0
    last_lsn: int = -1
    last_seq: int = -1
    max_committed_us: int = 0


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


#: A change and the pipeline's columns: group key, Kafka key, route, transformed message.
Row = tuple[ChangeRow, str | None, str | None, str | None, str | None]


def messages(plan: DeliveryPlan, rows: Iterable[Row]) -> Iterator[Message]:
    """Change rows (with the pipeline's _group/_key/_route/_message columns) as Messages."""
    fmt = formatter(plan.format, sink=plan.sink, db=plan.db)
    fn = load_function(plan.transform_function) if plan.transform_function else None
    for change, group, key, route, message in rows:
        if message is not None:
            value: str | None = message
        else:
            value = fmt(change)
            if fn is not None:
                value = json.dumps(fn(json.loads(value)), ensure_ascii=False, default=str)
        message_key = key.encode() if key is not None else None
        table = f"{change.schema}.{change.table}"
        yield Message(
            change.lsn, change.seq, value.encode() if value is not None else None,
            message_key, route, table=table, action=change.action, group=group or "",
        )  # fmt: skip
        if plan.tombstones and change.action == "delete":
            # Shares the delete's cursor: delivery never splits the pair across chunks.
            yield Message(
                change.lsn, change.seq, None, message_key, route,
                table=table, action="tombstone", group=group or "",
            )  # fmt: skip


def send(sink: Sink, chunk: Sequence[Message], plan: DeliveryPlan) -> None:
    """Deliver a chunk, retrying what was not delivered while the error is retryable."""
    pending = list(chunk)
    deadline = time.monotonic() + plan.retry_timeout
    attempt = 0
    while True:
        try:
            sink.deliver(pending)
            return
        except SinkError as exc:
            if not exc.retryable:
                raise
            pending = [m for i, m in enumerate(pending) if i not in exc.delivered]
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise SinkError(
                    f"sink {plan.sink}: still failing after {plan.retry_timeout:g}s and "
                    f"{attempt} attempt{'s' if attempt > 1 else ''}: {exc.problem}",
                    exc.fix,
                    retryable=True,
                ) from exc
            wait = exc.retry_after or min(0.25 * 2**attempt, 5.0) * random.uniform(0.8, 1.2)
            log.warning(
                "sink %s: %s; %d message(s) pending, retry %d in %.1fs",
                plan.sink, exc.problem, len(pending), attempt, min(wait, left),
            )  # fmt: skip
            time.sleep(min(wait, left))


def deliver_partition(
    plan: DeliveryPlan, partition: int, rows: Iterable[Row], sink: Sink | None = None
) -> Stats:
    sink = sink or sink_for(plan.destination)
    stats = Stats(partition)
    use_ledger = not sink.replaces_batches
    through = (
        plan.ledger.delivered_through(
            plan.sink, plan.query_id, plan.batch_id, partition, plan.partitions
        )
        if use_ledger
        else None
    )
    sink.begin(BatchInfo(plan.sink, plan.batch_id, partition, plan.partitions))
    try:
        chunk: list[Message] = []

        def flush() -> None:
            send(sink, chunk, plan)
            last = chunk[-1]
            stats.delivered += len(chunk)
            stats.last_lsn, stats.last_seq = last.lsn, last.seq
            if use_ledger:
                plan.ledger.record(
                    plan.sink, plan.query_id, plan.batch_id, partition, plan.partitions,
                    last.cursor, stats.delivered + stats.skipped,
                )  # fmt: skip
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


def _track(rows: Iterable[Row], stats: Stats) -> Iterator[Row]:
    for r in rows:
        if r[0].committed_at_us > stats.max_committed_us:
            stats.max_committed_us = r[0].committed_at_us
        yield r
