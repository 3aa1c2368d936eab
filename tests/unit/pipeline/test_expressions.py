"""The Spark SQL a sink's settings become (text only: Spark analyzes it in the pipeline)."""

from __future__ import annotations

from typing import Any

from walstream.change import CHANGE_COLUMNS
from walstream.config import parse_config
from walstream.engine.sql import quote, selection_expr
from walstream.pipeline.expressions import delivery_columns, expressions, group_expr, projection


def sink(**settings: Any) -> Any:
    dest = settings.pop("destination", {"type": "kafka", "bootstrap_servers": "k:9092",
                                        "topic": "orders"})  # fmt: skip
    data = {
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "sinks": [{"name": "s", "source": "app", "destination": dest, **settings}],
    }
    events = settings.pop("events", None)
    if events:
        data["events"] = events
    return parse_config(data).sinks[0]


def test_quote_escapes_backslashes_and_quotes() -> None:
    assert quote("it's a \\ path") == "'it\\'s a \\\\ path'"


def test_group_keys() -> None:
    assert group_expr(None) == "concat_ws('\u001f', `schema`, `table`, concat_ws(',', pk))"
    assert group_expr(["table", "record.customer_id", "lower(action)"]) == (
        "concat_ws('\u001f', CAST(`table` AS STRING), "
        "get_json_object(`record`, '$.customer_id'), CAST((lower(action)) AS STRING))"
    )


def test_selection_of_actions_tables_and_filter() -> None:
    s = sink(actions=["insert", "update"], tables=["public.ord*"], filter="pk[0] > '5'")
    assert selection_expr(s) == (
        "action IN ('insert', 'update') AND (concat(`schema`, '.', `table`) RLIKE "
        "'(?s:public\\\\.ord.*)\\\\Z') AND (pk[0] > '5')"
    )


def test_a_sink_without_tables_leaves_the_event_outbox_out() -> None:
    data = {
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "events": {"source": "app"},
        "sinks": [
            {"name": "all", "source": "app", "destination": {"type": "file", "path": "/tmp/o"}},
            {"name": "ev", "source": "app", "event_types": ["order.paid"],
             "destination": {"type": "file", "path": "/tmp/e"}},
        ],
    }  # fmt: skip
    everything, events = parse_config(data).sinks
    assert selection_expr(everything).endswith(
        "NOT (`schema` = 'walstream' AND `table` = 'events')"
    )
    assert selection_expr(events) == (
        "action IN ('insert') AND (concat(`schema`, '.', `table`) RLIKE "
        "'(?s:walstream\\\\.events)\\\\Z') AND get_json_object(record, '$.event_type') IN "
        "('order.paid')"
    )


def test_projection_of_a_routed_kafka_sink_in_sql_format() -> None:
    s = sink(destination={"type": "kafka", "bootstrap_servers": "k:9092",
                          "topic": "concat('cdc.', `table`)", "key": "record.id"})  # fmt: skip
    p = projection(s, skip_before=42)
    assert p.where.startswith("lsn >= 42 AND action IN (")
    assert p.columns[1:3] == [
        "CAST((record.id) AS STRING) AS _key",
        "CAST((concat('cdc.', `table`)) AS STRING) AS _route",
    ]
    # a batch of changes: the delivery worker makes the message (each format's `arrow`), SQL the key
    assert not p.sql_message and p.worker_format == "sequin"
    assert p.columns[-1].endswith(" AS _ikey") and "_message" not in p.names
    assert "`pk`" not in p.keep and "`record`" in p.keep
    # a batch with backfill rows: SQL makes it
    b = projection(s, skip_before=42, backfill=True)
    assert b.sql_message and b.worker_format is None and b.names[-2:] == ["_message", "_ikey"]


def test_a_python_transform_needs_the_row_and_no_sql_message() -> None:
    s = sink(transform="myapp.cdc:shape")
    p = projection(s)
    assert not p.sql_message and not any("_message" in c for c in p.columns)
    # every column it reads travels on; json_nulls as an empty array where NULL
    kept = [c.strip("`") for c in p.keep]
    assert delivery_columns(s) == [c for c in CHANGE_COLUMNS if c in {*kept, "json_nulls"}]
    assert p.names[-1] == "json_nulls" and "coalesce(`json_nulls`" in p.columns[-1]


def test_debezium_reads_the_columns_its_records_need_and_skips_truncates_by_default() -> None:
    s = sink(format="debezium")
    p = projection(s)
    assert not p.sql_message and p.worker_format is None  # made by the task, as records
    assert {"table_oid", "json_nulls", "unchanged_toast", "old", "record", "xid"} <= set(p.names)
    assert "action IN ('insert', 'update', 'delete', 'read')" in p.where  # skipped.operations: t
    every = sink(format="debezium", debezium={"skipped.operations": "none"})
    assert "'truncate'" in projection(every).where
    none = sink(format="debezium", debezium={"skipped.operations": "c,u,d,t"}, actions=["insert"])
    assert projection(none).where.startswith("FALSE")


def test_the_expressions_a_user_wrote_are_the_ones_validated() -> None:
    s = sink(filter="action = 'insert'", transform={"id": "record.id"}, group_by=["pk"])
    assert expressions(s) == ["action = 'insert'", "record.id", "pk"]
    routed = sink(destination={"type": "webhook", "url": "concat('https://h/', `table`)"})
    assert expressions(routed) == ["concat('https://h/', `table`)"]
