"""Message formats, byte for byte on known change rows."""

from __future__ import annotations

import base64
import json

import pytest

from walstream.change import ChangeRow, idempotency_key, read_idempotency_key
from walstream.formats import formatter
from walstream.formats.sequin import changed_values
from walstream.formats.text import iso_timestamp

TS = 1_763_884_850_561_930  # 2025-11-23T08:00:50.561930Z


def row(action: str, record: str | None, old: str | None = None, **kw: object) -> ChangeRow:
    base = dict(
        source="app", lsn=26441264, seq=3, xid=741, committed_at_us=TS, action=action,
        schema="public", table="orders", pk=["1"], record=record, old=old,
        annotations=None, unchanged_toast=None,
    )  # fmt: skip
    base.update(kw)
    return ChangeRow(**base)  # type: ignore[arg-type]


def test_iso_timestamp() -> None:
    assert iso_timestamp(TS) == "2025-11-23T08:00:50.561930Z"
    assert iso_timestamp(0) == "1970-01-01T00:00:00.000000Z"


def test_sequin_update_byte_for_byte() -> None:
    fmt = formatter("sequin", sink="orders-to-kafka", db="app")
    out = fmt(
        row(
            "update",
            '{"id":1,"status":"paid","amount":"10.50"}',
            '{"id":1,"status":"new","amount":"10.50"}',
            annotations='{"user":"ann"}',
        )
    )
    key = idempotency_key(26441264, 3)
    assert out == (
        '{"record":{"id":1,"status":"paid","amount":"10.50"},"changes":{"status":"new"},'
        '"action":"update","metadata":{"table_schema":"public","table_name":"orders",'
        '"commit_timestamp":"2025-11-23T08:00:50.561930Z","commit_lsn":26441264,'
        f'"commit_idx":3,"idempotency_key":"{key}","transaction_annotations":{{"user":"ann"}},'
        '"sink":{"name":"orders-to-kafka"},"source":{"name":"app"}}}'
    )
    json.loads(out)


def test_sequin_changes_rules() -> None:
    assert changed_values('{"a":1,"b":2}', None) == "null"  # old unknown: not "nothing changed"
    assert changed_values('{"a":1,"b":2}', '{"a":1,"b":3}') == '{"b":3}'
    fmt = formatter("sequin", sink="s", db="app")
    insert = json.loads(fmt(row("insert", '{"id":1}')))
    assert insert["changes"] is None and insert["record"] == {"id": 1}
    truncate = json.loads(fmt(row("truncate", None, pk=[])))
    assert truncate["record"] is None and truncate["action"] == "truncate"


def test_sequin_escapes_names() -> None:
    fmt = formatter("sequin", sink='we"ird', db="app")
    out = json.loads(fmt(row("insert", "{}", table='ta"ble')))
    assert out["metadata"]["table_name"] == 'ta"ble'
    assert out["metadata"]["sink"]["name"] == 'we"ird'


def test_record_format_and_unknown() -> None:
    fmt = formatter("record", sink="s", db="app")
    assert fmt(row("delete", '{"id":1}')) == '{"id":1}'
    with pytest.raises(ValueError, match="sequin, debezium, record"):
        formatter("avro", sink="s", db="app")
    assert formatter("debezium", sink="s", db="app") is None  # made as records


def test_a_backfill_row_carries_its_backfill_key() -> None:
    read = row("read", '{"id":42}', xid=None, backfill=7, pk=["42"])
    seq = json.loads(formatter("sequin", sink="s", db="d")(read))
    assert seq["action"] == "read" and seq["changes"] is None
    assert seq["metadata"]["idempotency_key"] == read_idempotency_key(7, ["42"])
    assert base64.b64decode(seq["metadata"]["idempotency_key"]) == b'read:7:["42"]'
    # the same row read by another backfill, or with a composite key, gets another key
    assert read_idempotency_key(8, ["42"]) != read_idempotency_key(7, ["42"])
    assert read_idempotency_key(7, ["a,b", "c"]) != read_idempotency_key(7, ["a", "b,c"])
