"""Sinks' columns made once on the streaming DataFrame (pipeline/streamed.py) give every batch
exactly the rows and columns the per-batch projection (SinkSteps.prepare) gives."""

from __future__ import annotations

from typing import Any

import pytest

from tests.changes import TS_MS, row
from tests.integration.test_formats_sql import frame
from walstream.change import CHANGE_COLUMNS
from walstream.config import parse_config
from walstream.pipeline.steps import SinkSteps
from walstream.pipeline.streamed import StreamedSinks

KAFKA = {"type": "kafka", "bootstrap_servers": "k:9092", "topic": "concat('t.', `table`)"}

ROWS = [
    row("insert", '{"id":1,"n":"a"}', lsn=10, seq=0),
    row("update", '{"id":1,"n":"b"}', '{"id":1,"n":"a"}', lsn=20, seq=0),  # sequin: in Python
    row("update", '{"id":2,"n":"b"}', None, lsn=20, seq=1, table="items", pk=["2"]),
    row("delete", None, '{"id":1}', lsn=30, seq=0),
    row("insert", '{"id":3}', lsn=30, seq=1, table="items", pk=["3"], annotations='{"u":1}'),
    row("watermark", None, lsn=35, seq=0, table="walstream_watermarks", pk=[]),
    row("truncate", None, lsn=40, seq=0, pk=[]),
]

SINKS: list[dict[str, Any]] = [
    {"name": "plain", "destination": KAFKA},
    {"name": "picky", "destination": KAFKA, "tables": ["public.items"],
     "actions": ["insert", "update"], "filter": "get_json_object(record, '$.id') > 1"},
    {"name": "shaped", "destination": KAFKA, "transform": {"id": "get_json_object(record, '$.id')",
     "op": "action"}, "group_by": ["table"]},
    {"name": "debezium", "destination": KAFKA, "format": "debezium"},
    {"name": "python", "destination": KAFKA, "transform": "tests.integration.transforms:shape"},
]  # fmt: skip


def sinks(names: list[str]) -> list[Any]:
    chosen = [dict(s, source="app") for s in SINKS if s["name"] in names]
    return parse_config(
        {"sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}], "sinks": chosen}
    ).sinks


def collected(df: Any) -> list[tuple[Any, ...]]:
    """The rows, sorted; a debezium envelope's ts_ms (the time it was made) left out."""
    rows = [tuple(TS_MS.sub("}", v) if isinstance(v, str) else v for v in r) for r in df.collect()]
    return sorted(rows, key=repr)


@pytest.mark.parametrize("skip", [None, 30], ids=["all", "skip_before"])
def test_streamed_columns_equal_the_per_batch_projection(spark: Any, skip: int | None) -> None:
    configs = sinks([s["name"] for s in SINKS])
    batch = frame(spark, ROWS).drop("backfill")
    streamed = StreamedSinks(spark, configs, "appdb")
    added = streamed.add(batch)
    for sink in configs:
        expected = SinkSteps(spark, sink, skip, db="appdb").prepare(batch)
        got = streamed.prepare(added, sink.name, skip)
        assert got.columns == expected.columns, sink.name
        assert collected(got) == collected(expected), sink.name
    assert streamed.raw(added).columns == list(CHANGE_COLUMNS)
    assert collected(streamed.raw(added)) == collected(batch.select(*CHANGE_COLUMNS))


def test_a_sink_selects_only_its_rows_and_its_worker_gets_the_row(spark: Any) -> None:
    """What the equality above rests on, spelled out: the selection, and the row's JSON
    sent on to the delivery worker, which makes a batch of changes' messages
    (each format's `arrow` rendering); with backfill rows in the batch, SQL makes them and the row's JSON
    goes on only where SQL made no message (the sequin update with an old row)."""
    configs = sinks(["plain", "picky"])
    streamed = StreamedSinks(spark, configs, "appdb")
    added = streamed.add(frame(spark, ROWS).drop("backfill"))
    picky = streamed.prepare(added, "picky", None).collect()
    assert [(r.table, r.action, r.lsn) for r in picky] == [("items", "update", 20), ("items",
            "insert", 30)]  # fmt: skip
    prepared = streamed.prepare(added, "plain", None)
    assert "_message" not in prepared.columns and "_ikey" in prepared.columns
    plain = {(r.lsn, r.seq): r for r in prepared.collect()}
    assert sorted(plain) == [(10, 0), (20, 0), (20, 1), (30, 0), (30, 1), (40, 0)]  # no watermark
    assert plain[(20, 0)].record == '{"id":1,"n":"b"}' and plain[(20, 0)].old is not None
    assert plain[(10, 0)].record == '{"id":1,"n":"a"}'
    assert plain[(30, 1)]._route == "t.items"
    with_reads = SinkSteps(spark, configs[0], None, backfill=True, db="appdb")
    sql = {(r.lsn, r.seq): r for r in with_reads.prepare(frame(spark, ROWS)).collect()}
    assert sql[(20, 0)]._message is None and sql[(20, 0)].record == '{"id":1,"n":"b"}'
    assert sql[(10, 0)]._message.startswith('{"record":{"id":1,"n":"a"}')
    assert sql[(10, 0)].record is None
