"""A wrong setup fails the query at start with the fix, and never moves the slot."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import unique
from walstream.postgres.embedded import free_port
from walstream.testing import wait_until

pytestmark = pytest.mark.spark


def failure(spark, tmp_path, **options: str) -> str:
    """Start a query that must fail; return its error text."""
    try:
        reader = spark.readStream.format("walstream")
        for k, v in options.items():
            reader = reader.option(k, v)
        query = (
            reader.load()
            .writeStream.format("memory")
            .queryName(unique("q"))
            .option("checkpointLocation", str(tmp_path / unique("ckpt")))
            .start()
        )
    except Exception as exc:  # failed while planning
        return str(exc)
    try:
        exc = wait_until(query.exception, timeout=60, message="the query did not fail")
        return str(exc)
    finally:
        query.stop()


def confirmed(db, slot):
    return db.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )


def test_unreachable_server(spark, tmp_path):
    text = failure(
        spark, tmp_path, dsn=f"postgresql://postgres@127.0.0.1:{free_port()}/x", slot="s"
    )
    assert "cannot connect to PostgreSQL" in text
    assert "check that the server runs" in text


def test_missing_dsn_and_bad_options(spark, tmp_path, db):
    assert 'option "dsn" is required' in failure(spark, tmp_path, slot="s")
    text = failure(spark, tmp_path, dsn=db.dsn, maxChangesPerBatch="lots")
    assert "option \"maxChangesPerBatch\" is 'lots'; it must be a number >= 1" in text
    assert "option \"slot\" is 'Bad-Name'" in failure(spark, tmp_path, dsn=db.dsn, slot="Bad-Name")


def test_wal_level_not_logical(spark, tmp_path, replica_level_server):
    text = failure(spark, tmp_path, dsn=replica_level_server.dsn(), slot="s")
    assert "wal_level is 'replica'" in text
    assert "ALTER SYSTEM SET wal_level = logical;" in text


def test_role_without_replication_permission(spark, tmp_path, db):
    db.execute("CREATE ROLE plain LOGIN")
    try:
        text = failure(spark, tmp_path, dsn=db.server.dsn(db.name, user="plain"), slot="s")
        assert "role plain has no REPLICATION attribute" in text
        assert 'ALTER ROLE "plain" WITH REPLICATION;' in text
    finally:
        db.execute(f"REVOKE ALL ON DATABASE {db.name} FROM plain")
        db.execute("DROP ROLE plain")


def test_slot_with_another_plugin_is_left_alone(spark, tmp_path, db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = db.create_slot("test_decoding")
    before = confirmed(db, slot)
    text = failure(spark, tmp_path, dsn=db.dsn, slot=slot)
    assert "needs a logical pgoutput slot" in text and f"pg_drop_replication_slot('{slot}')" in text
    assert confirmed(db, slot) == before


def test_publication_missing_a_requested_table(spark, tmp_path, db):
    db.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    pub = db.create_publication("a")
    slot = db.create_slot()
    before = confirmed(db, slot)
    text = failure(
        spark, tmp_path, dsn=db.dsn, slot=slot, publication=pub, tables="public.a,public.b"
    )
    assert "does not cover public.b" in text
    assert f'ALTER PUBLICATION "{pub}" ADD TABLE "public"."b";' in text
    assert confirmed(db, slot) == before


def test_slot_in_use_by_another_connection(spark, tmp_path, db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    db.execute("INSERT INTO t VALUES (1)")
    # a real consumer that answers keepalives holds the slot
    holder = subprocess.Popen(
        [
            str(db.server.bin / "pg_recvlogical"), "-d", db.dsn, "-S", slot, "--start", "-f", "/dev/null",
            "-o", "proto_version=1", "-o", f"publication_names={pub}", "-F", "0", "-s", "1",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(
            lambda: db.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )[0][0],
            30,
        )
        text = failure(spark, tmp_path, dsn=db.dsn, slot=slot, publication=pub)
        assert "slot is in use by another connection" in text
        assert holder.poll() is None  # the other consumer was not disturbed
    finally:
        holder.terminate()
        holder.wait(10)


def test_streaming_options_are_checked_before_anything_is_read(spark, tmp_path, db):
    text = failure(spark, tmp_path, dsn=db.dsn, streaming="yes")
    assert "option \"streaming\" is 'yes'; it must be true or false" in text
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    missing = tmp_path / "no-such-dir"
    text = failure(spark, tmp_path, dsn=db.dsn, slot=slot, publication=pub, streaming="true",
                   spillDir=str(missing))  # fmt: skip
    assert f"cannot spool in-progress transactions under {missing}" in text
    assert "set the source's spill_dir to a writable local directory" in text
