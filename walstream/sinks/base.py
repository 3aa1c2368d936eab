"""The sink contracts: three kinds of destination, what each implements and may assume.

A sink type is its `DestinationSettings` subclass (the `destination:` section, with
`type: <name>`) and its sink class, a subclass of one kind, decorated `@register`
(`registry.py`). Each kind declares one frozen `Capabilities`; the delivery route of
a batch is picked from it in one place (`delivery/route.py`).

- `MessageSink` (Kafka, webhooks, Redis Streams, NATS, RabbitMQ, the Postgres
  mirror): a message is durable when `deliver` returns; then the ledger records it.
  A failure raises `SinkError`; the delivery layer retries, parks or dead-letters —
  a sink never sleeps, retries beyond its client or drops a message.
- `BatchSink` (files, pull streams): durable at `finish`; a replay of a batch's
  partition replaces what an interrupted run wrote; no ledger, no parking.
- `TableSink` (Delta, Iceberg; `lake/contract.py`): on the driver, one typed batch of
  one table per micro-batch, in one commit that records the batch.

The first two share the task protocol of `TaskSink`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, Protocol, Self
from urllib.parse import urlsplit

from walstream.change import idempotency_key
from walstream.fields import Duration, Model
from walstream.formats.keys import MESSAGE_KEY_SQL


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

    def key_expression(self) -> str:
        return MESSAGE_KEY_SQL

    def default_key(self) -> bool:
        """The messages are keyed as a destination's are by default (the change's key)."""
        return self.key_expression() == DestinationSettings.key_expression(self)

    def route_expression(self) -> str | None:
        return None

    def message_format(self) -> str | None:
        """A format this destination needs whatever the sink's `format` says (or None)."""
        return None

    def format_routes(self) -> bool:
        """Each message goes where its format names (`format: debezium`: Debezium's topic
        of its table), the settings naming no place (Kafka with no `topic`)."""
        return False

    def group_by(self) -> list[str] | None:
        """The grouping this destination needs (None: the sink's `group_by`, default per row)."""
        return None

    def pull_stream(self) -> str | None:
        """The pull stream this destination feeds (`type: stream`), or None. The server's
        stream API reads such settings as a `PullStreamSettings`."""
        return None

    def read_back(self) -> list[bytes]:
        """Every message this destination holds, in order, when walstream can read them
        back itself (a file sink's jsonl files: the demo, tools); else TypeError."""
        raise TypeError(f"a {self.type} destination is not read back by walstream")

    @classmethod
    def check_sinks(cls, sinks: Sequence[tuple[int, Any]]) -> None:
        """Checks between the config's sinks of this type as it is resolved, with no
        connection (`sinks`: (index in `sinks:`, SinkConfig)); a ValueError names
        `sinks[i].destination.<key>`. Default: none. (`preflight` runs later, and may
        reach servers.)"""

    def typed_shape(self, conn: Any, schema: str, table: str, columns: Any) -> Any:
        """A table sink's columns of `schema.table` (a `TableShape`; `columns`: those the
        publication sends): its backfills are read typed into them. Default: a message
        destination, whose backfills are read as change rows (never called)."""
        raise TypeError(f"a {self.type} destination takes messages, not typed rows")

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


class PullStreamSettings(Protocol):
    """What the server's stream API reads of the settings of a destination feeding a pull
    stream (`pull_stream()` is not None)."""

    stream: str
    retention: float
    max_bytes: int
    catch_up_threshold: int

    def consumer_token(self) -> str | None: ...


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
    #: The idempotency key when it is not the cursor's (backfill rows: backfill id + pk;
    #: a change's further records).
    idempotency_override: str | None = None
    #: Which of its change's records (0 the first): a tombstone after its delete is 1, as
    #: are Debezium's further records of one change (`formats/debezium.py`).
    part: int = 0

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


class Kind(StrEnum):
    """The three sink kinds (see the module docstring)."""

    MESSAGES = "messages"
    BATCHES = "batches"
    TABLES = "tables"


@dataclass(frozen=True)
class Capabilities:
    """What a sink type can take, declared once by its kind and class: the delivery
    route (`delivery/route.py`) and the config's checks read this, never the class."""

    kind: Kind
    #: Takes Arrow batches of formatted messages (`deliver_columns`), not only Messages.
    columns: bool = False
    #: Has tombstones (Kafka: a null-value message after a delete, for log compaction).
    tombstones: bool = False

    @property
    def ledger(self) -> bool:
        """Delivered messages are recorded in the ledger and failures parked (message
        sinks); a batch sink's replay replaces its output instead."""
        return self.kind is Kind.MESSAGES


class Sink(ABC):
    """What every sink kind has: its settings, its extra, its capabilities, a connection
    test, and the driver's hooks around a micro-batch."""

    #: The settings model of the `destination:` section this sink serves.
    settings_model: ClassVar[type[DestinationSettings]]
    #: `pip install 'walstream[<extra>]'` installs what the sink needs (None: nothing).
    extra: ClassVar[str | None] = None
    capabilities: ClassVar[Capabilities]

    def __init__(self, config: Any) -> None:
        self.config = config

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


class TaskSink(Sink):
    """The task protocol message and batch sinks share, in one Spark task (one partition
    of one micro-batch), in this order:

        begin(batch)           once per partition, before anything else
        deliver(messages)      zero or more times, each with up to `batch_size` messages
        finish()               once, after the last deliver of the partition succeeded
        close()                always, also after an error

    Messages come in WAL order (`cursor`) within a partition, and all messages of one
    group key are in the same partition; a sink keeps that order for each group (Kafka:
    same key, same partition, idempotent producer; files: append order). A partial
    failure's `SinkError.delivered` holds the indices known to be delivered.
    """

    def begin(self, batch: BatchInfo) -> None:
        self.batch = batch

    @abstractmethod
    def deliver(self, messages: Sequence[Message]) -> None:
        """Deliver all messages in order; return only when they are durably accepted (a
        batch sink: accepted for `finish`)."""

    def deliver_columns(self, batch: Any) -> None:
        """Deliver an Arrow RecordBatch in order: columns `lsn`, `seq`, `schema`, `table`,
        `action`, `_key`, `_route` (when the sink routes), `_ikey` (idempotency key) and
        `_message` (the formatted message), none of the last two NULL. Only for sinks
        with `capabilities.columns`, with the guarantees of `deliver`; a partial
        failure's `SinkError.delivered` holds the row indices delivered. A message sink
        gets at most `batch_size` rows per call (no tombstones: with them, and on a
        replay, it gets messages)."""
        raise NotImplementedError

    def finish(self) -> None:
        """The partition is complete (a batch sink makes its output durable here)."""

    def close(self) -> None:
        """Release what `begin` or `deliver` acquired; called also after an error."""


class MessageSink(TaskSink):
    """A destination of messages, each durable when `deliver` returns: ledger, parking."""

    capabilities = Capabilities(Kind.MESSAGES)


class BatchSink(TaskSink):
    """A destination whose batch output is durable at `finish` and replaced on a replay."""

    capabilities = Capabilities(Kind.BATCHES)


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
