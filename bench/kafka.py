"""`walstream run` into Kafka (tansu): throughput against what Postgres can send, and latency.

    .venv/bin/python -m bench.kafka [--changes 1000000] [--latency-seconds 30] [--rate 5000]

1. Writes CHANGES inserts (8 columns, 100 rows per transaction) while two slots
   exist: one for walstream, one for the reference.
2. Reference: `pg_recvlogical` reads the second slot to /dev/null (C, pgoutput).
3. walstream: the Runtime of `walstream run` with one Kafka sink (sequin format,
   topic routed by table, acks=all, idempotent producer) into a tansu broker on
   this machine; changes/s from the first delivered batch until all are acknowledged.
4. Latency: a writer at a steady RATE changes/s (50-row transactions) into a
   second table, routed to its own topic; for every message, Kafka's timestamp
   (set when walstream produced it) minus the change's commit timestamp; p50 / p99.
5. The floor, measured first in the same Spark session: the same source on its own
   slot into a no-op foreachBatch that only collects each change's commit time, at
   the same rate; commit → the driver holding the batch, p50 / p99. The target for
   Kafka's p50 is 1.5x this floor (what walstream adds to Spark's own micro-batch).
6. Peak RSS of the driver JVM and of the Python processes.

Postgres, Spark, the broker and this script share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import sql

from bench.cpu import cpu_by_group, print_breakdown
from bench.results import figure
from bench.stream import TABLE, peak_rss_mb, recvlogical, write
from walstream.change import parse_lsn
from walstream.config import parse_config
from walstream.engine.session import build_spark
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.testing import TansuBroker, TopicReader

PROBE = "CREATE TABLE {} (id bigint PRIMARY KEY, at timestamptz, note text);"


def steady(dsn: str, table: str, rate: int, seconds: float, first: int = 0, per: int = 50) -> int:
    """Insert `rate` rows/s into `table` (ids from `first`) in `per`-row transactions for
    `seconds`; rows written.

    Commits with synchronous_commit on, as production does: the bench server runs
    with it off for the bulk writes, and then the walsender sends a commit only after
    the WAL writer flushed it (wal_writer_delay, 200 ms), Postgres' delay, not ours.
    """
    written = 0
    with connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, now(), 'x' FROM generate_series(%s::bigint, %s::bigint) g"
                ).format(sql.Identifier(table)),
                (first + written, first + written + per - 1),
            )
            written += per
            ahead = written / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
    return written


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in ms."""
    lat = sorted(seconds)
    if not lat:
        return float("nan"), float("nan")
    return statistics.median(lat) * 1000, lat[max(0, int(len(lat) * 0.99) - 1)] * 1000


def phases(query: Any, last: int = 50) -> dict[str, float]:
    """Median milliseconds of each phase of the query's last batches that held data
    (Spark's durationMs: latestOffset, walCommit, queryPlanning, addBatch, commitOffsets)."""
    seen: dict[str, list[float]] = {}
    batches = [p for p in query.recentProgress if p["numInputRows"]][-last:]
    for p in batches:
        for k, v in p["durationMs"].items():
            seen.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in seen.items()}


def floor_latencies(
    spark: Any, dsn: str, rate: int, seconds: float, work: Path
) -> tuple[list[float], dict[str, float]]:
    """Commit → driver for the same source into a no-op foreachBatch (Spark's micro-batch
    floor): slot `floor` on table `probe_floor`, after a warm-up."""
    import walstream

    with connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('floor', 'pgoutput')")
    walstream.register(spark)
    measuring = threading.Event()
    out: list[float] = []
    seen = 0

    def sink(batch: Any, _: int) -> None:
        nonlocal seen
        stamps = [r.committed_at for r in batch.select("committed_at").collect()]
        now = time.time()
        seen += len(stamps)
        if measuring.is_set():
            out.extend(now - t.replace(tzinfo=UTC).timestamp() for t in stamps)

    q = (
        spark.readStream.format("walstream").option("dsn", dsn).option("slot", "floor")
        .option("publication", "floor").load()
        .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "floor"))
        .trigger(processingTime="0 seconds").start()
    )  # fmt: skip

    def caught_up(n: int) -> None:
        deadline = time.monotonic() + 120
        while seen < n and time.monotonic() < deadline:
            if q.exception():
                raise SystemExit(f"floor query failed: {q.exception()}")
            time.sleep(0.05)

    try:
        # Warm up: the query starts while rows arrive; once it caught up, a few more
        # seconds at the rate, then measure.
        written = steady(dsn, "probe_floor", rate, 5)
        caught_up(written)
        written += steady(dsn, "probe_floor", rate, 5, first=written)
        measuring.set()
        written += steady(dsn, "probe_floor", rate, seconds, first=written)
        caught_up(written)
        spent = phases(q)
    finally:
        q.stop()
    with connect(dsn, autocommit=True) as conn:
        # the source's replication connection closes a moment after the query stops
        deadline = time.monotonic() + 30
        while conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'floor'"
        ).fetchone()[0] and time.monotonic() < deadline:  # fmt: skip
            time.sleep(0.1)
        conn.execute("SELECT pg_drop_replication_slot('floor')")
    return out, spent


def delivered(runtime: Runtime) -> int:
    p = runtime.progress().get("kafka")
    return 0 if p is None else p.delivered + p.skipped


def wait_for(runtime: Runtime, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while delivered(runtime) < n:
        runtime.poll()
        if runtime.fatal is not None:
            raise SystemExit(f"walstream stopped: {runtime.fatal}")
        if time.monotonic() > deadline:
            raise SystemExit(f"only {delivered(runtime):,} of {n:,} delivered after {timeout:.0f}s")
        time.sleep(0.02)


def kafka_latencies(bootstrap: str, topic: str, n: int, timeout: float = 60) -> list[float]:
    """Seconds from commit to Kafka timestamp for the first n messages of `topic`."""
    reader = TopicReader(bootstrap, topic)
    out: list[float] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            for m in reader.consume(1000, 0.5):
                message = json.loads(m.value())
                if "metadata" in message:  # sequin
                    committed = message["metadata"]["commit_timestamp"]
                    commit_s = datetime.fromisoformat(committed.replace("Z", "+00:00")).timestamp()
                else:  # debezium (milliseconds)
                    commit_s = message["source"]["ts_ms"] / 1000
                out.append(m.timestamp()[1] / 1000 - commit_s)
    finally:
        reader.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=5000, help="changes/s for the latency run")
    ap.add_argument("--max-batch", type=int, default=200_000, help="max_changes_per_batch")
    ap.add_argument(
        "--partition-bytes", type=int, default=None,
        help="source partition_bytes (default: walstream's); 1000000000 puts a batch in one task",
    )  # fmt: skip
    ap.add_argument(
        "--spark-conf", type=json.loads, default={},
        help='JSON of spark.conf settings over walstream\'s, e.g. \'{"spark.driver.extraJavaOptions": '
        '"-XX:TieredStopAtLevel=4"}\' (C2 on a 2-core machine)',
    )  # fmt: skip
    ap.add_argument(
        "--format", default="sequin", choices=["sequin", "debezium"],
        help="the sink's message format",
    )  # fmt: skip
    ap.add_argument("-v", "--verbose", action="store_true", help="log every batch's timing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("walstream.pipeline.batches").setLevel(logging.DEBUG)

    work = Path(tempfile.mkdtemp(prefix="walstream-bench-kafka-"))
    with (
        EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg,
        TansuBroker() as broker,
    ):
        dsn = pg.dsn()
        with connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute(PROBE.format("probe"))
            conn.execute(PROBE.format("probe_floor"))
            conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history, probe")
            conn.execute("CREATE PUBLICATION floor FOR TABLE probe_floor")
            for slot in ("bench", "bench_ref"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            t0 = time.perf_counter()
            write(conn, 1, args.changes, 100)
            until = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
            print(
                f"workload: {args.changes:,} inserts in 100-row transactions, "
                f"{time.perf_counter() - t0:.1f}s"
            )
        ref_rate = args.changes / recvlogical(pg, "bench_ref", until)

        cfg = parse_config(
            {
                "spark": {
                    "master": "local[2]",
                    "checkpoint_dir": str(work / "checkpoints"),
                    "conf": {"spark.driver.memory": "2g", **args.spark_conf},
                },
                "sources": [
                    {"name": "bench", "dsn": dsn, "slot": "bench", "publication": "bench",
                     "max_changes_per_batch": args.max_batch,
                     **({"partition_bytes": args.partition_bytes} if args.partition_bytes else {})}
                ],
                "sinks": [
                    {
                        "name": "kafka", "source": "bench", "batch_size": 5000,
                        "format": args.format,
                        "destination": {
                            "type": "kafka", "bootstrap_servers": broker.bootstrap_servers,
                            "topic": "concat('bench.', `table`)", "create_topics": True,
                            "producer": {"linger.ms": 5, "batch.size": 1_000_000},
                        },
                    }
                ],
            }
        )  # fmt: skip
        spark = build_spark(cfg)
        floor_lat, floor_spent = floor_latencies(spark, dsn, args.rate, args.latency_seconds, work)
        floor = percentiles(floor_lat)
        start = time.perf_counter()
        runtime = Runtime(cfg, spark=spark).start()
        try:
            wait_for(runtime, 1, 300)
            first_at = time.perf_counter()
            first_n = delivered(runtime)
            cpu_before = cpu_by_group(pg.data)
            wait_for(runtime, args.changes, 3600)
            end = time.perf_counter()
            cpu_after = cpu_by_group(pg.data)
            wall = args.changes / (end - start)
            # The first batch may take the whole backlog (max_changes_per_batch): then
            # there is no "after the first batch" and the figure is the wall-clock one.
            after_first = (
                (args.changes - first_n) / (end - first_at) if first_n < args.changes else wall
            )

            # Latency at a steady rate, on its own table and topic.
            written = steady(dsn, "probe", args.rate, args.latency_seconds)
            wait_for(runtime, args.changes + written, 120)
            kafka_spent = phases(runtime.queries[0].query)
            rss = peak_rss_mb()
        finally:
            runtime.stop()
            spark.stop()
        lat = kafka_latencies(broker.bootstrap_servers, "bench.probe", written)

    p50, p99 = percentiles(lat)
    floor50, floor99 = floor
    print()
    print_breakdown("kafka", cpu_after, cpu_before, args.changes - first_n, 0.35 * ref_rate)
    print()
    print(f"{'figure':<56}{'value':>14}")
    print(f"{'pg_recvlogical to /dev/null (reference)':<56}{ref_rate:>12,.0f}/s")
    print(f"{'walstream run → Kafka, from the first delivered batch':<56}{after_first:>12,.0f}/s")
    print(f"{'walstream run → Kafka, including start':<56}{wall:>12,.0f}/s")
    print(f"{'ratio → Kafka / reference (target >= 0.35)':<56}{after_first / ref_rate:>13.2f}x")
    print(
        f"{f'floor: commit → no-op foreachBatch at {args.rate:,}/s, p50':<56}{floor50:>11,.0f} ms"
    )
    print(f"{'floor p99':<56}{floor99:>11,.0f} ms")
    print(f"{f'latency commit → Kafka at {args.rate:,}/s, p50':<56}{p50:>11,.0f} ms")
    print(f"{'ratio Kafka p50 / floor p50 (target <= 1.5)':<56}{p50 / floor50:>13.2f}x")
    print(f"{'latency p99 (target <= 500 ms)':<56}{p99:>11,.0f} ms")
    print(f"{'messages measured for latency':<56}{len(lat):>14,}")
    print("median ms per batch of the latency runs (Spark's durationMs), floor / Kafka:")
    for k in sorted(set(floor_spent) | set(kafka_spent)):
        print(f"  {k:<54}{floor_spent.get(k, 0):>7,.0f} /{kafka_spent.get(k, 0):>6,.0f}")
    for k, v in rss.items():
        print(f"{'peak RSS ' + k:<56}{v:>11,.0f} MB")
    ref = "pg_recvlogical to /dev/null"
    figure("kafka", "walstream run → Kafka (changes/s)", after_first, "/s", reference=ref,
           reference_value=ref_rate, target=">= 0.35x")  # fmt: skip
    floor_ref = "floor: the source into a no-op foreachBatch, p50"
    figure("kafka", f"latency commit → Kafka at {args.rate:,}/s, p50", p50, "ms",
           reference=floor_ref, reference_value=floor50, target="<= 1.5x")  # fmt: skip
    figure("kafka", "latency commit → Kafka, p99", p99, "ms", target="<= 500 ms")
    for k, v in rss.items():
        figure("kafka", f"peak RSS {k}", v, "MB")


if __name__ == "__main__":
    main()
