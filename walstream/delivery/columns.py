"""Deliver a partition from Arrow columns: the paths with no Python step per message.

`deliver_columns` serves sinks that replace batches (files, pull streams): each Arrow
batch of SQL-formatted messages is written whole. `deliver_ledger_columns` serves a
sink that keeps the ledger (Kafka) on a fresh batch: chunks of `batch_size` rows go to
the sink's own send loop, and anything the sink did not take goes on through the
message path of `deliver.py` (retries, parking, dead letters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from walstream.delivery.deliver import (
    DeliveryPlan,
    Row,
    Settle,
    Stats,
    deliver_chunk,
    deliver_partition,
    messages,
    send,
)
from walstream.errors import SinkError
from walstream.secrets import scrubbed, secret_values
from walstream.sinks.base import BatchInfo, TaskSink
from walstream.sinks.registry import task_sink_for

log = logging.getLogger(__name__)


def deliver_columns(
    plan: DeliveryPlan,
    partition: int,
    batches: Iterable[Any],
    rows: Callable[[Iterable[Any]], Iterable[Row]],
    sink: TaskSink | None = None,
) -> Stats:
    """Deliver a partition to a batch sink as Arrow batches of formatted messages
    (`Route.COLUMNS`).

    Only for sinks that replace batches (no ledger, no parking) and plans without a
    Python transform or tombstones. A batch with a row SQL could not format (its
    `_message` or `_ikey` is NULL) is formatted in Python (`rows` makes Rows of it)
    and delivered message by message, in its place.
    """
    sink = sink or task_sink_for(plan.destination)
    caps = sink.capabilities
    assert caps.columns and not caps.ledger and plan.transform_function is None
    stats = Stats(partition)
    sink.begin(BatchInfo(plan.sink, plan.batch_id, partition, plan.partitions))
    try:
        for batch, whole in _batches(batches, stats):
            if whole:
                sink.deliver_columns(batch)
            else:
                send(sink, list(messages(plan, rows([batch]))), plan)
            n = batch.num_rows
            stats.delivered += n
            stats.last_lsn, stats.last_seq = _at(batch, "lsn", n - 1), _at(batch, "seq", n - 1)
        sink.finish()
    finally:
        sink.close()
    return stats


def _batches(batches: Iterable[Any], stats: Stats) -> Iterator[tuple[Any, bool]]:
    """The non-empty Arrow batches, each with whether SQL formatted every row (no NULL
    `_message` or `_ikey`); counts their newest commit time into `stats`."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        col = dict(zip(batch.schema.names, batch.columns, strict=True))
        stats.max_committed_us = max(stats.max_committed_us, _max_micros(col["committed_at"]))
        yield batch, not (col["_message"].null_count or col["_ikey"].null_count)


def _max_micros(column: Any) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    value = pc.max(column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())).as_py()
    return int(value or 0)


def deliver_ledger_columns(
    plan: DeliveryPlan,
    partition: int,
    batches: Iterable[Any],
    rows: Callable[[Iterable[Any]], Iterable[Row]],
    sink: TaskSink | None = None,
) -> Stats:
    """Deliver a partition to a message sink taking columns that keeps the ledger (Kafka) from Arrow
    columns: each chunk of `batch_size` SQL-formatted rows goes to `deliver_columns` whole,
    with no Python step per message but the sink's own send loop.

    Only the common case takes this path (`Route.LEDGER_COLUMNS`): a fresh batch (the
    ledger holds nothing of it) of a sink with nothing parked, no Python transform and no
    tombstones; a retried task attempt goes row by row (`deliver_partition` asks the
    ledger what the earlier attempt delivered). What the sink did not take of a chunk goes through the message path —
    inline retries, parking, dead letters — exactly as `deliver_partition` would send it,
    and so does everything after a chunk that parked something (its groups are blocked
    now) and any batch with a row SQL could not format. Each chunk is recorded in the
    ledger as `deliver_partition` records it.
    """
    sink = sink or task_sink_for(plan.destination)
    assert sink.capabilities.columns and sink.capabilities.ledger
    assert plan.transform_function is None and not plan.tombstones
    if not (plan.fresh and plan.unblocked):  # a retried attempt (BatchPart.apply)
        return deliver_partition(plan, partition, rows(batches), sink)
    stats = Stats(partition)
    settle = Settle(plan, partition, stats, plan.parking, 0, ledger=True)
    blocked: set[str] = set()
    sink.begin(BatchInfo(plan.sink, plan.batch_id, partition, plan.partitions))
    try:
        for batch, whole in _batches(batches, stats):
            for start in range(0, batch.num_rows, plan.batch_size):
                rows_of = batch.slice(start, plan.batch_size)
                if whole and not blocked:
                    try:
                        sink.deliver_columns(rows_of)
                    except SinkError as raw:
                        exc = scrubbed(raw, secret_values(plan.destination))
                        log.warning(
                            "sink %s: %s; %d of %d message(s) delivered, the rest go through "
                            "retries",
                            plan.sink,
                            exc.problem,
                            len(exc.delivered),
                            rows_of.num_rows,
                        )
                        chunk = list(messages(plan, rows([rows_of])))
                        rest = [m for i, m in enumerate(chunk) if i not in exc.delivered]
                        settle(chunk, deliver_chunk(sink, rest, plan, blocked, stats))
                        continue
                    stats.delivered += rows_of.num_rows
                    last = rows_of.num_rows - 1
                    settle.record((_at(rows_of, "lsn", last), _at(rows_of, "seq", last)))
                    continue
                chunk = list(messages(plan, rows([rows_of])))
                settle(chunk, deliver_chunk(sink, chunk, plan, blocked, stats))
        sink.finish()
    finally:
        sink.close()
    return stats


def _at(batch: Any, name: str, i: int) -> Any:
    return batch.column(batch.schema.get_field_index(name))[i].as_py()
