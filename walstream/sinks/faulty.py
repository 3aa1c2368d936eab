"""`type: faulty`: a sink that fails on purpose, around a real one (see FaultyDestination).

Shipped so that operators can rehearse what walstream does when a destination
misbehaves (parking, dead letters, pause on full) and so the chaos test can make
a sink fail for a while: create the `while_exists` file to start failing,
remove it to heal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from walstream.errors import SinkError
from walstream.fields import Duration, LocalPath
from walstream.sinks.base import (
    BatchInfo,
    Capabilities,
    DestinationSettings,
    Kind,
    Message,
    MessageDestination,
    SinkContext,
    TaskSink,
)
from walstream.sinks.registry import register, sink_for

if TYPE_CHECKING:
    AnyDestination = DestinationSettings  # at run time: every registered one (registry.py)


class FaultyDestination(MessageDestination):
    """A fault-injecting wrapper around another destination (chaos tests, rehearsals).

    While it is active (always, or while the file `while_exists` exists), messages
    whose key is in `fail_keys` (every message when the list is empty) fail with a
    retryable or non-retryable SinkError; the others go to `inner`, which may be
    another faulty destination (two rules at once).
    """

    type: Literal["faulty"]
    inner: AnyDestination
    fail_keys: list[str] = Field(default_factory=list)
    retryable: bool = True
    while_exists: LocalPath | None = None
    retry_timeout: Duration = 0.5  # inline retries before a failed message is parked

    def key_expression(self) -> str:  # keyed and routed as the destination it wraps
        return self.inner.key_expression()

    def route_expression(self) -> str | None:
        return self.inner.route_expression()

    def message_format(self) -> str | None:
        return self.inner.message_format()

    def group_by(self) -> list[str] | None:
        return self.inner.group_by()

    def for_shard(self, shard: int) -> FaultyDestination:
        return self.model_copy(update={"inner": self.inner.for_shard(shard)})

    def resolved(self, context: SinkContext) -> FaultyDestination:
        return self.model_copy(update={"inner": self.inner.resolved(context)})

    def unwrapped(self) -> DestinationSettings:
        return self.inner.unwrapped()


@register
class FaultySink(TaskSink):
    #: Per instance: the wrapped sink's, without columns.
    capabilities = Capabilities(Kind.MESSAGES)
    settings_model = FaultyDestination
    config: FaultyDestination

    def __init__(self, config: FaultyDestination) -> None:
        super().__init__(config)
        inner = sink_for(config.inner)
        assert isinstance(inner, TaskSink), "a faulty sink wraps a message or batch sink"
        self.inner = inner
        # the wrapped sink's kind, but messages only: faults are injected per message
        self.capabilities = replace(inner.capabilities, columns=False)  # type: ignore[misc]
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
                exc.problem,
                exc.fix,
                retryable=exc.retryable,
                retry_after=exc.retry_after,
                pause=exc.pause,
                delivered=frozenset(good[k] for k in exc.delivered),
            ) from exc
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
