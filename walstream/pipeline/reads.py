"""Backfill rows delivered straight from their staged chunks: one task per chunk, no Spark SQL.

In a batch that places backfill chunks, a read row whose key has no change in the
batch is ordered with nothing: it can be delivered where it was staged. For a
batch sink taking columns (files, pull streams) whose messages are its format's as
they are (`Route.STAGED_CHUNKS`, see `delivery/route.py`) and a format `ReadTemplate` can cut, each such chunk is one task that reads
its staged file with pyarrow, drops the rows the DBLog rule drops (`backfill/dblog.py`), leaves out the rows whose key the batch
changes (those go through Spark with the batch's changes, in order), builds the
messages in Arrow (`formats/template.py`) and hands them to the sink.

The windows' changed keys and the batch's groups travel to the tasks as sets: they
are bounded (`LIMIT`), and past that, or when an update in a window moved a key,
every read row goes through Spark as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from walstream.backfill.dblog import dropped, key_of
from walstream.backfill.typed import ReadRows, TypedChunk
from walstream.config import SinkConfig
from walstream.delivery.columns import deliver_columns
from walstream.delivery.deliver import DeliveryPlan, Stats
from walstream.formats.keys import group_keys
from walstream.formats.template import ReadTemplate, read_batch

#: Up to this many window changes and batch groups are sent to the tasks as sets.
LIMIT = 250_000
#: Rows per Arrow batch a task reads and delivers (one row group of the file sink).
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class Direct:
    """What the chunk tasks need besides the plan."""

    chunks: tuple[tuple[TypedChunk, ReadTemplate], ...]
    changed: dict[tuple[int, int], frozenset[str]]  # chunk -> its window's changed keys
    truncated: frozenset[tuple[int, int]]
    tied: frozenset[str]  # groups the batch's changes have: their read rows go with them


def plan_direct(
    reads: ReadRows, sink: SinkConfig, plan: DeliveryPlan, source: str, groups: Any
) -> Direct | None:
    """The direct delivery of `reads`, or None when Spark must place them (a key moved in
    a window, too many changes to send as sets, a format with no template). `groups`:
    the batch's changes as the sink's prepared rows (`_group`)."""
    if reads.moved or reads.changed + reads.cut > LIMIT:
        return None
    chunks = []
    for c in reads.chunks:
        if not sink.wants_table(c.schema, c.table):
            continue
        template = ReadTemplate.of(
            plan.format,
            sink=plan.sink,
            db=plan.db,
            source=source,
            schema=c.schema,
            table=c.table,
            backfill=c.backfill,
            lsn=c.lsn,
            committed_us=c.committed_us,
        )
        if template is None:
            return None
        chunks.append((c, template))
    tied: frozenset[str] = frozenset()
    found = groups.select("_group").distinct().limit(LIMIT + 1).collect()
    if len(found) > LIMIT:
        return None
    tied = frozenset(r[0] for r in found)
    changed: dict[tuple[int, int], set[str]] = {}
    truncated = set()
    if reads.changed or reads.cut:
        for r in reads.inside.selectExpr("backfill", "chunk", "action", "pk").collect():
            if r.action == "truncate":
                truncated.add((r.backfill, r.chunk))
            elif r.pk is not None:
                changed.setdefault((r.backfill, r.chunk), set()).add(key_of(r.pk))
    return Direct(
        tuple(chunks), {k: frozenset(v) for k, v in changed.items()}, frozenset(truncated), tied
    )


def tied_rows(reads: Any, groups: Any) -> Any:
    """The read rows (a prepared DataFrame) whose group the batch's changes have."""
    from pyspark.sql import functions as F

    keys = F.broadcast(groups.selectExpr("_group AS _tied").distinct())
    return reads.join(keys, F.col("_group") == F.col("_tied"), "left_semi")


def deliver_direct(spark: Any, direct: Direct, plan: DeliveryPlan, first: int) -> list[Stats]:
    """Deliver each chunk's free rows in its own task, as partition `first + i`."""
    if not direct.chunks:
        return []
    jobs = list(enumerate(direct.chunks))
    rdd = spark.sparkContext.parallelize(jobs, len(jobs))
    ship = replace(direct, chunks=())  # each task gets its own chunk with the job's row

    def run(part: Iterator[tuple[int, tuple[TypedChunk, ReadTemplate]]]) -> Iterator[Stats]:
        for i, (chunk, template) in part:
            yield deliver_chunk(ship, chunk, template, plan, first + i)

    return list(rdd.mapPartitions(run).collect())


def deliver_chunk(
    direct: Direct, chunk: TypedChunk, template: ReadTemplate, plan: DeliveryPlan, partition: int
) -> Stats:
    """One chunk's rows that are neither dropped nor tied, to the sink, as one partition."""
    return deliver_columns(plan, partition, _batches(direct, chunk, template), _no_rows, None)


def _batches(direct: Direct, chunk: TypedChunk, template: ReadTemplate) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    at = (chunk.backfill, chunk.chunk)
    if at in direct.truncated:
        return
    changed = pa.array(sorted(direct.changed.get(at, ())), pa.string())
    tied = pa.array(sorted(direct.tied), pa.string())
    filesystem, path = pafs.FileSystem.from_uri(chunk.path)
    with filesystem.open_input_file(path) as f:
        staged = pq.ParquetFile(f)
        for batch in staged.iter_batches(BATCH_ROWS, columns=["pk", "record", "ord"]):
            rows = pa.Table.from_batches([batch])
            drop = dropped(rows["pk"], changed)
            if len(tied):
                with_batch = pc.is_in(
                    group_keys(chunk.schema, chunk.table, rows["pk"]), value_set=tied
                )
                drop = with_batch if drop is None else pc.or_(drop, with_batch)
            if drop is not None:
                rows = rows.filter(pc.invert(drop))
            if rows.num_rows:
                yield read_batch(
                    template,
                    rows,
                    schema=chunk.schema,
                    table=chunk.table,
                    lsn=chunk.lsn,
                    high_seq=chunk.seq,
                    committed_us=chunk.committed_us,
                )


def _no_rows(batches: Any) -> Any:
    raise AssertionError("read rows built in Arrow have every message and key")


def with_reads(stream: Any, reads: Any, sink: SinkConfig, partitions: int) -> Any:
    """The batch's changes and backfill rows, each group in one partition in WAL order.

    A read row shares its group with no other read row when groups are rows (the
    default): only read rows whose group also has stream changes in this batch must
    be ordered with them (shuffled by group). The others are delivered where they
    were read (their partitions follow the grouped ones), sorted in place — a
    chunk's rows are not shuffled. With a `group_by` that spans rows, all are grouped.
    """
    from pyspark.sql import functions as F

    if sink.group_by or sink.destination.group_by():
        return grouped(stream.unionByName(reads), partitions)
    changes = stream.count()
    free = reads.sortWithinPartitions("lsn", "seq")
    if changes == 0:
        return free
    if changes > TIED_ROWS:
        return grouped(stream.unionByName(reads), partitions)
    groups = F.broadcast(stream.selectExpr("_group AS _tied").distinct())
    on = F.col("_group") == F.col("_tied")
    tied = reads.join(groups, on, "left_semi")
    free = reads.join(groups, on, "left_anti").sortWithinPartitions("lsn", "seq")
    return grouped(stream.unionByName(tied), partitions).union(free)


#: Up to this many stream changes in a batch with backfill rows, their group keys are
#: broadcast to pick the read rows that must be ordered with them.
TIED_ROWS = 250_000


def grouped(df: Any, partitions: int) -> Any:
    """Spread by group key, each partition in WAL order."""
    return df.repartition(partitions, "_group").sortWithinPartitions("lsn", "seq")
