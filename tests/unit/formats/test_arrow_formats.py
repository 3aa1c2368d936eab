"""The message formats made over Arrow columns equal the Python formatters byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from tests.changes import TS, row
from walstream.change import ChangeRow, change_key
from walstream.formats import ARROW_FORMATS, batch_messages, formatter

ODD = 'qu"ote\\back/slash é 😀 \u2028 tab\tnew\nline\x01\x07\x19\x0b\x1f'


ROWS = [
    row("insert"),
    row("insert", xid=None, annotations='{"user":"ann"}', seq=4),
    row("update", '{"id":1,"a":2,"b":"x"}', '{"id":1,"a":1,"b":"x"}'),  # sequin: changes
    row("update", '{"id":1,"a":2}', None, lsn=26441300),
    row("update", None, '{"id":1}'),  # a TOASTed-only row: no new record
    row("delete", None, '{"id":1}', committed_at_us=TS + 1),
    row("delete", '{"id":1}', None),
    row("delete", None, None),
    row("truncate", None, pk=[]),
    row("insert", schema=ODD, table="Ταβλε 'q'", source='src "x"'),
    row("insert", table="ends in a newline\n", source="back\\slash", lsn=2**40, seq=2**31 - 1),
    row("insert", committed_at_us=0),
    row("insert", committed_at_us=-1_500),  # before 1970: floor division, as Python's
    row("update", '{"id":2,"n":[1,2]}', '{"id":2,"n":[1]}', committed_at_us=TS + 7),
]


#: The change columns' Arrow types as Spark hands them to a Python task.
TYPES = {"lsn": pa.int64(), "seq": pa.int32(), "xid": pa.int64(), "table_oid": pa.int64(),
         "pk": pa.list_(pa.string()), "unchanged_toast": pa.list_(pa.string())}  # fmt: skip


def batch(rows: list[ChangeRow]) -> Any:
    cols = {f: [getattr(r, f) for r in rows] for f in ChangeRow._fields if f != "backfill"}
    us = cols.pop("committed_at_us")
    arrays = {k: pa.array(v, TYPES.get(k, pa.string())) for k, v in cols.items()}
    arrays["committed_at"] = pa.array(us, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    arrays["_ikey"] = pa.array([change_key(r) for r in rows])
    return pa.RecordBatch.from_pydict(arrays)


@pytest.mark.parametrize("name", ARROW_FORMATS)
def test_arrow_messages_equal_the_python_formatter(name: str) -> None:
    sink, db = 'sink "one"\x01', "app\\db"
    got = batch_messages(name, batch(ROWS), sink=sink, db=db).to_pylist()
    fmt = formatter(name, sink=sink, db=db)
    assert fmt is not None
    for r, made in zip(ROWS, got, strict=True):
        assert made == fmt(r), r
        json.loads(made)


def test_a_batch_of_one_transaction_and_a_slice_are_formatted_alike() -> None:
    rows = [row("insert", f'{{"id":{i}}}', seq=i) for i in range(1000)]
    whole = batch(rows)
    part = whole.slice(500, 300)  # a chunk of a batch: offsets into the shared buffers
    fmt = formatter("sequin", sink="s", db="d")
    assert batch_messages("sequin", part, sink="s", db="d").to_pylist() == [
        fmt(r) for r in rows[500:800]
    ]


def test_a_format_not_made_in_arrow_is_refused() -> None:
    for name in ("mirror", "debezium"):
        with pytest.raises(ValueError, match="not made in Arrow"):
            batch_messages(name, batch([row("insert")]), sink="s", db="d")
