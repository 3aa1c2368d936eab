"""Backfill throughput next to COPY, and the memory it takes.

    .venv/bin/python -m bench.backfill [--rows 5000000] [--chunk-size 20000]

1. Fills an 8-column table (`accounts_history`, as bench.stream) with ROWS rows on an
   embedded Postgres.
2. `COPY (SELECT * FROM accounts_history) TO STDOUT` with psql into /dev/null: the
   rate Postgres itself reads and sends the table at on this machine.
3. The Runtime of `walstream run` (walstream's default Spark settings, `local[2]`) with
   one parquet file sink; a backfill of the table, from the request until every chunk
   is delivered. Memory of the driver JVM, this process and Spark's Python processes
   is sampled, and the JVM's live heap read after a full GC at 20 % and at the end.
4. Prints rows/s of both, the ratio (target ≥ 0.2: the issue's for JSON messages), the
   CPU per row of each process group (Postgres included) next to the budget per row at
   the target, and memory at 20 % and 100 %.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.backlog import GROUPS, jvm_live_heap_mb, rss_by_group
from bench.cpu import cpu_by_group, print_breakdown
from bench.results import figure
from bench.stream import TABLE
from walstream.backfill.requests import request
from walstream.backfill.store import DONE, BackfillStore
from walstream.config import parse_config
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime


def fill(dsn: str, rows: int) -> None:
    with connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        step = 1_000_000
        for first in range(1, rows + 1, step):
            conn.execute(
                """INSERT INTO accounts_history
                   SELECT g, g %% 100000, g %% 10, g %% 100, (g %% 9999) - 5000,
                          now() - g * interval '1 second', 'filler', 'note ' || g
                   FROM generate_series(%s::bigint, %s::bigint) g""",
                (first, min(first + step, rows + 1) - 1),
            )
        conn.execute("VACUUM ANALYZE accounts_history")


def copy_rate(pg: EmbeddedPostgres, rows: int) -> float:
    """Rows/s of `COPY (SELECT ...) TO STDOUT` into /dev/null, with psql (best of two)."""
    psql = Path(pg.bin) / "psql"
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        with open("/dev/null", "wb") as null:
            subprocess.run(
                [str(psql), pg.dsn(), "-qc", "COPY (SELECT * FROM accounts_history) TO STDOUT"],
                stdout=null, check=True,
            )  # fmt: skip
        best = max(best, rows / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--chunk-size", type=int, default=None, help="first chunk size (adapts)")
    ap.add_argument("--target-seconds", type=float, default=None, help="per chunk (0: fixed)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="walstream-bench-backfill-"))
    try:
        with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
            dsn = pg.dsn()
            t0 = time.perf_counter()
            fill(dsn, args.rows)
            print(f"table: {args.rows:,} rows × 8 columns in {time.perf_counter() - t0:.0f}s")
            copy = copy_rate(pg, args.rows)
            print(f"COPY TO STDOUT > /dev/null: {copy:,.0f} rows/s")
            with connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history")
            cfg = parse_config({
                "spark": {"master": "local[2]", "checkpoint_dir": str(work / "checkpoints")},
                "sources": [{"name": "bench", "dsn": dsn, "slot": "bench",
                             "publication": "bench"}],
                "sinks": [{"name": "files", "source": "bench",
                           "destination": {"type": "file", "path": str(work / "out"),
                                           "format": "parquet"}}],
            })  # fmt: skip
            runtime = Runtime(cfg).start()
            store = BackfillStore(cfg.state_dsn)
            samples: list[tuple[int, dict[str, float]]] = []
            heap: dict[str, float | None] = {}
            try:
                cpu = cpu_by_group(pg.data)
                t0 = time.perf_counter()
                read_done: float | None = None
                (b,) = request(cfg, store, "files", chunk_size=args.chunk_size,
                               target_seconds=args.target_seconds)  # fmt: skip
                next_report = 0.1
                while True:
                    runtime.poll()
                    if runtime.fatal is not None:
                        raise SystemExit(f"walstream stopped: {runtime.fatal}")
                    now = store.get(b.id)
                    assert now is not None
                    if now.status not in ("pending", "running", DONE):
                        raise SystemExit(f"backfill {now.status}: {now.error}")
                    done = now.rows_read / args.rows
                    if read_done is None and now.rows_read >= args.rows:
                        read_done = time.perf_counter() - t0
                    samples.append((now.rows_read, rss_by_group()))
                    if done >= next_report:
                        p = runtime.progress().get("files")
                        print(
                            f"  read {now.rows_read:>10,} ({now.rows_read / (time.perf_counter() - t0):,.0f}/s), "
                            f"delivered {p.delivered if p else 0:>10,}, chunk size {now.chunk_size:,}  "
                            + "  ".join(f"{k} {mb:,.0f} MB" for k, mb in samples[-1][1].items()),
                            flush=True,
                        )  # fmt: skip
                        next_report += 0.1
                    if "at 20%" not in heap and done >= 0.2:
                        heap["at 20%"] = jvm_live_heap_mb()
                    if now.status == DONE:
                        elapsed = time.perf_counter() - t0
                        heap["at 100%"] = jvm_live_heap_mb()
                        break
                    time.sleep(0.5)
                delivered = runtime.progress()["files"].delivered
                cpu_after = cpu_by_group(pg.data)
            finally:
                runtime.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = args.rows / elapsed
    print()
    print(f"backfill: {args.rows:,} rows in {elapsed:.1f}s = {rate:,.0f} rows/s "
          f"({delivered:,} messages delivered); {now.chunks} chunks; reading took "
          f"{read_done or elapsed:.1f}s ({args.rows / (read_done or elapsed):,.0f} rows/s)")  # fmt: skip
    print(f"COPY:     {copy:,.0f} rows/s")
    print(f"ratio:    {rate / copy:.2f}x of COPY (target >= 0.2x: JSON messages)")
    figure("backfill", "backfill (rows/s)", rate, "/s", reference="COPY TO STDOUT",
           reference_value=copy, target=">= 0.2x")  # fmt: skip
    print_breakdown("backfill", cpu_after, cpu, args.rows, copy * 0.2)
    early = next(m for n, m in samples if n >= args.rows * 0.2)
    late = samples[-1][1]
    print(f"{'process group':<30}{'at 20%':>10}{'at 100%':>10}{'growth':>10}")
    for g in GROUPS:
        print(f"{g:<30}{early[g]:>7,.0f} MB{late[g]:>7,.0f} MB{late[g] - early[g]:>+7,.0f} MB")
    figure("backfill", "peak RSS, all processes", max(sum(m.values()) for _, m in samples), "MB")
    print("driver JVM live heap after GC: "
          + ", ".join(f"{k} {v:,.0f} MB" if v else f"{k} n/a" for k, v in heap.items()))  # fmt: skip


if __name__ == "__main__":
    main()
