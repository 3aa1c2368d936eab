"""`format: debezium`'s settings (Debezium's property names and defaults), topic names, the
records of one change (keys, parts, tombstones, a table gone from the catalog) and the
sink rules that go with them. Values and whole messages are proven against Debezium itself
in tests/integration/test_debezium_*.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from walstream.change import ChangeRow, idempotency_key
from walstream.config import parse_config
from walstream.errors import ConfigError, WalstreamError
from walstream.formats.debezium import DebeziumSettings, Records, UnknownTable, topic
from walstream.formats.debezium_types import PgColumn

COLUMNS = [PgColumn("region", "text", not_null=True), PgColumn("id", "int4", not_null=True),
           PgColumn("v", "text")]  # fmt: skip


def change(action: str, record: str | None, old: str | None = None, **kw: Any) -> ChangeRow:
    base: dict[str, Any] = dict(
        source="app", lsn=100, seq=2, xid=7, committed_at_us=1_700_000_000_000_000,
        action=action, schema="public", table="acct", pk=["eu", "1"], record=record,
        old=old, annotations=None, unchanged_toast=None, table_oid=42,
    )  # fmt: skip
    base.update(kw)
    return ChangeRow(**base)


def records(settings: DebeziumSettings, key: list[str] | None = None) -> tuple[Records, list[int]]:
    asked: list[int] = []

    def catalog(oid: int) -> tuple[list[PgColumn], list[str]]:
        asked.append(oid)
        return (COLUMNS, ["region", "id"] if key is None else key) if oid == 42 else ([], [])

    return Records(settings, "appdb", catalog), asked


def test_defaults_are_debeziums() -> None:
    s = DebeziumSettings.of({})
    assert (s.tombstones, s.placeholder, s.skipped) == (
        True, "__debezium_unavailable_value", frozenset({"truncate"}),
    )  # fmt: skip
    assert (s.key_schemas, s.value_schemas, s.prefix) == (True, True, None)
    assert s.values.decimal_handling_mode == "precise"


def test_settings_by_debeziums_names_as_text_or_yaml_values() -> None:
    s = DebeziumSettings.of({
        "tombstones.on.delete": "false", "key.converter.schemas.enable": False,
        "skipped.operations": "none", "topic.prefix": "dbserver1",
        "decimal.handling.mode": "string", "unavailable.value.placeholder": "?",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    })  # fmt: skip
    assert (s.tombstones, s.key_schemas, s.value_schemas) == (False, False, True)
    assert (s.skipped, s.prefix, s.placeholder) == (frozenset(), "dbserver1", "?")
    assert s.values.decimal_handling_mode == "string"
    assert DebeziumSettings.of({"skipped.operations": "c, t"}).skipped == {"insert", "truncate"}


@pytest.mark.parametrize(
    ("props", "problem", "fix"),
    [
        ({"database.hostname": "h"}, "database.hostname is not a message setting",
         "walstream import debezium"),
        ({"value.converter": "io.confluent.connect.avro.AvroConverter"},
         "value.converter is 'io.confluent.connect.avro.AvroConverter'", "schema registry"),
        ({"skipped.operations": "c,x"}, "skipped.operations has 'x'", "c, u, d, t"),
        ({"tombstones.on.delete": "yes"}, "tombstones.on.delete is 'yes'", "true or false"),
        ({"time.precision.mode": "nanos"}, "time.precision.mode is 'nanos'", "adaptive"),
        ({"topic.prefix": " "}, "topic.prefix is empty", "prefix"),
    ],
)  # fmt: skip
def test_a_bad_setting_names_itself_and_the_fix(props: Any, problem: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        DebeziumSettings.of(props)
    assert problem in info.value.problem and fix in (info.value.fix or "")


def test_topics_are_debeziums_with_unsafe_characters_replaced() -> None:
    assert topic("dbserver1", "public", "orders") == "dbserver1.public.orders"
    assert topic("p", "sales dept", "ordérs$1") == "p.sales_dept.ord_rs_1"


def test_a_primary_key_update_is_a_delete_a_tombstone_and_a_create() -> None:
    make, asked = records(DebeziumSettings.of({"topic.prefix": "p"}))
    moved = change("update", '{"region":"us","id":1,"v":"b"}', '{"region":"eu","id":1,"v":"a"}')
    out = make(moved)
    assert [t for t, _ in out] == ["p.public.acct"] * 3
    keys = [json.loads(r.key)["payload"] for _, r in out if r.key is not None]
    assert keys == [{"region": "eu", "id": 1}] * 2 + [{"region": "us", "id": 1}]
    ops = [None if r.value is None else json.loads(r.value)["payload"]["op"] for _, r in out]
    assert ops == ["d", None, "c"]
    make(change("insert", '{"region":"eu","id":2,"v":null}'))
    assert asked == [42]  # the table's columns are read once per task


def test_truncates_are_skipped_by_default_and_have_no_key() -> None:
    make, _ = records(DebeziumSettings.of({}))
    assert make(change("truncate", None, pk=[])) == []
    make, _ = records(DebeziumSettings.of({"skipped.operations": "none"}))
    ((name, record),) = make(change("truncate", None, pk=[]))
    assert name == "app.public.acct"  # no topic.prefix: the source's name
    assert record.key is None and json.loads(record.value or b"")["payload"]["op"] == "t"


def test_a_table_with_no_primary_key_has_a_null_key_and_schemas_can_be_off() -> None:
    make, _ = records(DebeziumSettings.of({"value.converter.schemas.enable": "false"}), key=[])
    ((_, created),) = make(change("insert", '{"region":"eu","id":1,"v":"x"}'))
    assert created.key is None
    value = json.loads(created.value or b"")
    assert "schema" not in value and value["after"] == {"region": "eu", "id": 1, "v": "x"}
    deleted = make(change("delete", None, '{"region":"eu","id":1,"v":"x"}'))
    assert [(r.key, r.value is None) for _, r in deleted] == [(None, False), (None, True)]


def test_a_backfill_row_is_an_incremental_snapshot_read() -> None:
    make, _ = records(DebeziumSettings.of({"key.converter.schemas.enable": "false"}))
    ((_, read),) = make(change("read", '{"region":"eu","id":1,"v":"x"}', xid=None, backfill=3))
    assert json.loads(read.key or b"") == {"region": "eu", "id": 1}
    payload = json.loads(read.value or b"")["payload"]
    assert payload["op"] == "r" and payload["before"] is None
    assert payload["source"]["snapshot"] == "incremental"


def test_a_table_gone_from_the_catalog_is_named() -> None:
    make, _ = records(DebeziumSettings.of({}))
    with pytest.raises(UnknownTable, match=r"public\.acct \(OID 9\) is no longer"):
        make(change("insert", '{"id":1}', table_oid=9))


def test_a_changes_further_records_have_their_own_idempotency_keys() -> None:
    assert base64.b64decode(idempotency_key(100, 2)) == b"100:2"
    assert base64.b64decode(idempotency_key(100, 2, 2)) == b"100:2:2"


def sink_config(**settings: Any) -> Any:
    dest = settings.pop("destination", {"type": "kafka", "bootstrap_servers": "k:9092"})
    return parse_config({
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "sinks": [{"name": "s", "source": "app", "destination": dest, **settings}],
    }).sinks[0]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"format": "sequin"}, "destination.topic: name the topic"),
        ({"format": "sequin", "debezium": {"topic.prefix": "p"}},
         "debezium: these settings are format: debezium's"),
        ({"format": "debezium", "tombstones": True}, "tombstones.on.delete: false"),
        ({"format": "debezium", "transform": "m:f"}, "a transform makes a message of its own"),
        ({"format": "debezium", "debezium": {"slot.name": "s"}}, "slot.name is not a message"),
        ({"format": "debezium",
          "destination": {"type": "stream", "stream": "s", "token": "t" * 32}},
         "a pull stream keeps one message per change"),
    ],
)  # fmt: skip
def test_sink_rules_of_the_debezium_format(settings: Any, message: str) -> None:
    with pytest.raises(WalstreamError) as info:
        sink_config(**settings)
    assert message in str(info.value)


def test_a_debezium_sink_takes_debeziums_topics_and_keys() -> None:
    s = sink_config(format="debezium", debezium={"topic.prefix": "dbserver1"})
    assert s.destination.format_routes() and s.debezium_settings().prefix == "dbserver1"
    assert s.taken_actions() == ["insert", "update", "delete", "read"]
    named = sink_config(format="debezium", destination={
        "type": "kafka", "bootstrap_servers": "k:9092", "topic": "all-changes"})  # fmt: skip
    assert not named.destination.format_routes()  # the sink's topic wins
