"""The Postgres mirror's pure core: values back to text input, runs, statements, DDL."""

from __future__ import annotations

import base64
import json

import pytest

from walstream.sinks.postgres.sql import (
    Column,
    TableDef,
    create_table,
    operations,
    row_keys,
    runs,
    statement,
    to_text,
)


def col(name: str, type_sql: str = "text", kind: str = "scalar", array: bool = False,
        delim: str = ",") -> Column:  # fmt: skip
    return Column(name, type_sql, False, kind, array, delim)


def table() -> TableDef:
    t = TableDef("copy", "orders", pk=["id"])
    for c in (col("id", "integer"), col("status"), col("note")):
        t.columns[c.name] = c
    return t


@pytest.mark.parametrize(
    ("value", "column", "expected"),
    [
        (None, col("x"), None),
        (base64.b64encode(b"\x00\xff").decode(), col("b", "bytea", "bytea"), "\\x00ff"),
        ({"a": [1, "é"]}, col("j", "jsonb", "json"), '{"a": [1, "é"]}'),
        ("-0043-03-15", col("d", "date", "date"), "0044-03-15 BC"),
        ("0000-01-01T10:00:00", col("t", "timestamp", "date"), "0001-01-01 10:00:00 BC"),
        ("2024-02-29", col("d", "date", "date"), "2024-02-29"),
        (True, col("f", "boolean"), "true"),
        (0.1, col("f", "float8"), "0.1"),
        (12, col("i", "integer"), "12"),
        ([1, None, 3], col("a", "integer[]", array=True), '{"1",NULL,"3"}'),
        ([['a"b']], col("a", "text[]", array=True), '{{"a\\"b"}}'),
        (["(1,1),(0,0)"], col("b", "box[]", array=True, delim=";"), '{"(1,1),(0,0)"}'),
        ([[1, 2]], col("j", "jsonb[]", "json", array=True), '{"[1, 2]"}'),  # a JSON value
    ],
)
def test_values_become_text_input_of_their_column(value, column, expected) -> None:
    assert to_text(value, column) == expected


def test_an_update_that_moves_the_key_deletes_the_old_row_first() -> None:
    change = {"action": "update", "record": {"id": 2, "status": "x"}, "old": {"id": 1}}
    ops = operations(table(), change)
    assert [k for k, _ in ops] == ["delete", "upsert"]
    assert ops[0][1] == {"record": {"id": 1}}
    assert row_keys(table(), change) == ["[1]", "[2]"]  # both rows it touches
    plain = {"action": "update", "record": {"id": 1, "status": "y"}, "old": {"id": 1}}
    assert [k for k, _ in operations(table(), plain)] == ["upsert"]
    assert row_keys(table(), {"action": "truncate"}) is None


def test_runs_break_on_kind_columns_and_a_repeated_key() -> None:
    changes = [
        {"action": "insert", "schema": "public", "table": "orders", "record": {"id": 1, "status": "a"}},
        {"action": "insert", "schema": "public", "table": "orders", "record": {"id": 2, "status": "a"}},
        {"action": "update", "schema": "public", "table": "orders", "record": {"id": 1, "status": "b"}},
        {"action": "insert", "schema": "public", "table": "orders",
         "record": {"id": 3, "status": "a", "note": "n"}},
        {"action": "delete", "schema": "public", "table": "orders", "record": {"id": 2}},
        {"action": "truncate", "schema": "public", "table": "orders"},
    ]  # fmt: skip
    got = runs(changes, list(range(len(changes))), lambda c: table())
    assert [(kind, [i for i, _ in ops]) for _, kind, ops in got] == [
        ("upsert", [0, 1]),  # same columns, keys 1 and 2
        ("upsert", [2]),  # key 1 again: a new statement keeps the order
        ("upsert", [3]),  # another column set
        ("delete", [4]),
        ("truncate", [5]),
    ]


def test_a_key_change_that_left_toast_unsent_moves_the_row_and_chains_break_the_run() -> None:
    def move(old: int, new: int) -> dict:
        return {"action": "update", "schema": "public", "table": "orders",
                "record": {"id": new, "status": "s"}, "old": {"id": old},
                "unchanged_toast": ["note"]}  # fmt: skip

    ops = operations(table(), move(1, 2))
    assert [k for k, _ in ops] == ["move"]
    assert row_keys(table(), move(1, 2)) == ["[1]", "[2]"]
    changes = [move(1, 11), move(5, 15), move(11, 21), move(7, 17)]
    got = runs(changes, list(range(len(changes))), lambda c: table())
    # 11 is moved to and then from: the second move sees the table after the first
    assert [(kind, [i for i, _ in ops]) for _, kind, ops in got] == [
        ("move", [0, 1]), ("move", [2, 3]),
    ]  # fmt: skip
    text, (data,) = statement(table(), "move", [c for _, c in got[0][2]])
    assert ('DELETE FROM "copy"."orders" t USING d WHERE t."id" = d."_o_id" '
            'RETURNING d._i, t."note"') in text  # fmt: skip
    assert 'SELECT d."id", d."status", g."note" FROM d LEFT JOIN g' in text
    assert '"note" = coalesce(EXCLUDED."note", t."note")' in text
    assert [(r["id"], r["_o_id"], r["_i"]) for r in json.loads(data)] == [("11", "1", 0),
                                                                          ("15", "5", 1)]  # fmt: skip


def test_statements_cast_each_value_and_leave_unchanged_toast_alone() -> None:
    t = table()
    changes = [{"record": {"id": 1, "status": "paid", "note": None}, "unchanged_toast": ["note"]}]
    text, params = statement(t, "upsert", changes)
    assert text == (
        'INSERT INTO "copy"."orders" ("id", "status") SELECT (r->>\'id\')::integer AS "id", '
        "(r->>'status')::text AS \"status\" FROM jsonb_array_elements(%s::jsonb) j(r) "
        'ON CONFLICT ("id") DO UPDATE SET "status" = EXCLUDED."status"'
    )
    assert json.loads(params[0]) == [{"id": "1", "status": "paid"}]
    text, params = statement(t, "delete", [{"record": {"id": 7}}])
    assert text.startswith('DELETE FROM "copy"."orders" t USING (SELECT (r->>\'id\')::integer')
    assert text.endswith('WHERE t."id" = d."id"') and json.loads(params[0]) == [{"id": "7"}]
    assert statement(t, "truncate", []) == ('TRUNCATE "copy"."orders"', ())


def test_identifiers_are_quoted_in_ddl() -> None:
    t = TableDef('we"ird', "t", pk=["id"], types=["CREATE TYPE x AS ENUM ('a')"])
    t.columns["id"] = Column("id", "integer", True, "scalar", False)
    assert create_table(t) == [
        'CREATE SCHEMA IF NOT EXISTS "we""ird"',
        "CREATE TYPE x AS ENUM ('a')",
        'CREATE TABLE IF NOT EXISTS "we""ird"."t" ("id" integer NOT NULL, PRIMARY KEY ("id"))',
    ]
