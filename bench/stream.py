"""Throughput and latency of the Spark source against what Postgres can send.

    .venv/bin/python -m bench.stream [--changes 1000000] [--latency-seconds 30]

1. Writes CHANGES inserts (8 columns, 100 rows per transaction) while two slots
   exist: one for walstream, one for the reference.
2. Reference: `pg_recvlogical` reads the second slot to /dev/null (C, pgoutput).
3. walstream: `format("walstream")` into a foreachBatch `count()` sink.
4. Latency: a writer at a steady 5k changes/s (50-row transactions); for every row
   the time from its commit timestamp to the sink; p50 / p99.
5. Peak RSS (VmHWM) of the driver JVM and of the Python processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import time
from datetime import UTC
from pathlib import Path

from bench.results import figure
from walstream.change import format_lsn, parse_lsn
from walstream.engine.session import FS_CHECKPOINTS, spark_environment
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect

TABLE = """
CREATE TABLE accounts_history (
    id bigint PRIMARY KEY, aid int, bid int, tid int, delta int,
    mtime timestamptz, filler char(22), note text);
"""


def with_slot(conn) -> None:
    """TABLE, the publication `bench` of it and the slot `bench` (pgoutput) that holds every
    change written after this."""
    conn.execute(TABLE)
    conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history")
    conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")


def write(conn, start: int, rows: int, per_txn: int, table: str = "accounts_history") -> None:
    """Rows `start`.. of accounts_history's shape into `table` (one of that shape), in
    transactions of `per_txn` rows."""
    for first in range(start, start + rows, per_txn):
        conn.execute(
            f"""INSERT INTO {table}
               SELECT g, g %% 100000, g %% 10, g %% 100, (g %% 9999) - 5000, now(), 'f', 'n' || g
               FROM generate_series(%s::bigint, %s::bigint) g""",
            (first, min(first + per_txn, start + rows) - 1),
        )


def recvlogical(pg: EmbeddedPostgres, slot: str, until: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            str(pg.bin / "pg_recvlogical"), "-d", pg.dsn(), "-S", slot, "--start", "-f", "/dev/null",
            "-o", "proto_version=1", "-o", "publication_names=bench", "-o", "messages=true",
            "-E", format_lsn(until), "--no-loop",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - t0


def peak_rss_mb() -> dict[str, float]:
    """VmHWM of this process's descendants, grouped as JVM and Python."""
    me = os.getpid()
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                names[int(d.name)] = (
                    (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                )
            except OSError:
                continue
    out = {"driver JVM": 0.0, "Python driver + workers": 0.0}
    for pid in parents:
        p = pid
        while p not in (0, 1, me):
            p = parents.get(p, 0)
        if p != me and pid != me:
            continue
        try:
            hwm = next(
                line
                for line in (Path("/proc") / str(pid) / "status").read_text().splitlines()
                if line.startswith("VmHWM")
            )
        except (OSError, StopIteration):
            continue
        mb = int(hwm.split()[1]) / 1024
        key = (
            "driver JVM"
            if "java" in names[pid]
            else "Python driver + workers"
            if "python" in names[pid]
            else None
        )
        if key:
            out[key] += mb if key.startswith("Python") else 0
            if key == "driver JVM":
                out[key] = max(out[key], mb)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=5000, help="changes/s for the latency run")
    ap.add_argument(
        "--default-checkpoints",
        action="store_true",
        help="keep Spark's default checkpoint manager (writes .crc side files)",
    )
    args = ap.parse_args()
    spark_environment("local[2]")

    with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
        dsn = pg.dsn()
        with connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history")
            for slot in ("bench", "bench_ref"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            t0 = time.perf_counter()
            write(conn, 1, args.changes, 100)
            until = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
            print(
                f"workload: {args.changes:,} inserts in 100-row transactions, {time.perf_counter() - t0:.1f}s"
            )

        ref_secs = recvlogical(pg, "bench_ref", until)
        ref_rate = args.changes / ref_secs

        from pyspark.sql import SparkSession

        import walstream

        builder = SparkSession.builder
        if not args.default_checkpoints:
            # Local checkpoint: write offset/commit logs without Hadoop's .crc side files
            # (~40 ms less per log write here; rename on a local disk is atomic).
            builder = builder.config(
                "spark.sql.streaming.checkpointFileManagerClass", FS_CHECKPOINTS
            )
        spark = (
            builder.master("local[2]")
            .config("spark.python.worker.reuse", "true")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        walstream.register(spark)
        counted = 0
        first_at: float | None = None
        latencies: list[float] = []
        measuring = threading.Event()
        lock = threading.Lock()

        def sink(batch, batch_id: int) -> None:
            nonlocal counted, first_at
            if measuring.is_set():
                now = time.time()
                ts = [r.committed_at for r in batch.select("committed_at").collect()]
                with lock:
                    latencies.extend(now - t.replace(tzinfo=UTC).timestamp() for t in ts)
                    counted += len(ts)
                return
            n = batch.count()
            with lock:
                if n and first_at is None:
                    first_at = time.perf_counter()
                counted += n

        query_start = time.perf_counter()
        q = (
            spark.readStream.format("walstream").option("dsn", dsn).option("slot", "bench")
            .option("publication", "bench").option("maxChangesPerBatch", "200000").load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", f"/tmp/walstream-bench-{os.getpid()}")
            .trigger(processingTime="0 seconds").start()
        )  # fmt: skip
        while counted < args.changes:
            if q.exception():
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.05)
        end = time.perf_counter()
        wall_rate = args.changes / (end - query_start)
        steady_rate = args.changes / (end - (first_at or query_start))

        # live: the same amount written while the warm query streams (no prefetch advantage)
        with lock:
            counted = 0
        t_live = time.perf_counter()
        with connect(dsn, autocommit=True) as conn:
            write(conn, args.changes + 1, args.changes, 100)
        while counted < args.changes:
            if q.exception():
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.05)
        live_rate = args.changes / (time.perf_counter() - t_live)
        base = 2 * args.changes

        # latency at a steady rate
        with lock:
            counted = 0
        measuring.set()
        per_txn = 50
        written = 0
        with connect(dsn, autocommit=True) as conn:
            # The server runs with synchronous_commit=off for the bulk writes; there the
            # walsender sends a commit only after the WAL writer flushed it (wal_writer_delay,
            # 200 ms), which is Postgres' delay, not walstream's. Commit as production does.
            conn.execute("SET synchronous_commit = on")
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.latency_seconds:
                write(conn, base + 1 + written, per_txn, per_txn)
                written += per_txn
                ahead = written / args.rate - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        deadline = time.monotonic() + 60
        while counted < written and time.monotonic() < deadline:
            time.sleep(0.05)
        rss = peak_rss_mb()
        q.stop()
        spark.stop()

    lat = sorted(latencies)
    p50 = statistics.median(lat) * 1000 if lat else float("nan")
    p99 = lat[int(len(lat) * 0.99) - 1] * 1000 if lat else float("nan")
    print()
    print(f"{'figure':<52}{'value':>14}")
    print(f"{'pg_recvlogical to /dev/null (reference)':<52}{ref_rate:>12,.0f}/s")
    print(f"{'walstream catch-up: backlog in slot, from first batch':<52}{steady_rate:>12,.0f}/s")
    print(f"{'walstream catch-up, including query start':<52}{wall_rate:>12,.0f}/s")
    print(f"{'walstream live: written while streaming':<52}{live_rate:>12,.0f}/s")
    print(f"{'ratio catch-up / reference (target >= 0.5)':<52}{steady_rate / ref_rate:>13.2f}x")
    print(f"{'ratio live / reference':<52}{live_rate / ref_rate:>13.2f}x")
    print(
        f"{f'latency commit → sink at {args.rate:,}/s, p50 (target <= 250 ms)':<52}{p50:>11,.0f} ms"
    )
    print(f"{'latency p99 (target <= 1000 ms)':<52}{p99:>11,.0f} ms")
    print(f"{'changes measured for latency':<52}{len(lat):>14,}")
    for k, v in rss.items():
        print(f"{'peak RSS ' + k:<52}{v:>11,.0f} MB")
    ref = "pg_recvlogical to /dev/null"
    figure("stream", "Spark source catch-up (changes/s)", steady_rate, "/s", reference=ref,
           reference_value=ref_rate, target=">= 0.5x")  # fmt: skip
    figure("stream", "Spark source live (changes/s)", live_rate, "/s", reference=ref,
           reference_value=ref_rate)  # fmt: skip
    figure("stream", f"latency commit → sink at {args.rate:,}/s, p50", p50, "ms",
           target="<= 250 ms")  # fmt: skip
    figure("stream", "latency commit → sink, p99", p99, "ms", target="<= 1000 ms")
    for k, v in rss.items():
        figure("stream", f"peak RSS {k}", v, "MB")


if __name__ == "__main__":
    main()
