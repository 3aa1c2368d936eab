"""Debezium's messages of one change: key and value as Debezium's PostgreSQL connector and
Kafka Connect's JsonConverter make them (`{"schema", "payload"}` with schemas on, the
payload alone with them off), from a change row and its table's columns
(`debezium_types.load_columns`).

The records of `format: debezium` (`debezium.py`): one change is one record, but a
primary-key update is three (a delete of the old key, its tombstone, a create) and a
delete is followed by its tombstone (`tombstones.on.delete`; a null key's too). A
REPLICA IDENTITY DEFAULT delete's `before` holds every column (null but the key's), an
unchanged TOAST value is `unavailable.value.placeholder`. Checked against Debezium 3.6
itself (tests/integration/test_debezium_messages.py, test_debezium_run.py);
docs/from-debezium.md lists what differs.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

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
    """One Kafka record: its key and value as the converter made them (None: no key, as
    of a table with no primary key or a truncate; a tombstone's value)."""

    key: bytes | None
    value: bytes | None


class JsonConverter:
    """Kafka Connect's JsonConverter: `{"schema", "payload"}` when `schemas_enable` (its
    `schemas.enable`, on by default), else the payload alone; compact JSON, UTF-8.

    The converter seam: a record is made as (schema, payload) and encoded here, so a
    converter with another wire format (Avro with a schema registry's id, not available
    here: docs/from-debezium.md) is a class with this `encode`."""

    def __init__(self, schemas_enable: bool = True) -> None:
        self.schemas_enable = schemas_enable
        #: Each schema's JSON, made once (a table's schemas are the same dict every time).
        self._schemas: dict[int, tuple[dict[str, Any], bytes]] = {}

    def encode(self, schema: dict[str, Any], payload: Any) -> bytes:
        """Compact UTF-8 JSON, as Kafka Connect writes it (orjson: a change's records are
        made one by one, and the standard library's encoder is several times slower)."""
        text = orjson.dumps(payload)
        if not self.schemas_enable:
            return text
        made = self._schemas.get(id(schema))
        if made is None or made[0] is not schema:
            made = (schema, orjson.dumps(schema))
            self._schemas[id(schema)] = made
        return b'{"schema":' + made[1] + b',"payload":' + text + b"}"


class Converter(Protocol):
    def encode(self, schema: dict[str, Any], payload: Any) -> bytes: ...


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
        key_converter: Converter | None = None,
        value_converter: Converter | None = None,
        tombstones: bool = True,
        placeholder: str = PLACEHOLDER,
    ) -> None:
        self.prefix, self.db, self.schema, self.table = prefix, db, schema, table
        made = [(c.name, Column(c, settings or Settings())) for c in columns]
        #: The columns Debezium sends (not those it leaves out), by name.
        self.sent = [(n, c) for n, c in made if c.schema() is not None]
        #: Each sent column with whether its value is the record's as it is.
        self._makers = [(n, c, c.as_is) for n, c in self.sent]
        #: A column's value needs its JSON text in the record (json, jsonb).
        self._texts = any(c.needs_text for _, c in self.sent)
        self.key_names = list(key)
        self._sent_names = {n for n, _ in self.sent}
        self.keys = key_converter or JsonConverter()
        self.values = value_converter or JsonConverter()
        self.tombstones, self.placeholder = tombstones, placeholder
        base = f"{prefix}.{schema}.{table}"
        sent = dict(self.sent)
        columns_schema = [c.schema() for _, c in self.sent]
        self.key_schema = {
            "type": "struct",
            "fields": [sent[n].schema() for n in self.key_names if n in sent],
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
        values = orjson.loads(text)
        raw = object_spans(text) if self._texts else {}
        out: dict[str, Any] = {}
        for name, col, as_is in self._makers:
            if unchanged and name in unchanged:
                out[name] = self._unavailable(col)
            elif name not in values:
                out[name] = None
            elif as_is:
                out[name] = values[name]
            else:
                out[name] = col.value(values[name], raw.get(name), name in json_nulls)
        return out

    def placeholders(self) -> dict[str, Any]:
        """Per column sent, its value in a row whose unchanged TOAST value was left out."""
        return {n: self._unavailable(c) for n, c in self.sent}

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

    def key_of(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The record key's payload: the primary key's columns in the key's order; None
        for a table with no primary key (Debezium's key is then null)."""
        if not self.key_names:
            return None
        return {n: row.get(n) for n in self.key_names if n in self._sent_names}

    # -- messages ------------------------------------------------------------------------
    def messages(self, c: ChangeRow, now_us: int) -> list[Message]:
        """The Kafka records of one change (`now_us`: the envelope's processing time)."""
        if c.action == "truncate":
            return [self._message(None, None, c, "t", now_us, None)]
        after = self.row(c.record, c.json_nulls or (), c.unchanged_toast or ())
        if c.action in ("insert", "read"):
            assert after is not None
            return [self._message(None, after, c, OP[c.action], now_us, self.key_of(after))]
        if c.action == "delete":
            before = self.row(c.old or c.record)
            assert before is not None
            key = self.key_of(before)
            out = [self._message(before, None, c, "d", now_us, key)]
            return out + self._tombstones(key)
        before = self.row(c.old)
        assert after is not None
        key = self.key_of(after)
        if before is not None and self.key_of(before) != key:  # the key moved
            old_key = self.key_of(before)
            out = [self._message(before, None, c, "d", now_us, old_key)]
            out += self._tombstones(old_key)
            return [*out, self._message(None, after, c, "c", now_us, key)]
        return [self._message(before, after, c, "u", now_us, key)]

    def _message(
        self,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        c: ChangeRow,
        op: str,
        now_us: int,
        key: dict[str, Any] | None,
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
        return Message(self._key(key), self.values.encode(self.value_schema, payload))

    def _tombstones(self, key: dict[str, Any] | None) -> list[Message]:
        """The tombstone after a delete (none when they are off); a table without a primary
        key gets one too, its key null, as Debezium sends it."""
        return [Message(self._key(key), None)] if self.tombstones else []

    def _key(self, key: dict[str, Any] | None) -> bytes | None:
        return None if key is None else self.keys.encode(self.key_schema, key)

    def source(self, c: ChangeRow) -> dict[str, Any]:
        """Debezium's `source` block: `lsn` the change's own and `sequence` `["<the end of
        the commit before>", "<lsn>"]` (a JSON text); both null on a backfill's rows, whose
        `lsn` Debezium's incremental snapshot leaves null too."""
        us = c.committed_at_us
        return {
            "version": "walstream",
            "connector": "postgresql",
            "name": self.prefix,
            "ts_ms": us // 1000,
            "snapshot": "incremental" if c.backfill is not None else "false",
            "db": self.db,
            "sequence": None if c.change_lsn is None else _sequence(c),
            "ts_us": us,
            "ts_ns": us * 1000,
            "schema": c.schema,
            "table": c.table,
            "txId": c.xid,
            "lsn": c.change_lsn,
            "xmin": None,
            "origin": None,
            "origin_lsn": None,
        }


def _sequence(c: ChangeRow) -> str:
    """`["<last commit>","<lsn>"]` as Debezium writes it (JSON text, null when unknown)."""
    last = "null" if c.last_commit_lsn is None else f'"{c.last_commit_lsn}"'
    return f'[{last},"{c.change_lsn}"]'
