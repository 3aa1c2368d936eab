"""The Spark source end to end: format("walstream") → foreachBatch, against a real Postgres."""

from __future__ import annotations

import json

import pytest

from tests.conftest import unique
from tests.streams import StreamRun
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder

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
    "table_oid",
    "change_lsn",
)


def as_tuples(rows):
    return [tuple(getattr(r, c) for c in COLUMNS) for r in rows]


def oracle(db, slot, pub, source):
    """The same changes decoded directly from a second slot (the decoder oracle)."""
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder(source, meta.types, meta.primary_keys)
    return [r for m in db.read(slot, pub) for r in decoder.decode(m.payload, m.data_start)]


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
    # the commit before each transaction: the oracle knows it from its second one on
    known = [(r.last_commit_lsn, e.last_commit_lsn) for r, e in zip(rows, expected, strict=True)
             if e.last_commit_lsn is not None]  # fmt: skip
    assert known and all(mine == theirs for mine, theirs in known)
    assert all(r.change_lsn is not None and r.change_lsn < r.lsn for r in rows)
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
    oids = dict(db.execute("SELECT relname, oid::int8 FROM pg_class WHERE relname IN "
                           "('orders', 'items')"))  # fmt: skip
    assert [r.table_oid for r in rows] == [oids[r.table] for r in rows]


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


def test_a_querys_first_batch_with_changes_takes_at_most_a_thousand(db):
    """The reader as Spark drives it (no Spark needed): with a backlog of 2,500 changes in
    the slot, all received, the query's first batch with changes ends after 1,000 of
    them (FIRST_BATCH_ROWS), whatever maxChangesPerBatch; once a batch with changes was
    planned, the next takes up to maxChangesPerBatch."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from walstream.source.datasource import WalstreamDataSource
    from walstream.testing import wait_until

    db.execute("CREATE TABLE backlog (id int PRIMARY KEY)")
    pub = db.create_publication("backlog")
    slot = db.create_slot()
    for first in range(1, 2501, 300):  # 300-row transactions: the first batch ends inside one
        db.execute("INSERT INTO backlog SELECT g FROM generate_series(%s::int, %s::int) g",
                   (first, min(first + 299, 2500)))  # fmt: skip
    reader = WalstreamDataSource(
        {"dsn": db.dsn, "slot": slot, "publication": pub, "maxChangesPerBatch": "50000",
         "heartbeatInterval": "0"}
    ).streamReader(None)  # fmt: skip

    def changes(start: dict[str, int], end: dict[str, int]) -> list[int]:
        parts = reader.partitions(start, end)
        return [
            int(pk[0]) for p in parts for b in reader.read(p) for pk in b.column("pk").to_pylist()
        ]

    try:
        start = reader.initialOffset()
        limit = ReadMaxRows(50_000)
        reader.latestOffset(start, limit)  # starts reading the slot
        capture = reader._driver.capture
        wait_until(lambda: sum(rows for _, _, rows in capture.buffer.ends) == 2500, 60)
        first = reader.latestOffset(start, limit)
        assert changes(start, first) == list(range(1, 1001))
        second = reader.latestOffset(first, limit)
        assert changes(first, second) == list(range(1001, 2501))
    finally:
        reader.stop()


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


def test_schema_changes_mid_stream_drop_column_and_type_change(spark, db, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, a text, b int)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    with StreamRun(spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub) as run:
        run.query.processAllAvailable()
        db.execute("INSERT INTO t VALUES (1, 'x', 10)")
        db.execute("ALTER TABLE t DROP COLUMN a")
        db.execute("INSERT INTO t VALUES (2, 20)")
        db.execute("ALTER TABLE t ALTER COLUMN b TYPE numeric(10,2)")
        db.execute("INSERT INTO t VALUES (3, 30)")
        rows = run.wait_for_rows(3)
    assert [json.loads(r.record) for r in rows] == [
        {"id": 1, "a": "x", "b": 10},
        {"id": 2, "b": 20},
        {"id": 3, "b": "30.00"},  # numeric now: exact string
    ]


def test_full_buffer_pauses_reading_but_keeps_the_connection(spark, db, tmp_path):
    """A slow sink fills the 1 MiB buffer: Postgres is held back (it keeps the WAL), and for
    longer than wal_sender_timeout (10 s) capture keeps answering, so the walsender stays."""
    from walstream.postgres.replication import connect
    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    db.execute("ALTER TABLE t ALTER COLUMN pad SET STORAGE PLAIN")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    opts = dict(
        dsn=db.dsn,
        slot=slot,
        publication=pub,
        maxBufferBytes=str(1 << 20),
        maxChangesPerBatch="500",
    )
    reader = spark.readStream.format("walstream")
    for k, v in opts.items():
        reader = reader.option(k, v)
    batches: list[list] = []
    sent_during_stall: list[int] = []

    def lsn(conn, expr):
        return int(
            conn.execute(
                f"SELECT ({expr} - '0/0'::pg_lsn)::int8 FROM pg_stat_replication LIMIT 1"
            ).fetchone()[0]
        )

    def slow_sink(batch, batch_id):
        rows = batch.select("pk").collect()
        if rows and not sent_during_stall:
            # the slow sink under test: stall longer than wal_sender_timeout, watching the walsender
            with connect(db.dsn, autocommit=True) as conn:
                deadline = _time.monotonic() + 12
                while _time.monotonic() < deadline:
                    sent_during_stall.append(lsn(conn, "sent_lsn"))
                    _time.sleep(0.5)
        batches.append([int(r.pk[0]) for r in rows])

    import time as _time

    query = (
        reader.load()
        .writeStream.foreachBatch(slow_sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()
        pid = db.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )[0][0]
        start = int(db.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")[0][0])
        # ~21 MB in 200 transactions (one big transaction is decoded whole before it is sent)
        for first in range(1, 20001, 100):
            db.execute(
                "INSERT INTO t SELECT g, repeat('p', 1000) FROM generate_series(%s::int, %s::int) g",
                (first, first + 99),
            )
        end = int(db.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")[0][0])
        wait_until(
            lambda: sum(map(len, batches)) >= 20000,
            180,
            message=lambda: f"{sum(map(len, batches))} rows",
        )
        assert query.exception() is None
        assert (
            db.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))[
                0
            ][0]
            == pid
        )
    finally:
        query.stop()
    assert [i for b in batches for i in b] == list(range(1, 20001))
    held_back = max(sent_during_stall) - start
    assert held_back < (end - start) / 2, (
        f"walsender sent {held_back} of {end - start} bytes while the sink stalled"
    )


def test_a_batch_as_big_as_the_buffer_does_not_stop_the_stream(spark, db, tmp_path):
    """maxChangesPerBatch lets one batch take the whole 1 MiB buffer: Spark commits it only
    when it plans the next batch, which needs changes the full buffer had no room for.
    Capture reads on past its bound instead of waiting for a commit that cannot come."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    db.execute("ALTER TABLE t ALTER COLUMN pad SET STORAGE PLAIN")
    pub = db.create_publication("t")
    slot = db.create_slot()
    for first in range(1, 5001, 100):  # ~5 MB in 50 transactions
        db.execute(
            "INSERT INTO t SELECT g, repeat('p', 1000) FROM generate_series(%s::int, %s::int) g",
            (first, first + 99),
        )
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub,
        maxBufferBytes=str(1 << 20), maxChangesPerBatch="100000",
    ) as run:  # fmt: skip
        run.wait_for_rows(5000, timeout=120)
    assert [int(r.pk[0]) for r in run.collected.rows()] == list(range(1, 5001))


def test_the_first_batch_with_changes_is_small_and_the_next_ones_are_not(spark, db, tmp_path):
    """A query's first changes go out in a batch of at most FIRST_BATCH_ROWS (a cold batch
    of 50,000 delays the first message by seconds) and, with a backlog in the slot, in its
    batch 0 (not after an empty one); the batches after it take the limit."""
    from walstream.source.datasource import FIRST_BATCH_ROWS

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    n = 3 * FIRST_BATCH_ROWS
    db.execute("INSERT INTO t SELECT generate_series(1, %s)", (n,))
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub,
        maxChangesPerBatch="100000",
    ) as run:  # fmt: skip
        run.wait_for_rows(n, timeout=120)
    assert [int(r.pk[0]) for r in run.collected.rows()] == list(range(1, n + 1))
    sizes = [len(rows) for _, rows in run.collected.batches if rows]
    assert run.collected.batches[0][0] == 0 and run.collected.batches[0][1]  # batch 0 has them
    assert sizes[0] <= FIRST_BATCH_ROWS
    assert max(sizes[1:]) > FIRST_BATCH_ROWS, sizes  # one transaction: the rest in one batch


def test_stale_replication_connection_fails_loudly(spark, db, tmp_path):
    import os
    import signal

    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    run = StreamRun(
        spark,
        tmp_path / "ckpt",
        dsn=db.dsn,
        slot=slot,
        publication=pub,
        heartbeatInterval="1",
        heartbeatTimeout="5",
    )
    pid = None
    try:
        run.query.processAllAvailable()
        pid = db.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )[0][0]
        os.kill(pid, signal.SIGSTOP)  # the walsender hangs: connection open, nothing arrives
        exc = wait_until(
            run.query.exception, 60, message="the query did not notice the stale connection"
        )
        assert "the replication connection is stale" in str(exc)
        assert "heartbeat is sent every 1s" in str(exc)
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        run.stop()


def test_a_replayed_batch_the_slot_cannot_resend_fails_after_replay_timeout(spark, db, tmp_path):
    """The checkpoint holds a planned batch (an offset without its commit) whose changes
    the slot never sends: the replay waits `replayTimeout`, then fails the query, naming
    the wait and what to check, instead of waiting for ever or skipping the batch."""
    from walstream.change import format_lsn
    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub, slot, ckpt = db.create_publication("t"), unique("slot"), tmp_path / "ckpt"
    db.slots.append(slot)
    options = {"dsn": db.dsn, "slot": slot, "publication": pub, "replayTimeout": "3"}
    run = StreamRun(spark, ckpt, **options)
    try:
        run.query.processAllAvailable()  # started: the slot exists
        db.execute("INSERT INTO t VALUES (1)")
        run.wait_for_rows(1)
    finally:
        run.stop()
    offsets = sorted((f for f in (ckpt / "offsets").iterdir() if f.name.isdigit()),
                     key=lambda f: int(f.name))  # fmt: skip
    *head, last = offsets[-1].read_text().splitlines()
    beyond = {"lsn": json.loads(last)["lsn"] + (1 << 30), "seq": 0}  # 1 GiB past it
    (ckpt / "offsets" / str(int(offsets[-1].name) + 1)).write_text(
        "\n".join([*head, json.dumps(beyond)])
    )
    run = StreamRun(spark, ckpt, **options)
    try:
        exc = wait_until(run.query.exception, 120, message="the replay did not give up")
    finally:
        run.stop()
    assert (
        f"slot {slot} did not deliver the changes up to {format_lsn(beyond['lsn'])} (change 0) "
        "within 3s (replayTimeout)"
    ) in str(exc)
    assert run.collected.rows() == []  # nothing delivered from the batch it cannot read


def _rss_of_stream_readers() -> dict[int, int]:
    """pid → resident KB of the Python processes below this one that run a streaming
    source's reader (PySpark's python_streaming_source_runner: capture and its buffer)."""
    from pathlib import Path

    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            status = (d / "status").read_text()
        except OSError:
            continue
        if b"python_streaming_source_runner" in cmd:
            kb = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
            if kb:
                out[int(d.name)] = int(kb[0])
    return out


@pytest.mark.parametrize("streaming", [False, True], ids=["at-commit", "streamed"])
def test_a_transaction_much_larger_than_the_buffer_is_delivered_without_holding_it(
    spark, db, tmp_path, streaming
):
    """One transaction of ~80 MB (10,000 rows of 8 KB) through an 8 MiB read-ahead buffer:
    it arrives in order, exactly once, in many batches that end inside the transaction,
    and the process that reads the slot never holds more than a small part of it. Streamed
    (`streaming`, Postgres sending it from its first MB on), it waits on walstream's disk
    for its commit, not in memory."""
    import threading

    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    db.execute("ALTER TABLE t ALTER COLUMN pad SET STORAGE PLAIN")
    pub = db.create_publication("t")
    slot = db.create_slot()
    batches: list[list[tuple[int, int]]] = []
    options = dict(dsn=db.dsn, slot=slot, publication=pub, maxBufferBytes=str(8 << 20),
                   maxChangesPerBatch="500")  # fmt: skip
    if streaming:
        db.execute(f"ALTER DATABASE {db.name} SET logical_decoding_work_mem = '1MB'")
        options |= dict(streaming="true", spillDir=str(tmp_path))

    def keep_keys(batch, batch_id):  # only (pk, lsn): the test's own memory stays small
        rows = batch.orderBy("lsn", "seq").select("pk", "lsn").collect()
        batches.append([(int(r.pk[0]), r.lsn) for r in rows])

    reader = spark.readStream.format("walstream")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load().writeStream.foreachBatch(keep_keys)
        .option("checkpointLocation", str(tmp_path / "ckpt")).start()
    )  # fmt: skip
    peak: dict[int, int] = {}
    samples = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            for pid, kb in _rss_of_stream_readers().items():
                peak[pid] = max(peak.get(pid, 0), kb)
            samples[0] += 1

    try:
        query.processAllAvailable()
        before = _rss_of_stream_readers()
        assert before, "no python_streaming_source_runner process found"
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        n = 10_000
        db.execute("INSERT INTO t SELECT g, repeat('p', 8000) FROM generate_series(1, %s) g", (n,))
        wait_until(
            lambda: query.exception() is not None or sum(map(len, batches)) >= n,
            300,
            message=lambda: f"{sum(map(len, batches))} rows",
        )
        assert query.exception() is None
        taken = samples[0]  # a whole sample after the last batch
        wait_until(lambda: samples[0] >= taken + 2, 10, message="no memory sample taken")
    finally:
        stop.set()
        query.stop()
    rows = [r for b in batches for r in b]
    assert [pk for pk, _ in rows] == list(range(1, n + 1))
    assert len({lsn for _, lsn in rows}) == 1  # one transaction
    assert sum(1 for b in batches if b) >= 20  # delivered in pieces of at most 500
    growth_mb = {pid: (peak.get(pid, kb) - kb) / 1024 for pid, kb in before.items()}
    print(f"stream reader RSS growth (MB): {growth_mb}")
    # Holding the transaction would take >80 MB in the reader; the buffer is 8 MiB.
    assert max(growth_mb.values()) < 40, growth_mb
    if streaming:  # it was streamed: the server did not hold it until the commit
        (streamed,) = db.execute(
            "SELECT stream_bytes FROM pg_stat_replication_slots WHERE slot_name = %s", (slot,)
        )[0]
        assert streamed > 50 << 20
