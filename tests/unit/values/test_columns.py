"""Backfill records built column by column in Arrow equal, byte for byte, the records the
decoder's codecs build row by row (`compile_fields_encoder`) from the same Postgres text."""

from __future__ import annotations

import base64

import pyarrow as pa
import pytest

from walstream.values import codecs as t
from walstream.values.codecs import array_codec
from walstream.values.columns import records, select_texts
from walstream.values.rows import compile_fields_encoder

#: column -> (codec, Postgres text values, NULL as None)
COLUMNS: dict[str, tuple[t.Codec, list[str | None]]] = {
    "id": (t.INT, ["1", "2", "3", "4", "5", "6"]),
    "flag": (t.BOOL, ["t", "f", None, "t", "f", "t"]),
    "ratio": (t.FLOAT, ["1.5", "NaN", "-Infinity", "1e+100", None, "Infinity"]),
    "amount": (t.NUMERIC, ["1.50", "NaN", None, "-0.001", "12345678901234567890.1", "0"]),
    "name": (
        t.TEXT,
        ["plain", 'quote " here', "back\\slash", "tab\there\nnewline", "ünï ☃", "\x01ctl"],
    ),
    "day": (t.DATE, ["2024-01-02", "infinity", "0044-03-15 BC", None, "-infinity", "1999-12-31"]),
    "at": (
        t.TIMESTAMP,
        [
            "2024-01-02 03:04:05",
            "2024-01-02 03:04:05.678",
            "infinity",
            "0044-03-15 12:00:00 BC",
            None,
            "2024-02-29 23:59:59.999999",
        ],
    ),
    "atz": (
        t.TIMESTAMPTZ,
        [
            "2024-01-02 03:04:05+00",
            "2024-01-02 03:04:05.678+00",
            "2024-01-02 03:04:05+05:30",
            "infinity",
            "0044-03-15 12:00:00+00 BC",
            None,
        ],
    ),
    "doc": (t.JSON, ['{"a": [1, 2]}', "null", None, "[]", '"s"', "{}"]),
    "tags": (array_codec(t.INT), ["{1,2,NULL}", "{}", None, "{{1,2},{3,4}}", "{5}", "{}"]),
    "uid": (t.TEXT, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"] * 6),
}
BLOBS = [b"\x00\x01binary", b"", None, b"\xff" * 100, b"x", b"y"]


def hex_text(b: bytes | None) -> str | None:
    return None if b is None else "\\x" + b.hex()


@pytest.mark.parametrize("key", [["id"], ["id", "name"]])
def test_arrow_records_equal_the_codecs_row_by_row(key):
    names = [*COLUMNS, "blob"]
    codecs = [c for c, _ in COLUMNS.values()] + [t.BYTEA]
    key_idx = [names.index(k) for k in key]
    texts = [values for _, values in COLUMNS.values()]
    # what the backfill's SELECT gives: bytea as one-line base64
    arrow = [pa.array(v, pa.string()) for v in texts] + [
        pa.array([None if b is None else base64.b64encode(b).decode() for b in BLOBS])
    ]
    got_records, got_pk = records(arrow, names, codecs, key_idx)
    encode = compile_fields_encoder(names, codecs, key_idx)
    rows = len(BLOBS)
    for r in range(rows):
        fields = [None if col[r] is None else col[r].encode() for col in texts]
        fields.append(None if BLOBS[r] is None else hex_text(BLOBS[r]).encode())
        want_record, want_pk = encode(fields)
        assert got_records[r].as_py() == want_record, r
        assert got_pk[r].as_py() == want_pk, r


def test_no_columns_and_no_rows():
    record, pk = records([], [], [], [])
    assert len(record) == 0 and len(pk) == 0
    record, pk = records([pa.array([], pa.string())], ["id"], [t.INT], [0])
    assert len(record) == 0 and len(pk) == 0


def test_json_nulls_lists_the_json_columns_holding_the_json_null() -> None:
    """As the decoder's `json_nulls`: the JSON null is a value (`null` text), SQL NULL is not;
    a text column holding 'null' is text."""
    from walstream.values.columns import json_nulls

    doc = pa.array(["null", None, '{"a": null}', "null"], pa.string())
    other = pa.array(["null", "null", None, "1"], pa.string())
    note = pa.array(["null", "x", None, None], pa.string())
    got = json_nulls([doc, other, note], ["doc", "other", "note"], [t.JSON, t.JSON, t.TEXT])
    assert got.to_pylist() == [["doc", "other"], ["other"], None, ["doc"]]
    assert json_nulls([note], ["note"], [t.TEXT]).to_pylist() == [None] * 4


def test_text_types_are_selected_as_they_are_the_others_as_their_output_text() -> None:
    """text, varchar, char(n) and name come as they are (their binary form is their output
    text); "char" (whose binary '' is a NUL byte), uuid and bytea are converted."""
    from psycopg import sql

    names = ["t", "v", "c", "n", "ch", "u", "b"]
    codecs = [t.TEXT, t.TEXT, t.TEXT, t.TEXT, t.TEXT, t.TEXT, t.BYTEA]
    rendered = [
        sql.SQL(", ").join([s]).as_string(None)
        for s in select_texts(names, codecs, [25, 1043, 1042, 19, 18, 2950, 17])
    ]
    assert rendered[:4] == ['"t"', '"v"', '"c"', '"n"']
    assert rendered[4] == 'CASE WHEN "ch" IS NULL THEN NULL ELSE concat("ch") END AS "ch"'
    assert rendered[5].startswith('CASE WHEN "u"') and "encode" in rendered[6]
    # without the OIDs, every column is converted
    assert all("CASE" in s.as_string(None) for s in select_texts(names[:4], codecs[:4]))
