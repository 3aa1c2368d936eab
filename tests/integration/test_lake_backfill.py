"""Backfilling lake tables: a table's rows into a Delta and an Iceberg mirror while writes
go on; the stream's newer version wins (DBLog), and the mirrors end equal to the source."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_backfill import churn, config, request, run_until_done
from tests.lake import delta_rows, iceberg_rows, normalised, source_rows
from walstream.backfill.store import BackfillStore
from walstream.config import Plan
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]


def mirrors(db: Any, tmp_path: Path, pub: str, slot: str) -> Plan:
    """A config of two mirror sinks: `delta` under tmp_path/d, `iceberg` under tmp_path/w."""
    return config(db, tmp_path, pub, slot, [
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "d" / "{table}")}},
        {"name": "iceberg", "source": "app",
         "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path / "w")}}},
    ])  # fmt: skip


def test_backfill_fills_lake_mirrors_and_concurrent_writes_win(spark, db, tmp_path):
    keys = 8_000
    db.execute("CREATE TABLE hot (id int PRIMARY KEY, v int NOT NULL, note text)")
    db.execute(f"INSERT INTO hot SELECT g, 0, 'start' FROM generate_series(1, {keys}) g")
    pub = db.create_publication("hot")
    slot = db.create_slot()
    cfg = mirrors(db, tmp_path, pub, slot)
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


def lake_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.parquet"))


def test_a_quiet_tables_chunks_become_data_files_and_a_second_backfill_merges(spark, db, tmp_path):
    db.execute("CREATE TABLE quiet (id bigint PRIMARY KEY, v int, note text, at timestamptz)")
    db.execute("INSERT INTO quiet SELECT g, g % 7, 'n' || g, now() - g * interval '1 min' "
               "FROM generate_series(1, 3000) g")  # fmt: skip
    pub = db.create_publication("quiet")
    slot = db.create_slot()
    cfg = mirrors(db, tmp_path, pub, slot)
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    want = normalised(source_rows(db.dsn, "quiet"))

    def equal() -> bool:
        runtime.poll()
        return (
            normalised(delta_rows(tmp_path / "d" / "quiet")) == want
            and normalised(iceberg_rows(db.dsn, "public.quiet")) == want
        )

    try:
        ids = [b.id for s in ("delta", "iceberg")
               for b in request(cfg, store, s, chunk_size=1000, target_seconds=0)]  # fmt: skip
        run_until_done(runtime, store, ids)
        wait_until(equal, 60, interval=1, message=lambda: f"{runtime.progress()}")
        # nothing changed while they were read: each chunk's staged file is a data file now
        for root, id_ in ((tmp_path / "d", ids[0]), (tmp_path / "w", ids[1])):
            names = [re.sub(r"-\d+\.parquet$", "", f) for f in lake_files(root)]
            assert names == [f"walstream-backfill-{id_}-{n}" for n in range(3)], root
        # the mirrors have these keys now: a second backfill merges its rows, adds none
        db.execute("UPDATE quiet SET note = 'changed' WHERE id % 500 = 0")
        again = [b.id for s in ("delta", "iceberg") for b in request(cfg, store, s)]
        run_until_done(runtime, store, again)
        want = normalised(source_rows(db.dsn, "quiet"))
        wait_until(equal, 60, interval=1, message=lambda: f"{runtime.progress()}")
    finally:
        runtime.stop()
    assert len(delta_rows(tmp_path / "d" / "quiet")) == 3000


def test_a_value_a_lake_column_cannot_hold_fails_the_backfill_naming_it(spark, db, tmp_path):
    db.execute("CREATE TABLE odd (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO odd VALUES (1, 1.5), (2, 'NaN'), (3, 2)")
    pub = db.create_publication("odd")
    slot = db.create_slot()
    cfg = config(db, tmp_path, pub, slot, [
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "d" / "{table}")}},
    ])  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    try:
        (b,) = request(cfg, store, "delta")

        def failed() -> bool:
            runtime.poll()
            now = store.get(b.id)
            return now is not None and now.status == "failed"

        wait_until(failed, 120, interval=0.5, message=lambda: f"{store.get(b.id)}")
    finally:
        runtime.stop()
    done = store.get(b.id)
    assert done is not None and done.error is not None
    assert "column amount (Postgres numeric)" in done.error, done.error
    assert "columns: exclude" in done.error, done.error
