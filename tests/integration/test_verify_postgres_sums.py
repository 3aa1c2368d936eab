"""A Postgres mirror's bucket sums computed by Postgres itself (`PostgresTable.sums`): the
source and its copy in another database — the acct table of tests/lake.py (composite text
key, TOASTed text, arrays with NULLs, jsonb edge values, timestamptz, NULLs) — are equal
bucket for bucket although the copy's database prints time in another time zone; a row
changed, one deleted and one added in the copy are found in their buckets, row by row, and
nothing else; a pass cut short resumes after its last key range with the same sums."""

from __future__ import annotations

from typing import Any

import pytest

from tests.lake import REAL_TABLE, fill_real
from tests.unit.test_verify_run import Kept
from walstream.decode.table_shape import load_shape
from walstream.postgres.replication import connect
from walstream.testing import AtRest, copy_table
from walstream.verify.run import Verification
from walstream.verify.sides import PostgresTable

ROWS = 3_000


def copy(dsn: str, target: str) -> None:
    copy_table(dsn, target, "acct", REAL_TABLE)


def sides(db: Any, target: str, chunk: int = 400) -> tuple[PostgresTable, PostgresTable]:
    with connect(db.dsn, autocommit=True) as conn:
        shape = load_shape(conn, "public", "acct")
    source = PostgresTable("source", db.dsn, "public", "acct", shape, chunk)
    return source, PostgresTable("sink", target, "public", "acct", shape, chunk)


def test_postgres_sums_find_exactly_the_rows_that_differ(db, target):
    db.execute(REAL_TABLE)
    keys = fill_real(db.dsn, ROWS)
    copy(db.dsn, target)
    name = target.rsplit("/", 1)[-1].split("?")[0]
    with connect(target, autocommit=True) as t:  # prints timestamptz as +09 there
        t.execute(f"ALTER DATABASE {name} SET TimeZone = 'Asia/Tokyo'")
    source, sink = sides(db, target)

    check = Verification(source, sink, AtRest(), direct_rows=0)  # type: ignore[arg-type]
    assert check._hashing() == "postgres"
    equal = check.run("public.acct", "acct", ROWS)
    assert equal.equal and equal.buckets_different == 0, equal
    assert equal.source_rows == equal.sink_rows == ROWS

    (r1, k1), (r2, k2) = keys[10], keys[2_000]
    with connect(target, autocommit=True) as t:
        t.execute("UPDATE acct SET doc = '{\"a\": 1}' WHERE region = %s AND id = %s", (r1, k1))
        t.execute("DELETE FROM acct WHERE region = %s AND id = %s", (r2, k2))
        t.execute("INSERT INTO acct (region, id, n) VALUES ('zz', 9, 1)")
    found = Verification(source, sink, AtRest(), direct_rows=0).run("public.acct", "acct", ROWS)  # type: ignore[arg-type]
    assert (found.different, found.missing, found.extra) == ([(r1, k1)], [(r2, k2)], [("zz", 9)])
    assert 1 <= found.buckets_different <= 3 and found.buckets == 64


def test_a_postgres_sums_pass_cut_short_resumes_with_the_same_sums(db, target):
    db.execute(REAL_TABLE)
    keys = fill_real(db.dsn, ROWS)
    copy(db.dsn, target)
    r, k = keys[2_500]
    with connect(target, autocommit=True) as t:
        t.execute("UPDATE acct SET n = n + 1 WHERE region = %s AND id = %s", (r, k))
    source, sink = sides(db, target)
    cut = Kept(stop_at=4)  # in the source's pass, after some key ranges
    with pytest.raises(KeyboardInterrupt):
        Verification(source, sink, AtRest(), direct_rows=0, checkpoint=cut).run(  # type: ignore[arg-type]
            "public.acct", "acct", ROWS
        )
    assert cut.state is not None and cut.state["hashing"] == "postgres"
    assert cut.state["after"] is not None and cut.state["phase"] == "source"
    cut.stop_at = None
    resumed = Verification(source, sink, AtRest(), direct_rows=0, checkpoint=cut).run(  # type: ignore[arg-type]
        "public.acct", "acct", ROWS
    )
    assert resumed.different == [(r, k)] and resumed.source_rows == ROWS == resumed.sink_rows


def test_rows_only_in_the_mirror_are_deleted_unless_the_source_has_them_again(db, target):
    """`remove_extra` (a Postgres mirror's `--repair`): of the keys reported only in the sink,
    it deletes those the source still lacks, and leaves a key the source has again (its row
    is the stream's to bring), comparing keys in their types — a timestamptz key given as
    Python's isoformat text, a text key with a comma."""
    from walstream.config import parse_config
    from walstream.verify.sinks import remove_extra

    ddl = "CREATE TABLE ev (at timestamptz, name text, v int, PRIMARY KEY (at, name))"
    db.execute(ddl)
    db.execute("INSERT INTO ev VALUES ('2024-01-01 00:00+00', 'a', 1)")
    with connect(target, autocommit=True) as t:
        t.execute(ddl)
        t.execute(
            "INSERT INTO ev VALUES ('2024-01-01 00:00+00', 'a', 1), "
            "('2024-01-02 10:30+02', 'x,y', 2), ('2024-01-03 00:00+00', 'back', 3)"
        )
    db.execute("INSERT INTO ev VALUES ('2024-01-03 00:00+00', 'back', 4)")  # again at the source
    plan = parse_config({
        "sources": [{"name": "app", "dsn": db.dsn, "slot": "s", "publication": "p"}],
        "sinks": [{"name": "pg", "source": "app",
                   "destination": {"type": "postgres", "dsn": target}}],
    })  # fmt: skip
    with connect(target, autocommit=True) as t:
        rows = t.execute("SELECT at, name FROM ev ORDER BY at").fetchall()
    extra = [tuple(r) for r in rows[1:]]  # as verify reports them: Python values
    assert remove_extra(plan, plan.sink("pg"), "public", "ev", extra) == 1
    with connect(target, autocommit=True) as t:
        left = t.execute("SELECT name, v FROM ev ORDER BY at").fetchall()
    assert left == [("a", 1), ("back", 3)]
    assert remove_extra(plan, plan.sink("pg"), "public", "ev", extra) == 0
