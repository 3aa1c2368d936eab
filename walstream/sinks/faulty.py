"""`type: faulty`: a sink that fails on purpose, around a real one (see FaultyDestination).

Shipped so that operators can rehearse what walstream does when a destination
misbehaves (parking, dead letters, pause on full) and so the chaos test can make
a sink fail for a while: create the `while_exists` file to start failing,
remove it to heal.
"""

from __future__ import annotations

from collections.abc import Sequence

from walstream.config import FaultyDestination
from walstream.errors import SinkError
from walstream.sinks.base import BatchInfo, Message, Sink
from walstream.sinks.registry import sink_for


class FaultySink(Sink):
    config: FaultyDestination

    def __init__(self, config: FaultyDestination) -> None:
        super().__init__(config)
        self.inner = sink_for(config.inner)
        self.replaces_batches = self.inner.replaces_batches  # type: ignore[misc]
        self.keys = {k.encode() for k in config.fail_keys}

    def active(self) -> bool:
        path = self.config.while_exists
        return path is None or path.exists()

    def begin(self, batch: BatchInfo) -> None:
        super().begin(batch)
        self.inner.begin(batch)

    def deliver(self, messages: Sequence[Message]) -> None:
        if not self.active():
            self.inner.deliver(messages)
            return
        bad = [i for i, m in enumerate(messages) if not self.keys or m.key in self.keys]
        if not bad:
            self.inner.deliver(messages)
            return
        good = [i for i in range(len(messages)) if i not in set(bad)]
        try:
            self.inner.deliver([messages[i] for i in good])
            delivered = frozenset(good)
        except SinkError as exc:
            raise SinkError(
                exc.problem, exc.fix, retryable=exc.retryable, retry_after=exc.retry_after,
                pause=exc.pause, delivered=frozenset(good[k] for k in exc.delivered),
            ) from exc  # fmt: skip
        first = messages[bad[0]]
        raise SinkError(
            f"injected failure (faulty sink) for key {first.key!r} and {len(bad) - 1} more",
            "remove the faulty wrapper from the destination, or the while_exists file",
            retryable=self.config.retryable,
            delivered=delivered,
        )

    def finish(self) -> None:
        self.inner.finish()

    def close(self) -> None:
        self.inner.close()

    def test_connection(self) -> None:
        self.inner.test_connection()

    def prepare_batch(self, sink: str, batch_id: int, partitions: int) -> None:
        self.inner.prepare_batch(sink, batch_id, partitions)
