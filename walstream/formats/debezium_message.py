"""Debezium's messages of one change: key and value as Debezium's PostgreSQL connector and
Kafka Connect's JsonConverter make them (`{"schema", "payload"}` with schemas on, the
payload alone with them off), from a change row and its table's columns
(`debezium_types.load_columns`).

The reference (Python) maker of `format: debezium` (issue 48): one change is one message,
but a primary-key update is three (a delete of the old key, its tombstone, a create) and
a delete is followed by its tombstone (`tombstones.on.delete`). A REPLICA IDENTITY
DEFAULT delete's `before` holds every column (null but the key's), an unchanged TOAST
value is `unavailable.value.placeholder`. Checked against Debezium 3.6 itself
(tests/integration/test_debezium_messages.py); docs/from-debezium.md lists what differs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from walstream.change import ChangeRow
from walstream.formats.debezium_types import Column, PgColumn, Settings, fields, object_spans

#: Debezium's `op` of each action.
OP = {"insert": "c", "update": "u", "delete": "d", "read": "r", "truncate": "t"}
#: Debezium's default `unavailable.value.placeholder`.
PLACEHOLDER = "__debezium_unavailable_value"

_SOURCE_SCHEMA = {
    "type": "struct",
    "fields": [
        *fields("string version, string connector, string name, int64 ts_ms"),
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {
                "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,"
                "false,incremental"
            },
            "default": "false",
            "field": "snapshot",
        },
        *fields(
            "string db, string sequence?, int64 ts_us?, int64 ts_ns?, string schema, "
            "string table, int64 txId?, int64 lsn?, int64 xmin?, string origin?, "
            "int64 origin_lsn?"
        ),
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "version": 1,
    "field": "source",
}
_TRANSACTION_SCHEMA = {
    "type": "struct",
    "fields": fields("string id, int64 total_order, int64 data_collection_order"),
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


@dataclass(frozen=True)
class Message:
    """One Kafka record: key and value JSON (None: a tombstone's value)."""

    key: str
    value: str | None


class TableMessages:
    """The key and value makers of one table's changes."""

    def __init__(
        self,
        prefix: str,
        db: str,
        schema: str,
        table: str,
        columns: Sequence[PgColumn],
        key: Sequence[str],
        settings: Settings | None = None,
        schemas: bool = True,
        tombstones: bool = True,
        placeholder: str = PLACEHOLDER,
    ) -> None:
        self.prefix, self.db, self.schema, self.table = prefix, db, schema, table
        made = [(c.name, Column(c, settings or Settings())) for c in columns]
        #: The columns Debezium sends (not those it leaves out), by name.
        self.sent = [(n, c) for n, c in made if c.schema() is not None]
        self.key_names = list(key)
        self.schemas, self.tombstones, self.placeholder = schemas, tombstones, placeholder
        base = f"{prefix}.{schema}.{table}"
        columns_schema = [c.schema() for _, c in self.sent]
        self.key_schema = {
            "type": "struct",
            "fields": [c.schema() for n, c in self.sent if n in self.key_names],
            "optional": False,
            "name": f"{base}.Key",
        }
        row = {
            "type": "struct",
            "fields": columns_schema,
            "optional": True,
            "name": f"{base}.Value",
        }
        self.value_schema = {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                _SOURCE_SCHEMA,
                _TRANSACTION_SCHEMA,
                *fields("string op, int64 ts_ms?, int64 ts_us?, int64 ts_ns?"),
            ],
            "optional": False,
            "name": f"{base}.Envelope",
            "version": 2,
        }

    # -- rows ----------------------------------------------------------------------------
    def row(
        self, text: str | None, json_nulls: Sequence[str] = (), unchanged: Sequence[str] = ()
    ) -> dict[str, Any] | None:
        """A record's JSON (`record` or `old`) as Debezium's row: every column it sends,
        those the record lacks null (a DEFAULT identity's old row holds only the key),
        unchanged TOAST values as the placeholder."""
        if text is None:
            return None
        values, raw = json.loads(text), object_spans(text)
        out: dict[str, Any] = {}
        for name, col in self.sent:
            if name in unchanged:
                out[name] = self._unavailable(col)
            elif name in values:
                out[name] = col.value(values[name], raw[name], name in json_nulls)
            else:
                out[name] = None
        return out

    def _unavailable(self, col: Column) -> Any:
        """The placeholder as Debezium sends it in a column of this type: the text, its
        bytes in base64, and in an array of integers its bytes as numbers."""
        schema = col.schema()
        assert schema is not None
        raw = self.placeholder.encode()
        if schema["type"] == "array":
            if schema["items"]["type"] in ("int16", "int32", "int64"):
                return list(raw)
            return [self.placeholder]
        if schema["type"] == "bytes":
            return base64.b64encode(raw).decode()
        return self.placeholder if schema["type"] == "string" else None

    def key_of(self, row: dict[str, Any]) -> dict[str, Any]:
        return {n: row.get(n) for n, _ in self.sent if n in self.key_names}

    # -- messages ------------------------------------------------------------------------
    def messages(self, c: ChangeRow, now_us: int) -> list[Message]:
        """The Kafka records of one change (`now_us`: the envelope's processing time)."""
        if c.action == "truncate":
            return [self._message(None, None, c, "t", now_us, {})]
        after = self.row(c.record, c.json_nulls or (), c.unchanged_toast or ())
        if c.action in ("insert", "read"):
            assert after is not None
            return [self._message(None, after, c, OP[c.action], now_us, self.key_of(after))]
        if c.action == "delete":
            before = self.row(c.old or c.record)
            assert before is not None
            key = self.key_of(before)
            out = [self._message(before, None, c, "d", now_us, key)]
            return out + ([self._tombstone(key)] if self.tombstones else [])
        before = self.row(c.old)
        assert after is not None
        key = self.key_of(after)
        if before is not None and self.key_of(before) != key:  # the key moved
            old_key = self.key_of(before)
            out = [self._message(before, None, c, "d", now_us, old_key)]
            out += [self._tombstone(old_key)] if self.tombstones else []
            return [*out, self._message(None, after, c, "c", now_us, key)]
        return [self._message(before, after, c, "u", now_us, key)]

    def _message(
        self,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        c: ChangeRow,
        op: str,
        now_us: int,
        key: dict[str, Any],
    ) -> Message:
        payload = {
            "before": before,
            "after": after,
            "source": self.source(c),
            "transaction": None,
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
        }
        return Message(self._wrap(self.key_schema, key), self._wrap(self.value_schema, payload))

    def _tombstone(self, key: dict[str, Any]) -> Message:
        return Message(self._wrap(self.key_schema, key), None)

    def _wrap(self, schema: dict[str, Any], payload: Any) -> str:
        body = {"schema": schema, "payload": payload} if self.schemas else payload
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))

    def source(self, c: ChangeRow) -> dict[str, Any]:
        """Debezium's `source` block. `lsn` is the commit's (Debezium's is each change's own
        LSN, which the change row does not carry yet) and `sequence` is null."""
        us = c.committed_at_us
        return {
            "version": "walstream",
            "connector": "postgresql",
            "name": self.prefix,
            "ts_ms": us // 1000,
            "snapshot": "incremental" if c.backfill is not None else "false",
            "db": self.db,
            "sequence": None,
            "ts_us": us,
            "ts_ns": us * 1000,
            "schema": c.schema,
            "table": c.table,
            "txId": c.xid,
            "lsn": c.lsn,
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }
