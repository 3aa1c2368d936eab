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
back off, never drops a message: the delivery layer decides (retry, fail the
batch, later: park or dead-letter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

from walstream.change import idempotency_key


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
    ikey: str | None = None

    @property
    def cursor(self) -> tuple[int, int]:
        return (self.lsn, self.seq)

    @property
    def idempotency_key(self) -> str:
        """What the sink passes on for deduplication: `base64("lsn:seq")` or `ikey`."""
        return self.ikey or idempotency_key(self.lsn, self.seq)


@dataclass(frozen=True)
class BatchInfo:
    sink: str
    batch_id: int
    partition: int
    partitions: int


class Sink(ABC):
    """One destination, as used inside one Spark task (see the module docstring)."""

    #: True when `finish()` is the durability point and a replayed batch replaces its output.
    replaces_batches: ClassVar[bool] = False
    #: True when the sink takes whole Arrow batches of SQL-formatted messages
    #: (`deliver_columns`): no Python step per message.
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
        `action`, `_key`, `_ikey` (idempotency key) and `_message` (the formatted
        message), none of the last two NULL. Only for `columnar` sinks."""
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
