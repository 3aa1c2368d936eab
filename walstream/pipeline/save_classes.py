"""Save Spark's classes for faster starts (see `classes.py`): `python -m walstream.pipeline.save_classes`.

`build_archive` runs, in a child process, a small job of the kinds walstream runs (SQL
message formats, `mapInArrow`, the registered data source, a streaming query of a Python
data source into a `foreachBatch`) in a JVM that writes the class data sharing archive
as it exits; the archive is renamed into place whole.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from walstream.engine.classes import QUIET, archive_path
from walstream.engine.session import find_java

log = logging.getLogger(__name__)

#: Archives kept in the cache, newest first (each virtualenv's jars have their own).
KEEP = 3


def build_archive(force: bool = False) -> Path | None:
    """Write the archive (in a child process: its JVM writes it when it exits); its path,
    or None when it could not be written (the reason is logged)."""
    path = archive_path(find_java())
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "walstream.pipeline.save_classes", "--job", str(partial)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WALSTREAM_CLASS_ARCHIVE": "off"},  # it writes one, uses none
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        log.warning(
            "could not save Spark's classes for faster starts (%s); walstream runs without",
            (done.stderr.strip().splitlines() or ["no output"])[-1],
        )
        return None
    partial.replace(path)  # whole, or not there: a JVM never maps a half-written one
    log.info("saved Spark's classes in %s (%.0fs)", path, time.monotonic() - t0)
    _prune(path.parent)
    return path


def _prune(folder: Path) -> None:
    """Keep the KEEP newest archives (~160 MB each): one per Java and PySpark install."""
    saved = sorted(folder.glob("spark-*.jsa"), key=lambda f: f.stat().st_mtime, reverse=True)
    for old in saved[KEEP:]:
        old.unlink(missing_ok=True)
        log.info("removed an older archive of Spark's classes: %s", old)


def _job(target: Path) -> None:
    """The representative job, in a JVM that writes the archive to `target` at exit."""
    from walstream.config import parse_config
    from walstream.engine.session import build_spark
    from walstream.formats import sql_format
    from walstream.formats.keys import sql_idempotency_key
    from walstream.source.datasource import register

    cfg = parse_config(
        {
            "spark": {
                "master": "local[1]",
                "conf": {
                    "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target} {QUIET}",
                },
            },
            "sources": [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:1/app"}],
            "sinks": [
                {
                    "name": "out",
                    "source": "app",
                    "destination": {"type": "file", "path": "/nonexistent"},
                }
            ],
        }
    )
    spark = build_spark(cfg)
    register(spark)
    rows = spark.range(0, 1000).selectExpr(
        "'app' AS source",
        "id AS lsn",
        "CAST(id % 7 AS INT) AS seq",
        "id AS xid",
        "timestamp_micros(id) AS committed_at",
        "'insert' AS action",
        "'public' AS schema",
        "'t' AS table",
        "array(CAST(id AS STRING)) AS pk",
        "to_json(named_struct('id', id)) AS record",
        "CAST(NULL AS STRING) AS old",
        "CAST(NULL AS STRING) AS annotations",
    )
    for name in ("sequin", "record"):
        message = sql_format(name, sink="out", db="app", backfill=False)
        ikey = sql_idempotency_key(False)
        out = rows.selectExpr("*", f"{message} AS _message", f"{ikey} AS _ikey").repartition(2)

        def same(batches: object) -> object:
            yield from batches  # type: ignore[misc]

        out.mapInArrow(same, out.schema).where("lsn % 100 = 0").collect()
    try:
        _stream(spark)
    except Exception as exc:  # the archive still helps, with fewer of the query's classes
        print(f"the streaming query failed: {exc}", file=sys.stderr)
    spark.stop()


def _stream(spark: Any) -> None:
    """A streaming query of a Python data source into a `foreachBatch` for three batches:
    the classes of a query's start and of its first batches (MicroBatchExecution, the
    offset and commit logs, the Python streaming source, ForeachBatchSink)."""
    import tempfile

    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"n": start["n"] + 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return [InputPartition(end["n"])]

        def read(self, partition: Any) -> Any:
            yield from ((partition.value * 10 + i,) for i in range(10))

    class Ticks(DataSource):
        @classmethod
        def name(cls) -> str:
            return "walstream_ticks"

        def schema(self) -> str:
            return "id long"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    spark.dataSource.register(Ticks)
    seen: list[int] = []

    def batch(df: Any, batch_id: int) -> None:
        df.selectExpr("id", "to_json(named_struct('id', id)) AS _message").collect()
        seen.append(batch_id)

    with tempfile.TemporaryDirectory() as ckpt:
        q = (
            spark.readStream.format("walstream_ticks")
            .load()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", ckpt)
            .trigger(processingTime="0 seconds")
            .start()
        )
        deadline = time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline and q.isActive:
            time.sleep(0.1)
        q.stop()
    if len(seen) < 3:  # the archive still helps, with fewer of the query's classes
        print(f"the streaming query ran {len(seen)} of 3 batches", file=sys.stderr)


def main() -> None:
    if sys.argv[1:2] == ["--job"]:
        _job(Path(sys.argv[2]))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(0 if build_archive(force="--force" in sys.argv) else 1)


if __name__ == "__main__":
    main()
