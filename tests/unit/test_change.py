from __future__ import annotations

import base64

import pytest

import walstream
from walstream.change import WalCursor, format_lsn, idempotency_key, parse_lsn
from walstream.errors import WalstreamError


def test_public_api_is_pinned():
    assert sorted(walstream.__all__) == sorted([
        "CHANGE_COLUMNS", "CHANGE_SCHEMA_DDL", "ChangeRow", "ConfigError", "ConnectionFailed",
        "DecodeError", "SetupError", "WalCursor", "WalstreamError", "__version__", "format_lsn",
        "idempotency_key", "parse_lsn", "register", "spark_schema",
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("0/16B3748", 0x16B3748),
        ("16/B374D848", (0x16 << 32) | 0xB374D848),
        ("FFFFFFFF/FFFFFFFF", (1 << 64) - 1),
    ],
)
def test_lsn_round_trip(text, value):
    assert parse_lsn(text) == value
    assert format_lsn(value) == text
    assert parse_lsn(text.lower()) == value


@pytest.mark.parametrize("bad", ["", "16B3748", "0/", "G/1", "1/2/3", "123456789/0"])
def test_bad_lsn_says_how_to_write_one(bad):
    with pytest.raises(WalstreamError, match="invalid LSN") as e:
        parse_lsn(bad)
    assert "0/16B3748" in str(e.value.fix)


def test_cursor_total_order():
    cursors = [WalCursor(5, 2), WalCursor(4, 9), WalCursor(5, 0), WalCursor(4, 0)]
    assert sorted(cursors) == [WalCursor(4, 0), WalCursor(4, 9), WalCursor(5, 0), WalCursor(5, 2)]
    assert WalCursor(4, 9) < WalCursor(5, 0)
    assert WalCursor(3, 1) == WalCursor(3, 1) and len({WalCursor(3, 1), WalCursor(3, 1)}) == 1


def test_idempotency_key_is_base64_of_lsn_colon_seq():
    key = WalCursor(0x16B3748, 3).idempotency_key
    assert base64.b64decode(key) == f"{0x16B3748}:3".encode()
    assert key == idempotency_key(0x16B3748, 3)
    assert WalCursor(1, 23).idempotency_key != WalCursor(12, 3).idempotency_key


def test_cursor_json_round_trip_and_errors():
    c = WalCursor(123, 4)
    assert WalCursor.from_json(c.to_json()) == c
    with pytest.raises(WalstreamError, match="invalid WAL cursor"):
        WalCursor.from_json({"lsn": "x"})
    with pytest.raises(ValueError):
        WalCursor(-1, 0)


def test_the_change_schema_is_one_definition_in_ddl_spark_and_arrow() -> None:
    import pyarrow as pa
    from pyspark.sql import types as T

    from walstream.change import (
        CHANGE_COLUMNS,
        CHANGE_SCHEMA_DDL,
        ChangeRow,
        arrow_schema,
        spark_schema,
    )

    assert CHANGE_SCHEMA_DDL == (  # the contract: a source's schema, column order included
        "source STRING, lsn BIGINT, seq INT, xid BIGINT, committed_at TIMESTAMP, action STRING, "
        "schema STRING, table STRING, pk ARRAY<STRING>, record STRING, old STRING, "
        "annotations STRING, unchanged_toast ARRAY<STRING>, table_oid BIGINT, json_nulls ARRAY<STRING>, "
        "change_lsn BIGINT, last_commit_lsn BIGINT"
    )
    spark = spark_schema()
    assert tuple(spark.names) == tuple(arrow_schema().names) == CHANGE_COLUMNS
    row = tuple(f.replace("committed_at_us", "committed_at") for f in ChangeRow._fields)
    assert row[: len(CHANGE_COLUMNS)] == CHANGE_COLUMNS  # the row's fields in the same order
    assert spark.simpleString().replace(",", ", ").replace(":", " ").upper() == (
        "STRUCT<" + CHANGE_SCHEMA_DDL.upper() + ">"
    )
    nullable = {f.name for f in spark.fields if f.nullable}
    assert nullable == {"xid", "record", "old", "annotations", "unchanged_toast", "table_oid",
                        "json_nulls", "change_lsn", "last_commit_lsn"}  # fmt: skip
    assert spark["pk"].dataType == T.ArrayType(T.StringType(), True)  # a key part may be NULL
    assert spark["json_nulls"].dataType == T.ArrayType(T.StringType(), False)
    arrow = arrow_schema()
    assert arrow.field("committed_at").type == pa.timestamp("us", tz="UTC")
    assert arrow.field("pk").type == pa.list_(pa.string())
    assert arrow.field("seq").type == pa.int32()
