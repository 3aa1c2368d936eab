"""A slot PostgreSQL invalidated, or one someone dropped: the source stops and says what
was lost; `walstream recover` makes a new slot and backfills; nothing is re-created
behind the operator's back. The server caps slots at 1 MB of WAL (max_slot_wal_keep_size),
so a few switched WAL segments and a checkpoint invalidate an idle slot."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import SERVERS, TEST_SETTINGS, TestDatabase, fresh_database, unique
from tests.integration.test_backfill import messages
from tests.integration.test_server import health, metrics
from tests.streams import StreamRun
from walstream.backfill.store import DONE, BackfillStore
from walstream.change import format_lsn
from walstream.cli import app
from walstream.config import load_config
from walstream.errors import SetupError
from walstream.postgres.embedded import EmbeddedPostgres, wheel_pg_bin
from walstream.postgres.prepare import prepare_capture
from walstream.postgres.setup import check_database
from walstream.postgres.slots import SlotLost, slot_info
from walstream.runtime import Runtime
from walstream.server.monitor import SlotState, slot_state
from walstream.source.checkpoint import committed_lsn
from walstream.testing import supervised, wait_until


@pytest.fixture(scope="module", params=SERVERS)
def capped(request: pytest.FixtureRequest) -> Iterator[EmbeddedPostgres]:
    """Debian's server, then the newest (which names why: `invalidation_reason`)."""
    server = EmbeddedPostgres(
        settings={**TEST_SETTINGS, "max_slot_wal_keep_size": "1MB"},
        bin_dir=wheel_pg_bin() if request.param == "pg-newest" else None,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cdb(capped: EmbeddedPostgres) -> Iterator[TestDatabase]:
    with fresh_database(capped) as tdb:
        yield tdb


def invalidate(db: TestDatabase, slot: str) -> None:
    """Write WAL past the 1 MB the slot may hold back, then checkpoint: Postgres
    invalidates the (idle) slot."""
    db.execute("CREATE TABLE IF NOT EXISTS filler (id int, pad text)")
    for _ in range(3):
        db.execute("INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
        db.execute("SELECT pg_switch_wal()")
    db.execute("CHECKPOINT")
    wait_until(lambda: slot_info(db.conn, slot).lost, 30, message="the slot was not invalidated")  # type: ignore[union-attr]


def load_config_text(tmp_path: Path, raw: dict[str, Any]) -> Any:
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def files_config(db: TestDatabase, tmp_path: Path, slot: str, pub: str) -> dict[str, Any]:
    """Source `app` without heartbeats (nothing moves the slot but delivery) into a file
    sink `files` under tmp_path/out."""
    return {
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "heartbeat_interval": 0}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    }  # fmt: skip


def slot_exists(db: TestDatabase, slot: str) -> bool:
    return bool(db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)))


def captured(db: TestDatabase) -> tuple[str, str, int]:
    """Table t, its publication and a slot made as a source's first start makes it:
    (publication, slot, the slot's confirmed LSN)."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    return pub, slot, prepare_capture(db.dsn, slot, pub, [], "app")


def test_an_invalidated_slot_stops_the_source_with_the_lost_range_and_the_recovery(cdb):
    pub, slot, confirmed = captured(cdb)
    cdb.execute("INSERT INTO t VALUES (1)")
    invalidate(cdb, slot)
    for resume_from in (None, confirmed):  # fresh or from a checkpoint: lost either way
        with pytest.raises(SlotLost) as info:
            prepare_capture(cdb.dsn, slot, pub, [], "app", resume_from=resume_from)
        text = str(info.value)
        assert f"replication slot {slot} of source 'app' was invalidated by PostgreSQL" in text
        assert f"after {format_lsn(confirmed)} up to now (" in text
        assert "max_slot_wal_keep_size" in text
        assert "walstream recover app" in text
    # the lost slot is left as it is: walstream does not drop or replace it by itself
    assert slot_info(cdb.conn, slot).lost  # type: ignore[union-attr]
    slot_finding = next(
        f for f in check_database(cdb.dsn, slot, pub) if f.subject == f"slot {slot}"
    )
    assert slot_finding.level == "error"
    assert "invalidated by PostgreSQL: WAL it still needed was removed" in slot_finding.message
    assert slot_state(cdb.dsn, slot).wal_status == "lost"


def test_a_dropped_slot_is_not_created_again_when_the_source_resumes(cdb):
    pub, slot, confirmed = captured(cdb)
    cdb.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    with pytest.raises(SlotLost) as info:
        prepare_capture(cdb.dsn, slot, pub, [], "app", resume_from=confirmed)
    assert (f"replication slot {slot} of source 'app' does not exist, but the source resumes "
            f"from LSN {format_lsn(confirmed)}: the slot was dropped") in str(info.value)  # fmt: skip
    assert not slot_exists(cdb, slot)
    # starting fresh (no checkpoint) creates it, as on a first start
    prepare_capture(cdb.dsn, slot, pub, [], "app", resume_from=None)
    assert slot_exists(cdb, slot)


def fill_until_warned(db: TestDatabase, slot: str, table: str) -> SlotState:
    """Rows into `table` (one int column) until the idle slot is close to its WAL limit;
    the slot's state then."""
    for i in range(60):
        db.execute(f"INSERT INTO {table} SELECT generate_series(%s::int, %s::int)",
                   (i * 10_000, i * 10_000 + 9_999))  # fmt: skip
        state = slot_state(db.dsn, slot)
        assert state.wal_status != "lost"
        if state.retention_warning() is not None:
            return state
    pytest.fail(f"no warning while the slot neared its limit: {state}")


def test_a_slot_close_to_its_wal_limit_is_a_warning(capped, cdb):
    """Postgres counts what a slot may hold back to the end of the WAL segment (16 MB)
    past max_slot_wal_keep_size: WAL is written until under a quarter of that is left."""
    cdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = cdb.create_slot()
    first = slot_state(cdb.dsn, slot)
    assert first.safe_wal_bytes is not None and first.retention_warning() is None
    state = fill_until_warned(cdb, slot, "t")
    assert state.safe_wal_bytes is not None and state.safe_wal_bytes < first.safe_wal_bytes
    assert state.retention_warning() == (
        f"the slot may hold back only {state.safe_wal_bytes / (1 << 20):,.0f} MiB more WAL "
        "before PostgreSQL invalidates it (max_slot_wal_keep_size)"
    )


@pytest.mark.spark
def test_a_running_walstream_warns_of_a_slot_near_its_limit_in_health_metrics_and_log(
    spark, cdb, tmp_path, caplog
):
    """WAL of a table the publication leaves out piles up behind a slot that nothing moves
    (no heartbeats, no changes to deliver): the running walstream's /health has the source
    as a warning naming the limit, /metrics has the WAL left, and the log says it."""
    cdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    cdb.execute("CREATE TABLE filler (id int)")
    pub, slot = cdb.create_publication("t"), cdb.create_slot()
    state = fill_until_warned(cdb, slot, "filler")
    assert state.safe_wal_bytes is not None
    cfg = load_config_text(tmp_path, {**files_config(cdb, tmp_path, slot, pub),
                                      "server": {"port": 0}})  # fmt: skip
    caplog.set_level(logging.WARNING, logger="walstream.runtime")
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        url = rt.server.url

        def source() -> dict[str, Any]:
            return dict(health(url)["sources"][0])

        wait_until(lambda: source()["streaming"], 120, message=lambda: f"{source()}")
        h = source()
        assert h["status"] == "warning", h
        assert any("may hold back only" in r and "(max_slot_wal_keep_size)" in r
                   for r in h["reasons"]), h  # fmt: skip
        left = metrics(url)[("walstream_slot_safe_wal_bytes", (("source", "app"),))]
        assert 0 < left <= state.safe_wal_bytes and h["safe_wal_bytes"] == left
        wait_until(lambda: any(r.getMessage().startswith("source app: the slot may hold back "
                                                         "only") for r in caplog.records),
                   30, message="no warning in the log")  # fmt: skip


@pytest.mark.spark
def test_run_stops_on_a_lost_slot_and_recover_backfills_the_sinks(spark, cdb, tmp_path):
    """Postgres invalidates the slot under a running walstream: it stops with the error.
    Changes committed afterwards are lost: `walstream run` exits 2 naming them;
    `walstream recover` replaces the slot and backfills; the next run delivers the rows
    as the table has them."""
    cdb.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pub = cdb.create_publication("t")
    slot = unique("slot")
    cdb.slots.append(slot)
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump(files_config(cdb, tmp_path, slot, pub)))
    cfg = load_config(path)
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        cdb.execute("INSERT INTO t SELECT g, 'first' FROM generate_series(1, 5) g")
        wait_until(lambda: (p := rt.progress().get("files")) and p.delivered >= 5, 120)
        # Postgres invalidates the slot while walstream streams: it ends the connection
        invalidate(cdb, slot)
        wait_until(lambda: rt.fatal is not None, 120, message=lambda: f"{rt.sources()}")
        assert f"replication slot {slot} of source 'app' was invalidated" in str(rt.fatal)
    resume = committed_lsn(str(tmp_path / "ckpt" / "app"))
    assert resume is not None
    # changes committed while the slot is gone: they are lost
    cdb.execute("UPDATE t SET v = 'between' WHERE id = 2")
    cdb.execute("DELETE FROM t WHERE id = 3")
    cdb.execute("INSERT INTO t VALUES (6, 'between')")

    run = subprocess.run([sys.executable, "-m", "walstream.cli", "run", "-c", str(path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2, run.stderr
    err = " ".join(run.stderr.split())
    assert f"replication slot {slot} of source 'app' was invalidated by PostgreSQL" in err
    assert "walstream recover app" in err
    assert slot_info(cdb.conn, slot).lost  # type: ignore[union-attr]

    result = CliRunner().invoke(app, ["recover", "app", "--yes", "-c", str(path)])
    assert result.exit_code == 0, result.output
    new = slot_info(cdb.conn, slot)
    assert new is not None and not new.lost and new.confirmed is not None
    assert f"created slot {slot} at {format_lsn(new.confirmed)}" in result.output
    match = re.search(r"backfill (\d+): public\.t → sink files", result.output)
    assert match, result.output
    again = CliRunner().invoke(app, ["recover", "app", "--yes", "-c", str(path)])
    assert again.exit_code == 1 and "is healthy" in again.output

    store = BackfillStore(cdb.dsn)
    with supervised(Runtime(cfg, spark=spark).start()):
        cdb.execute("INSERT INTO t VALUES (7, 'after')")
        wait_until(lambda: (b := store.get(int(match[1]))) and b.status == DONE, 180)
        wait_until(lambda: any(m["record"]["id"] == 7 for m in messages(tmp_path / "out")), 60)
    got = messages(tmp_path / "out")
    changes = [
        (m["action"], m["record"]["id"], m["record"]["v"]) for m in got if m["action"] != "read"
    ]
    # the first run's inserts, then the change after recovery; the lost ones never arrive
    assert changes == [*(("insert", i, "first") for i in range(1, 6)), ("insert", 7, "after")]
    assert len([m for m in got if m["action"] == "insert" and m["record"]["id"] <= 5]) == 5
    reads = sorted((m["record"]["id"], m["record"]["v"]) for m in got if m["action"] == "read")
    table = sorted(cdb.execute("SELECT id, v FROM t WHERE id <= 6"))
    assert [r for r in reads if r[0] != 7] == table  # the rows as the table has them
    assert (3, "first") not in reads and 3 in {c[1] for c in changes}  # deleted in between: stays
    assert new.confirmed > resume  # the new slot starts after the lost changes


@pytest.mark.spark
def test_a_spark_query_resuming_from_its_checkpoint_without_its_slot_fails(spark, cdb, tmp_path):
    """format("walstream"): the slot dropped between two runs of a query is not made
    again; the query fails naming the LSN its checkpoint resumes from."""
    cdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = cdb.create_publication("t")
    slot = unique("slot")
    cdb.slots.append(slot)
    opts = {"dsn": cdb.dsn, "slot": slot, "publication": pub, "name": "app"}
    with StreamRun(spark, tmp_path / "ckpt", **opts) as run:
        run.query.processAllAvailable()  # the query made its slot
        cdb.execute("INSERT INTO t SELECT generate_series(1, 3)")
        run.wait_for_rows(3)
    resume = committed_lsn(str(tmp_path / "ckpt"))
    assert resume is not None
    wait_until(lambda: not cdb.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0], 30)  # fmt: skip
    cdb.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    cdb.execute("INSERT INTO t SELECT generate_series(4, 6)")  # lost: no slot kept it
    with StreamRun(spark, tmp_path / "ckpt", **opts) as again:
        wait_until(lambda: again.query.exception() is not None, 120)
        text = str(again.query.exception())
    assert (f"replication slot {slot} of source 'app' does not exist, but the source resumes "
            f"from LSN {format_lsn(resume)}") in " ".join(text.split())  # fmt: skip
    assert again.collected.rows() == []
    assert not slot_exists(cdb, slot)


@pytest.mark.spark
def test_a_remote_checkpoint_is_read_through_spark_so_a_dropped_slot_is_not_made_again(
    spark, db, tmp_path
):
    """The checkpoint on a Hadoop file system other than the local one (viewfs://, mounted
    on a local directory here; HDFS and S3 are read the same way): `walstream run` reads
    where it resumes through Spark, so a slot dropped between two runs stops the start
    instead of being made again; an unreadable checkpoint is an error, not a first start;
    and a location pyarrow cannot open for the staged files is refused at start."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub, slot = db.create_publication("t"), unique("slot")
    db.slots.append(slot)
    mount = unique("cluster").replace("_", "")  # a host name
    spark._jsc.hadoopConfiguration().set(
        f"fs.viewfs.mounttable.{mount}.link./ckpt", (tmp_path / "ckpt").as_uri()
    )
    (tmp_path / "ckpt").mkdir()
    remote = f"viewfs://{mount}/ckpt"
    opts = {"dsn": db.dsn, "slot": slot, "publication": pub, "name": "app"}
    with StreamRun(spark, f"{remote}/app", **opts) as run:  # type: ignore[arg-type]
        run.query.processAllAvailable()  # the query made its slot
        db.execute("INSERT INTO t SELECT generate_series(1, 3)")
        run.wait_for_rows(3)
    resume = committed_lsn(f"{remote}/app", spark)
    assert resume is not None and resume == committed_lsn(str(tmp_path / "ckpt" / "app"))
    wait_until(lambda: not slot_info(db.conn, slot).active, 30)  # type: ignore[union-attr]
    db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    db.execute("INSERT INTO t VALUES (6)")  # lost: no slot kept it
    cfg = load_config_text(tmp_path, {
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": remote},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    })  # fmt: skip
    with pytest.raises(SlotLost) as info:
        Runtime(cfg, spark=spark).start()
    assert (f"replication slot {slot} of source 'app' does not exist, but the source resumes "
            f"from LSN {format_lsn(resume)}") in str(info.value)  # fmt: skip
    assert not slot_exists(db, slot)
    with pytest.raises(SetupError, match=r"cannot read the streaming checkpoint viewfs://"):
        committed_lsn(f"viewfs://{mount}x/ckpt/app", spark)  # no mount table
    # With a slot again (as `walstream recover` makes): pyarrow cannot open viewfs://
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with pytest.raises(SetupError, match=r"through pyarrow, which cannot open it") as refused:
        Runtime(cfg, spark=spark).start()
    assert "s3://" in (refused.value.fix or "")


def test_a_slot_lost_while_its_sink_is_paused_stops_the_run(spark, cdb, tmp_path, monkeypatch):
    """The most common way a slot gets lost: nothing consumes it, because its sink is
    paused. The batch waiting for the resume looks at the slot, and the run stops with the
    error (before, it waited for a resume that could deliver nothing)."""
    from walstream.delivery.parking import ParkingLot
    from walstream.pipeline import batches as pipeline

    monkeypatch.setattr(pipeline, "SLOT_CHECK_SECONDS", 1.0)
    cdb.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pub = cdb.create_publication("t")
    slot = unique("slot")
    cdb.slots.append(slot)
    cfg = load_config_text(tmp_path, files_config(cdb, tmp_path, slot, pub))
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        wait_until(lambda: slot_exists(cdb, slot), 120)
        ParkingLot(cfg.state_dsn).set_paused("files", True, "maintenance")
        cdb.execute("INSERT INTO t VALUES (1, 'held')")
        wait_until(lambda: any(sq.pipeline.holding for sq in rt.queries), 120,
                   message=lambda: f"{rt.sources()}")  # fmt: skip
        invalidate(cdb, slot)
        wait_until(lambda: rt.fatal is not None, 60, message=lambda: f"{rt.sources()}")
        assert f"replication slot {slot} of source 'app' was invalidated" in str(rt.fatal)
