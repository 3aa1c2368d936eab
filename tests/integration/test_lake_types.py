"""Typed lake columns: each Postgres type's column type, and values a column cannot hold."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import unique
from tests.lake import delta_rows, run_config
from walstream.config import parse_config
from walstream.decode.table_shape import Column, TableShape, load_shape
from walstream.delivery.parking import ParkingLot
from walstream.delivery.progress import SinkProgress as Progress
from walstream.errors import SinkError
from walstream.lake.typed import to_batch, typed_rows
from walstream.runtime import Runtime
from walstream.testing import wait_until


def test_column_types_come_from_the_catalog(db):
    db.execute("""
        CREATE TYPE mood AS ENUM ('ok', 'sad');
        CREATE TYPE pair AS (a int, b text);
        CREATE DOMAIN price AS numeric(8,3) CHECK (VALUE >= 0);
        CREATE TABLE t (
            a smallint, b integer, c bigint, d real, e double precision, f numeric(12,4),
            g numeric, h numeric(50,2), i boolean, j date, k timestamptz, l timestamp,
            m bytea, n json, o jsonb, p int[], q text[], r numeric(10,2)[], s uuid, u mood,
            v pair, w price, x time, y interval, z varchar(10), id int,
            PRIMARY KEY (z, id)
        )""")  # fmt: skip
    shape = load_shape(db.conn, "public", "t")
    assert {c.name: c.type for c in shape.columns} == {
        "a": "INT", "b": "INT", "c": "BIGINT", "d": "FLOAT", "e": "DOUBLE",
        "f": "DECIMAL(12,4)", "g": "STRING", "h": "STRING", "i": "BOOLEAN", "j": "DATE",
        "k": "TIMESTAMP", "l": "TIMESTAMP_NTZ", "m": "BINARY", "n": "STRING", "o": "STRING",
        "p": "ARRAY<INT>", "q": "ARRAY<STRING>", "r": "ARRAY<DECIMAL(10,2)>", "s": "STRING",
        "u": "STRING", "v": "STRING", "w": "DECIMAL(8,3)", "x": "STRING", "y": "STRING",
        "z": "STRING", "id": "INT",
    }  # fmt: skip
    assert shape.key == ("z", "id")
    assert [c.name for c in shape.select(["a"], None).columns] == ["a", "z", "id"]
    assert "b" not in shape.select(None, ["b", "id"]).names and "id" in shape.names


def test_a_table_without_a_key_is_refused_for_mirror_with_the_fix(db):
    db.execute("CREATE TABLE nokey (a int)")
    with pytest.raises(SinkError, match="neither a primary key") as e:
        load_shape(db.conn, "public", "nokey")
    assert "mode: changelog" in (e.value.fix or "")
    assert load_shape(db.conn, "public", "nokey", need_key=False).key == ()


def cfg_data(db: Any, tmp_path: Any, slot: str, pub: str) -> dict[str, Any]:
    delta = {"type": "delta", "path": str(tmp_path / "lake" / "{table}")}
    return run_config(db, tmp_path, slot, pub, [{"name": "lake", "source": "app",
                                                  "destination": delta}])  # fmt: skip


@pytest.mark.spark
@pytest.mark.parametrize("published", [1, 2], ids=["its own publication", "two tables"])
def test_a_value_its_column_cannot_hold_stops_the_sink_and_is_never_null(
    spark, db, tmp_path, published
):
    """With a publication of two tables pyarrow types, a batch's rows are not cached (one
    job brings them to the driver): the JVM's typing of the refused value reads them again
    from the source, and the batch is held all the same (the other table's row, committed
    per table, is there once)."""
    db.execute("CREATE TABLE prices (id int PRIMARY KEY, price numeric(10,2))")
    db.execute("CREATE TABLE tags (id int PRIMARY KEY, tag text)")
    pub = db.create_publication(*["prices", "tags"][:published])
    slot = unique("slot")
    db.slots.append(slot)
    cfg = parse_config(cfg_data(db, tmp_path, slot, pub))
    runtime = Runtime(cfg, spark=spark).start()
    try:
        db.execute("INSERT INTO prices VALUES (1, 9.99)")

        def first() -> bool:
            runtime.poll()
            p = runtime.progress().get("lake")
            return p is not None and p.delivered >= 1

        wait_until(first, 120, interval=0.2, message=lambda: f"{runtime.progress()}")
        db.execute("INSERT INTO tags VALUES (1, 'a'); INSERT INTO prices VALUES (2, 'NaN')")
        db.execute("INSERT INTO prices VALUES (3, 1.5)")
        lot = ParkingLot(cfg.state_dsn)
        wait_until(lambda: "lake" in lot.paused(), 120, message="the sink was not paused")
        reason = lot.paused()["lake"] or ""
        assert "public.prices" in reason and "price (Postgres numeric)" in reason
        assert "columns: exclude" in reason
        wait_until(
            lambda: "walstream resume lake" in runtime.sources()[0].holding.get("lake", ""),
            30, interval=0.2, message=lambda: f"holding: {runtime.sources()[0].holding}",
        )  # fmt: skip
        assert runtime.fatal is None  # the run goes on; its batches wait
    finally:
        runtime.stop()
    # what was written before stays; nothing of the held batch (not NULL, not row 3)
    assert [(r["id"], str(r["price"])) for r in delta_rows(tmp_path / "lake" / "prices")] == [
        (1, "9.99")
    ]
    # the fix the error names: leave the column out, resume; the held batch goes through
    data = cfg_data(db, tmp_path, slot, pub)
    data["sinks"][0]["destination"]["columns"] = {"exclude": ["price"]}
    lot.set_paused("lake", False)
    runtime = Runtime(parse_config(data), spark=spark).start()
    try:
        wait_until(
            lambda: runtime.poll() or (runtime.progress().get("lake") or Progress()).delivered >= 2,
            120, interval=0.2, message=lambda: f"{runtime.progress()}",
        )  # fmt: skip
    finally:
        runtime.stop()
    rows = sorted(delta_rows(tmp_path / "lake" / "prices"), key=lambda r: r["id"])
    assert [(r["id"], r["price"] and str(r["price"])) for r in rows] == [
        (1, "9.99"), (2, None), (3, None),
    ]  # fmt: skip
    if published == 2:  # committed once: before the held table's failure, or after resume
        tags = [(r["id"], r["tag"]) for r in delta_rows(tmp_path / "lake" / "tags")]
        assert tags == [(1, "a")]
    else:
        assert not (tmp_path / "lake" / "tags").exists()


SHAPE = TableShape("public", "t", (
    Column("id", "INT"), Column("n", "DECIMAL(10,2)"), Column("d", "DATE"),
    Column("ts", "TIMESTAMP"), Column("l", "TIMESTAMP_NTZ"), Column("a", "ARRAY<DECIMAL(5,1)>"),
    Column("b", "BINARY"), Column("j", "STRING"),
), ("id",), {"n": "numeric", "d": "date", "ts": "timestamptz", "a": "numeric[]"})  # fmt: skip


def changes(spark: Any, *records: dict[str, Any]) -> Any:
    from walstream.change import spark_schema

    rows = [
        ("app", 10, i, 1, datetime(2024, 1, 1, tzinfo=UTC), "insert", "public", "t", [str(i)],
         json.dumps(r), None, None, None, 16384, None, None, None)
        for i, r in enumerate(records)
    ]  # fmt: skip
    return spark.createDataFrame(rows, spark_schema())


def typed(spark: Any, *records: dict[str, Any]) -> Any:
    return to_batch(typed_rows(changes(spark, *records), SHAPE).toArrow(), SHAPE)


@pytest.mark.spark
def test_a_change_is_parsed_once_not_once_a_column(spark):
    """Spark's optimizer makes `from_json(record).col` a parse of its own for each column
    (`OptimizeJsonExprs`): the plan that runs must parse `record` and `old` once a row."""
    rows = typed_rows(changes(spark, {"id": 1}), SHAPE)
    plan = rows._jdf.queryExecution().optimizedPlan().toString()
    parses = re.findall(r"from_json\(.*?, (record|old)#\d+, ", plan)
    assert sorted(parses) == ["old", "record"], plan


@pytest.mark.spark
def test_a_shape_s_typing_is_made_once_and_told_apart_by_postgres_types(spark):
    """The typing's columns are kept per shape (building them costs a batch a quarter of a
    second); shapes alike but for a column's Postgres type are typed each their own way."""
    from walstream.lake.typed import _projection

    as_text = TableShape("public", "t", (Column("id", "INT"), Column("j", "STRING")), ("id",))
    as_json = TableShape("public", "t", as_text.columns, ("id",), {"id": "integer", "j": "jsonb"})
    assert _projection(spark, as_text, True, False) is _projection(spark, as_text, True, False)
    df = changes(spark, {"id": 1, "j": "123"})
    for _ in range(2):  # either order, each its own typing
        (text,) = to_batch(typed_rows(df, as_text, only=True).toArrow(), as_text).to_pylist()
        (json_,) = to_batch(typed_rows(df, as_json, only=True).toArrow(), as_json).to_pylist()
        assert (text["j"], json_["j"]) == ("123", '"123"')


@pytest.mark.spark
def test_typing_keeps_every_value_and_refuses_what_a_column_cannot_hold(spark):
    good = {"id": 1, "n": "12.30", "d": "2024-02-29", "ts": "2024-01-02T03:04:05.678901Z",
            "l": "2024-01-02T03:04:05", "a": ["1.5", None], "b": "AAEC", "j": {"k": [1]}}  # fmt: skip
    (row,) = typed(spark, good).to_pylist()
    assert row["n"] == Decimal("12.30") and row["d"] == date(2024, 2, 29)
    assert row["ts"] == datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert row["l"] == datetime(2024, 1, 2, 3, 4, 5)
    assert row["a"] == [Decimal("1.5"), None] and row["b"] == b"\x00\x01\x02"
    assert json.loads(row["j"]) == {"k": [1]}
    for column, value in (("n", "NaN"), ("d", "infinity"), ("ts", "-infinity"),
                          ("a", ["1.5", "NaN"]), ("a", [["1"], ["2"]])):  # fmt: skip
        with pytest.raises(SinkError, match=rf"cannot hold: {column} \(Postgres"):
            typed(spark, good, {**good, "id": 2, column: value})


def test_the_iceberg_check_works_before_the_state_schema_exists(db, tmp_path):
    from walstream.sinks.registry import sink_for

    plan = parse_config({
        "state": {"schema": "fresh_state"},
        "sources": [{"name": "app", "dsn": db.dsn}],
        "sinks": [{"name": "lake", "source": "app",
                   "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path)}}}],
    })  # fmt: skip
    assert not db.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'fresh_state'")
    sink_for(plan.sinks[0].destination).test_connection()
    tables = db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'fresh_state' ORDER BY 1"
    )
    assert [t[0] for t in tables] == ["iceberg_namespace_properties", "iceberg_tables"]


#: A table pyarrow types on the driver (`arrow_typable`): every such type, a composite key.
TYPABLE = TableShape("public", "t", (
    Column("id", "BIGINT"), Column("k", "STRING"), Column("i", "INT"), Column("f", "DOUBLE"),
    Column("b", "BOOLEAN"), Column("d", "DATE"), Column("ts", "TIMESTAMP"),
    Column("l", "TIMESTAMP_NTZ"), Column("ai", "ARRAY<INT>"), Column("at", "ARRAY<STRING>"),
    Column("n", "DECIMAL(12,4)"), Column("an", "ARRAY<DECIMAL(5,1)>"),
), ("id", "k"), {"id": "bigint", "k": "text", "i": "integer", "f": "double precision",
                 "b": "boolean", "d": "date", "ts": "timestamptz", "l": "timestamp",
                 "ai": "integer[]", "at": "text[]", "n": "numeric", "an": "numeric[]"})  # fmt: skip
EDGES = [
    {"id": 9223372036854775807, "k": "", "i": -2147483648, "f": 1e308, "b": True,
     "d": "2024-02-29", "ts": "2024-01-02T03:04:05.678901Z", "l": "2024-01-02T03:04:05",
     "ai": [1, None, 3], "at": ["a", None, ""], "n": "99999999.9999", "an": ["1.5", None],
     "gone": "a column the sink leaves out"},
    {"id": -9223372036854775808, "k": 'ünï "q" \\ \n\t😀', "i": None, "f": -0.0, "b": False,
     "d": "0001-01-01", "ts": "1970-01-01T00:00:00Z", "l": "9999-12-31T23:59:59.999999",
     "ai": [], "at": ["x,y", "{}", "NULL"], "n": "-0.0001", "an": []},
    {"id": 3, "k": "c", "i": 7, "f": 5e-324, "b": None, "d": "9999-12-31",
     "ts": "0001-01-01T00:00:00Z", "l": None, "ai": None, "at": None, "n": "12.3", "an": None},
]  # fmt: skip


def change_rows(spark: Any, changes: list[tuple[Any, ...]]) -> Any:
    """Change rows of (action, table, record, old, unchanged TOAST columns)."""
    from walstream.change import spark_schema

    rows = [
        ("app", 10 + i, 0, 1, datetime(2024, 1, 1, tzinfo=UTC), action, "public", table, ["1"],
         None if record is None else json.dumps(record), None if old is None else json.dumps(old),
         None, toast, 16384, None, None, None)
        for i, (action, table, record, old, toast) in enumerate(changes)
    ]  # fmt: skip
    return spark.createDataFrame(rows, spark_schema())


@pytest.mark.spark
def test_a_table_pyarrow_types_is_typed_on_the_driver_exactly_as_by_the_jvm(spark):
    """A table of types pyarrow reads as Spark does has its change rows collected as they are
    and typed on the driver: the batch equals the JVM's typing of it, value for value and
    type for type: edge values, NULLs, a key change's old key, a TOAST column left out, a
    delete and a truncate, a column the sink does not keep. A value pyarrow cannot type
    (NaN, infinity) sends the batch to the JVM's typing, which keeps it or refuses it."""
    from walstream.lake.typed import RAW_COLUMNS, arrow_typable, arrow_typed, batch_rows

    assert arrow_typable(TYPABLE) and not arrow_typable(SHAPE)
    moved = {**EDGES[2], "id": 4, "k": "moved"}
    toasted = {k: v for k, v in EDGES[1].items() if k != "at"}
    df = change_rows(spark, [
        *[("insert", "t", r, None, None) for r in EDGES],
        ("update", "t", moved, {"id": 3, "k": "c"}, None),
        ("update", "t", toasted, None, ["at"]),
        ("delete", "t", None, {"id": 9223372036854775807, "k": ""}, None),
        ("insert", "other", {"id": 1}, None, None),
        ("truncate", "t", None, None, None),
    ])  # fmt: skip
    ours = df.where("`table` = 't'")
    by_pyarrow = arrow_typed(ours.select(*RAW_COLUMNS).toArrow(), TYPABLE, True)
    assert by_pyarrow is not None
    for only, rows in ((False, df), (True, ours)):  # another table's change left out, or none
        by_jvm = to_batch(typed_rows(rows, TYPABLE, only).toArrow(), TYPABLE)
        assert by_jvm.num_rows == 7
        assert batch_rows(rows, TYPABLE, only).equals(by_pyarrow)  # the driver typed it
        every = rows.select(*RAW_COLUMNS).toArrow()  # the batch's rows, collected once
        assert batch_rows(rows, TYPABLE, only, raw=every).equals(by_pyarrow)
        assert to_batch(by_pyarrow, TYPABLE).equals(by_jvm, check_metadata=True)
    for only in (True, False):  # a batch without the table's changes (a heartbeat's)
        assert batch_rows(df.where("false"), TYPABLE, only).num_rows == 0
    with pytest.raises(SinkError, match=r"change of public\.other .* no longer has"):
        to_batch(batch_rows(df, TYPABLE, only=True), TYPABLE)

    nan = change_rows(spark, [("insert", "t", {**EDGES[0], "f": "NaN"}, None, None)])
    assert arrow_typed(nan.select(*RAW_COLUMNS).toArrow(), TYPABLE, True) is None
    (row,) = to_batch(batch_rows(nan, TYPABLE, True), TYPABLE).to_pylist()
    assert row["f"] != row["f"] and row["at"] == ["a", None, ""]  # NaN, by the JVM
    for column, value in (("ts", "infinity"), ("n", "NaN"), ("an", ["1.5", "NaN"])):
        refused = change_rows(spark, [("insert", "t", {**EDGES[0], column: value}, None, None)])
        with pytest.raises(SinkError, match=rf"cannot hold: {column} \(Postgres"):
            to_batch(batch_rows(refused, TYPABLE, True), TYPABLE)
