"""The executor side of delivery: the mapInArrow function that delivers one partition.

Each task reads its partition's Arrow batches (change columns plus the pipeline's
extras), delivers them in order, and yields one row of counts (`STATS_DDL`) for the
driver, by the batch's route (`delivery/route.py`): `deliver_columns` (a batch sink
taking the Arrow batches themselves), `deliver_ledger_columns` (a message sink taking
them, Kafka, on a fresh batch) or message by message (`deliver_partition`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from walstream.change import ChangeRow
from walstream.delivery.columns import deliver_columns, deliver_ledger_columns
from walstream.delivery.deliver import DeliveryPlan, Row, deliver_partition
from walstream.delivery.route import Route
from walstream.formats import batch_messages
from walstream.nopandas import no_pandas
from walstream.sinks.registry import task_sink_for

STATS_DDL = (
    "partition INT, delivered BIGINT, skipped BIGINT, last_lsn BIGINT, last_seq INT, "
    "max_committed_us BIGINT, parked BIGINT, dead BIGINT, discarded BIGINT"
)


def deliver_arrow(plan: DeliveryPlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: deliver this task's partition, yield one row of counts."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        sink = task_sink_for(plan.destination)
        if plan.worker_format is not None:
            batches = with_messages(plan, batches)
        rows = lambda b: _rows(b, pa)  # noqa: E731
        if plan.route is Route.COLUMNS:
            stats = deliver_columns(plan, partition, batches, rows, sink)
        elif plan.route is Route.LEDGER_COLUMNS:
            stats = deliver_ledger_columns(plan, partition, batches, rows, sink)
        else:
            stats = deliver_partition(plan, partition, _rows(batches, pa), sink)
        with no_pandas():
            counts = pa.RecordBatch.from_pylist([vars(stats)], schema=_stats_schema(pa))
        yield counts

    return run


def with_messages(plan: DeliveryPlan, batches: Iterable[Any]) -> Iterator[Any]:
    """Each Arrow batch with its `_message` column, made in `plan.worker_format`."""
    assert plan.worker_format is not None
    for batch in batches:
        made = batch_messages(plan.worker_format, batch, sink=plan.sink, db=plan.db)
        yield batch.append_column("_message", made)


def _stats_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("partition", pa.int32()),
            ("delivered", pa.int64()),
            ("skipped", pa.int64()),
            ("last_lsn", pa.int64()),
            ("last_seq", pa.int32()),
            ("max_committed_us", pa.int64()),
            ("parked", pa.int64()),
            ("dead", pa.int64()),
            ("discarded", pa.int64()),
        ]
    )


_EXTRAS = ("_group", "_key", "_route", "_message", "_ikey")


def _rows(batches: Iterable[Any], pa: Any) -> Iterator[Row]:
    """Arrow batches of change columns (+ the pipeline's extras) as Rows, column-wise."""
    for batch in batches:
        cols = dict(zip(batch.schema.names, batch.columns, strict=True))
        cols["committed_at_us"] = cols.pop("committed_at").cast(pa.int64())
        none = [None] * batch.num_rows
        fields = zip(
            *(cols[f].to_pylist() if f in cols else none for f in ChangeRow._fields), strict=True
        )
        extras = [cols[x].to_pylist() if x in cols else none for x in _EXTRAS]
        yield from zip(map(ChangeRow._make, fields), *extras, strict=True)
