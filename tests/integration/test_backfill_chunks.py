"""Key-range chunks for backfills, on real tables: together the chunks read every row
exactly once, in key order, for integer, composite and text keys and a partial predicate."""

from __future__ import annotations

import pytest

from walstream.backfill.chunks import check_where, chunk_query, describe, estimate_rows, plan
from walstream.backfill.predicate import parse
from walstream.errors import ConfigError


def read_all(db, table, size, where=None):
    where = parse(where) if where else None
    t = describe(db.conn, "public", table)
    check_where(db.conn, t, where)
    chunks = list(plan(db.conn, t, size, where))
    rows = []
    for r in chunks:
        query, params = chunk_query(t, r, where)
        part = db.conn.execute(query, params).fetchall()
        assert len(part) <= size
        rows.extend(part)
    return chunks, rows


def test_integer_keys_are_cut_into_ranges_that_cover_each_row_once(db):
    db.execute("CREATE TABLE nums (id bigint PRIMARY KEY, v text)")
    db.execute("INSERT INTO nums SELECT g * 3, 'v' || g FROM generate_series(1, 1050) g")
    db.execute("DELETE FROM nums WHERE id % 7 = 0")  # gaps in the key space
    expected = db.execute("SELECT id, v FROM nums ORDER BY id")
    chunks, rows = read_all(db, "nums", 100)
    assert rows == expected
    assert len(chunks) == -(-len(expected) // 100)  # full chunks, then the rest
    assert chunks[0].after is None and chunks[-1].upto is None


def test_composite_and_text_keys_follow_the_index_order(db):
    db.execute("CREATE TABLE pairs (a int, b text, n int, PRIMARY KEY (a, b))")
    db.execute(
        "INSERT INTO pairs SELECT g % 13, 'k' || (g * 7919 % 1000) || ' é''\"', g "
        "FROM generate_series(1, 2000) g ON CONFLICT DO NOTHING"
    )
    chunks, rows = read_all(db, "pairs", 77)
    assert rows == db.execute("SELECT a, b, n FROM pairs ORDER BY a, b")
    assert len(chunks) > 20
    db.execute('CREATE TABLE words (w text COLLATE "C" PRIMARY KEY)')
    db.execute("INSERT INTO words SELECT md5(g::text) FROM generate_series(1, 500) g")
    db.execute("INSERT INTO words VALUES ('ünïcödé'), (''), ('a''b,c)')")
    _, rows = read_all(db, "words", 50)
    assert rows == db.execute("SELECT w FROM words ORDER BY w")


def test_a_where_predicate_reads_only_its_rows(db):
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
    db.execute(
        "INSERT INTO orders SELECT g, CASE WHEN g % 4 = 0 THEN 'open%' ELSE 'done' END "
        "FROM generate_series(1, 1000) g"
    )
    where = "status LIKE 'open%'"
    chunks, rows = read_all(db, "orders", 60, where)
    assert rows == db.execute(
        "SELECT id, status FROM orders WHERE status LIKE 'open%%' ORDER BY id"
    )
    assert len(chunks) == -(-250 // 60)


def test_a_table_without_a_key_or_a_bad_predicate_is_refused_with_the_fix(db):
    db.execute("CREATE TABLE loose (n int)")
    with pytest.raises(ConfigError, match=r"public.loose has no primary key") as err:
        describe(db.conn, "public", "loose")
    assert "ADD PRIMARY KEY" in str(err.value)
    with pytest.raises(ConfigError, match=r"public.nothing does not exist"):
        describe(db.conn, "public", "nothing")
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(ConfigError, match=r"--where 'no_such_col > 1' is refused.*no_such_col"):
        check_where(db.conn, describe(db.conn, "public", "t"), parse("no_such_col > 1"))
    with pytest.raises(
        ConfigError, match=r"is refused: it is not a valid predicate on public.t: argument of AND"
    ):
        check_where(db.conn, describe(db.conn, "public", "t"), parse("id || 'x'"))


def test_the_row_estimate_comes_from_the_planner(db):
    db.execute("CREATE TABLE est (id int PRIMARY KEY, kind text)")
    db.execute("INSERT INTO est SELECT g, CASE WHEN g % 10 = 0 THEN 'a' ELSE 'b' END "
               "FROM generate_series(1, 20000) g")  # fmt: skip
    db.execute("ANALYZE est")
    t = describe(db.conn, "public", "est")
    assert estimate_rows(db.conn, t, None) == 20000
    assert 1500 <= estimate_rows(db.conn, t, parse("kind = 'a'")) <= 2500  # the planner's guess
