"""`walstream verify` throughput on an equal table, next to COPY TO STDOUT.

    .venv/bin/python -m bench.verify [--rows 5000000] [--only postgres,delta]

1. Fills the 8-column table of bench.stream (`accounts_history`) with ROWS rows on an
   embedded Postgres, and its copy: in a second database (a Postgres mirror) and as a
   Delta table (delta-rs, from the rows as walstream types them).
2. `COPY (SELECT * FROM accounts_history) TO STDOUT` with psql into /dev/null: the rate
   Postgres itself reads and sends the table at on this machine.
3. One verification of the table against each copy, as `walstream verify` runs it (the
   same sides, hashes and comparison), with nothing writing: the copies are equal, so
   each side is read and hashed once. There is no stream to wait for (the wait for the
   sink's slot is what a verification adds to this under a running pipeline: about one
   micro-batch per comparison).
4. Prints rows/s verified (the source's rows over the whole verification, both sides
   read) and the ratio to COPY (target ≥ 0.3), and the CPU per row of each process group.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.backfill import copy_rate, fill
from bench.cpu import cpu_by_group, print_breakdown
from bench.results import figure
from walstream.config import parse_config
from walstream.decode.table_shape import load_shape
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.sinks.registry import sink_for
from walstream.testing import AtRest
from walstream.testing import copy_table as copy
from walstream.verify.run import Verification
from walstream.verify.sides import Boundary, LakeTable, PostgresTable

CHUNK = 100_000


def copy_table(dsn: str, mirror_dsn: str) -> None:
    """The table's rows into the same table in the mirror database (COPY out, COPY in)."""
    from bench.stream import TABLE

    copy(dsn, mirror_dsn, "accounts_history", TABLE)
    with connect(mirror_dsn, autocommit=True) as target:
        target.execute("VACUUM ANALYZE accounts_history")


def delta_copy(dsn: str, shape: Any, path: Path) -> None:
    """The table as a Delta table, its rows read as walstream types them."""
    import pyarrow as pa
    from deltalake import write_deltalake

    source = PostgresTable("source", dsn, "public", "accounts_history", shape, 1_000_000)
    for batch in source.batches():
        if not isinstance(batch, Boundary):  # the end of a key range
            write_deltalake(str(path), pa.table(batch), mode="append")


def run(name: str, source: Any, sink: Any, pg_data: str, rows: int, copy: float) -> None:
    check = Verification(source, sink, AtRest())  # type: ignore[arg-type]
    cpu = cpu_by_group(pg_data)
    t0 = time.perf_counter()
    result = check.run("public.accounts_history", name, rows)
    elapsed = time.perf_counter() - t0
    cpu_after = cpu_by_group(pg_data)
    assert result.equal and result.source_rows == rows == result.sink_rows, result
    rate = rows / elapsed
    print(
        f"verify against the {name}: {elapsed:.1f}s, {rate:,.0f} rows/s = {rate / copy:.2f}x COPY"
    )
    print_breakdown("verify", cpu_after, cpu, rows, copy * 0.3)
    figure("verify", f"verify an equal {rows:,}-row table against a {name}", rate, "rows/s",
           reference="COPY TO STDOUT", reference_value=copy, target="≥ 0.3×")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--only", default="postgres,delta", help="postgres and/or delta")
    args = ap.parse_args()
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-verify-"))
    try:
        with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
            dsn = pg.dsn()
            t0 = time.perf_counter()
            fill(dsn, args.rows)
            with connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE DATABASE mirror")
                shape = load_shape(conn, "public", "accounts_history")
            mirror = pg.dsn("mirror")
            print(f"table: {args.rows:,} rows × 8 columns in {time.perf_counter() - t0:.0f}s")
            copy = copy_rate(pg, args.rows)
            print(f"COPY TO STDOUT > /dev/null: {copy:,.0f} rows/s")
            source = PostgresTable("source", dsn, "public", "accounts_history", shape, CHUNK)
            if "postgres" in only:
                copy_table(dsn, mirror)
                sink = PostgresTable("sink", mirror, "public", "accounts_history", shape, CHUNK)
                run("Postgres mirror", source, sink, pg.data, args.rows, copy)
            if "delta" in only:
                delta_copy(dsn, shape, work / "d" / "accounts_history")
                plan = parse_config({
                    "sources": [{"name": "bench", "dsn": dsn, "slot": "bench", "publication": "bench"}],
                    "sinks": [{"name": "d", "source": "bench", "destination": {
                        "type": "delta", "path": str(work / "d" / "{table}")}}],
                })  # fmt: skip
                lake = sink_for(plan.sink("d").destination)
                sink = LakeTable("sink", lake, "public", "accounts_history", shape, False)
                run("Delta mirror", source, sink, pg.data, args.rows, copy)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
