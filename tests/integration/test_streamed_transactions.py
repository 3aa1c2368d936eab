"""`streaming: true`: Postgres sends large transactions while they run (protocol 2);
walstream spools them and delivers each once, at its commit, or never when it aborts."""

from __future__ import annotations

import psycopg
import pytest

from tests.streams import StreamRun
from walstream.change import parse_lsn
from walstream.testing import wait_until

pytestmark = pytest.mark.spark

#: Debian's server and the newest major (tests/conftest.py).
ON_EVERY_SERVER = True

PAD = "p" * 200  # ~250 bytes a row: 300 rows pass the 64 kB below


def slot_stats(db, slot: str) -> tuple[int, int, int]:
    """(stream_txns, stream_bytes, spill_bytes) the server reports for the slot."""
    rows = db.execute(
        "SELECT stream_txns, stream_bytes, spill_bytes FROM pg_stat_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    return rows[0] if rows else (0, 0, 0)


def streamed_more_than(db, slot: str, nbytes: int) -> int:
    """Wait until the walsender has streamed more than `nbytes` in all; return how much."""
    wait_until(lambda: slot_stats(db, slot)[1] > nbytes, 60,
               message=lambda: f"streamed {slot_stats(db, slot)}")  # fmt: skip
    return slot_stats(db, slot)[1]


def confirmed_past(db, slot: str, lsn: int) -> None:
    """Wait until the slot's confirmed position is past `lsn`."""

    def past() -> bool:
        rows = db.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
        return parse_lsn(rows[0][0]) > lsn

    wait_until(past, 60, message=f"the slot never confirmed past {lsn}")


def terminate_walsender(db, slot: str) -> None:
    def done() -> bool:
        rows = db.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active",
            (slot,),
        )
        return bool(rows and rows[0][0])

    wait_until(done, 30, message="the slot's walsender never became active")


def test_streamed_transactions_arrive_whole_at_their_commit_and_aborted_ones_never(
    spark, db, tmp_path
):
    # The walsender of this database streams any transaction past 64 kB of changes.
    db.execute(f"ALTER DATABASE {db.name} SET logical_decoding_work_mem = '64kB'")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    spill = tmp_path / "spill"
    spill.mkdir()
    big = psycopg.connect(db.dsn, autocommit=False)
    with StreamRun(
        spark, tmp_path / "ckpt", dsn=db.dsn, slot=slot, publication=pub, streaming="true",
        spillDir=str(spill), maxBufferBytes=str(1 << 20), maxChangesPerBatch="1000",
    ) as run, big:  # fmt: skip
        run.query.processAllAvailable()
        # A transaction of 3,000 rows, streamed while it runs ...
        big.execute("INSERT INTO t SELECT g, %s FROM generate_series(1, 3000) g", (PAD,))
        sent = streamed_more_than(db, slot, 0)
        # ... a small one commits meanwhile and is delivered while the big one is open,
        db.execute("INSERT INTO t VALUES (10001, 'small')")
        rows = run.wait_for(lambda rows: len(rows) >= 1, what="the small transaction")
        assert [r.pk for r in rows] == [["10001"]]
        # a savepoint's 5,000 rows are streamed, then rolled back,
        big.execute("SAVEPOINT s")
        big.execute("INSERT INTO t SELECT g, %s FROM generate_series(20001, 25000) g", (PAD,))
        sent = streamed_more_than(db, slot, sent)
        big.execute("ROLLBACK TO SAVEPOINT s")
        big.execute("INSERT INTO t VALUES (30001, 'after the rollback')")
        stream_txns, _, spill_bytes = slot_stats(db, slot)
        assert stream_txns >= 1  # streamed by the server while it ran ...
        assert spill_bytes == 0  # ... never spilled to the server's disk (pg_replslot)
        big.commit()
        # Delivered, and confirmed to Postgres: a new walsender will not send it again.
        rows = run.wait_for(lambda rows: len(rows) >= 3002, 120, "the first big transaction")
        confirmed_past(db, slot, rows[-1].lsn)
        sent = slot_stats(db, slot)[1]
        # Another one, and the connection breaks before its commit: the new walsender
        # streams it again from its start, and what was spooled must not count twice.
        big.execute("INSERT INTO t SELECT g, %s FROM generate_series(60001, 63000) g", (PAD,))
        sent = streamed_more_than(db, slot, sent)
        terminate_walsender(db, slot)
        sent = streamed_more_than(db, slot, sent)
        big.commit()
        # Another streamed transaction aborts: nothing of it may arrive.
        big.execute("INSERT INTO t SELECT g, %s FROM generate_series(40001, 43000) g", (PAD,))
        sent = streamed_more_than(db, slot, sent)
        big.rollback()
        db.execute("INSERT INTO t VALUES (50001, 'last')")
        rows = run.wait_for(lambda rows: any(r.pk == ["50001"] for r in rows), 120, "the last row")
        run.query.processAllAvailable()
        rows = run.collected.rows()
    expected = [10001, *range(1, 3001), 30001, *range(60001, 63001), 50001]
    assert [int(r.pk[0]) for r in rows] == expected  # each once, in commit order
    committed = rows[1:3002]
    assert len({r.lsn for r in committed}) == 1  # one transaction, numbered like one
    assert [r.seq for r in committed] == list(range(3001))
    again = rows[3002:-1]
    assert len({r.lsn for r in again}) == 1 and [r.seq for r in again] == list(range(3000))
    assert rows[0].lsn < committed[0].lsn < again[0].lsn < rows[-1].lsn
    # each spooled change keeps its own WAL position (before its commit), and its
    # transaction the end of the commit before it
    for txn in (committed, again):
        at = [r.change_lsn for r in txn]
        assert all(at) and at == sorted(at) and len(set(at)) == len(at) and at[-1] < txn[0].lsn
    assert committed[0].last_commit_lsn is not None and again[0].last_commit_lsn is not None
    assert list(spill.iterdir()) == []  # the spool's files have no name: nothing is left
