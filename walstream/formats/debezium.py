"""The `debezium` format: the Kafka records Debezium's PostgreSQL connector sends, under the
Debezium properties a sink names in its `debezium:` block (Debezium's names and defaults).

Unlike the other formats, a change can be several records (a delete and its tombstone; a
primary-key update is a delete, a tombstone and a create, each under its own key), each
with Debezium's key, and every value depends on its column's Postgres type: a delivery
task reads each table's columns from the source's catalog once (`Records`, given the
reader), as the table is when the batch is delivered. So the format is made in Python only, by the delivery
task (no Spark SQL or Arrow rendering). The values are `debezium_types.py`'s, the
records `debezium_message.py`'s; docs/from-debezium.md lists what differs from Debezium.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from walstream.change import ChangeRow
from walstream.errors import ConfigError
from walstream.formats.debezium_message import (
    PLACEHOLDER,
    JsonConverter,
    Message,
    TableMessages,
)
from walstream.formats.debezium_types import PgColumn, Settings

#: Kafka Connect's JSON converter, the one converter walstream writes.
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

#: The properties a sink's `debezium:` block takes (Debezium's names), with what they do.
PROPERTIES: dict[str, str] = {
    "decimal.handling.mode": "precise | double | string (numeric and money)",
    "time.precision.mode": "adaptive | adaptive_time_microseconds | connect | isostring",
    "binary.handling.mode": "bytes | base64 | base64-url-safe | hex",
    "interval.handling.mode": "numeric | string",
    "hstore.handling.mode": "json | map",
    "money.fraction.digits": "digits of a money value (default 2)",
    "tombstones.on.delete": "a null-value record after each delete (default true)",
    "unavailable.value.placeholder": "an unchanged TOAST value (default "
    "__debezium_unavailable_value)",
    "skipped.operations": "operations not sent: c, u, d, t or none (default t)",
    "topic.prefix": "topics <prefix>.<schema>.<table> (default: the source's name)",
    "key.converter": JSON_CONVERTER,
    "value.converter": JSON_CONVERTER,
    "key.converter.schemas.enable": "the key as {schema, payload} (default true)",
    "value.converter.schemas.enable": "the value as {schema, payload} (default true)",
}
#: Debezium's operation letters, as `skipped.operations` names them.
SKIPPABLE = {"c": "insert", "u": "update", "d": "delete", "t": "truncate"}
#: Characters a Kafka topic may hold; Debezium replaces any other with `_`.
_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]")


@dataclass(frozen=True)
class DebeziumSettings:
    """A sink's `debezium:` block, read (defaults are Debezium's)."""

    values: Settings = field(default_factory=Settings)
    tombstones: bool = True
    placeholder: str = PLACEHOLDER
    #: The actions not sent (`skipped.operations`).
    skipped: frozenset[str] = frozenset({"truncate"})
    prefix: str | None = None  # None: the change's source name
    key_schemas: bool = True
    value_schemas: bool = True

    def messages(
        self,
        prefix: str,
        db: str,
        schema: str,
        table: str,
        columns: list[PgColumn],
        key: list[str],
        keys: JsonConverter | None = None,
        values: JsonConverter | None = None,
    ) -> TableMessages:
        """The record maker of one table under these settings."""
        return TableMessages(
            prefix,
            db,
            schema,
            table,
            columns,
            key,
            self.values,
            key_converter=keys or JsonConverter(self.key_schemas),
            value_converter=values or JsonConverter(self.value_schemas),
            tombstones=self.tombstones,
            placeholder=self.placeholder,
        )

    @classmethod
    def of(cls, props: Mapping[str, Any] | None) -> DebeziumSettings:
        """From Debezium's property names; an unknown property or value is a ConfigError
        naming it and what it takes."""
        props = dict(props or {})
        unknown = sorted(set(props) - set(PROPERTIES))
        if unknown:
            raise ConfigError(
                f"debezium: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a "
                "message setting walstream takes",
                f"use {', '.join(PROPERTIES)}; the connection, slot, publication and tables "
                "are the source's settings (walstream import debezium converts a connector's "
                "config: docs/from-debezium.md)",
            )
        for prop in ("key.converter", "value.converter"):
            if prop in props and props[prop] != JSON_CONVERTER:
                raise ConfigError(
                    f"debezium: {prop} is {props[prop]!r}",
                    f"use {JSON_CONVERTER}: Avro and other converters need a schema registry "
                    "walstream does not write to yet (docs/from-debezium.md)",
                )
        skipped = str(props.get("skipped.operations", "t")).replace(" ", "")
        letters = [] if skipped == "none" else [s for s in skipped.split(",") if s]
        bad = [s for s in letters if s not in SKIPPABLE]
        if bad:
            raise ConfigError(
                f"debezium: skipped.operations has {', '.join(map(repr, bad))}",
                "list c, u, d, t separated by commas, or none",
            )
        prefix = props.get("topic.prefix")
        if prefix is not None and not str(prefix).strip():
            raise ConfigError("debezium: topic.prefix is empty", "name the topics' prefix")
        return cls(
            values=Settings.of(props),
            tombstones=_flag(props, "tombstones.on.delete", True),
            placeholder=str(props.get("unavailable.value.placeholder", PLACEHOLDER)),
            skipped=frozenset(SKIPPABLE[s] for s in letters),
            prefix=None if prefix is None else str(prefix),
            key_schemas=_flag(props, "key.converter.schemas.enable", True),
            value_schemas=_flag(props, "value.converter.schemas.enable", True),
        )


def _flag(props: Mapping[str, Any], name: str, default: bool) -> bool:
    value = props.get(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"debezium: {name} is {value!r}", "write true or false")
    return text == "true"


def topic(prefix: str, schema: str, table: str) -> str:
    """Debezium's topic of a table: `<prefix>.<schema>.<table>`, any character a topic
    cannot hold as `_`."""
    return _TOPIC_UNSAFE.sub("_", f"{prefix}.{schema}.{table}")


class UnknownTable(Exception):
    """The change's table is no longer in the source's catalog: its column types, which
    Debezium's values need, are gone."""


class Records:
    """Debezium's records of one delivery task's changes: `records(change)` is a list of
    (topic, record), none for a skipped operation. Each table's columns and primary key
    are read from the source's catalog at its first change in the task."""

    def __init__(
        self,
        settings: DebeziumSettings,
        db: str,
        catalog: Callable[[int], tuple[list[PgColumn], list[str]]],
    ) -> None:
        """`catalog(table_oid)`: the table's columns and primary key, as `load_columns`
        and `load_key` read them from the source (none: the table is gone)."""
        self.settings, self.db, self.catalog = settings, db, catalog
        self._tables: dict[tuple[int, str, str, str], tuple[TableMessages, str]] = {}
        self._keys = JsonConverter(settings.key_schemas)
        self._values = JsonConverter(settings.value_schemas)

    def __call__(self, c: ChangeRow) -> list[tuple[str, Message]]:
        if c.action in self.settings.skipped:
            return []
        prefix = self.settings.prefix or c.source
        table, name = self._table(c, prefix)
        return [(name, m) for m in table.messages(c, time.time_ns() // 1000)]

    def _table(self, c: ChangeRow, prefix: str) -> tuple[TableMessages, str]:
        """The table's record maker and its topic."""
        oid = c.table_oid
        if oid is None:
            raise UnknownTable(f"{c.schema}.{c.table}: the change has no table OID")
        at = (oid, c.schema, c.table, prefix)  # a renamed table keeps its OID
        found = self._tables.get(at)
        if found is None:
            columns, key = self.catalog(oid)
            if not columns:
                raise UnknownTable(
                    f"{c.schema}.{c.table} (OID {oid}) is no longer in the source's catalog: "
                    "Debezium's values need its column types"
                )
            maker = self.settings.messages(
                prefix, self.db, c.schema, c.table, columns, key, self._keys, self._values
            )
            found = self._tables[at] = (maker, topic(prefix, c.schema, c.table))
        return found
