"""The Spark source end to end: format("walstream") → foreachBatch, against a real Postgres."""

from __future__ import annotations

import json

import pytest

from tests.conftest import unique
from tests.streams import StreamRun
from walstream.postgres.catalog import load_metadata
from walstream.postgres.decoder import ChangeDecoder

pytestmark = pytest.mark.spark

COLUMNS = (
    "source",
    "lsn",
    "seq",
    "xid",
    "action",
    "schema",
    "table",
    "pk",
    "record",
    "old",
    "annotations",
    "unchanged_toast",
)


def as_tuples(rows):
    return [tuple(getattr(r, c) for c in COLUMNS) for r in rows]


def oracle(db, slot, pub, source):
    """The same changes decoded directly from a second slot (the decoder oracle)."""
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder(source, meta.types, meta.primary_keys)
    return [r for m in db.read(slot, pub) for r in decoder.decode(m.payload)]


def test_every_action_end_to_end_equals_the_decoder(spark, db, tmp_path):
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, total numeric, body text)")
    db.execute("ALTER TABLE orders ALTER COLUMN body SET STORAGE EXTERNAL")
    db.execute("CREATE TABLE items (sku text PRIMARY KEY, qty int)")
    db.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    pub = db.create_publication("orders", "items")
    slot = unique("slot")
    oracle_slot = db.create_slot()
    db.slots.append(slot)
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub, name="app"
    ) as run:
        run.wait_for(lambda rows: True)  # started: slot created
        run.query.processAllAvailable()
        big = "x" * 10_000
        with db.conn.transaction():
            db.execute(
                "SELECT pg_logical_emit_message(true, 'walstream:annotations', '{\"by\": \"test\"}')"
            )
            db.execute(
                "INSERT INTO orders VALUES (1, 'new', 10.5, %s), (2, 'new', 20, 'short')", (big,)
            )
            db.execute("INSERT INTO items VALUES ('a', 1), ('b', 2)")
        db.execute("UPDATE orders SET status = 'paid' WHERE id = 1")  # TOASTed body unchanged
        db.execute("UPDATE items SET qty = 5 WHERE sku = 'a'")  # FULL: old row
        db.execute("DELETE FROM orders WHERE id = 2")
        db.execute("ALTER TABLE orders ADD COLUMN note text")
        db.execute("INSERT INTO orders VALUES (3, 'new', 1, 'b', 'added column')")
        db.execute("TRUNCATE orders, items")
        rows = run.wait_for_rows(10)
    expected = oracle(db, oracle_slot, pub, "app")
    assert len(expected) == 10
    assert as_tuples(rows) == [tuple(getattr(e, c) for c in COLUMNS) for e in expected]
    assert [r.action for r in rows] == ["insert"] * 4 + [
        "update",
        "update",
        "delete",
        "insert",
        "truncate",
        "truncate",
    ]
    assert json.loads(rows[0].annotations) == {"by": "test"}
    assert rows[4].unchanged_toast == ["body"] and "body" not in json.loads(rows[4].record)
    assert json.loads(rows[5].old) == {"sku": "a", "qty": 1}
    assert json.loads(rows[7].record)["note"] == "added column"
    assert all(r.committed_at is not None for r in rows)


def test_admission_control_splits_a_large_transaction_over_batches(spark, db, tmp_path):
    db.execute("CREATE TABLE big (id int PRIMARY KEY)")
    pub = db.create_publication("big")
    slot = unique("slot")
    db.slots.append(slot)
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub, maxChangesPerBatch="1000"
    ) as run:
        run.query.processAllAvailable()
        db.execute("INSERT INTO big SELECT g FROM generate_series(1, 5000) g")
        rows = run.wait_for_rows(5000)
        batches = [(bid, rows) for bid, rows in run.collected.batches if rows]
    assert [int(r.pk[0]) for r in rows] == list(range(1, 5001))
    assert [r.seq for r in rows] == list(range(5000))
    assert len(batches) >= 5 and all(len(b) <= 1000 for _, b in batches)


def test_idle_database_slot_advances_while_another_database_writes(spark, db, pg, tmp_path):
    from walstream.postgres.replication import connect
    from walstream.testing import wait_until

    db.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
    pub = db.create_publication("quiet")
    slot = unique("slot")
    db.slots.append(slot)
    other = unique("busy")
    with connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {other}")
    try:
        with connect(pg.dsn(other), autocommit=True) as busy:
            busy.execute("CREATE TABLE noise (id serial PRIMARY KEY, pad text)")
            with StreamRun(
                spark,
                tmp_path / "ckpt",
                dsn=db.dsn,
                slot=slot,
                publication=pub,
                heartbeatInterval="1",
            ) as run:
                run.query.processAllAvailable()

                def confirmed() -> int:
                    row = db.execute(
                        "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,),
                    )
                    return int(row[0][0])

                before = confirmed()
                busy.execute(
                    "INSERT INTO noise (pad) SELECT repeat('x', 500) FROM generate_series(1, 2000)"
                )
                written = int(
                    busy.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()[
                        0
                    ]
                )
                wait_until(
                    lambda: confirmed() >= written,
                    timeout=30,
                    message="slot did not advance past the other database's WAL",
                )
                assert confirmed() > before
                assert run.collected.rows() == []  # heartbeats are not rows
    finally:
        with connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {other} WITH (FORCE)")


def test_reconnects_after_the_walsender_is_terminated(spark, db, tmp_path):
    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub, maxChangesPerBatch="100"
    ) as run:
        run.query.processAllAvailable()
        db.execute("INSERT INTO t SELECT g FROM generate_series(1, 500) g")
        run.wait_for_rows(100)

        def terminate() -> bool:
            rows = db.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active",
                (slot,),
            )
            return bool(rows and rows[0][0])

        wait_until(terminate, 30)
        db.execute("INSERT INTO t SELECT g FROM generate_series(501, 1000) g")
        rows = run.wait_for_rows(1000)
        assert not run.query.exception()
    assert [int(r.pk[0]) for r in rows] == list(range(1, 1001))  # all once, in order
