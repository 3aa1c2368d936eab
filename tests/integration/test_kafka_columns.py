"""Kafka from Arrow columns (`deliver_ledger_columns`, a fresh batch's common path): the
same messages, headers and ledger records as message by message, against tansu; what
the broker or client refuses goes through retries and dead letters as before."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import TestDatabase, unique
from tests.kafka import consume
from walstream.change import ChangeRow, change_key, idempotency_key
from walstream.config import parse_config
from walstream.delivery.columns import deliver_ledger_columns
from walstream.delivery.deliver import DeliveryPlan, Stats, deliver_partition
from walstream.delivery.ledger import Ledger
from walstream.delivery.parking import DEAD, ParkingLot
from walstream.delivery.route import Route
from walstream.formats import formatter
from walstream.pipeline.tasks import _rows
from walstream.testing import TansuBroker

pytestmark = pytest.mark.kafka

TS = 1_763_884_850_561_930

SCHEMA = pa.schema([
    ("source", pa.string()), ("lsn", pa.int64()), ("seq", pa.int32()), ("xid", pa.int64()),
    ("committed_at", pa.timestamp("us", tz="UTC")), ("action", pa.string()),
    ("schema", pa.string()), ("table", pa.string()), ("record", pa.string()),
    ("old", pa.string()), ("annotations", pa.string()), ("_group", pa.string()),
    ("_key", pa.string()), ("_route", pa.string()), ("_message", pa.string()),
    ("_ikey", pa.string()),
])  # fmt: skip


def batches(
    n: int, per_batch: int, topics: tuple[str, str], python_rows: bool = True, big: int = -1
) -> list[pa.RecordBatch]:
    """Change rows as the pipeline hands them to a Kafka task: `_message`/`_ikey` as SQL
    makes them (Python's formatter here), NULL `_message` where SQL leaves a row to Python
    (some updates), routed to two topics by table; row `big` carries a 20 kB message."""
    fmt = formatter("sequin", sink="k", db="app")
    rows: list[dict[str, Any]] = []
    for i in range(n):
        update = python_rows and 130 <= i < 190 and i % 7 == 3
        table = "a" if i % 3 else "b"
        record = f'{{"id":{i},"v":"{"x" * (20_000 if i == big else 3)}"}}'
        row = dict(
            source="app", lsn=1000 + i // 4, seq=i % 4, xid=9, committed_at=TS + i,
            action="update" if update else "insert", schema="public", table=table,
            record=record, old=f'{{"id":{i}}}' if update else None, annotations=None,
            _group=f"public.{table}.{i}", _key=str(i),
            _route=topics[0] if table == "a" else topics[1],
        )  # fmt: skip
        change = ChangeRow(
            **{k: v for k, v in row.items() if k in ChangeRow._fields},
            pk=[str(i)], unchanged_toast=None, committed_at_us=TS + i,
        )  # fmt: skip
        row["_message"] = None if update else fmt(change)
        row["_ikey"] = change_key(change)
        if row["_message"] is not None:
            row["record"] = row["old"] = None  # what the pipeline trims when SQL formatted
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMA).to_batches(max_chunksize=per_batch)


def plan(
    bootstrap: str, ledger: Ledger, parking: ParkingLot, batch_id: int, **producer: Any
) -> DeliveryPlan:
    cfg = parse_config({
        "sources": [{"name": "app", "dsn": "postgresql:///app", "slot": "s", "publication": "p"}],
        "sinks": [{"name": "k", "source": "app",
                   "destination": {"type": "kafka", "bootstrap_servers": bootstrap,
                                   "topic": "concat('t.', `table`)", "create_topics": True,
                                   "producer": producer}}],
    })  # fmt: skip
    return DeliveryPlan(
        sink="k", destination=cfg.sinks[0].destination, format="sequin", db="app",
        batch_size=100, retry_timeout=5.0, ledger=ledger, query_id="q", batch_id=batch_id,
        partitions=1, parking=parking, route=Route.LEDGER_COLUMNS, fresh=True, unblocked=True,
    )  # fmt: skip


def read(bootstrap: str, topic: str, n: int) -> list[tuple[Any, ...]]:
    return [
        (m.key(), m.value(), m.headers()) for m in consume(bootstrap, topic, n)
    ]  # fmt: skip


def stores(db: TestDatabase) -> tuple[Ledger, ParkingLot]:
    schema = unique("state")
    ledger, lot = Ledger(db.dsn, schema), ParkingLot(db.dsn, schema)
    ledger.ensure()
    lot.ensure()
    return ledger, lot


def test_columns_send_what_messages_send(db: TestDatabase, kafka: TansuBroker) -> None:
    ledger, lot = stores(db)
    by_row_topics, by_col_topics = (unique("row"), unique("row")), (unique("col"), unique("col"))
    rows_plan = plan(kafka.bootstrap_servers, ledger, lot, 1)
    data = batches(450, 128, by_row_topics)
    by_row = deliver_partition(rows_plan, 0, _rows(data, pa))
    cols_plan = plan(kafka.bootstrap_servers, ledger, lot, 2)
    data = batches(450, 128, by_col_topics)
    assert sum(b.column("_message").null_count > 0 for b in data) == 1  # one batch for Python
    by_col = deliver_ledger_columns(cols_plan, 0, iter(data), lambda b: _rows(b, pa))

    def counts(s: Stats) -> tuple[int, ...]:
        return (s.delivered, s.skipped, s.parked, s.dead, s.last_lsn, s.last_seq,
                s.max_committed_us)  # fmt: skip

    assert counts(by_col) == counts(by_row) == (450, 0, 0, 0, 1112, 1, TS + 449)
    for row_topic, col_topic, n in zip(by_row_topics, by_col_topics, (300, 150), strict=True):
        expected = read(kafka.bootstrap_servers, row_topic, n)
        got = read(kafka.bootstrap_servers, col_topic, n)
        assert got == expected
        assert [int(k) for k, _, _ in got] == sorted(int(k) for k, _, _ in got)  # WAL order
    _, value, headers = read(kafka.bootstrap_servers, by_col_topics[0], 300)[0]  # row 1
    assert headers == [("idempotency-key", idempotency_key(1000, 1).encode()),
                       ("walstream-lsn", b"0/3E8"), ("walstream-table", b"public.a")]  # fmt: skip
    assert json.loads(value)["record"] == {"id": 1, "v": "xxx"}
    assert ledger.delivered_through("k", "q", 2, 0, 1) == (1112, 1)
    assert lot.counts() == {}


def test_a_refused_message_becomes_a_dead_letter_and_the_rest_arrive(
    db: TestDatabase, kafka: TansuBroker
) -> None:
    ledger, lot = stores(db)
    topics = (unique("a"), unique("b"))
    p = plan(kafka.bootstrap_servers, ledger, lot, 3, **{"message.max.bytes": 10_000})
    data = batches(300, 300, topics, python_rows=False, big=151)  # row 151: table "a"

    stats = deliver_ledger_columns(p, 0, iter(data), lambda b: _rows(b, pa))

    assert (stats.delivered, stats.parked, stats.dead) == (299, 0, 1)
    (dead,) = lot.list(DEAD, sink="k")
    assert (dead.lsn, dead.seq, dead.message.key) == (1000 + 151 // 4, 151 % 4, b"151")
    assert "MSG_SIZE_TOO_LARGE" in dead.errors[-1]["error"]
    got = read(kafka.bootstrap_servers, topics[0], 199)
    assert [int(k) for k, _, _ in got] == [i for i in range(300) if i % 3 and i != 151]
    assert ledger.delivered_through("k", "q", 3, 0, 1) == (1074, 3)
