"""`walstream verify` of an equal 1M-row table while writes flow: no false difference.

    .venv/bin/python -m bench.verify_writes [--rows 1000000] [--rounds 2]

1. On an embedded Postgres, the acct table of the tests (tests/lake.py: a composite key
   with text, TOASTed text, arrays with NULLs, jsonb edge values, an enum, NULLs) with
   ROWS rows; one row in 20 holds a 6 kB TOASTed value (300 MB of them at 1M rows).
2. `walstream run` (the Runtime, `local[2]`) with a Postgres mirror and a merge-on-read
   Delta mirror, both backfilled on creation.
3. Once both are, the tests' RealWriter writes until the end: updates leaving the TOASTed
   value out, updates of it, primary-key changes (of the number and of the text part),
   jsonb and array updates, deletes and inserts, a third of them several to a
   transaction. Meanwhile each sink is verified ROUNDS times, as `walstream verify` does
   (`verify_sink`: bucket sums, the wait for the sink, re-checks).
4. Exits 1 when a verification reports any key missing, extra or different (the mirrors
   are equal: each such key is a false difference); prints each verification's time,
   rows/s and its keys still changing, and the writer's rate meanwhile.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.lake import plan
from bench.results import figure
from walstream.backfill.store import DONE, BackfillStore
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until
from walstream.verify.job import Options, verify_sink

TOASTED_EVERY = 20


def fill(dsn: str, rows: int) -> list[tuple[str, int]]:
    """`rows` rows in acct, one in TOASTED_EVERY with its TOASTed value; their keys."""
    from tests.lake import REAL_TABLE, REGIONS, real_row

    keys = [(REGIONS[k % len(REGIONS)], k) for k in range(1, rows + 1)]
    copy = "COPY acct (region, id, big, arr, doc, mood, price, n, at) FROM STDIN"
    with connect(dsn, autocommit=True) as conn:
        conn.execute(REAL_TABLE)
        with conn.cursor().copy(copy) as cp:
            for region, k in keys:
                row = real_row(region, k)
                cp.write_row(row if k % TOASTED_EVERY == 0 else (row[0], row[1], None, *row[3:]))
        conn.execute("VACUUM ANALYZE acct")
        conn.execute("CREATE PUBLICATION bench FOR TABLE acct")
    return keys


def verify_under_writes(cfg: Any, sink: str, rows: int, writer: Any) -> bool:
    """One verification of `sink` while `writer` writes: True when it found no difference."""
    ops = sum(writer.ops.values())
    t0 = time.perf_counter()
    outcome = verify_sink(cfg, sink, Options(wait=600), "command", lambda _: None)
    elapsed = time.perf_counter() - t0
    (result,) = outcome.results
    written = sum(writer.ops.values()) - ops
    print(
        f"verify {sink} while writing: {elapsed:.1f}s, {rows / elapsed:,.0f} rows/s, "
        f"{result.source_rows:,} source rows, {result.buckets_different} of {result.buckets} "
        f"buckets different, {len(result.unsettled)} key(s) still changing; "
        f"the writer made {written / elapsed:,.0f} changes/s meanwhile",
        flush=True,
    )
    wrong = {"missing": result.missing, "extra": result.extra, "different": result.different}
    for kind, keys in wrong.items():
        if keys:
            print(f"  FALSE DIFFERENCE: {len(keys)} key(s) {kind}: {keys[:10]}", flush=True)
    figure("verify", f"verify {sink} under writes (rows/s)", rows / elapsed, "/s")
    return result.equal


def main() -> None:
    from tests.lake import RealWriter

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2, help="verifications of each sink")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-verify-writes-"))
    equal = True
    try:
        with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
            dsn = pg.dsn()
            t0 = time.perf_counter()
            keys = fill(dsn, args.rows)
            with connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE DATABASE mirror")
            print(f"acct: {args.rows:,} rows in {time.perf_counter() - t0:.0f}s", flush=True)
            sinks = [
                {"name": "pg", "source": "bench", "backfill": "on_create",
                 "destination": {"type": "postgres", "dsn": pg.dsn("mirror")}},
                {"name": "delta", "source": "bench", "backfill": "on_create",
                 "destination": {"type": "delta", "path": str(work / "delta" / "{table}"),
                                 "updates": "merge_on_read"}},
            ]  # fmt: skip
            cfg = plan(dsn, work, "verify_writes", sinks)
            stop = threading.Event()
            writer = RealWriter(dsn, keys, seed=7)
            writing = threading.Thread(target=writer.run, args=(stop, 0.005), daemon=True)
            with supervised(Runtime(cfg).start()):
                try:
                    store = BackfillStore(cfg.state_dsn)
                    t0 = time.perf_counter()
                    wait_until(lambda: [b.status for b in store.find()] == [DONE, DONE],
                               3600, interval=1.0, message="the mirrors' backfills")  # fmt: skip
                    print(f"both mirrors backfilled in {time.perf_counter() - t0:.0f}s", flush=True)
                    writing.start()
                    time.sleep(10)  # the writer under way, the stream carrying its changes
                    for _ in range(args.rounds):
                        for sink in ("pg", "delta"):
                            equal = verify_under_writes(cfg, sink, args.rows, writer) and equal
                    print(f"the writer's changes: {writer.ops}", flush=True)
                finally:
                    stop.set()
                    writing.join(60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not equal:
        raise SystemExit("a verification reported a difference between equal tables")


if __name__ == "__main__":
    main()
