"""How `walstream verify` reads a compacted topic's messages (`verify/topic.py`): each key's
latest message, a delete or tombstone removing it, the `record` taken verbatim from a sequin
message (whatever its columns are named or hold), and a record that only leaves out values
the source has (unchanged TOASTed ones) counted as equal, not one that differs."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from walstream.change import ChangeRow
from walstream.verify.topic import Latest, equivalent

META = '"metadata":{"table_schema":"public","table_name":"t"}'


def change(action: str, record: str | None, old: str | None = None, **kw: Any) -> ChangeRow:
    base: dict[str, Any] = dict(
        source="app", lsn=100, seq=2, xid=7, committed_at_us=1_700_000_000_000_000,
        action=action, schema="public", table="acct", pk=None, record=record,
        old=old, annotations=None, unchanged_toast=None, table_oid=42,
    )  # fmt: skip
    return ChangeRow(**{**base, **kw})


def sequin(record: str, action: str = "update") -> bytes:
    return f'{{"record":{record},"changes":null,"action":"{action}",{META}}}'.encode()


def test_the_latest_message_of_each_key_with_its_record_verbatim():
    latest = Latest({}, "topic", "sequin", ("public", "t"))
    # a column named like the message's own fields, braces and quotes inside a value, and
    # a number as Postgres prints it (not as a JSON library would write it back)
    tricky = '{"id":1,"changes":"},\\"action\\":\\"delete\\"","price":1.50}'
    for key, value in (
        (b"1", sequin('{"id":1}', "insert")),
        (b"1", sequin(tricky)),
        (b"2", sequin('{"id":2}', "insert")),
        (b"2", sequin('{"id":2}', "delete")),
        (b"3", sequin('{"id":3}', "read")),
        (b"3", None),  # a tombstone
        (b"4", sequin('{"id":4}', "read")),
    ):
        latest.add(key, value)
    assert latest.of("public", "t") == {"1": tricky, "4": '{"id":4}'}
    assert latest.of("public", "other") == {}


def test_a_record_format_message_is_of_the_sinks_one_table():
    latest = Latest({}, "topic", "record", ("s", "u"))
    latest.add(b"k", b'{"id":1}')
    latest.add(b"gone", None)
    assert latest.of("s", "u") == {"k": '{"id":1}'}


def table(rows: dict[str, dict[str, object]]) -> pa.Table:
    return pa.table(
        {"_key": list(rows), "record": [json.dumps(r) for r in rows.values()]},
    )


def test_a_record_leaving_out_values_is_equal_on_the_rest_only():
    full = {"id": 1, "big": "x" * 10, "n": 2}
    source = table({"a": full, "b": full, "c": full, "d": full, "e": full})
    sink = table(
        {
            "a": {"id": 1, "n": 2},  # the TOASTed value left out: equal on the rest
            "b": {"id": 1, "n": 3},  # left out, and another value differs
            "c": full,  # all there (compared by hash, not here)
            "d": {"id": 1, "n": 2, "other": 1},  # a column the source does not have
        }
    )
    assert equivalent([source], [sink]) == {("a",)}
    assert equivalent([], [sink]) == set()


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas on", "schemas off"])
def test_a_debezium_record_is_compared_as_its_key_and_after(schemas):
    """A record the sink makes (`Records`, format debezium) and the source row as verify
    makes it (`DebeziumRows` over the record a backfill reads) are the same key and row;
    a delete and its tombstone remove the key; an update whose unchanged TOASTed value is
    the placeholder is equal on the rest, not a changed value."""
    from walstream.formats.debezium import DebeziumSettings, Records
    from walstream.formats.debezium_message import TableMessages
    from walstream.formats.debezium_types import PgColumn
    from walstream.verify.topic import DebeziumRows

    columns = [PgColumn("region", "text", not_null=True), PgColumn("id", "int4", not_null=True),
               PgColumn("ok", "bool"), PgColumn("big", "text")]  # fmt: skip
    props = {"key.converter.schemas.enable": schemas, "value.converter.schemas.enable": schemas}
    settings = DebeziumSettings.of(props)
    sink = Records(settings, "appdb", lambda oid: (columns, ["region", "id"]))
    maker = TableMessages("app", "", "public", "acct", columns, ["region", "id"], settings.values)
    source = DebeziumRows(maker, ["region", "id"])
    latest = Latest({}, "app.public.acct", "debezium", ("public", "acct"))

    def send(c: ChangeRow) -> None:
        for _, message in sink(c):
            latest.add(message.key, message.value)

    row = '{"region":"eu","id":1,"ok":true,"big":"' + "x" * 50 + '"}'
    send(change("read", row))
    send(change("insert", '{"region":"us","id":2,"ok":null,"big":null}'))
    send(change("delete", None, '{"region":"us","id":2}'))
    read = source.table(pa.array([row]), pa.array([None], pa.list_(pa.string())))
    (key,) = read.column("_key").to_pylist()
    assert key == '{"id":1,"region":"eu"}' and source.joined(key) == "eu,1"
    assert latest.of("public", "acct") == {key: read.column("record")[0].as_py()}

    send(change("update", '{"region":"eu","id":1,"ok":false}', unchanged_toast=["big"]))
    changed = source.table(
        pa.array([row.replace("true", "false")]), pa.array([None], pa.list_(pa.string()))
    )
    sink_rows = pa.table({"_key": list(latest.of("public", "acct")),
                          "record": list(latest.of("public", "acct").values())})  # fmt: skip
    assert source.equivalent([changed], [sink_rows]) == {(key,)}
    assert source.equivalent([read], [sink_rows]) == set()  # ok differs: not equal on the rest


def test_a_debezium_key_is_what_it_means_not_its_bytes():
    """A key written by another producer — spaced, its fields in another order, with or
    without the schema — is the key the sink writes: its tombstone removes the row, its
    record replaces it. A key that is not JSON stays as it is (a key the source lacks)."""
    latest = Latest({}, "app.public.acct", "debezium", ("public", "acct"))
    source = {"schema": "public", "table": "acct"}

    def record(after: dict[str, Any]) -> bytes:
        return json.dumps({"op": "u", "after": after, "source": source}).encode()

    latest.add(b'{"region":"eu","id":1}', record({"region": "eu", "id": 1, "n": 1}))
    latest.add(b'{"region":"eu","id":2}', record({"region": "eu", "id": 2, "n": 2}))
    latest.add(b'{"id": 1, "region": "eu"}', None)
    latest.add(
        json.dumps({"schema": {"type": "struct"}, "payload": {"id": 2, "region": "eu"}}).encode(),
        record({"region": "eu", "id": 2, "n": 3}),
    )
    latest.add(b"not json", record({"region": "xx", "id": 9}))
    assert latest.of("public", "acct") == {
        '{"id":2,"region":"eu"}': '{"region":"eu","id":2,"n":3}',
        "not json": '{"region":"xx","id":9}',
    }
