"""Reading what a test's Kafka sink wrote to tansu: every message of a topic, from its start."""

from __future__ import annotations

from typing import Any

from walstream.testing import TopicReader, wait_until


def _read(reader: TopicReader, n: int, timeout: float) -> list[Any]:
    got: list[Any] = []

    def enough() -> bool:
        m = reader.poll(0.5)
        if m is not None:
            got.append(m)
        return len(got) >= n

    wait_until(
        enough, timeout, interval=0,
        message=lambda: f"{reader.topic}: {len(got)}/{n} (last consumer error: "
        f"{reader.last_error or 'none'}; consumer reopened {reader.reopened}x; "
        f"{reader.partitions()})",
    )  # fmt: skip
    return got


def consume(bootstrap: str, topic: str, n: int, timeout: float = 60) -> list[Any]:
    """Exactly `n` messages of the topic: fails if fewer arrive, or one more follows."""
    reader = TopicReader(bootstrap, topic)
    try:
        got = _read(reader, n, timeout)
        extra = reader.poll(2.0)  # nothing beyond the expected messages
        assert extra is None, f"unexpected extra message {extra.value()!r}"
    finally:
        reader.close()
    return got


def consume_all(bootstrap: str, topic: str, at_least: int, timeout: float = 90) -> list[Any]:
    """Every message of the topic: at least `at_least`, then until 3 s pass without one."""
    reader = TopicReader(bootstrap, topic)
    try:
        got = _read(reader, at_least, timeout)
        while (m := reader.poll(3.0)) is not None:
            got.append(m)
    finally:
        reader.close()
    return got
