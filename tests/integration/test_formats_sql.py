"""The Spark SQL forms of the message formats equal the Python formatters byte for byte,
or are NULL (left to Python) where they cannot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.changes import row
from walstream.change import ChangeRow, change_key
from walstream.formats import ARROW_FORMATS, formatter, sql_format
from walstream.formats.keys import sql_idempotency_key

ODD = 'qu"ote\\back/slash é 😀 \u2028 tab\tnew\nline\x01\x07\x19'  # escapes both write alike
CONTROL = "vt\x0bend\x1a"  # Java writes \u000B, Python \u000b: left to Python


def differs(s: str) -> bool:
    return any(ch in "\x0b\x0e\x0f" or "\x1a" <= ch <= "\x1f" for ch in s)


ROWS = [
    row("insert"),
    row("insert", xid=None, annotations='{"user":"ann"}'),
    row("update", '{"id":1,"a":2}', '{"id":1,"a":1}'),  # sequin: changes in Python
    row("update", '{"id":1,"a":2}', None),
    row("delete", None, '{"id":1}'),
    row("delete", '{"id":1}', None),
    row("delete", None, None),
    row("truncate", None, pk=[]),
    row("read", '{"id":7}', lsn=99, seq=12, xid=None, pk=["7"], backfill=3),
    row("read", '{"k":"x"}', pk=["x" * 200, None], backfill=12),  # base64 over 76 characters
    row("read", '{"k":1}', pk=[ODD, "2"], backfill=5),
    row("read", '{"k":1}', pk=[CONTROL], backfill=5),
    row("insert", schema=ODD, table="Ταβλε 'q'", source='src "x"'),
    row("insert", schema=CONTROL),
    row("insert", table="ends in a newline\n", source="back\\slash"),  # escaped, not plain
    row("update", '{"id":1}', None, table=CONTROL, lsn=2**40, seq=2**31 - 1),
    row("insert", committed_at_us=0),
]


def frame(spark: Any, rows: list[ChangeRow]) -> Any:
    data = [(*r[:4], r.committed_at_us, *r[5:]) for r in rows]
    ddl = (
        "source STRING, lsn BIGINT, seq INT, xid BIGINT, us BIGINT, action STRING, "
        "schema STRING, table STRING, pk ARRAY<STRING>, record STRING, old STRING, "
        "annotations STRING, unchanged_toast ARRAY<STRING>, table_oid BIGINT, "
        "json_nulls ARRAY<STRING>, change_lsn BIGINT, last_commit_lsn BIGINT, backfill BIGINT"
    )
    return (
        spark.createDataFrame(data, ddl)
        .selectExpr("*", "timestamp_micros(us) AS committed_at")
        .drop("us")
    )


@pytest.mark.parametrize("name", ARROW_FORMATS)
def test_sql_format_equals_python(spark: Any, name: str) -> None:
    sink, db = 'sink "one"\x01', "app\\db"
    expr = sql_format(name, sink=sink, db=db, backfill=True)
    assert expr is not None
    got = [r.m for r in frame(spark, ROWS).selectExpr(f"{expr} AS m").collect()]
    fmt = formatter(name, sink=sink, db=db)
    assert fmt is not None
    in_sql = 0
    for r, sql in zip(ROWS, got, strict=True):
        python = fmt(r)
        if sql is None:  # left to Python: only where SQL cannot match it
            assert (
                (name == "sequin" and r.action == "update" and r.old is not None)
                or differs(r.schema + r.table + r.source)
                or (r.backfill is not None and differs("".join(p or "" for p in r.pk)))
            ), (r, python)
            continue
        in_sql += 1
        assert sql == python, r
        json.loads(sql)
    assert len(ROWS) - in_sql == {"sequin": 4, "record": 0}[name]


def test_sql_idempotency_key_equals_python(spark: Any) -> None:
    got = frame(spark, ROWS).selectExpr(f"{sql_idempotency_key(True)} AS k").collect()
    for r, k in zip(ROWS, got, strict=True):
        if k.k is None:
            assert r.backfill is not None and CONTROL in r.pk
        else:
            assert k.k == change_key(r), r
    stream = [r for r in ROWS if r.backfill is None]
    plain = frame(spark, stream).selectExpr(f"{sql_idempotency_key(False)} AS k").collect()
    assert [k.k for k in plain] == [change_key(r) for r in stream]


def test_mirror_and_debezium_have_no_sql_form() -> None:
    assert sql_format("mirror", sink="s", db="d", backfill=False) is None
    assert sql_format("debezium", sink="s", db="d", backfill=True) is None
