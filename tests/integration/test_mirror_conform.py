"""The Postgres mirror brings a target table's columns to the source's as the target's own
catalog has them, not as the process last saw them: a process that never saw the table
before (a new Python worker, or `walstream run` after a restart) found a column the source
had dropped or widened meanwhile and left the target as it was — the widened column then
refused the first value past its old type (a dead letter), the dropped one stayed."""

from __future__ import annotations

from decimal import Decimal

import psycopg

from walstream.sinks.postgres.definitions import conform, load_definition


def columns(dsn: str, table: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (table,),
        ).fetchall()


def test_a_target_table_follows_the_source_it_lagged_behind(db, other_db):
    # the target as an earlier run left it; the source changed since
    other_db.execute("CREATE TYPE mood AS ENUM ('ok')")
    other_db.execute(
        "CREATE TABLE s (id int PRIMARY KEY, a int, c numeric(6,2), d text, m mood, keep text)"
    )
    other_db.execute("INSERT INTO s VALUES (1, 7, 1.25, 'x', 'ok', 'k')")
    db.execute("CREATE TYPE mood AS ENUM ('ok')")
    db.execute("CREATE TABLE s (id int PRIMARY KEY, a bigint, c numeric(12,2), e text, m mood)")
    with psycopg.connect(db.dsn) as source, psycopg.connect(other_db.dsn) as target:
        fresh = load_definition(source, "public", "s", "public")
        # a change from before `keep` was dropped still names it: it stays for now
        conform(target, fresh, {"id", "keep"}, create_tables=True)
        target.commit()
    assert columns(other_db.dsn, "s") == [
        ("id", "integer"), ("a", "bigint"), ("c", "numeric(12,2)"), ("m", "mood"),
        ("keep", "text"), ("e", "text"),
    ]  # fmt: skip
    with psycopg.connect(other_db.dsn) as conn:
        assert conn.execute("SELECT id, a, c, m::text FROM s").fetchall() == [
            (1, 7, Decimal("1.25"), "ok")
        ]
        conn.execute("INSERT INTO s (id, a) VALUES (2, 5000000000)")  # past int: taken now


def test_a_table_walstream_did_not_create_only_gains_columns(db, other_db):
    other_db.execute("CREATE TABLE s (id int PRIMARY KEY, a int, mine text)")
    db.execute("CREATE TABLE s (id int PRIMARY KEY, a bigint, e text)")
    with psycopg.connect(db.dsn) as source, psycopg.connect(other_db.dsn) as target:
        conform(target, load_definition(source, "public", "s", "public"), set(), False)
        target.commit()
    assert columns(other_db.dsn, "s") == [
        ("id", "integer"), ("a", "integer"), ("mine", "text"), ("e", "text"),
    ]  # fmt: skip


def test_a_retype_the_rows_cannot_take_is_left_for_the_refused_value_to_name(db, other_db):
    other_db.execute("CREATE TABLE s (id int PRIMARY KEY, a text)")
    other_db.execute("INSERT INTO s VALUES (1, 'not a number')")
    db.execute("CREATE TABLE s (id int PRIMARY KEY, a int, b text)")
    with psycopg.connect(db.dsn) as source, psycopg.connect(other_db.dsn) as target:
        conform(target, load_definition(source, "public", "s", "public"), set(), True)
        target.commit()
    assert columns(other_db.dsn, "s") == [("id", "integer"), ("a", "text"), ("b", "text")]
