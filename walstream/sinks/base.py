"""The Sink contract: what every destination implements and what it may assume.

A sink instance lives in one Spark task (one partition of one micro-batch) on an
executor. The delivery layer calls, in this order:

    begin(batch)           once per partition, before anything else
    deliver(messages)      zero or more times, each with up to `batch_size` messages
    finish()               once, after the last deliver of the partition succeeded
    close()                always, also after an error

Ordering the sink may assume: messages come in WAL order (`cursor`) within a
partition, and all messages of one group key are in the same partition. A sink
must keep that order for messages of the same group (Kafka: same key, same
partition, idempotent producer; files: append order).

What `deliver` guarantees before it returns normally: every message it was given
is durably accepted by the destination (acknowledged by the broker, written by
the server) — unless `replaces_batches` is true, in which case durability is
reached in `finish()` and a replay of the same batch and partition overwrites
what an interrupted run wrote. Only after that may the delivery ledger record the
messages as delivered, and only then may the replication slot move past them.

Errors: `deliver` raises `walstream.errors.SinkError` with `retryable` set and,
for a partial failure, `delivered` = the indices known to be delivered. A sink
never retries on its own beyond its client's built-in retries, never sleeps to
back off, never drops a message: the delivery layer decides (retry inline, park
and retry later, dead-letter, or fail the batch for sinks that replace batches).

A sink type is one module: its `DestinationSettings` subclass (the `destination:`
section, with `type: <name>`), its `Sink` subclass naming those settings and its
optional-dependency extra, decorated with `@register` (see `registry.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self
from urllib.parse import urlsplit

from walstream.change import idempotency_key
from walstream.fields import Duration, Model


@dataclass(frozen=True)
class SinkContext:
    """Where a sink runs, as the config's plan knows it: its source and the state database."""

    source: str
    source_dsn: str
    state_dsn: str
    state_schema: str


class DestinationSettings(Model):
    """Base of every sink's `destination:` settings: how the pipeline keys and routes them.

    Each sink narrows `type` to its own name (`type: Literal["kafka"]`).
    `key_expression`: the message key (Spark SQL), kept with every message (Kafka's key,
    the key a dead letter is listed by). `route_expression`: where each message goes, when
    that is computed per change (a topic, stream, subject, URL... given as an expression);
    None when every message goes to the one place the settings name.
    """

    type: str
    #: The destination has tombstones (Kafka: a null-value message after a delete).
    has_tombstones: ClassVar[bool] = False
    #: The destination writes typed rows into tables (lake sinks), not messages.
    writes_tables: ClassVar[bool] = False

    def key_expression(self) -> str:
        return "concat_ws(',', pk)"

    def route_expression(self) -> str | None:
        return None

    def message_format(self) -> str | None:
        """A format this destination needs whatever the sink's `format` says (or None)."""
        return None

    def group_by(self) -> list[str] | None:
        """The grouping this destination needs (None: the sink's `group_by`, default per row)."""
        return None

    @classmethod
    def preflight(cls, plan: Any, sinks: Sequence[Any]) -> None:
        """Checks across the whole config before anything runs, for `sinks` (the plan's
        sinks of this type, wrapped ones included): a ConfigError names the problem and the
        fix. Default: none."""

    def for_shard(self, shard: int) -> Self:
        """These settings for the sink's copy in shard `shard` of a sharded source."""
        return self.model_copy()

    def resolved(self, context: SinkContext) -> Self:
        """These settings completed with what the plan knows (a copy; default: unchanged)."""
        return self.model_copy()

    def unwrapped(self) -> DestinationSettings:
        """The destination that receives the messages (a wrapper's innermost one)."""
        return self


#: How long a message sink retries a failing chunk inline before it parks (or fails the
#: batch), unless its settings say otherwise.
RETRY_TIMEOUT = 60.0


class MessageDestination(DestinationSettings):
    """Settings of a sink that delivers messages (Kafka, webhooks, Redis Streams, NATS,
    RabbitMQ, the Postgres mirror): a chunk that fails with a retryable error is retried
    inline for `retry_timeout` seconds, then its messages are parked."""

    retry_timeout: Duration = RETRY_TIMEOUT


def retry_timeout(destination: DestinationSettings) -> float:
    """A sink's inline retry time: a message sink's own setting, else RETRY_TIMEOUT."""
    if isinstance(destination, MessageDestination):
        return destination.retry_timeout
    return RETRY_TIMEOUT


class Message(NamedTuple):
    """One formatted change on its way to a destination (a tuple: built once per change)."""

    lsn: int
    seq: int
    value: bytes | None  # None: a tombstone (Kafka)
    key: bytes | None = None
    route: str | None = None  # topic, stream, subject ... when the sink routes per message
    table: str = ""  # schema.table
    action: str = ""
    group: str = ""
    #: Set when the message could not be built (a Python transform raised): it is never
    #: sent; the delivery layer makes it a dead letter with this reason.
    error: str | None = None
    #: The idempotency key when it is not the cursor's (backfill rows: backfill id + pk).
    idempotency_override: str | None = None

    @property
    def cursor(self) -> tuple[int, int]:
        return (self.lsn, self.seq)

    @property
    def idempotency_key(self) -> str:
        """What the sink passes on for deduplication: `base64("lsn:seq")`, or
        `idempotency_override` (backfill rows: backfill id and key)."""
        return self.idempotency_override or idempotency_key(self.lsn, self.seq)


@dataclass(frozen=True)
class BatchInfo:
    sink: str
    batch_id: int
    partition: int
    partitions: int


class Sink(ABC):
    """One destination, as used inside one Spark task (see the module docstring)."""

    #: The settings model of the `destination:` section this sink serves.
    settings_model: ClassVar[type[DestinationSettings]]
    #: `pip install 'walstream[<extra>]'` installs what the sink needs (None: nothing).
    extra: ClassVar[str | None] = None

    #: True when `finish()` is the durability point and a replayed batch replaces its output.
    replaces_batches: ClassVar[bool] = False
    #: True when the sink takes whole Arrow batches of SQL-formatted messages
    #: (`deliver_columns`): no Python step per message but the sink's own send loop.
    columnar: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    def begin(self, batch: BatchInfo) -> None:
        self.batch = batch

    @abstractmethod
    def deliver(self, messages: Sequence[Message]) -> None:
        """Deliver all messages in order; return only when they are durably accepted."""

    def deliver_columns(self, batch: Any) -> None:
        """Deliver an Arrow RecordBatch in order: columns `lsn`, `seq`, `schema`, `table`,
        `action`, `_key`, `_route` (when the sink routes), `_ikey` (idempotency key) and
        `_message` (the formatted message), none of the last two NULL. Only for
        `columnar` sinks, with the guarantees of `deliver`; a partial failure's
        `SinkError.delivered` holds the row indices delivered. A sink that keeps the
        ledger gets at most `batch_size` rows per call (no tombstones: with them, and
        on a replay, it gets messages)."""
        raise NotImplementedError

    def finish(self) -> None:  # noqa: B027 - optional hook
        """The partition is complete (nothing to do for streaming destinations)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what `begin` or `deliver` acquired; called also after an error."""

    @abstractmethod
    def test_connection(self) -> None:
        """Reach the destination (without delivering anything); raise SinkError saying why not."""

    # Driver side, once per micro-batch before any task runs.
    def prepare_batch(self, sink: str, batch_id: int, partitions: int) -> None:  # noqa: B027
        """Get ready for a batch (e.g. remove what an earlier, differently split run wrote)."""

    # Driver side, once per micro-batch after every partition finished.
    def batch_delivered(  # noqa: B027
        self, sink: str, batch_id: int, last: tuple[int, int] | None
    ) -> None:
        """Every partition of the batch delivered; `last`: its greatest cursor (None: no
        message). Called before the batch's commit, so it may run again on a replay."""


def url_for_messages(url: str, default_port: int | None = None) -> str:
    """A destination URL fit for errors and logs: scheme and host only — no user, password,
    path or query (a webhook URL's path can be its secret, as Slack's are)."""
    parts = urlsplit(url.strip())
    host = parts.netloc.rsplit("@", 1)[-1]
    if default_port is not None and parts.port is None:
        host = f"{host}:{default_port}"
    hidden = "/…" if parts.path not in ("", "/") or parts.query else ""
    return f"{parts.scheme}://{host}{hidden}"


def servers_for_messages(servers: str, default_port: int | None = None) -> str:
    """A comma-separated list of server URLs fit for messages (see `url_for_messages`)."""
    return ",".join(
        url_for_messages(s, default_port) if "://" in s else s.rsplit("@", 1)[-1]
        for s in (x.strip() for x in servers.split(","))
        if s
    )
