"""The tests' Kafka reader resumes a stalled consumer at the next offset: nothing skipped,
nothing twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import unique
from tests.kafka import Reader


def written(bootstrap: str, n: int) -> str:
    """A new one-partition topic holding the messages "0" … "n-1"."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = unique("reader")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        fut.result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, str(i).encode())
        if i % 7 == 0:
            producer.flush(30)  # several record batches
    assert producer.flush(30) == 0
    return topic


def test_a_resumed_reader_reads_every_message_once_in_order(kafka: Any) -> None:
    topic = written(kafka.bootstrap_servers, 60)
    reader = Reader(kafka.bootstrap_servers, topic)
    try:
        reader.read(25, 60)
        reader._resume()  # as after a stall: a new consumer, from the start
        got = reader.read(60, 60)
        assert reader.resumed == 1
        assert [m.value().decode() for m in got] == [str(i) for i in range(60)]
        assert reader.poll(1.0) is None
    finally:
        reader.close()


@pytest.mark.parametrize("n", [61])
def test_a_reader_that_waits_for_more_than_exists_fails_saying_so(kafka: Any, n: int) -> None:
    topic = written(kafka.bootstrap_servers, 60)
    reader = Reader(kafka.bootstrap_servers, topic)
    try:
        with pytest.raises(TimeoutError) as failed:
            reader.read(n, 12)
        assert f"{topic}: 60/{n}" in str(failed.value), str(failed.value)
    finally:
        reader.close()
