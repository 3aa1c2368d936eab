"""The Kafka sink against a real broker (tansu): what `deliver` reports when some
or all messages of a chunk fail, so the delivery layer retries exactly those."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.conftest import unique
from tests.kafka import consume_all
from walstream.change import idempotency_key
from walstream.config import parse_config
from walstream.errors import SinkError
from walstream.sinks.base import BatchInfo, Message
from walstream.sinks.kafka.sink import KafkaSink
from walstream.testing import TansuBroker

pytestmark = pytest.mark.kafka


def kafka_sink(
    bootstrap: str, topic: str, create_topics: bool = True, **producer: Any
) -> KafkaSink:
    cfg = parse_config(
        {
            "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1:1/db"}],
            "sinks": [
                {
                    "name": "k", "source": "app",
                    "destination": {
                        "type": "kafka", "bootstrap_servers": bootstrap, "topic": topic,
                        "create_topics": create_topics, "producer": producer,
                    },
                }
            ],
        }
    )  # fmt: skip
    sink = KafkaSink(cfg.sinks[0].destination)
    sink.begin(BatchInfo("k", 0, 0, 1))
    return sink


def message(n: int, value: bytes | None = None) -> Message:
    return Message(
        100 + n, 0, value if value is not None else f'{{"n":{n}}}'.encode(), f"k{n}".encode(),
        table="public.t", action="insert",
    )  # fmt: skip


def test_a_refused_message_is_named_and_the_rest_of_the_chunk_is_acknowledged(
    kafka: TansuBroker,
) -> None:
    topic = unique("sink")
    sink = kafka_sink(kafka.bootstrap_servers, topic, **{"message.max.bytes": 10_000})
    chunk = [message(0), message(1), message(2, b"x" * 20_000), message(3), message(4)]

    with pytest.raises(SinkError) as info:
        sink.deliver(chunk)

    err = info.value
    assert not err.retryable  # the same message would be refused again: a dead letter later
    assert "MSG_SIZE_TOO_LARGE" in err.problem
    assert "max.message.bytes" in (err.fix or "")
    assert err.delivered == frozenset({0, 1, 3, 4})
    got = consume_all(kafka.bootstrap_servers, topic, at_least=4)
    assert [m.key() for m in got] == [b"k0", b"k1", b"k3", b"k4"]
    assert [dict(m.headers())["idempotency-key"].decode() for m in got] == [
        idempotency_key(100 + n, 0) for n in (0, 1, 3, 4)
    ]


def test_a_hung_broker_fails_every_report_retryably_and_a_retry_delivers_all() -> None:
    topic = unique("sink")
    with TansuBroker() as broker:
        sink = kafka_sink(broker.bootstrap_servers, topic, **{"message.timeout.ms": 1500})
        sink.deliver([message(0)])  # the topic exists and is known before the broker hangs
        chunk = [message(1), message(2), Message(102, 0, None, b"k2", action="tombstone")]
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(SinkError) as info:
                sink.deliver(chunk)
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        err = info.value
        assert err.retryable
        assert "timed out" in err.problem.lower()
        assert err.delivered == frozenset()  # no report said delivered: all are retried

        # The broker is back. The delivery layer retries retryable errors: librdkafka may
        # first report the producer fenced (it bumped its epoch after the timeouts), and
        # the sink then recreates the producer.
        errors = []
        for _ in range(5):
            try:
                sink.deliver(chunk)
                break
            except SinkError as exc:
                errors.append(exc)
                assert exc.retryable, exc
        else:
            raise AssertionError(f"still failing after 5 retries: {errors}")

        got = consume_all(broker.bootstrap_servers, topic, at_least=4)
        # The timed-out requests may still have landed once the broker resumed: a retry
        # can duplicate (the ledger's window), never lose. Order holds per key.
        keys = [m.key() for m in got]
        assert keys[0] == b"k0"
        assert set(keys) == {b"k0", b"k1", b"k2"}
        k2 = [m.value() for m in got if m.key() == b"k2"]
        assert k2[-2:] == [b'{"n":2}', None]  # the tombstone after its delete, last


def test_the_headers_name_the_change_and_its_position(kafka: TansuBroker) -> None:
    topic = unique("headers")
    sink = kafka_sink(kafka.bootstrap_servers, topic)
    sink.deliver([Message(0x1A2B3C4D5E, 7, b'{"n":1}', b"k1", table="public.t", action="update")])
    (got,) = consume_all(kafka.bootstrap_servers, topic, at_least=1)
    assert [(k, v.decode()) for k, v in got.headers()] == [
        ("idempotency-key", idempotency_key(0x1A2B3C4D5E, 7)),
        ("walstream-lsn", "1A/2B3C4D5E"),
        ("walstream-table", "public.t"),
    ]


def test_an_unknown_topic_without_create_topics_is_an_error_at_check(kafka: TansuBroker) -> None:
    """`walstream check` probes each sink: a missing topic it may not create is an error
    that a retry cannot fix. (tansu, like a Kafka with auto.create.topics.enable, makes a
    topic on the first message to it, so delivery itself cannot show it here.)"""
    topic = unique("absent")
    sink = kafka_sink(kafka.bootstrap_servers, topic, create_topics=False)
    with pytest.raises(SinkError) as info:
        sink.test_connection()
    err = info.value
    assert not err.retryable
    assert err.problem == f"Kafka: topic {topic!r} does not exist on {kafka.bootstrap_servers}"
    assert err.fix == "create it, or set destination.create_topics: true"
    kafka_sink(kafka.bootstrap_servers, topic, create_topics=True).test_connection()  # no error


def test_a_refused_login_is_not_retried_and_says_to_check_the_credentials() -> None:
    broker = TansuBroker(authentication=True).start()  # knows no users: refuses every login
    try:
        sink = kafka_sink(
            broker.bootstrap_servers, unique("locked"),
            **{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
               "sasl.username": "walstream", "sasl.password": "kafka-secret-3",
               "message.timeout.ms": 4000},
        )  # fmt: skip
        with pytest.raises(SinkError) as info:
            sink.deliver([message(0)])
    finally:
        broker.stop()
    err = info.value
    assert not err.retryable, err
    assert "AUTHENTICATION" in err.problem and "SASL" in err.problem
    assert "check the SASL credentials" in err.fix and "kafka-secret-3" not in str(err)


def test_librdkafka_says_each_line_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """A broker that is down makes librdkafka repeat its connection error every few
    milliseconds; walstream's log gets each line once (the SinkError says the rest)."""
    from walstream.postgres.embedded import free_port

    sink = kafka_sink(
        f"127.0.0.1:{free_port()}", unique("down"), create_topics=False,
        **{"message.timeout.ms": 3000, "reconnect.backoff.ms": 10,
           "reconnect.backoff.max.ms": 20},
    )  # fmt: skip
    with (
        caplog.at_level("DEBUG", logger="walstream.kafka.librdkafka"),
        pytest.raises(SinkError) as info,
    ):
        sink.deliver([message(0)])
    assert info.value.retryable
    lines = [r.getMessage() for r in caplog.records if r.name == "walstream.kafka.librdkafka"]
    assert any("Connection refused" in line for line in lines), lines
    assert len(lines) == len(set(lines)), lines
