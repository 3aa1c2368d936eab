"""Reading what a test's Kafka sink wrote to tansu: every message of a topic, from its start."""

from __future__ import annotations

from typing import Any

from tests.conftest import unique
from walstream.testing import wait_until


def _reader(bootstrap: str, topic: str) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("g"),
            "enable.auto.commit": False,
            # A fetch refused as out of range (tansu, for a topic just created) resets to the
            # start, not the end: the default ("latest") would skip everything written so far.
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return consumer


def _read(consumer: Any, topic: str, n: int, timeout: float) -> list[Any]:
    got: list[Any] = []
    errors: list[str] = []

    def enough() -> bool:
        m = consumer.poll(0.5)
        if m is not None:
            if m.error():
                errors[-1:] = [str(m.error())]
            else:
                got.append(m)
        return len(got) >= n

    wait_until(
        enough, timeout, interval=0,
        message=lambda: f"{topic}: {len(got)}/{n} (last consumer error: {errors or 'none'}; "
        f"{_partitions(consumer, topic)})",
    )  # fmt: skip
    return got


def _partitions(consumer: Any, topic: str) -> str:
    """How many partitions the topic has (a diagnostic: the reader reads partition 0)."""
    try:
        return (
            f"{len(consumer.list_topics(topic, timeout=5).topics[topic].partitions)} partition(s)"
        )
    except Exception as exc:  # only for the message of a failed wait
        return f"partitions unknown: {exc}"


def consume(bootstrap: str, topic: str, n: int, timeout: float = 60) -> list[Any]:
    """Exactly `n` messages of the topic: fails if fewer arrive, or one more follows."""
    consumer = _reader(bootstrap, topic)
    try:
        got = _read(consumer, topic, n, timeout)
        extra = consumer.poll(2.0)  # nothing beyond the expected messages
        assert extra is None or extra.error(), f"unexpected extra message {extra.value()!r}"
    finally:
        consumer.close()
    return got


def consume_all(bootstrap: str, topic: str, at_least: int, timeout: float = 90) -> list[Any]:
    """Every message of the topic: at least `at_least`, then until 3 s pass without one."""
    consumer = _reader(bootstrap, topic)
    try:
        got = _read(consumer, topic, at_least, timeout)
        while (m := consumer.poll(3.0)) is not None:
            if not m.error():
                got.append(m)
    finally:
        consumer.close()
    return got
