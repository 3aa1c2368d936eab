"""Backfilling lake tables: a table's rows into a Delta and an Iceberg mirror while writes
go on; the stream's newer version wins (DBLog), and the mirrors end equal to the source."""

from __future__ import annotations

import threading

import pytest

from tests.integration.test_backfill import churn, config, request, run_until_done
from tests.lake import delta_rows, iceberg_rows, normalised, source_rows
from walstream.backfill.store import BackfillStore
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]


def test_backfill_fills_lake_mirrors_and_concurrent_writes_win(spark, db, tmp_path):
    keys = 8_000
    db.execute("CREATE TABLE hot (id int PRIMARY KEY, v int NOT NULL, note text)")
    db.execute(f"INSERT INTO hot SELECT g, 0, 'start' FROM generate_series(1, {keys}) g")
    pub = db.create_publication("hot")
    slot = db.create_slot()
    cfg = config(db, tmp_path, pub, slot, [
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "d" / "{table}")}},
        {"name": "iceberg", "source": "app",
         "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path / "w")}}},
    ])  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    stop = threading.Event()
    counts: list[int] = []
    writer = threading.Thread(target=lambda: counts.append(churn(db.dsn, "hot", keys, stop, 3)))
    try:
        writer.start()
        ids = [b.id for b in request(cfg, store, "delta", chunk_size=1000, target_seconds=0)]
        ids += [b.id for b in request(cfg, store, "iceberg", chunk_size=1500, target_seconds=0)]
        run_until_done(runtime, store, ids)
        stop.set()
        writer.join(30)
        want = normalised(source_rows(db.dsn, "hot"))

        def equal() -> bool:
            runtime.poll()
            return (
                normalised(delta_rows(tmp_path / "d" / "hot")) == want
                and normalised(iceberg_rows(db.dsn, "public.hot")) == want
            )

        wait_until(equal, 120, interval=1, message=lambda: f"{runtime.progress()}")
    finally:
        stop.set()
        runtime.stop()
    assert counts and counts[0] > 50, "the writer barely ran during the backfill"
    done = store.get(ids[0])
    assert done is not None and done.rows_read >= keys * 0.8
