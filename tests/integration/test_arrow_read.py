"""Backfill rows as typed Arrow (ADBC's binary COPY reader): the same values, in the same
lake types, as the stream gives for the same rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from psycopg import sql

from tests.integration.test_lake import TYPES, insert
from tests.integration.test_run import oracle
from walstream.backfill.adbc import _uri, connect
from walstream.backfill.arrow_read import read_batches, select
from walstream.change import spark_schema
from walstream.decode.table_shape import load_shape
from walstream.errors import ConnectionFailed, SinkError
from walstream.lake.typed import to_batch, typed_rows


@pytest.mark.spark
def test_arrow_rows_equal_the_streams_typed_rows(spark, db):
    db.execute(TYPES)
    # text types are read as they are (their binary form is their output text): char(n)'s
    # padding, a domain over it, name, varchar, and "char" (whose binary form is not)
    db.execute("CREATE DOMAIN code AS char(4)")
    db.execute("ALTER TABLE items ADD COLUMN words text[], ADD COLUMN ids uuid[], "
               "ADD COLUMN pad char(6), ADD COLUMN dom code, ADD COLUMN nm name, "
               "ADD COLUMN short varchar(5), ADD COLUMN one \"char\"")  # fmt: skip
    pub = db.create_publication("items")
    slot = db.create_slot()
    insert(db, range(1, 30))
    db.execute("UPDATE items SET words = ARRAY['a', 'b c'], ids = ARRAY[gen_random_uuid()], "
               "doc = '{\"z\": 1, \"a\": [true, null]}' WHERE id < 5")  # fmt: skip
    db.execute("UPDATE items SET price = NULL, at = NULL, tags = ARRAY[1, NULL] WHERE id = 7")
    db.execute("UPDATE items SET pad = 'a b', dom = 'é', nm = 'n\"m', short = E'\\t\\n\\x01', "
               "one = 'q' WHERE id = 8")  # fmt: skip
    db.execute("UPDATE items SET pad = '', dom = '', nm = '', short = '', one = '' WHERE id = 9")
    shape = load_shape(db.conn, "public", "items")
    query = select(shape).as_string(db.conn)
    assert '"pad", "dom", "nm", "short", CASE WHEN "one"' in query, query
    with connect(db.dsn) as conn:
        read = pa.Table.from_batches(
            list(read_batches(conn, shape, select(shape, sql.SQL("id > $1")), [0])),
        ).sort_by("id")
    # the stream's view of the same rows: every change decoded, typed in Spark, newest kept
    changes = oracle(db, slot, pub, "app")
    width = len(spark_schema().fields)
    rows = [(*c[:4], c.committed_at, *c[5:width]) for c in changes]
    df = spark.createDataFrame(rows, spark_schema())
    streamed = to_batch(typed_rows(df, shape).toArrow(), shape)
    newest: dict[int, dict] = {}  # each row as the stream leaves it (unchanged TOAST kept)
    for r in streamed.to_pylist():
        toast = set(r["_toast"] or ())
        newest[r["id"]] = {
            **newest.get(r["id"], {}),
            **{k: v for k, v in r.items() if k not in toast},
        }
    assert read.num_rows == len(newest) == 29
    assert read.schema.names == shape.names
    for row in read.to_pylist():
        want = {n: newest[row["id"]][n] for n in shape.names}
        for n in ("doc",):  # JSON: the same document (Postgres spaces it, the stream does not)
            row[n], want[n] = json.loads(row[n]), json.loads(want[n])
        assert row == want, row["id"]


def test_a_value_the_lake_type_cannot_hold_fails_the_read_naming_it(db):
    db.execute("CREATE TABLE money (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO money VALUES (1, 1.5), (2, 'NaN')")
    shape = load_shape(db.conn, "public", "money")
    with (
        connect(db.dsn) as conn,
        pytest.raises(SinkError, match=r"column amount \(Postgres numeric\)"),
    ):
        list(read_batches(conn, shape, select(shape)))


def test_any_dsn_form_becomes_a_uri():
    assert _uri("postgresql://u@h:5/d") == "postgresql://u@h:5/d"
    assert _uri("host=db.internal port=5433 user=app password=p@ss:w/rd dbname=orders "
                "sslmode=require") == (
        "postgresql://app:p%40ss%3Aw%2Frd@db.internal:5433/orders?sslmode=require"
    )  # fmt: skip


def test_an_unreachable_server_is_named_without_its_password():
    with pytest.raises(ConnectionFailed) as err:
        connect("host=127.0.0.1 port=1 user=app password=s3cret-pw dbname=orders")
    assert "cannot connect to PostgreSQL at user=app dbname=orders host=127.0.0.1 port=1" in str(
        err.value
    )
    assert "s3cret-pw" not in str(err.value) and "s3cret-pw" not in str(err.value.fix)
