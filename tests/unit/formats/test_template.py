"""Read rows' messages built in Arrow are byte for byte the format functions' (walstream/formats/),
with their idempotency keys, message keys and places in the batch."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from walstream.change import ChangeRow, read_idempotency_key
from walstream.formats import formatter
from walstream.formats.keys import group_keys
from walstream.formats.template import ReadTemplate, read_batch

PKS = [["1"], ["2"], ['quote " and \\ backslash'], ["tab\there", "ünï"], ["\x0b\x1f ctl"],
       ["a,b", "c"]]  # fmt: skip
RECORDS = [json.dumps({"id": i, "note": f"n{i} é"}, ensure_ascii=False) for i in range(len(PKS))]


def staged(pks: list[list[str | None]]) -> pa.Table:
    return pa.table({
        "pk": pa.array(pks, pa.list_(pa.string())),
        "record": RECORDS[: len(pks)],
        "ord": pa.array([i * 2 for i in range(len(pks))], pa.int32()),  # a gap: a dropped row
    })  # fmt: skip


@pytest.mark.parametrize("fmt", ["sequin", "record"])
@pytest.mark.parametrize("names", [("public", "t"), ('we"ird', "tä\\ble")])
def test_messages_equal_the_format_functions(fmt, names):
    schema, table = names
    template = ReadTemplate.of(fmt, sink="files", db="app db", source="src", schema=schema,
                               table=table, backfill=7, lsn=900, committed_us=1_700_000_000_123_456)  # fmt: skip
    assert template is not None
    out = read_batch(template, staged(PKS), schema=schema, table=table, lsn=900, high_seq=3,
                     committed_us=1_700_000_000_123_456).to_pydict()  # fmt: skip
    want = formatter(fmt, sink="files", db="app db")
    for i, pk in enumerate(PKS):
        row = ChangeRow("src", 900, 4 + 2 * i, None, 1_700_000_000_123_456, "read", schema, table,
                        pk, RECORDS[i], None, None, None, backfill=7)  # fmt: skip
        assert want is not None
        assert out["_message"][i] == want(row)
        assert out["_ikey"][i] == read_idempotency_key(7, pk)
        assert out["_key"][i] == ",".join(pk)
        assert (out["lsn"][i], out["seq"][i], out["action"][i]) == (900, 4 + 2 * i, "read")
    assert {out["schema"][0], out["table"][0]} == {schema, table}


def test_null_key_values_are_left_out_of_the_key_and_written_as_null_in_the_ikey():
    template = ReadTemplate.of("sequin", sink="s", db="d", source="src", schema="public",
                               table="t", backfill=1, lsn=5, committed_us=0)  # fmt: skip
    assert template is not None
    out = read_batch(template, staged([["a", None]]), schema="public", table="t", lsn=5,
                     high_seq=0, committed_us=0).to_pydict()  # fmt: skip
    assert out["_key"] == ["a"]
    assert out["_ikey"] == [read_idempotency_key(1, ["a", None])]


def test_the_group_is_the_pipelines_default_group():
    assert group_keys("public", "t", pa.array([["1", "x"]], pa.list_(pa.string()))).to_pylist() == [
        "public\x1ft\x1f1,x"
    ]


def test_a_format_made_as_records_has_no_template():
    """Debezium's records depend on the table's column types: Spark places their rows."""
    assert ReadTemplate.of("debezium", sink="s", db="d", source="src", schema="public",
                           table="t", backfill=1, lsn=5, committed_us=0) is None  # fmt: skip
