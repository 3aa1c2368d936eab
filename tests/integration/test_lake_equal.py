"""The lakehouse promise in one run, on the kind of table users have (`tests/lake.py`'s acct: a
composite key with a text part, TOASTed text, key changes, arrays with NULL elements, jsonb
edge values): Delta and Iceberg tables in every mode, backfilled while a writer runs from the
start, through kill -9 of `walstream run` (three times, the first while the backfills read)
and a column added mid-way. The mirrors and the histories' current rows equal the source row
by row; the changelogs hold every change exactly once."""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any

import psycopg
import pytest
import yaml

from tests.integration.test_crash import slot_inactive
from tests.integration.test_run import oracle
from tests.integration.test_run_crash import Run
from tests.lake import (
    MODES,
    REAL_JSON,
    REAL_KEY,
    REAL_SELECT,
    REAL_TABLE,
    RealWriter,
    current_versions,
    differences,
    every_mode_rows,
    every_mode_sinks,
    fill_real,
    normalised,
)
from walstream.backfill.requests import request
from walstream.backfill.store import DONE, BackfillStore
from walstream.config import load_config
from walstream.postgres.replication import connect
from walstream.testing import wait_until

pytestmark = pytest.mark.spark

ROWS = 3_000


def write_extra(dsn: str, stop: threading.Event, seed: int) -> None:
    """The column added mid-way, set on random keys until `stop`."""
    rng = random.Random(seed)
    with connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            k = rng.randrange(1, ROWS)
            conn.execute("UPDATE acct SET extra = %s WHERE id = %s", (f"e{k}", k))
            time.sleep(0.01)  # pacing: a steady write load


def source(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(REAL_SELECT.replace(" FROM acct", ", extra FROM acct"))
        names = [d.name for d in cur.description or ()]
        return normalised([dict(zip(names, r, strict=True)) for r in cur.fetchall()], REAL_JSON)


def lake(db: Any, tmp_path: Any, fmt: str, mode: str) -> list[dict[str, Any]]:
    return every_mode_rows(db.dsn, tmp_path, fmt, mode, "acct")


def test_lake_tables_of_a_real_table_through_backfill_writes_kills_and_a_new_column(db, tmp_path):
    db.execute(REAL_TABLE)
    keys = fill_real(db.dsn, ROWS)
    pub = db.create_publication("acct")
    # both slots before the first write: walstream's stream is the oracle's from there on
    oracle_slot, slot = db.create_slot(), db.create_slot()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "max_changes_per_batch": 3000}],
        "sinks": every_mode_sinks(tmp_path),
    }))  # fmt: skip
    plan = load_config(config)
    store = BackfillStore(plan.state_dsn)
    store.ensure()  # requested before the first run creates the state tables
    ids = [b.id for s in plan.sinks
           for b in request(plan, store, s.name, chunk_size=500, target_seconds=0)]  # fmt: skip
    stop = threading.Event()
    writer = RealWriter(db.dsn, keys, seed=5)
    writing = threading.Thread(target=writer.run, args=(stop, 0.01))
    extra = threading.Thread(target=write_extra, args=(db.dsn, stop, 6))
    rng = random.Random(23)
    kills_mid_backfill = 0
    run: Run | None = None
    try:
        writing.start()
        for i in range(3):
            run = Run(config, tmp_path)
            if i == 1:  # a column added between two runs, written from then on
                db.execute("ALTER TABLE acct ADD COLUMN extra text")
                extra.start()
            if i == 0:  # the first run has read chunks; the others have started streaming
                started = lambda: any(getattr(store.get(b), "rows_read", 0) > 0 for b in ids)  # noqa: E731
            else:
                started = lambda: not slot_inactive(db, slot)  # noqa: E731
            wait_until(started, 180, message=lambda r=run: f"run output:\n{r.output()}")
            # A kill at a random point, not a wait for a result: the first soon after the
            # first chunk was read, while the backfills still go.
            time.sleep(rng.uniform(0, 1) if i == 0 else rng.uniform(2, 6))
            kills_mid_backfill += any(getattr(store.get(b), "status", None) != DONE for b in ids)
            run.kill()
            wait_until(lambda: slot_inactive(db, slot), 30)
        stop.set()
        writing.join(30)
        extra.join(30)
        run = Run(config, tmp_path)
        want = source(db.dsn)
        changes = [c for c in oracle(db, oracle_slot, pub, "app") if c.action != "watermark"]

        def equal() -> bool:
            if any(getattr(store.get(b), "status", None) != DONE for b in ids):
                return False
            try:
                return all(
                    not differences(normalised(lake(db, tmp_path, fmt, "mirror"), REAL_JSON),
                                    want, REAL_KEY)
                    and not differences(normalised(current_versions(
                        lake(db, tmp_path, fmt, "history")), REAL_JSON), want, REAL_KEY)
                    and sum(r["_op"] != "read" for r in lake(db, tmp_path, fmt, "changelog"))
                    >= len(changes)
                    for fmt in ("delta", "iceberg")
                )  # fmt: skip
            except Exception:  # a table not written yet
                return False

        def what_differs() -> str:
            out = [f"run output:\n{run.output()[-3000:]}" if run else ""]
            out.append(f"backfills: {[getattr(store.get(b), 'status', None) for b in ids]}")
            for fmt in ("delta", "iceberg"):
                try:
                    got = normalised(lake(db, tmp_path, fmt, "mirror"), REAL_JSON)
                    out.append(f"{fmt} mirror:\n{differences(got, want, REAL_KEY)}")
                    got = normalised(current_versions(lake(db, tmp_path, fmt, "history")),
                                     REAL_JSON)  # fmt: skip
                    out.append(f"{fmt} history:\n{differences(got, want, REAL_KEY)}")
                    log = lake(db, tmp_path, fmt, "changelog")
                    out.append(f"{fmt} changelog: {sum(r['_op'] != 'read' for r in log)} "
                               f"changes of {len(changes)}")  # fmt: skip
                except Exception as exc:
                    out.append(f"{fmt}: {type(exc).__name__}: {exc}")
            return "\n".join(out)

        wait_until(equal, 300, interval=3, message=what_differs)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(60) == 0, run.output()
    finally:
        stop.set()
        if run is not None:
            run.kill()
    for op in ("update, TOAST unchanged", "key change", "key change (text part)", "delete",
               "insert", "jsonb and array update"):  # fmt: skip
        assert writer.ops.get(op, 0) >= 5, writer.ops
    assert kills_mid_backfill >= 1, "no kill landed while a backfill was still going"
    for fmt in ("delta", "iceberg"):
        # every change exactly once in the changelog, whatever the kills did
        log = lake(db, tmp_path, fmt, "changelog")
        streamed = sorted((r["_lsn"], r["_seq"], r["_op"]) for r in log if r["_op"] != "read")
        assert streamed == [(c.lsn, c.seq, c.action) for c in changes], fmt
        # the column added mid-way is in every table, with the values written since
        for mode in MODES:
            rows = lake(db, tmp_path, fmt, mode)
            assert sum(1 for r in rows if r["extra"] is not None) > 10, (fmt, mode)
