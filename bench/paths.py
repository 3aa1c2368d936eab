"""Spark's own ceilings for a backlog: how fast the source's changes can reach a Python
task at all, by each path, before walstream builds or sends a message.

    .venv/bin/python -m bench.paths [--changes 300000] [--paths jvm,delivery,all,raw]

Each path reads the same backlog (CHANGES inserts into bench.stream's 8-column table,
100 rows per transaction) from a slot of its own into a `foreachBatch`; changes/s from
the end of the first batch with changes to the last, against `pg_recvlogical` on
the same backlog:

- `jvm`: `batch.count()`. The source's Python worker decodes and hands Arrow to the
  JVM; nothing goes back to Python. The ceiling of the source itself.
- `delivery`: the columns a message sink's task reads (Kafka's: every change column
  but `pk` and `unchanged_toast`) through a counting `mapInArrow`. The ceiling of
  walstream's delivery path before the message columns and the produce loop.
- `all`: every column through a counting `mapInArrow`, as a user's Python UDF over
  `format("walstream")` reads them.
- `raw`: the source's partitions themselves (the raw WAL slices, one binary row per
  task) decoded into canonical Arrow batches inside the counting `mapInArrow`: what
  a design that hands Python the slices instead of rows could reach.

The first path also warms the JVM up; run it first. docs/performance-log.md has figures.
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cpu import cpu_by_group
from bench.results import figure
from bench.stream import TABLE, recvlogical, write
from walstream.change import CHANGE_COLUMNS, parse_lsn
from walstream.config import parse_config
from walstream.engine.session import build_spark
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.source.datasource import WalstreamDataSource, WalstreamStreamReader
from walstream.source.options import SourceOptions

#: The columns of `delivery` (walstream.pipeline.expressions.delivery_columns for Kafka).
DELIVERY = [c for c in CHANGE_COLUMNS if c not in ("pk", "unchanged_toast", "table_oid")]
PATHS = ("jvm", "delivery", "all", "raw")


class _SlicesReader(WalstreamStreamReader):
    def read(self, partition: Any) -> Iterator[Any]:
        import pyarrow as pa

        blob = pa.array([pickle.dumps(partition)], pa.binary())
        yield pa.RecordBatch.from_arrays([blob], ["slices"])


class SlicesSource(WalstreamDataSource):
    """The walstream source with one binary row per task: its partition, pickled."""

    @classmethod
    def name(cls) -> str:
        return "walstream_slices"

    def schema(self) -> str:
        return "slices binary"

    def streamReader(self, schema: Any) -> _SlicesReader:
        return _SlicesReader(SourceOptions.parse(self.options))


def _count(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], ["n"])


def _decode_count(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    from walstream.source.partition import partition_batches

    n = 0
    for b in batches:
        for blob in b.column(0).to_pylist():
            n += sum(a.num_rows for a in partition_batches(pickle.loads(blob)))
    yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], ["n"])


def counted(path: str, batch: Any) -> int:
    if path == "jvm":
        return int(batch.count())
    if path == "raw":
        return sum(r.n for r in batch.mapInArrow(_decode_count, "n long").collect())
    cols = DELIVERY if path == "delivery" else list(CHANGE_COLUMNS)
    return sum(r.n for r in batch.select(*cols).mapInArrow(_count, "n long").collect())


def drain(
    spark: Any, dsn: str, path: str, changes: int, work: Path
) -> tuple[float, dict[str, float]]:
    """Changes/s of `path` on its slot, from the end of its first batch with changes, and
    each process group's CPU µs per change over the same span."""
    seen, first = 0, (0.0, 0)
    cpu: dict[str, float] = {}

    def sink(batch: Any, _: int) -> None:
        nonlocal seen, first, cpu
        n = counted(path, batch)
        if n and not first[0]:
            first = (time.perf_counter(), n)
            cpu = cpu_by_group()
        seen += n

    q = (
        spark.readStream.format("walstream_slices" if path == "raw" else "walstream")
        .option("dsn", dsn).option("slot", path).option("publication", "bench")
        .option("maxChangesPerBatch", "200000").load()
        .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / path))
        .trigger(processingTime="0 seconds").start()
    )  # fmt: skip
    try:
        while seen < changes:
            if q.exception() is not None:
                raise SystemExit(f"path {path} failed: {q.exception()}")
            time.sleep(0.02)
        end, after = time.perf_counter(), cpu_by_group()
    finally:
        q.stop()
    n = changes - first[1]
    return n / (end - first[0]), {g: (after[g] - cpu[g]) / n * 1e6 for g in cpu}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--paths", default=",".join(PATHS), help="which paths, in this order")
    args = ap.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := set(paths) - set(PATHS):
        raise SystemExit(f"unknown path(s) {', '.join(sorted(unknown))}: use {', '.join(PATHS)}")
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-paths-"))
    with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
        dsn = pg.dsn()
        with connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history")
            for slot in ("reference", *paths):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            write(conn, 1, args.changes, 100)
            until = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        reference = args.changes / recvlogical(pg, "reference", until)
        print(f"pg_recvlogical: {reference:,.0f} changes/s")
        cfg = parse_config({
            "spark": {"master": "local[2]", "checkpoint_dir": str(work / "checkpoints"),
                      "conf": {"spark.driver.memory": "2g"}},
            "sources": [{"name": "bench", "dsn": dsn}],
            "sinks": [{"name": "unused", "source": "bench",
                       "destination": {"type": "file", "path": str(work / "unused")}}],
        })  # fmt: skip
        spark = build_spark(cfg)
        try:
            spark.dataSource.register(WalstreamDataSource)
            spark.dataSource.register(SlicesSource)
            for path in paths:
                rate, cpu = drain(spark, dsn, path, args.changes, work)
                print(f"{path:<9}{rate:>10,.0f} changes/s  {rate / reference:.2f}x pg_recvlogical"
                      f"  CPU µs/change: JVM {cpu['driver JVM']:.1f}, Spark's Python "
                      f"{cpu['Spark Python processes']:.1f}, capture "
                      f"{cpu['walstream driver (Python)']:.1f}")  # fmt: skip
                figure("paths", f"{path}: changes/s", rate, "changes/s",
                       reference="pg_recvlogical to /dev/null", reference_value=reference)  # fmt: skip
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
