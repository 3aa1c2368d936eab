"""How `walstream verify` reads a compacted topic's messages (`verify/topic.py`): each key's
latest message, a delete or tombstone removing it, the `record` taken verbatim from a sequin
message (whatever its columns are named or hold), and a record that only leaves out values
the source has (unchanged TOASTed ones) counted as equal, not one that differs."""

from __future__ import annotations

import json

import pyarrow as pa

from walstream.verify.topic import Latest, equivalent

META = '"metadata":{"table_schema":"public","table_name":"t"}'


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
        latest.latest[key] = latest._entry(value)
    assert latest.of("public", "t") == {"1": tricky, "4": '{"id":4}'}
    assert latest.of("public", "other") == {}


def test_a_record_format_message_is_of_the_sinks_one_table():
    latest = Latest({}, "topic", "record", ("s", "u"))
    latest.latest[b"k"] = latest._entry(b'{"id":1}')
    latest.latest[b"gone"] = latest._entry(None)
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
