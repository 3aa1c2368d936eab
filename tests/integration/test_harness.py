"""The shared components the later suites rely on really work."""

from __future__ import annotations

import json
import uuid

import pytest

from walstream.change import CHANGE_COLUMNS, spark_schema
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder
from walstream.testing import TopicReader, wait_until


@pytest.mark.kafka
def test_tansu_broker_round_trips_keys_and_headers(kafka):
    from confluent_kafka import Consumer, Producer

    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    for i in range(5):
        producer.produce(
            topic,
            key=f"k{i % 2}",
            value=json.dumps({"n": i}),
            headers={"idempotency-key": f"id{i}"},
        )
    assert producer.flush(15) == 0
    consumer = Consumer({
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
    })  # fmt: skip
    consumer.subscribe([topic])
    got: list[tuple[str, int, str]] = []

    def drained() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(
                (
                    msg.key().decode(),
                    json.loads(msg.value())["n"],
                    dict(msg.headers())["idempotency-key"].decode(),
                )
            )
        return len(got) == 5

    try:
        wait_until(drained, timeout=60, interval=0, message=lambda: f"consumed {got}")
    finally:
        consumer.close()
    assert sorted(got, key=lambda g: g[1]) == [(f"k{i % 2}", i, f"id{i}") for i in range(5)]


@pytest.mark.kafka
def test_topic_reader_reopens_a_quiet_consumer_at_the_next_offset(kafka):
    from confluent_kafka import Producer

    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

    def send(first: int, n: int) -> None:
        for i in range(first, first + n):
            producer.produce(topic, value=str(i), partition=0)
        assert producer.flush(15) == 0

    send(0, 5)
    reader = TopicReader(kafka.bootstrap_servers, topic, stall=0.5)
    got: list[int] = []
    try:
        wait_until(lambda: got.extend(int(m.value()) for m in reader.consume(100, 0.2)) or
                   len(got) >= 5, 60, interval=0, message=lambda: f"read {got}")  # fmt: skip
        wait_until(lambda: reader.poll(0.2) is None and reader.reopened >= 1, 30, interval=0)
        send(5, 5)  # read by the new consumer, from where the first one stopped
        wait_until(lambda: got.extend(int(m.value()) for m in reader.consume(100, 0.2)) or
                   len(got) >= 10, 60, interval=0, message=lambda: f"read {got}")  # fmt: skip
        assert reader.poll(1.0) is None
    finally:
        reader.close()
    assert got == list(range(10))
    assert reader.next_offset == 10


@pytest.mark.spark
def test_decoded_rows_fit_the_canonical_spark_schema(spark, db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pub, slot = db.create_publication("t"), db.create_slot()
    db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    db.execute("DELETE FROM t WHERE id = 1")
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("app", meta.types, meta.primary_keys)
    rows = [r for m in db.read(slot, pub) for r in decoder.decode(m.payload, m.data_start)]
    spark_rows = [(*r[:4], r.committed_at, *r[5 : len(CHANGE_COLUMNS)]) for r in rows]
    df = spark.createDataFrame(spark_rows, spark_schema())
    assert tuple(df.columns) == CHANGE_COLUMNS
    got = df.orderBy("lsn", "seq").collect()
    assert [(g.action, g.pk, g.seq) for g in got] == [
        ("insert", ["1"], 0),
        ("insert", ["2"], 1),
        ("delete", ["1"], 0),
    ]
    # the commit time survives the Spark round trip to the microsecond (Spark hands back
    # a naive datetime in this process's local time: .timestamp() reads it as such)
    assert [round(g.committed_at.timestamp() * 1_000_000) for g in got] == [
        r.committed_at_us for r in rows
    ]
    assert json.loads(got[1].record) == {"id": 2, "v": "b"}


def test_wait_until_returns_value_and_fails_at_deadline():
    calls = iter([0, 0, 7])
    assert wait_until(lambda: next(calls), timeout=5, interval=0) == 7
    with pytest.raises(TimeoutError, match=r"after 0\.1s: never"):
        wait_until(lambda: False, timeout=0.1, message="never")
