"""Does splitting a source into shards (slots) help? One slot for two tables vs two shards.

    .venv/bin/python -m bench.shards [--changes 1000000]

1. Creates two 8-column tables (as bench.stream) and the slots of both setups: source
   `one` (one slot and publication for both tables) and source `two` with
   `shards: [[a], [b]]` (two slots, two queries).
2. Writes CHANGES inserts, half into each table, in 1,000-row transactions (every slot
   keeps them all).
3. Drains the backlog with the Runtime of `walstream run` into a jsonl file sink, first
   `one`, then `two` (the same SparkSession, `local[2]`): changes/s from the start of the
   runtime until every change is delivered.
4. Prints both rates and the ratio. More shards help when one walsender (about one core
   on the database server) or one capture thread is the bound and there are spare cores
   for the other slot's walsender, capture and decoding.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.results import figure
from bench.stream import TABLE
from walstream.config import parse_config
from walstream.engine.session import build_spark
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.prepare import prepare_capture
from walstream.postgres.replication import connect
from walstream.runtime import Runtime


def drain(cfg_data: dict, spark: object, changes: int) -> float:
    cfg = parse_config(cfg_data)
    t0 = time.perf_counter()
    runtime = Runtime(cfg, spark=spark).start()
    try:
        while True:
            done = sum(p.delivered for p in runtime.progress().values())
            if done >= changes:
                return changes / (time.perf_counter() - t0)
            runtime.poll()
            if runtime.fatal is not None:
                raise runtime.fatal
            time.sleep(0.2)
    finally:
        runtime.stop()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=1_000_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-shards-"))
    try:
        with EmbeddedPostgres() as pg:
            dsn = pg.dsn()
            with connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE)
                for t in ("a", "b"):
                    conn.execute(f"CREATE TABLE {t} (LIKE accounts_history INCLUDING ALL)")
            prepare_capture(dsn, "walstream_one", "walstream_one", ["public.a", "public.b"], "one")
            for i, t in ((1, "a"), (2, "b")):
                prepare_capture(dsn, f"walstream_two_{i}", f"walstream_two_{i}", [f"public.{t}"],
                                f"two-{i}")  # fmt: skip
            t0 = time.perf_counter()
            with connect(dsn, autocommit=True) as conn:
                for first in range(0, args.changes, 1000):
                    table = "a" if (first // 1000) % 2 == 0 else "b"
                    conn.execute(
                        f"""INSERT INTO {table}
                            SELECT g, g %% 100000, g %% 10, g %% 100, (g %% 9999) - 5000, now(), 'f',
                                   'n' || g
                            FROM generate_series(%s::bigint, %s::bigint) g""",
                        (first, min(first + 1000, args.changes) - 1),
                    )
            print(f"workload: {args.changes:,} inserts into a and b in "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)  # fmt: skip
            base = {
                "server": {"enabled": False},
                "spark": {"checkpoint_dir": str(work / "ckpt")},
            }
            spark = build_spark(parse_config({**base, "sources": [{"name": "x", "dsn": dsn}],
                                              "sinks": [{"name": "x", "source": "x",
                                                         "destination": {"type": "file",
                                                                         "path": str(work)}}]}))  # fmt: skip
            one = drain({**base, "sources": [{"name": "one", "dsn": dsn,
                                              "tables": ["public.a", "public.b"]}],
                         "sinks": [{"name": "f", "source": "one", "destination": {
                             "type": "file", "path": str(work / "one")}}]}, spark, args.changes)  # fmt: skip
            print(f"one slot:   {one:,.0f} changes/s", flush=True)
            two = drain({**base, "sources": [{"name": "two", "dsn": dsn,
                                              "shards": [["public.a"], ["public.b"]]}],
                         "sinks": [{"name": "f", "source": "two", "destination": {
                             "type": "file", "path": str(work / "two")}}]}, spark, args.changes)  # fmt: skip
            print(f"two shards: {two:,.0f} changes/s ({two / one:.2f}x of one slot)")
            spark.stop()  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figure("shards", "two shards, backlog drain into files (changes/s)", two, "/s",
           reference="one slot for both tables", reference_value=one)  # fmt: skip


if __name__ == "__main__":
    main()
