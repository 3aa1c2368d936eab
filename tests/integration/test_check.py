"""`walstream check`: a correct database passes; each wrong setup is an error that names the fix."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from walstream.cli import app
from walstream.postgres.setup import check_database, has_errors

#: Debian's server and the newest major (tests/conftest.py).
ON_EVERY_SERVER = True

runner = CliRunner()


def by_subject(findings):
    return {f.subject: f for f in findings}


@pytest.fixture
def shop(db):
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
    db.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
    return db


def test_correct_database_passes(shop):
    pub = shop.create_publication("orders")
    slot = shop.create_slot()
    findings = check_database(shop.dsn, slot, pub, ["public.orders"])
    assert not has_errors(findings), findings
    assert all(f.level == "ok" for f in findings), findings
    got = by_subject(findings)
    assert got["wal_level"].message == "logical"
    assert got[f"slot {slot}"].message == "exists (pgoutput)"
    assert got["table public.orders"].message == "primary key (id), replica identity FULL"

    result = runner.invoke(
        app,
        ["check", "--dsn", shop.dsn, "--slot", slot, "--publication", pub, "-t", "public.orders"],
    )
    assert result.exit_code == 0, result.output
    assert "ready: 0 error(s), 0 warning(s)" in result.output


def test_default_replica_identity_warns_with_exact_statement(db):
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    findings = check_database(db.dsn, tables=["public.items"])
    f = by_subject(findings)["table public.items"]
    assert f.level == "warning"
    assert f.fix == 'for old values: ALTER TABLE "public"."items" REPLICA IDENTITY FULL;'
    assert not has_errors(findings)


def test_missing_publication_names_the_create_statement(shop):
    findings = check_database(shop.dsn, publication="nope", tables=["public.orders"])
    f = by_subject(findings)["publication nope"]
    assert f.level == "warning"
    assert "does not exist yet; walstream run creates it" in f.message
    assert f.fix == 'to create it yourself: CREATE PUBLICATION "nope" FOR TABLE "public"."orders";'


def test_a_missing_table_is_the_only_fix_suggested(db):
    """No FOR ALL TABLES for a table that does not exist: the empty list is not "all"."""
    findings = check_database(db.dsn, publication="nope", tables=["public.nosuch"])
    assert by_subject(findings)["table public.nosuch"].level == "error"
    pub = by_subject(findings)["publication nope"]
    assert pub.fix is None and "once they exist" in pub.message
    assert not any("FOR ALL TABLES" in (f.fix or "") + f.message for f in findings)


def test_publication_not_covering_a_table_is_an_error(shop):
    shop.execute("CREATE TABLE other (id int PRIMARY KEY)")
    pub = shop.create_publication("other")
    findings = check_database(shop.dsn, publication=pub, tables=["public.*"])
    f = by_subject(findings)[f"publication {pub}"]
    assert f.level == "error"
    assert f.message == "does not cover public.orders"
    assert f.fix == f'ALTER PUBLICATION "{pub}" ADD TABLE "public"."orders";'


def test_table_without_primary_key_is_an_error(db):
    db.execute("CREATE TABLE events (at timestamptz, what text)")
    pub = db.create_publication("events")
    findings = check_database(db.dsn, publication=pub)  # tables come from the publication
    f = by_subject(findings)["table public.events"]
    assert f.level == "error"
    assert "has no primary key" in f.message
    assert 'ALTER TABLE "public"."events" ADD PRIMARY KEY (...)' in f.fix
    assert 'ALTER TABLE "public"."events" REPLICA IDENTITY FULL' in f.fix

    result = runner.invoke(app, ["check", "--dsn", db.dsn, "--publication", pub])
    assert result.exit_code == 1
    assert "not ready: 1 error(s)" in result.output


def test_missing_table_and_wrong_slot_plugin(db):
    slot = db.create_slot("test_decoding")
    findings = check_database(db.dsn, slot=slot, tables=["public.ghost"])
    got = by_subject(findings)
    assert got["table public.ghost"].level == "error"
    assert got[f"slot {slot}"].level == "error"
    assert "needs a logical pgoutput slot" in got[f"slot {slot}"].message
    assert f"pg_drop_replication_slot('{slot}')" in got[f"slot {slot}"].fix


def test_role_without_replication_permission(db):
    db.execute("CREATE ROLE plain LOGIN")
    try:
        findings = check_database(db.server.dsn(db.name, user="plain"))
        f = by_subject(findings)["replication permission"]
        assert f.level == "error"
        assert f.fix == 'run as a superuser: ALTER ROLE "plain" WITH REPLICATION;'
    finally:
        db.execute(f"REVOKE ALL ON DATABASE {db.name} FROM plain")
        db.execute("DROP ROLE plain")


def test_unreachable_server_is_a_clear_error():
    from walstream.postgres.embedded import free_port

    findings = check_database(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    (f,) = findings
    assert f.level == "error" and f.subject == "connection"
    assert "cannot connect to PostgreSQL" in f.message
    assert "check that the server runs" in f.fix


def test_wal_level_replica_is_an_error_with_the_fix(replica_level_server):
    findings = check_database(replica_level_server.dsn())
    f = by_subject(findings)["wal_level"]
    assert f.level == "error"
    assert f.message == "wal_level is 'replica'; logical replication needs 'logical'"
    assert "ALTER SYSTEM SET wal_level = logical;" in f.fix and "restart" in f.fix
    result = runner.invoke(app, ["check", "--dsn", replica_level_server.dsn()])
    assert result.exit_code == 1


def test_the_server_version_and_what_it_enables(db):
    """On Debian's 15 the version-dependent features are "no (needs N+)", on 18 "yes"."""
    version = int(db.execute("SHOW server_version_num")[0][0])
    findings = by_subject(check_database(db.dsn))
    message = findings["server version"].message
    assert message.startswith(f"PostgreSQL {db.execute('SHOW server_version')[0][0]}; ")
    for needs, what in ((16, "logical decoding on a standby"), (17, "failover slots"),
                        (18, "stored generated columns published")):  # fmt: skip
        assert f"{what}: {'yes' if version >= needs * 10000 else f'no (needs {needs}+)'}" in message
    keep = findings["max_slot_wal_keep_size"]
    assert keep.level == "ok" and keep.message.startswith("-1: a slot that stops advancing")
    work_mem = findings["logical_decoding_work_mem"]
    assert work_mem.level == "ok"
    assert work_mem.message.startswith(f"{db.execute('SHOW logical_decoding_work_mem')[0][0]}: ")
    assert "max_buffer_bytes" in work_mem.message
    streamed = by_subject(check_database(db.dsn, streaming=True))["logical_decoding_work_mem"]
    assert "streams a transaction with more changes than that while it runs" in streamed.message
    assert "spill_dir" in streamed.message


def test_replica_identity_nothing_is_an_error_that_names_the_fix(db):
    db.execute("CREATE TABLE n (id int PRIMARY KEY, v text)")
    db.execute("ALTER TABLE n REPLICA IDENTITY NOTHING")
    f = by_subject(check_database(db.dsn, tables=["public.n"]))["table public.n"]
    assert f.level == "error" and "REPLICA IDENTITY NOTHING" in f.message
    assert f.fix == 'ALTER TABLE "public"."n" REPLICA IDENTITY FULL; (or DEFAULT)'


def test_the_dsn_may_come_from_walstream_dsn(db, monkeypatch):
    monkeypatch.setenv("WALSTREAM_DSN", db.dsn)
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 0, result.output
    assert "wal_level" in result.output and "logical" in result.output
    monkeypatch.delenv("WALSTREAM_DSN")
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 2 and "give --dsn (or WALSTREAM_DSN)" in result.output


def test_no_free_slot_or_wal_sender_is_an_error_for_a_new_slot_only():
    from walstream.capture.stream import replication_connection, start_options
    from walstream.postgres.embedded import EmbeddedPostgres
    from walstream.testing import wait_until

    settings = {"max_replication_slots": "2", "max_wal_senders": "1"}
    with EmbeddedPostgres(settings=settings) as server:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
            for name in ("one", "two"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        full = by_subject(check_database(dsn, "three"))["replication slots"]
        assert full.level == "error" and full.message == "all 2 replication slots are in use"
        assert "max_replication_slots" in full.fix
        kept = by_subject(check_database(dsn, "one"))["replication slots"]  # it has its slot
        assert kept.level == "warning" and kept.message == "only 0 of 2 replication slots free"
        # The one WAL sender busy streaming a slot: a new source could not connect.
        stream = replication_connection(dsn)
        try:
            stream.cursor().start_replication(slot_name="one", decode=False,
                                              options=start_options("p"))  # fmt: skip
            wait_until(lambda: "wal senders" in by_subject(check_database(dsn, "one")), 30,
                       message="the WAL sender never showed as busy")  # fmt: skip
            busy = by_subject(check_database(dsn, "one"))["wal senders"]
        finally:
            stream.close()
        assert busy.level == "error" and busy.message == "all 1 WAL senders are busy"
        assert busy.fix == "raise max_wal_senders and restart PostgreSQL"
