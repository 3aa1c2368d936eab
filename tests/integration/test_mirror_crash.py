"""The Postgres mirror through `walstream run`, killed with kill -9 mid-stream: after a
20k-change workload on the decoder's all-types table, the mirror equals the source."""

from __future__ import annotations

import random
import threading
import time

import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_crash import slot_inactive
from tests.integration.test_decoder_types import CASES, USER_TYPES
from tests.integration.test_run_crash import Run
from tests.sinks.test_postgres import table_text
from walstream.postgres.replication import connect
from walstream.testing import wait_until

pytestmark = pytest.mark.spark

KEYS, TOTAL = 400, 20_000
LITERALS = ", ".join(lit for _, lit, _ in CASES)


def column(type_name: str) -> str:
    return next(f"c{i}" for i, (t, _, _) in enumerate(CASES) if t == type_name)


def write(dsn: str, start: int, n: int, seed: int) -> None:
    """n changes on KEYS keys (inserts of whole rows, updates of several types, deletes)
    in transactions of 1 to 60 changes."""
    rng = random.Random(seed)
    i4, txt, js, ts, num, arr, by = (column(t) for t in
                                     ("int4", "text", "jsonb", "timestamptz", "numeric", "int4[]", "bytea"))  # fmt: skip
    with connect(dsn, autocommit=True) as conn:
        done = 0
        while done < n:
            size = min(rng.choice((1, 5, 60)), n - done)
            with conn.transaction():
                for _ in range(size):
                    k, x = rng.randrange(KEYS), start + done
                    op = rng.random()
                    if op < 0.35:
                        conn.execute(
                            f"INSERT INTO alltypes VALUES ({k}, {LITERALS}) ON CONFLICT (id) "
                            f"DO UPDATE SET {i4} = {x}"
                        )
                    elif op < 0.85:
                        conn.execute(
                            f"UPDATE alltypes SET {i4} = %s, {txt} = %s, {js} = %s::jsonb, "
                            f"{ts} = now(), {num} = %s::numeric, {arr} = %s, {by} = %s WHERE id = %s",
                            (x, f"t{x} é", f'{{"x": {x}, "l": [1, null]}}', f"{x}.{x % 97}",
                             [x, None, -x], bytes([x % 256, 0, 255]), k),
                        )  # fmt: skip
                    else:
                        conn.execute("DELETE FROM alltypes WHERE id = %s", (k,))
                    done += 1


def test_the_mirror_equals_the_source_after_kill_9(db, tmp_path) -> None:
    db.execute(USER_TYPES)
    cols = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(CASES))
    db.execute(f"CREATE TABLE alltypes (id int PRIMARY KEY, {cols})")
    pub = db.create_publication("alltypes")
    slot = db.create_slot()  # before the writes: the slot holds all of them
    oracle = db.create_slot()  # the same changes, read by the test at the end
    mirror_db = unique("mirror")
    db.execute(f"CREATE DATABASE {mirror_db}")
    mirror = db.server.dsn(mirror_db)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "max_changes_per_batch": 2000}],
        "sinks": [{"name": "mirror", "source": "app", "batch_size": 300,
                   "destination": {"type": "postgres", "dsn": mirror}}],
    }))  # fmt: skip

    def cursor() -> int:
        with connect(mirror, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('walstream.mirror_cursors')").fetchone()[0] is None:
                return 0
            row = conn.execute("SELECT max(lsn) FROM walstream.mirror_cursors").fetchone()
            return int(row[0] or 0)

    write(db.dsn, 0, TOTAL // 2, seed=1)
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: cursor() > 0, 180, message=lambda: f"nothing applied:\n{run.output()}")
        writer = threading.Thread(target=write, args=(db.dsn, TOTAL // 2, TOTAL // 2, 2))
        writer.start()
        time.sleep(random.Random(3).uniform(1, 6))  # mid-stream, mid-chunk perhaps
        applied_at_kill = cursor()
        run.kill()
        writer.join(300)
        wait_until(lambda: slot_inactive(db, slot), 30)
        run = Run(config, tmp_path)
        end = int(db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        json_cols = {f"c{i}" for i, (t, _, _) in enumerate(CASES) if t == "json"}
        lossy = {
            f"c{i}" for i, (_, lit, _) in enumerate(CASES) if lit in ("'null'", "'[0:1]={5,6}'")
        }

        def same() -> bool:
            return table_text(mirror, "public.alltypes", json_cols, lossy) == (
                table_text(db.dsn, "public.alltypes", json_cols, lossy)
            )

        wait_until(
            same,
            300,
            interval=2,
            message=lambda: f"mirror at {cursor():X} of {end:X}:\n{run.output()[-3000:]}",
        )
        rows = db.execute("SELECT count(*) FROM alltypes")[0][0]
        print(f"mirror equals the source: {rows} rows after {TOTAL:,} changes; "
              f"killed with the mirror at {applied_at_kill:X}")  # fmt: skip
        assert 0 < applied_at_kill < end
        # the cursor is exactly the writer's last transaction (read from the oracle slot)
        assert cursor() == last_commit(db, oracle, pub), f"{cursor():X}"
    finally:
        run.kill()
        db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")


def last_commit(db, slot: str, pub: str) -> int:
    """The commit LSN of the last transaction with a change that the slot holds."""
    last, current = 0, 0
    for m in db.read(slot, pub, timeout=300):
        kind = m.payload[:1]
        if kind == b"B":
            current = int.from_bytes(m.payload[1:9], "big")  # the Begin's final (commit) LSN
        elif kind in (b"I", b"U", b"D", b"T"):
            last = current
    return last
