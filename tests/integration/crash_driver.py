"""A Spark driver for the crash tests: stream a slot into one file per batch, until killed.

    python crash_driver.py DSN SLOT PUBLICATION CHECKPOINT OUTDIR [MAX_CHANGES]

With WALSTREAM_TEST_KILL_AFTER_BATCH=N the sink kills its own process group right
after writing the first non-empty batch with id >= N, before Spark records the
batch as committed: the "between sink write and commit" crash.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import walstream
from walstream.config import parse_config
from walstream.engine.session import spark_conf, spark_environment
from walstream.source.checkpoint import remove_partial_writes


def main() -> None:
    dsn, slot, pub, checkpoint, outdir = sys.argv[1:6]
    max_changes = sys.argv[6] if len(sys.argv) > 6 else "2000"
    kill_after = int(os.environ.get("WALSTREAM_TEST_KILL_AFTER_BATCH", "-1"))
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    spark_environment("local[2]")
    # walstream's own settings for a local master (its saved classes: a faster start)
    config = parse_config({
        "spark": {"master": "local[2]", "checkpoint_dir": checkpoint},
        "sources": [{"name": "app", "dsn": dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "out", "source": "app",
                   "destination": {"type": "file", "path": outdir}}],
    })  # fmt: skip
    builder = SparkSession.builder.master("local[2]")
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    walstream.register(spark)
    remove_partial_writes(checkpoint)  # a previous kill may have interrupted batch 0's offsets
    df = (
        spark.readStream.format("walstream")
        .option("dsn", dsn).option("slot", slot).option("publication", pub)
        .option("maxChangesPerBatch", max_changes).option("heartbeatInterval", "1")
        .load()
    )  # fmt: skip

    def sink(batch, batch_id: int) -> None:
        rows = batch.select("lsn", "seq", "action", "pk", "record").collect()
        if not rows:
            return
        # one file per delivery; a replayed batch id gets a second file
        n = len(list(out.glob(f"batch-{batch_id:06d}-*.jsonl")))
        tmp = out / f".tmp-{batch_id}-{n}"
        with tmp.open("w") as f:
            for r in rows:
                f.write(json.dumps([r.lsn, r.seq, r.action, r.pk, r.record]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(out / f"batch-{batch_id:06d}-{n}.jsonl")
        if kill_after >= 0 and batch_id >= kill_after:
            os.killpg(os.getpgid(0), signal.SIGKILL)  # the JVM and workers too

    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    print("READY", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
