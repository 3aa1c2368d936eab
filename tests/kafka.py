"""Reading what a test's Kafka sink wrote to tansu: every message of a topic, from its start."""

from __future__ import annotations

import time
from typing import Any

from tests.conftest import unique
from walstream.testing import wait_until


def _reader(bootstrap: str, topic: str, offset: int | None = None) -> Any:
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
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING if offset is None else offset)])
    return consumer


#: A consumer that receives nothing for this long while messages are still expected is
#: replaced by a new one at the next offset: tansu (the test broker) sometimes leaves a
#: consumer's fetch session stalled with no error while the topic holds more messages.
STALL_SECONDS = 10.0


class Reader:
    """A topic's messages from its start, in order, resuming on a fresh consumer after a
    stall (see STALL_SECONDS)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.consumer = _reader(bootstrap, topic)
        self.got: list[Any] = []
        self.errors: list[str] = []
        self.resumed = 0
        self._skip = 0
        self._last = time.monotonic()

    def poll(self, timeout: float) -> Any:
        """The next message (or None after `timeout`); errors are noted, not returned."""
        m = self.consumer.poll(timeout)
        if m is not None and m.error():
            self.errors[-1:] = [str(m.error())]
            m = None
        if m is not None and self._skip:  # read again after a resume
            self._skip -= 1
            return self.poll(timeout)
        if m is not None:
            self._last = time.monotonic()
            self.got.append(m)
        return m

    def read(self, n: int, timeout: float) -> list[Any]:
        def enough() -> bool:
            self.poll(0.5)
            if len(self.got) < n and time.monotonic() - self._last > STALL_SECONDS:
                self._resume()
            return len(self.got) >= n

        wait_until(
            enough, timeout, interval=0,
            message=lambda: f"{self.topic}: {len(self.got)}/{n} (last consumer error: "
            f"{self.errors or 'none'}; resumed {self.resumed} time(s); {self._partitions()})",
        )  # fmt: skip
        return self.got

    def _partitions(self) -> str:
        """How many partitions the topic has (the reader reads partition 0 only)."""
        try:
            meta = self.consumer.list_topics(self.topic, timeout=5).topics[self.topic]
            return f"{len(meta.partitions)} partition(s)"
        except Exception as exc:  # a diagnostic only
            return f"partitions unknown: {exc}"

    def _resume(self) -> None:
        # From the start again, skipping what was read: tansu's offsets do not always
        # count records (a fetch at the next record's offset can find nothing).
        self.consumer.close()
        self.consumer = _reader(self.bootstrap, self.topic)
        self._skip = len(self.got)
        self.resumed += 1
        self._last = time.monotonic()

    def close(self) -> None:
        self.consumer.close()


def consume(bootstrap: str, topic: str, n: int, timeout: float = 60) -> list[Any]:
    """Exactly `n` messages of the topic: fails if fewer arrive, or one more follows."""
    reader = Reader(bootstrap, topic)
    try:
        got = list(reader.read(n, timeout))
        extra = reader.poll(2.0)  # nothing beyond the expected messages
        assert extra is None, f"unexpected extra message {extra.value()!r}"
    finally:
        reader.close()
    return got


def consume_all(bootstrap: str, topic: str, at_least: int, timeout: float = 90) -> list[Any]:
    """Every message of the topic: at least `at_least`, then until 3 s pass without one."""
    reader = Reader(bootstrap, topic)
    try:
        reader.read(at_least, timeout)
        while reader.poll(3.0) is not None:
            pass
    finally:
        reader.close()
    return list(reader.got)
