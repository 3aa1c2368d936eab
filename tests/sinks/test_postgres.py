"""The Postgres mirror sink against two real databases: changes decoded from the source's
WAL are applied to the target, which must then equal the source."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from tests.conftest import TestDatabase
from tests.integration.test_decoder_types import CASES, USER_TYPES, cases_for
from walstream.change import ChangeRow
from walstream.config import Destination
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder
from walstream.errors import SinkError
from walstream.formats.mirror import mirror
from walstream.postgres.replication import connect
from walstream.sinks.base import BatchInfo, Message
from walstream.sinks.postgres import sink as postgres_sink
from walstream.sinks.registry import sink_for

#: Debian's server and the newest major (tests/conftest.py) as the source; the target is 15.
ON_EVERY_SERVER = True


def changes(db: TestDatabase, slot: str, pub: str) -> list[ChangeRow]:
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("app", meta.types, meta.primary_keys)
    return [r for m in db.read(slot, pub) for r in decoder.decode(m.payload, m.data_start)]


def messages(rows: list[ChangeRow]) -> list[Message]:
    return [
        Message(r.lsn, r.seq, mirror(r).encode(), None, None, f"{r.schema}.{r.table}", r.action,
                group=f"{r.schema}\x1f{r.table}")
        for r in rows
    ]  # fmt: skip


def apply(
    db: TestDatabase, dsn: str, rows: list[ChangeRow], chunk: int = 100, batch: int = 1, **dest: Any
) -> None:
    config = {"type": "postgres", "dsn": dsn, "source_dsn": db.dsn, **dest}
    sink = sink_for(TypeAdapter(Destination).validate_python(config))
    sink.begin(BatchInfo("mirror", batch, 0, 1))
    try:
        msgs = messages(rows)
        for i in range(0, len(msgs), chunk):
            sink.deliver(msgs[i : i + chunk])
        sink.finish()
    finally:
        sink.close()


def table_text(dsn: str, table: str, json_cols: set[str], skip: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    """Every row as {column: its text output} (json compared as jsonb: json keeps its input text)."""
    with connect(dsn, autocommit=True) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()]  # fmt: skip
        exprs = [
            f"{c}::jsonb::text" if c in json_cols else f"{c}::text" for c in cols if c not in skip
        ]
        keep = [c for c in cols if c not in skip]
        rows = conn.execute(f"SELECT {', '.join(exprs)} FROM {table} ORDER BY id").fetchall()
    return [dict(zip(keep, r, strict=True)) for r in rows]


def test_every_type_of_the_decoders_table_is_mirrored_faithfully(db, target) -> None:
    cases = cases_for(db)  # no xml value on a server without libxml (the wheel's)
    db.execute(USER_TYPES)
    cols = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(cases))
    db.execute(f"CREATE TABLE alltypes (id int PRIMARY KEY, {cols})")
    pub, slot = db.create_publication("alltypes"), db.create_slot()
    literals = ", ".join(lit for _, lit, _ in cases)
    db.execute(f"INSERT INTO alltypes VALUES (1, {literals}), (3, {literals})")
    db.execute("INSERT INTO alltypes (id) VALUES (2)")  # every column NULL
    db.execute("UPDATE alltypes SET c1 = NOT c1, c5 = 7 WHERE id = 1")
    db.execute("INSERT INTO alltypes (id, c5) VALUES (4, 1)")
    db.execute("DELETE FROM alltypes WHERE id = 4")
    apply(db, target, changes(db, slot, pub), chunk=2)

    json_cols = {f"c{i}" for i, (t, _, _) in enumerate(CASES) if t == "json"}
    # What the canonical row cannot carry (documented): an array's lower bound ('[0:1]={5,6}'
    # is the list [5, 6]). A jsonb 'null' is the JSON null there too (`json_nulls`).
    lossy = {f"c{i}" for i, (t, lit, _) in enumerate(CASES) if lit == "'[0:1]={5,6}'"}
    assert any(lit == "'null'" for _, lit, _ in CASES)
    assert table_text(target, "public.alltypes", json_cols, lossy) == table_text(
        db.dsn, "public.alltypes", json_cols, lossy
    )
    with connect(target, autocommit=True) as conn:
        got = conn.execute(
            f"SELECT {', '.join(sorted(lossy))} FROM alltypes WHERE id = 1"
        ).fetchone()
        assert sorted(str(v) for v in got) == ["[5, 6]"]
        # the user-defined types were created, with their checks
        assert conn.execute("SELECT 'happy'::mood::text").fetchone()[0] == "happy"
        with pytest.raises(Exception, match="posint"):
            conn.execute("SELECT (-1)::posint")


def test_toast_key_and_schema_changes_truncate_and_replays_that_never_go_backwards(
    db, target
) -> None:
    db.execute("CREATE TABLE docs (id int PRIMARY KEY, n int, body text)")
    pub, slot = db.create_publication("docs"), db.create_slot()
    big = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(20000))  # incompressible
    db.execute("INSERT INTO docs VALUES (1, 0, %s), (2, 0, 'small')", (big,))
    db.execute("UPDATE docs SET n = 1 WHERE id = 1")  # body unchanged: TOAST not sent
    db.execute("ALTER TABLE docs ADD COLUMN tags text[]")
    db.execute("UPDATE docs SET n = 2, tags = '{a,\"b c\"}' WHERE id = 2")
    db.execute("INSERT INTO docs (id, n) VALUES (5, 5)")
    db.execute("UPDATE docs SET id = 6 WHERE id = 5")  # a changed key: row 5 must go
    rows = changes(db, slot, pub)
    assert rows[2].unchanged_toast == ["body"]
    apply(db, target, rows)
    assert table_text(target, "public.docs", set()) == table_text(db.dsn, "public.docs", set())

    # Replays: the same batch again, then an older slice after it: nothing moves back.
    apply(db, target, rows)
    apply(db, target, rows[:1])
    assert table_text(target, "public.docs", set()) == table_text(db.dsn, "public.docs", set())
    with connect(target, autocommit=True) as conn:
        cur = conn.execute("SELECT lsn, seq FROM walstream.mirror_cursors "
                           "WHERE sink = 'mirror' AND source_table = 'public.docs'").fetchone()  # fmt: skip
        assert tuple(cur) == (rows[-1].lsn, rows[-1].seq)

    db.execute("TRUNCATE docs")
    db.execute("INSERT INTO docs (id, n) VALUES (9, 9)")
    apply(db, target, changes(db, slot, pub))
    assert table_text(target, "public.docs", set()) == [
        {"id": "9", "n": "9", "body": None, "tags": None}
    ]


def test_a_key_change_that_leaves_a_toasted_value_unchanged_keeps_it(db, target) -> None:
    """Postgres does not send an unchanged TOASTed value, also when the key changes: the row
    moves to its new key in the target with the value it had under the old one. Several
    moves in one chunk (one chained: a key moved twice; one of the text part of a composite
    key). A row the target never had (a backfill the stream overrode, a table mirrored
    without one) takes the values Postgres did not send from the source row."""
    db.execute("CREATE TABLE acct (region text, id int, body text, n int, "
               "PRIMARY KEY (region, id))")  # fmt: skip
    db.execute("ALTER TABLE acct ALTER COLUMN body SET STORAGE EXTERNAL")
    pub, slot = db.create_publication("acct"), db.create_slot()
    body = {k: f"{k}:" + "x" * 6000 for k in range(1, 6)}
    for k in range(1, 6):
        db.execute("INSERT INTO acct VALUES ('eu', %s, %s, 0)", (k, body[k]))
    db.execute("UPDATE acct SET id = 11 WHERE id = 1")  # a move
    db.execute("UPDATE acct SET id = 12, n = 1 WHERE id = 11")  # and again, in the same chunk
    db.execute("UPDATE acct SET region = 'us east', id = 13 WHERE id = 2")  # the text part
    db.execute("UPDATE acct SET n = 7 WHERE id = 3")  # no move: body kept in place
    db.execute("UPDATE acct SET id = 15 WHERE id = 5")  # a row the target does not have
    db.execute("UPDATE acct SET n = 3 WHERE id = 4")  # nor this one (its insert is lost too)
    every = changes(db, slot, pub)
    assert [r.action for r in every] == ["insert"] * 5 + ["update"] * 6
    apply(db, target, every[:3])  # the target never gets the inserts of rows 4 and 5
    rows = every[5:]
    assert [r.unchanged_toast for r in rows] == [["body"]] * 6
    apply(db, target, rows)
    got = table_text(target, "public.acct", set())
    assert got == table_text(db.dsn, "public.acct", set())
    bodies = {r["id"]: r["body"] for r in got}
    assert (bodies["12"], bodies["13"], bodies["15"], bodies["4"]) == (
        body[1], body[2], body[5], body[4],
    )  # fmt: skip
    apply(db, target, rows)  # a replay moves nothing back
    assert table_text(target, "public.acct", set()) == got


def test_an_unsent_value_the_source_had_moved_away_is_filled_at_the_rows_next_change(
    db, target
) -> None:
    """The mirror lags the source: when it first needs a row's unsent value, the source has
    already moved the row to another key, so the value is not found and the row is written
    with NULL there. An unsent value is never NULL (only a stored value is TOASTed): the
    row's next change (the move) reads it again, from the row's new key."""
    db.execute("CREATE TABLE acct (region text, id int, body text, n int, "
               "PRIMARY KEY (region, id))")  # fmt: skip
    db.execute("ALTER TABLE acct ALTER COLUMN body SET STORAGE EXTERNAL")
    pub, slot = db.create_publication("acct"), db.create_slot()
    body = "5:" + "x" * 6000
    db.execute("INSERT INTO acct VALUES ('eu', 5, %s, 0)", (body,))  # never reaches the target
    db.execute("UPDATE acct SET n = 1 WHERE id = 5")
    db.execute("UPDATE acct SET region = 'ap 1', id = 30 WHERE id = 5")
    _insert, update, move = changes(db, slot, pub)
    apply(db, target, [update], batch=1)
    assert table_text(target, "public.acct", set()) == [
        {"region": "eu", "id": "5", "body": None, "n": "1"}  # not found under id 5 any more
    ]  # fmt: skip
    apply(db, target, [move], batch=2)
    assert table_text(target, "public.acct", set()) == table_text(db.dsn, "public.acct", set())


def test_a_dropped_column_and_changed_types_alter_the_target(db, target) -> None:
    """Applied as a running mirror applies them, step by step: the target loses the
    dropped column and takes each new type; a generated column the source never sends
    stays (empty) without the definition being looked up for every change."""
    db.execute("CREATE TABLE s (id int PRIMARY KEY, a int, b text, "
               "g int GENERATED ALWAYS AS (id * 2) STORED)")  # fmt: skip
    pub, slot = db.create_publication("s"), db.create_slot()
    steps = [
        (None, "INSERT INTO s (id, a, b) VALUES (1, 10, 'x')"),
        ("ALTER TABLE s DROP COLUMN b", "INSERT INTO s (id, a) VALUES (2, 20)"),
        (
            "ALTER TABLE s ALTER COLUMN a TYPE bigint",
            "INSERT INTO s (id, a) VALUES (3, 5000000000)",
        ),
        ("ALTER TABLE s ALTER COLUMN a TYPE text", "UPDATE s SET a = 'five' WHERE id = 1"),
    ]
    for ddl, dml in steps:
        if ddl:
            db.execute(ddl)
        db.execute(dml)
        apply(db, target, changes(db, slot, pub))
    with connect(target, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'public.s'::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum"
        ).fetchall()
    assert columns == [("id", "integer"), ("a", "text"), ("g", "integer")]
    assert table_text(target, "public.s", set(), {"g"}) == [
        {"id": "1", "a": "five"}, {"id": "2", "a": "20"}, {"id": "3", "a": "5000000000"},
    ]  # fmt: skip
    assert table_text(db.dsn, "public.s", set(), {"g"}) == table_text(
        target, "public.s", set(), {"g"}
    )


def test_a_refused_change_is_a_dead_letter_and_the_rest_of_its_chunk_is_applied(db, target) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication("t"), db.create_slot()
    db.execute("INSERT INTO t VALUES (1, 1)")
    rows = changes(db, slot, pub)
    apply(db, target, rows)
    with connect(target, autocommit=True) as conn:
        conn.execute("ALTER TABLE t ADD CHECK (n < 100)")  # the target differs from the source
    for i, n in ((2, 5), (3, 500), (4, 7)):
        db.execute("INSERT INTO t VALUES (%s, %s)", (i, n))
    rows = changes(db, slot, pub)  # the slot is read from its start again: id 1 is a replay
    bad = next(i for i, r in enumerate(rows) if json.loads(r.record)["id"] == 3)
    with pytest.raises(SinkError) as err:
        apply(db, target, rows)
    e = err.value
    assert e.retryable is False and e.delivered == frozenset(range(len(rows))) - {bad}
    assert "refused a change" in e.problem and "t_n_check" in e.problem
    assert [r["id"] for r in table_text(target, "public.t", set())] == ["1", "2", "4"]


def test_a_table_without_a_key_and_a_target_that_is_down(db, target, pg) -> None:
    db.execute("CREATE TABLE nokey (n int)")
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
    pub, slot = db.create_publication("nokey", "keyed"), db.create_slot()
    with db.conn.transaction():  # one chunk with both tables
        db.execute("INSERT INTO keyed VALUES (1)")
        db.execute("INSERT INTO nokey VALUES (1)")
        db.execute("INSERT INTO keyed VALUES (2)")
    rows = changes(db, slot, pub)
    with pytest.raises(SinkError) as err:
        apply(db, target, rows)
    assert not err.value.retryable and "no primary key" in err.value.problem
    assert err.value.delivered == {0, 2}  # the keyed table's changes were applied
    assert [r["id"] for r in table_text(target, "public.keyed", set())] == ["1", "2"]
    down = "postgresql://postgres@127.0.0.1:1/nothing"
    with pytest.raises(SinkError) as err:
        apply(db, down, rows)
    assert err.value.retryable
    assert json.loads(mirror(rows[1]))["record"] == {"n": 1}


def test_a_retried_dead_letter_is_applied_behind_the_cursor_or_refused_when_superseded(
    db, target
) -> None:
    """A refused change is a dead letter while later changes move the table's cursor on.
    Retried after the target is fixed, it is applied (not skipped as "already applied");
    a refused change whose row a later change rewrote is refused again, saying so."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication("t"), db.create_slot()
    db.execute("INSERT INTO t VALUES (1, 1)")
    apply(db, target, changes(db, slot, pub))
    with connect(target, autocommit=True) as conn:
        conn.execute("ALTER TABLE t ADD CONSTRAINT small CHECK (n < 100)")
    db.execute("INSERT INTO t VALUES (2, 500)")  # refused by the target
    db.execute("INSERT INTO t VALUES (10, 700)")  # refused, then rewritten below
    for i in range(3, 8):  # later rows flow on, moving the table's cursor past both
        db.execute("INSERT INTO t VALUES (%s, %s)", (i, i))
    db.execute("UPDATE t SET n = 8 WHERE id = 10")  # a later change of row 10: applied
    rows = changes(db, slot, pub)
    refused = [r for r in rows if json.loads(r.record)["id"] in (2, 10) and r.action == "insert"]
    with pytest.raises(SinkError) as err:
        apply(db, target, rows)
    assert err.value.delivered == frozenset(range(len(rows))) - {rows.index(r) for r in refused}
    landed = sorted(int(r["id"]) for r in table_text(target, "public.t", set()))
    assert landed == [1, 3, 4, 5, 6, 7, 10]

    # The operator fixes the target and retries both dead letters (what the retrier sends).
    with connect(target, autocommit=True) as conn:
        conn.execute("ALTER TABLE t DROP CONSTRAINT small")
    with pytest.raises(SinkError) as err:
        apply(db, target, refused)
    e = err.value
    assert e.retryable is False and e.delivered == {0}  # id 2 applied; id 10 refused again
    assert "a later change of the same row" in e.problem and "discard" in e.problem
    assert table_text(target, "public.t", set()) == table_text(db.dsn, "public.t", set())
    with connect(target, autocommit=True) as conn:
        cur = conn.execute("SELECT lsn, seq FROM walstream.mirror_cursors "
                           "WHERE sink = 'mirror' AND source_table = 'public.t'").fetchone()  # fmt: skip
        assert tuple(cur) == (rows[-1].lsn, rows[-1].seq)  # the cursor did not move back
        left = conn.execute("SELECT pk FROM walstream.mirror_refused").fetchall()
        assert left == [("[10]",)]  # only the superseded one is still listed
    # Retrying the superseded one again fails again: never reported as delivered.
    with pytest.raises(SinkError, match="a later change of the same row"):
        apply(db, target, refused[1:])


def test_a_renamed_source_table_renames_its_target_in_the_next_batch(db, target) -> None:
    """The source renames t to u. The batch that first sees u refuses u's changes, keyed
    by row (changes of t from before the rename may still be applying in another task);
    the next batch renames the target and applies u's changes; retried, the refused
    changes apply, or are refused again where a later change rewrote their row."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication("t"), db.create_slot()
    db.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 3) g")
    before = changes(db, slot, pub)
    apply(db, target, before, batch=1)
    db.execute("ALTER TABLE t RENAME TO u")
    db.execute("INSERT INTO u VALUES (4, 4)")
    db.execute("UPDATE u SET n = 10 WHERE id = 1")
    renamed = changes(db, slot, pub)[len(before) :]
    assert [(r.table, r.action) for r in renamed] == [("u", "insert"), ("u", "update")]
    for _ in range(2):  # two chunks of the batch that first sees u: both refused
        with pytest.raises(SinkError) as err:
            apply(db, target, renamed, batch=2)
        e = err.value
        assert not e.retryable and e.delivered == frozenset()
        assert "public.u is the table this sink mirrors into public.t, renamed" in e.problem
        assert "walstream dead-letters retry --sink mirror" in (e.fix or "")
    assert [r["id"] for r in table_text(target, "public.t", set())] == ["1", "2", "3"]
    with connect(target, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.u')").fetchone()[0] is None
        refused = conn.execute("SELECT source_table, pk FROM walstream.mirror_refused "
                               "ORDER BY lsn, seq").fetchall()  # fmt: skip
        assert refused == [("public.u", "[4]"), ("public.u", "[1]")]

    db.execute("UPDATE u SET n = 40 WHERE id = 4")  # rewrites the row of a refused change
    db.execute("INSERT INTO u VALUES (5, 5)")
    stale = dict(postgres_sink._TABLES)  # what another worker process knew of t
    apply(db, target, changes(db, slot, pub)[len(before) + len(renamed) :], batch=3)
    with connect(target, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.t')").fetchone()[0] is None
        claims = conn.execute("SELECT target_schema, target_table, source_table "
                              "FROM walstream.mirror_tables").fetchall()  # fmt: skip
        assert claims == [("public", "u", "public.u")]
    assert table_text(target, "public.u", set()) == [
        {"id": "1", "n": "1"}, {"id": "2", "n": "2"}, {"id": "3", "n": "3"},
        {"id": "4", "n": "40"}, {"id": "5", "n": "5"},
    ]  # fmt: skip

    with pytest.raises(SinkError) as err:  # the dead letters retried (the retrier's batch)
        apply(db, target, renamed, batch=-1)
    assert err.value.delivered == {1} and "a later change of the same row" in err.value.problem
    assert table_text(target, "public.u", set()) == table_text(db.dsn, "public.u", set())

    # A new table takes the old name; a worker that still knows the old t finds it gone.
    seen = len(changes(db, slot, pub))
    db.execute("CREATE TABLE t (id int PRIMARY KEY, label text)")
    db.execute(f"ALTER PUBLICATION {pub} ADD TABLE t")
    db.execute("INSERT INTO t VALUES (1, 'new')")
    postgres_sink._TABLES.update(stale)
    apply(db, target, changes(db, slot, pub)[seen:], batch=4)
    assert table_text(target, "public.t", set()) == [{"id": "1", "label": "new"}]
    assert table_text(target, "public.u", set()) == table_text(db.dsn, "public.u", set())


def test_a_swapped_table_never_mixes_its_rows_into_the_target_of_the_name(db, target) -> None:
    """Blue/green: t is renamed to t_old and t_new to t in one transaction. Each change
    carries its table's OID, so the first change of the new t moves the target t (the
    old table's rows) to t_old, after the old t's changes from before the swap; the new
    t's target follows its rename in the next batch. Without the OIDs, the new t's rows
    went into the target holding the old t's (a worker had t's definition cached)."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    db.execute("CREATE TABLE t_new (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication(), db.create_slot()
    db.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 3) g")
    db.execute("INSERT INTO t_new VALUES (1, 100), (7, 700)")
    first = changes(db, slot, pub)
    apply(db, target, first, batch=1)
    old_oid, new_oid = (
        db.execute(f"SELECT '{t}'::regclass::oid::int8")[0][0] for t in ["t", "t_new"]
    )
    assert {(r.table, r.table_oid) for r in first} == {("t", old_oid), ("t_new", new_oid)}

    db.execute("UPDATE t SET n = 20 WHERE id = 2")  # the old t, before the swap
    with connect(db.dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("ALTER TABLE t RENAME TO t_old")
        conn.execute("ALTER TABLE t_new RENAME TO t")
    db.execute("INSERT INTO t VALUES (8, 800)")  # the new t
    db.execute("UPDATE t_old SET n = 30 WHERE id = 3")  # the old t, renamed
    swap = changes(db, slot, pub)[len(first) :]
    assert [(r.table, r.table_oid, r.action) for r in swap] == [
        ("t", old_oid, "update"), ("t", new_oid, "insert"), ("t_old", old_oid, "update"),
    ]  # fmt: skip
    with pytest.raises(SinkError) as err:  # the new t's target is renamed in the next batch
        apply(db, target, swap, batch=2)
    assert err.value.delivered == {0, 2}
    assert "public.t is the table this sink mirrors into public.t_new, renamed" in err.value.problem
    assert table_text(target, "public.t_old", set()) == [
        {"id": "1", "n": "1"}, {"id": "2", "n": "20"}, {"id": "3", "n": "30"},
    ]  # fmt: skip
    with connect(target, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.t')").fetchone()[0] is None

    db.execute("INSERT INTO t VALUES (9, 900)")
    apply(db, target, changes(db, slot, pub)[len(first) + len(swap) :], batch=3)
    apply(db, target, swap[1:2], batch=-1)  # the refused change, retried
    for table in ("public.t", "public.t_old"):
        assert table_text(target, table, set()) == table_text(db.dsn, table, set())
    assert [r["id"] for r in table_text(target, "public.t", set())] == ["1", "7", "8", "9"]
    with connect(target, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.t_new')").fetchone()[0] is None
        claims = conn.execute("SELECT target_table, source_table, source_oid "
                              "FROM walstream.mirror_tables ORDER BY 1").fetchall()  # fmt: skip
        assert claims == [("t", "public.t", new_oid), ("t_old", "public.t_old", old_oid)]


def test_two_tables_that_trade_names_each_keep_their_rows(db, target) -> None:
    """t and u trade names (through a third). Each name's task (applied here one after
    the other, as two tasks of a batch may be) moves the target of the table that had
    the name: t's aside (u's target is still there), u's to t; the next batch moves the
    one aside to u. No row of one lands in the other's target."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    db.execute("CREATE TABLE u (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication(), db.create_slot()
    db.execute("INSERT INTO t VALUES (1, 1)")
    db.execute("INSERT INTO u VALUES (1, 100)")
    seen = changes(db, slot, pub)
    apply(db, target, seen, batch=1)
    with connect(db.dsn, autocommit=True) as conn, conn.transaction():
        for sql in ("t RENAME TO tmp", "u RENAME TO t", "tmp RENAME TO u"):
            conn.execute(f"ALTER TABLE {sql}")
    refused = []
    for batch, (b, a) in enumerate([(200, 2), (300, 3)], start=2):
        db.execute(f"INSERT INTO t VALUES ({b}, {b})")  # the table that was u
        db.execute(f"INSERT INTO u VALUES ({a}, {a})")  # the table that was t
        new = changes(db, slot, pub)[len(seen) :]
        seen += new
        for name in ("t", "u"):  # a task per name
            rows = [r for r in new if r.table == name]
            try:
                apply(db, target, rows, batch=batch)
            except SinkError as exc:
                assert batch == 2 and "renamed" in exc.problem, exc.problem
                refused += rows
    assert [(r.table, json.loads(r.record or "")["id"]) for r in refused] == [("t", 200), ("u", 2)]
    apply(db, target, refused, batch=-1)  # the dead letters retried
    for table in ("public.t", "public.u"):
        assert table_text(target, table, set()) == table_text(db.dsn, table, set())
    with connect(target, autocommit=True) as conn:
        names = conn.execute("SELECT target_table, source_table FROM walstream.mirror_tables "
                             "ORDER BY 1").fetchall()  # fmt: skip
    assert names == [("t", "public.t"), ("u", "public.u")]


def test_a_table_dropped_and_created_again_gets_a_target_of_its_own(db, target) -> None:
    """The target of a dropped table keeps its rows as `<name>_dropped_<oid>`; the new
    table under the name starts its own. The dropped table's last changes still apply
    (a fresh worker reads their definition from the target, the source has none)."""
    db.execute("CREATE TABLE d (id int PRIMARY KEY, v int)")
    pub, slot = db.create_publication(), db.create_slot()
    db.execute("INSERT INTO d VALUES (1, 1), (2, 2)")
    first = changes(db, slot, pub)
    apply(db, target, first, batch=1)
    old_oid = first[0].table_oid
    db.execute("UPDATE d SET v = 10 WHERE id = 1")
    db.execute("DROP TABLE d")
    db.execute("CREATE TABLE d (id int PRIMARY KEY, v int)")  # the same columns
    db.execute("INSERT INTO d VALUES (1, 100), (5, 500)")
    postgres_sink._TABLES.clear()  # another worker process: nothing cached
    apply(db, target, changes(db, slot, pub)[len(first) :], batch=2)
    assert table_text(target, "public.d", set()) == [
        {"id": "1", "v": "100"},
        {"id": "5", "v": "500"},
    ]
    assert table_text(target, f"public.d_dropped_{old_oid}", set()) == [
        {"id": "1", "v": "10"}, {"id": "2", "v": "2"},
    ]  # fmt: skip


def test_two_sources_into_one_target_table_is_a_config_error(db, other_db, target) -> None:
    """Cached and claimed by the target table, not the source's name: two source tables
    that would land in one target table (two databases' public.users, or public.users
    and audit.users under one `schema:`) stop with the names of both."""
    from walstream.errors import ConfigError

    for d in (db, other_db):
        d.execute("CREATE SCHEMA audit")
        d.execute("CREATE TABLE users (id int PRIMARY KEY, name text)")
        d.execute("CREATE TABLE audit.users (id int PRIMARY KEY, at text)")
    slot, pub = db.create_slot(), db.create_publication("users", "audit.users")
    db.execute("INSERT INTO users VALUES (1, 'a')")
    db.execute("INSERT INTO audit.users VALUES (1, 'x')")
    first, second = [r for r in changes(db, slot, pub) if r.action == "insert"]
    apply(db, target, [first], schema="copy")
    with pytest.raises(ConfigError) as err:
        apply(db, target, [second], schema="copy")
    assert "audit.users into copy.users" in err.value.problem
    assert "public.users" in err.value.problem and "destination.schema" in (err.value.fix or "")
    # Another database's public.users into the same target table, by another sink.
    other_slot, other_pub = other_db.create_slot(), other_db.create_publication("users")
    other_db.execute("INSERT INTO users VALUES (7, 'b')")
    (theirs,) = changes(other_db, other_slot, other_pub)
    config = {"type": "postgres", "dsn": target, "source_dsn": other_db.dsn, "schema": "copy"}
    sink = sink_for(TypeAdapter(Destination).validate_python(config))
    sink.begin(BatchInfo("other-mirror", 1, 0, 1))
    with pytest.raises(ConfigError, match=r"which sink mirror already fills from public\.users"):
        sink.deliver(messages([theirs]))
    assert table_text(target, "copy.users", set()) == [{"id": "1", "name": "a"}]


def test_create_tables_false_never_creates_and_fills_the_table_made_by_hand(db, target) -> None:
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, body text, n int)")
    db.execute("ALTER TABLE notes ALTER COLUMN body SET STORAGE EXTERNAL")
    slot, pub = db.create_slot(), db.create_publication("notes")
    big = "3:" + "x" * 6000
    db.execute("INSERT INTO notes VALUES (1, 'one', 0), (2, 'two', 0), (3, %s, 0)", (big,))
    db.execute("UPDATE notes SET body = 'uno' WHERE id = 1")
    db.execute("UPDATE notes SET n = 1 WHERE id = 3")  # body unsent: no target table to ask
    rows = changes(db, slot, pub)
    assert rows[-1].unchanged_toast == ["body"]
    with pytest.raises(SinkError) as err:
        apply(db, target, rows, create_tables=False)
    e = err.value
    assert not e.retryable and e.delivered == frozenset()
    assert e.problem == (
        'Postgres mirror: public.notes refused a change: table "public"."notes" '
        "does not exist in the target (5 of 5 changes)"
    )
    assert e.fix == (
        "create it, or set destination.create_tables: true; then `walstream dead-letters retry`"
    )
    with connect(target, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.notes')").fetchone()[0] is None
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text, n int, "
                     "extra text DEFAULT 'x')")  # fmt: skip
    apply(db, target, rows, create_tables=False)
    assert table_text(target, "notes", set()) == [
        {"id": "1", "body": "uno", "n": "0", "extra": "x"},
        {"id": "2", "body": "two", "n": "0", "extra": "x"},
        {"id": "3", "body": big, "n": "1", "extra": "x"},
    ]  # fmt: skip
