"""Kafka sink (`type: kafka`): confluent-kafka, idempotent producer, every message acknowledged.

Order: messages of a group share a key, so they go to one Kafka partition; the
producer is idempotent (`enable.idempotence`), so retries inside librdkafka
never reorder or duplicate them. `deliver` returns only when every message of
the chunk has its delivery report; failures are classified into a SinkError.
Headers: `idempotency-key` (base64 "lsn:seq"), `walstream-lsn`, `walstream-table`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from walstream.change import format_lsn
from walstream.errors import SinkError
from walstream.fields import is_name
from walstream.nopandas import no_pandas
from walstream.sinks.base import (
    Capabilities,
    Kind,
    Message,
    MessageDestination,
    MessageSink,
)
from walstream.sinks.kafka.clients import (
    LIBRDKAFKA_LOG,
    confluent,
    forget_producer,
    forget_topics,
    known_topics,
    login_cause,
    producer_for,
)
from walstream.sinks.registry import register


class KafkaDestination(MessageDestination):
    type: Literal["kafka"]
    bootstrap_servers: str = Field(min_length=1)
    #: A topic name, or a Spark SQL expression; none: the format's topic of each table
    #: (`format: debezium`: `<topic.prefix>.<schema>.<table>`, as Debezium names them).
    topic: str | None = Field(None, min_length=1)
    key: str = "pk"  # "pk" (key values joined by ','), or a Spark SQL expression
    producer: dict[str, str | int | float | bool] = Field(default_factory=dict)
    create_topics: bool = False
    topic_partitions: int = Field(1, ge=1)

    def client_settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.producer}

    def key_expression(self) -> str:
        return super().key_expression() if self.key == "pk" else self.key

    def route_expression(self) -> str | None:
        return None if self.topic is None or is_name(self.topic) else self.topic

    def format_routes(self) -> bool:
        return self.topic is None


#: Our defaults under the user's `producer` settings (which win).
DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "message.timeout.ms": 30_000,  # a report per message within 30 s, even with the broker down
    "socket.connection.setup.timeout.ms": 5_000,
}


@register
class KafkaSink(MessageSink):
    settings_model = KafkaDestination
    extra = "kafka"
    capabilities = Capabilities(Kind.MESSAGES, columns=True, tombstones=True)
    config: KafkaDestination

    def __init__(self, config: KafkaDestination) -> None:
        super().__init__(config)
        self.settings = {**DEFAULTS, **config.client_settings()}

    # -- classification -----------------------------------------------------------------------
    def _fatal_codes(self) -> set[int]:
        E = confluent().KafkaError
        codes = {
            E.MSG_SIZE_TOO_LARGE,
            E.RECORD_LIST_TOO_LARGE,
            E.INVALID_RECORD,
            E.TOPIC_AUTHORIZATION_FAILED,
            E.CLUSTER_AUTHORIZATION_FAILED,
            E.SASL_AUTHENTICATION_FAILED,
            E._AUTHENTICATION,
            E.TOPIC_EXCEPTION,
            E._INVALID_ARG,
        }
        if not self.config.create_topics:
            codes |= {E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_TOPIC}
        return codes

    def _error(self, err: Any, topic: str | None, delivered: frozenset[int]) -> SinkError:
        E = confluent().KafkaError
        fatal = err.code() in self._fatal_codes()
        where = f"topic {topic!r} on {self.config.bootstrap_servers}"
        if err.code() in (E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_TOPIC):
            fix = "create the topic, or set destination.create_topics: true"
        elif err.code() in (E.MSG_SIZE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE):
            fix = "raise the topic's max.message.bytes (and producer message.max.bytes), or filter/transform the large rows"
        elif "AUTH" in err.name():
            fix = "grant the producer's principal WRITE on the topic / check the SASL credentials"
        else:
            fix = "check that the brokers in destination.bootstrap_servers are up and reachable"
        return SinkError(
            f"Kafka: {err.name()} ({err.str()}) for {where}",
            fix,
            retryable=not fatal and not err.fatal(),
            delivered=delivered,
        )

    # -- delivery -----------------------------------------------------------------------------
    def _ensure_topics(self, producer: Any, topics: set[str]) -> None:
        known = known_topics(producer)
        missing = topics - known
        if not missing:
            return
        meta = producer.list_topics(timeout=10)
        existing = set(meta.topics)
        new = missing - existing
        if new and self.config.create_topics:
            admin = confluent().admin.AdminClient(
                {
                    **{k: v for k, v in self.settings.items() if not k.startswith(_PRODUCER_ONLY)},
                    "logger": LIBRDKAFKA_LOG,
                }
            )
            NewTopic = confluent().admin.NewTopic
            futures = admin.create_topics(
                [NewTopic(t, num_partitions=self.config.topic_partitions) for t in sorted(new)]
            )
            for topic, fut in futures.items():
                try:
                    fut.result(15)
                except Exception as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise SinkError(
                            f"Kafka: cannot create topic {topic!r}: {exc}",
                            "create the topic yourself, or give the producer CREATE permission",
                            retryable=True,
                        ) from exc
            existing |= new
        known |= existing & missing

    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        default = self.config.topic
        if default is None and not all(m.route for m in messages):
            raise SinkError(
                "Kafka: a message has no topic (no destination.topic, no topic of its format)",
                "set destination.topic",
                retryable=False,
            )
        ikeys = [m.idempotency_key for m in messages]
        self._send(
            [m.route or default or "" for m in messages],
            [m.value for m in messages],
            [m.key for m in messages],
            (ikeys, [m.lsn for m in messages], [m.table for m in messages]),
            lambda failed: _failed_indices(
                [(i, m.value is None, m.key) for i, m in zip(ikeys, messages, strict=True)],
                failed,
            ),
        )

    def deliver_columns(self, batch: Any) -> None:
        """An Arrow batch of SQL-formatted messages (see `Sink.deliver_columns`), sent from
        its columns: the produce call is the only step per message. A SinkError's
        `delivered` holds row indices of the batch."""
        import pyarrow.compute as pc

        n = batch.num_rows
        if n == 0:
            return
        col = dict(zip(batch.schema.names, batch.columns, strict=True))
        default = self.config.topic or ""  # no topic: only with format debezium (not here)
        routes = col["_route"].to_pylist() if "_route" in col else None
        topics = [r or default for r in routes] if routes else [default] * n
        ikeys = col["_ikey"].to_pylist()
        with no_pandas():  # "." is converted from Python (see nopandas.py)
            tables = pc.binary_join_element_wise(col["schema"], col["table"], ".").to_pylist()
        lsns = col["lsn"].to_pylist()
        keys = col["_key"].to_pylist()
        self._send(
            topics,
            col["_message"].to_pylist(),
            keys,
            (ikeys, lsns, tables),
            lambda failed: _failed_indices(
                [
                    (i, False, None if k is None else k.encode())
                    for i, k in zip(ikeys, keys, strict=True)
                ],
                failed,
            ),
        )

    def _send(
        self,
        topics: list[str],
        values: list[Any],
        keys: list[Any],
        named: tuple[list[str], list[int], list[str]],
        locate: Any,
    ) -> None:
        """Produce every message (parallel lists) and wait for each one's report; raise a
        SinkError whose `delivered` holds the indices acknowledged when any failed.
        `named`: each message's idempotency key, LSN and table, for its headers.
        `locate(failed)` maps failed reports to indices."""
        kafka = confluent()
        producer = producer_for(self.settings)
        try:
            self._ensure_topics(producer, set(topics))
        except kafka.KafkaException as exc:
            raise self._error(
                login_cause(producer, exc.args[0]), self.config.topic, frozenset()
            ) from exc
        # One callback for the whole chunk (a closure per message costs more than the
        # produce call's Python side); a failed report is traced back to its index
        # through the idempotency-key header, only on that (rare) path. The call passes
        # its arguments by position, (topic, value, key, partition, callback, on_delivery,
        # timestamp, headers): by keyword each call took ~0.4 µs more (a 1M backlog has
        # a million of them). The report goes in `callback`: with it None, `on_delivery`
        # would be ignored. Timestamp 0: the producer's time.
        failed: list[tuple[Any, Any]] = []
        acked = 0

        def report(err: Any, msg: Any) -> None:
            nonlocal acked
            if err is None:
                acked += 1
            else:
                failed.append((err, msg))

        errors: dict[int, Any] = {}  # produce() refused these outright
        produce = producer.produce
        ikeys, lsns, tables = named
        lsn_texts = {lsn: format_lsn(lsn) for lsn in set(lsns)}  # a transaction's share one
        for i, (topic, value, key, ikey, lsn, table) in enumerate(
            zip(topics, values, keys, ikeys, lsns, tables, strict=True)
        ):
            header = [
                ("idempotency-key", ikey),
                ("walstream-lsn", lsn_texts[lsn]),
                ("walstream-table", table),
            ]
            while True:
                try:
                    produce(topic, value, key, _ANY_PARTITION, report, None, 0, header)
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: let reports drain
                except kafka.KafkaException as exc:
                    errors[i] = exc.args[0]
                    break
        # Every produced message gets exactly one report within message.timeout.ms.
        expected = len(topics) - len(errors)
        deadline = time.monotonic() + int(self.settings["message.timeout.ms"]) / 1000 + 30
        while acked + len(failed) < expected:
            producer.flush(1.0)
            if time.monotonic() > deadline:
                forget_producer(producer)
                raise SinkError(
                    f"Kafka: {expected - acked - len(failed)} delivery reports missing after "
                    f"message.timeout.ms on {self.config.bootstrap_servers}",
                    "check the brokers; the producer is recreated for the next attempt",
                    retryable=True,
                )  # nothing known delivered: a retry may resend acknowledged messages
        if failed:
            errors.update(locate(failed))
        if errors:
            first = min(errors)
            err = login_cause(producer, errors[first])
            if err.fatal() or err.code() in _reset_codes():
                forget_producer(producer)  # the retry gets a new producer (and producer id)
            forget_topics(producer)  # a deleted topic is looked up (and created) again
            delivered = frozenset(range(len(topics))) - errors.keys()
            raise self._error(err, topics[first], delivered)

    def test_connection(self) -> None:
        kafka = confluent()
        try:
            meta = producer_for(self.settings).list_topics(timeout=5)
        except kafka.KafkaException as exc:
            raise SinkError(
                f"Kafka: cannot reach {self.config.bootstrap_servers}: {exc.args[0].str()}",
                "check destination.bootstrap_servers (and the producer's security settings) "
                "and that the brokers are up",
                retryable=True,
            ) from exc
        topic = self.config.topic
        if (
            topic is not None
            and is_name(topic)
            and topic not in meta.topics
            and not self.config.create_topics
        ):
            raise SinkError(
                f"Kafka: topic {topic!r} does not exist on {self.config.bootstrap_servers}",
                "create it, or set destination.create_topics: true",
                retryable=False,
            )


#: librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses (by key).
_ANY_PARTITION = -1


def _reset_codes() -> set[int]:
    """Errors after which this producer's idempotence state is not to be trusted.

    After messages time out, librdkafka bumps the producer epoch; a broker may then
    answer every produce with PRODUCER_FENCED (seen with tansu) and the cached
    producer would fail forever. A fresh producer starts a fresh sequence.
    """
    E = confluent().KafkaError
    return {
        E._MSG_TIMED_OUT,
        E.PRODUCER_FENCED,
        E._FENCED,
        E.INVALID_PRODUCER_EPOCH,
        E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        E.UNKNOWN_PRODUCER_ID,
        E._TIMED_OUT_QUEUE,
    }


def _failed_indices(
    sent: Sequence[tuple[str, bool, bytes | None]], failed: list[tuple[Any, Any]]
) -> dict[int, Any]:
    """Indices of the messages whose delivery report carried an error.

    `sent`: each message's idempotency key, whether it is a tombstone and its key, in
    order (the records of one change share its idempotency key: a delete and its
    tombstone; Debezium's delete and create of a primary-key update, under two keys). A
    report that cannot be matched (no headers: it should not happen) marks every message
    of the chunk failed, so a retry resends rather than loses.
    """
    index: dict[tuple[str, bool, bytes | None], list[int]] = {}
    for i, k in enumerate(sent):
        index.setdefault(k, []).append(i)
    out: dict[int, Any] = {}
    for err, msg in failed:
        ik = next((v for k, v in msg.headers() or () if k == "idempotency-key"), None)
        found = index.get((ik.decode() if ik else "", msg.value() is None, msg.key()))
        for i in found if found else range(len(sent)):
            out.setdefault(i, err)
    return out


_PRODUCER_ONLY = (
    "acks",
    "enable.idempotence",
    "linger",
    "message.",
    "compression",
    "batch.",
    "queue.",
    "retries",
    "max.in.flight",
    "delivery.",
    "request.",
    "partitioner",
    "sticky",
)
