"""The RabbitMQ sink with a named exchange: declared by walstream or missing, and the
headers a consumer reads (read back with pika, a second client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import unique
from tests.servers import Service
from tests.sinks.test_contract import run_batch, workload
from walstream.errors import SinkError
from walstream.sinks.registry import sink_for

pika = pytest.importorskip("pika")


@pytest.fixture
def amqp(rabbitmq_service: Service) -> Iterator[tuple[str, Any]]:
    url = f"amqp://guest:guest@127.0.0.1:{rabbitmq_service.port}/%2F"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    yield url, conn.channel()
    conn.close()


def bound_queue(ch: Any, exchange: str, key: str) -> str:
    queue = unique("q")
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, exchange, routing_key=key)
    return queue


def drain(ch: Any, queue: str) -> list[tuple[Any, bytes]]:
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((props, body))


def test_declare_exchange_makes_a_durable_exchange_of_that_type_and_headers_name_the_change(
    amqp: tuple[str, Any],
) -> None:
    url, ch = amqp
    exchange = unique("changes")
    dest = {"type": "rabbitmq", "url": url, "exchange": exchange, "routing_key": "app.items",
            "declare_exchange": "topic"}  # fmt: skip
    with pytest.raises(SinkError, match="no queue takes messages"):  # none bound yet
        run_batch(dest, workload(1, 1))  # ... but the exchange is declared
    ch.exchange_declare(exchange, "topic", durable=True, passive=True)  # it exists now
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="PRECONDITION_FAILED"):
        ch.exchange_declare(exchange, "direct", durable=True)  # ... and is a topic exchange
    ch = ch.connection.channel()
    queue = bound_queue(ch, exchange, "app.*")
    sent = workload(2, 3)
    run_batch(dest, sent)
    got = drain(ch, queue)
    assert [body for _, body in got] == [m.value for m in sent]
    for (props, _), m in zip(got, sent, strict=True):
        assert props.headers == {"walstream-table": m.table, "walstream-action": m.action}
        assert props.message_id == m.idempotency_key and props.delivery_mode == 2


def test_a_missing_exchange_is_not_retried_and_says_how_to_make_it(amqp: tuple[str, Any]) -> None:
    url, _ = amqp
    missing = unique("nowhere")
    dest = {"type": "rabbitmq", "url": url, "exchange": missing, "routing_key": "k"}
    with pytest.raises(SinkError) as err:
        run_batch(dest, workload(1, 2))
    e = err.value
    assert not e.retryable and e.delivered == frozenset()
    assert missing in e.problem and "declare_exchange" in e.fix
    with pytest.raises(SinkError) as err:  # walstream check's probe says the same
        sink_for_settings(dest).test_connection()
    assert not err.value.retryable and "declare_exchange" in err.value.fix


def sink_for_settings(dest: dict[str, Any]) -> Any:
    from pydantic import TypeAdapter

    from walstream.config import Destination

    return sink_for(TypeAdapter(Destination).validate_python(dest))
