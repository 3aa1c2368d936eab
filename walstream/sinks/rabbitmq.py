"""RabbitMQ sink (`type: rabbitmq`): persistent messages, publisher confirms, in order.

Each message goes to `exchange` with its routing key (a fixed key or a Spark SQL
expression), `delivery_mode` 2 (persistent), `mandatory` (a message no queue
takes comes back as an error instead of vanishing), `message_id` = its
idempotency key (base64 "lsn:seq"), and headers `walstream-table` and
`walstream-action`. A chunk is published on one channel without waiting for each
confirm; then every confirm is awaited, so `deliver` returns only when the broker
has taken responsibility for all of them (persisted, for durable queues).
RabbitMQ does not drop duplicates: a consumer recognises a replayed message by
`message_id`.

The client is aiormq (asyncio, the protocol layer of aio-pika): its connections
live on the worker's shared loop (`sinks/aio.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, SecretStr

from walstream.errors import SinkError, optional_import
from walstream.fields import Duration, is_name
from walstream.sinks import aio
from walstream.sinks.base import Message, MessageDestination, MessageSink, url_for_messages
from walstream.sinks.clients import Clients
from walstream.sinks.registry import register


class RabbitMqDestination(MessageDestination):
    """RabbitMQ: persistent messages with publisher confirms; `message_id` is the
    idempotency key. The exchange must exist (or `declare_exchange`)."""

    type: Literal["rabbitmq"]
    url: SecretStr = SecretStr("amqp://guest:guest@127.0.0.1:5672/%2F")
    exchange: str = ""  # "" is the default exchange: the routing key names a queue
    routing_key: str = Field(min_length=1)  # a routing key, or a Spark SQL expression
    declare_exchange: str | None = None  # e.g. "topic": declare `exchange` durable, this type
    timeout: Duration = 10.0

    def route_expression(self) -> str | None:
        return None if is_name(self.routing_key, "._-*#") else self.routing_key


#: (url) -> (connection, channel); a closed channel is reopened on the next chunk. Used
#: on the shared loop's thread only.
_CHANNELS: Clients[tuple[Any, Any]] = Clients()
#: (channel id, exchange) declared already (on the shared loop's thread only).
_DECLARED: set[tuple[int, str]] = set()


def _aiormq() -> Any:
    return optional_import("aiormq", "aiormq (the RabbitMQ sink)", "rabbitmq")


@register
class RabbitMqSink(MessageSink):
    settings_model = RabbitMqDestination
    extra = "rabbitmq"
    config: RabbitMqDestination

    def __init__(self, config: RabbitMqDestination) -> None:
        super().__init__(config)
        self.url = config.url.get_secret_value()

    async def _channel(self) -> Any:
        aiormq = _aiormq()
        conn: Any
        ch: Any
        conn, ch = _CHANNELS.find(self.url) or (None, None)
        if ch is not None and not ch.is_closed and not conn.is_closed:
            return await self._declared(ch)
        if conn is None or conn.is_closed:
            try:
                conn = await asyncio.wait_for(aiormq.connect(self.url), self.config.timeout)
            except aiormq.exceptions.ProbableAuthenticationError as exc:
                raise SinkError(
                    f"RabbitMQ: login refused by {url_for_messages(self.url, 5672)}: {exc}",
                    "put the right user and password in destination.url",
                    retryable=False,
                ) from exc
            except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
                raise SinkError(
                    f"RabbitMQ: cannot connect to {url_for_messages(self.url, 5672)}: {type(exc).__name__}: {exc}",
                    "check destination.url and that RabbitMQ is up",
                    retryable=True,
                ) from exc
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        _CHANNELS.put(self.url, (conn, ch))
        return await self._declared(ch)

    async def _declared(self, ch: Any) -> Any:
        """`ch`, once this sink's exchange is declared on it (`declare_exchange`). The
        channel is shared by every sink of the URL: each declares its own exchange."""
        kind, exchange = self.config.declare_exchange, self.config.exchange
        if kind and exchange and (id(ch), exchange) not in _DECLARED:
            await ch.exchange_declare(exchange, exchange_type=kind, durable=True)
            _DECLARED.add((id(ch), exchange))
        return ch

    async def _publish(self, messages: Sequence[Message]) -> list[Any]:
        from pamqp import commands as spec

        ch = await self._channel()
        exchange, default = self.config.exchange, self.config.routing_key
        # Tasks start in order and take the channel's (FIFO) lock in order: the frames
        # leave in chunk order while the confirms are awaited together.
        tasks = [
            asyncio.ensure_future(
                ch.basic_publish(
                    m.value or b"",
                    exchange=exchange,
                    routing_key=m.route or default,
                    mandatory=True,
                    properties=spec.Basic.Properties(
                        delivery_mode=2,
                        content_type="application/json",
                        message_id=m.idempotency_key,
                        headers={"walstream-table": m.table, "walstream-action": m.action},
                    ),
                )
            )
            for m in messages
        ]
        return await asyncio.gather(*tasks, return_exceptions=True)

    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        try:
            results = aio.run(self._publish(messages), self.config.timeout * 3)
        except SinkError:
            raise
        except Exception as exc:
            raise self._error(exc, messages[0], frozenset()) from exc
        failed = {i: r for i, r in enumerate(results) if not _confirmed(r)}
        if failed:
            first = min(failed)
            delivered = frozenset(range(len(messages))) - failed.keys()
            raise self._error(failed[first], messages[first], delivered, len(failed))

    def _error(self, exc: Any, m: Message, delivered: frozenset[int], n: int = 0) -> SinkError:
        aiormq = _aiormq()
        E = aiormq.exceptions
        key = m.route or self.config.routing_key
        where = f"exchange {self.config.exchange or '(default)'!r}, routing key {key!r}"
        count = f" ({n} of the chunk)" if n else ""
        if isinstance(exc, E.PublishError):
            return SinkError(
                f"RabbitMQ: no queue takes messages for {where}{count}",
                "bind a queue to the exchange for this routing key (or, with the default "
                "exchange, create the queue the routing key names)",
                retryable=False,
                delivered=delivered,
            )
        if isinstance(exc, E.ChannelNotFoundEntity | E.ChannelAccessRefused):
            return SinkError(
                f"RabbitMQ: {exc} ({where}){count}",
                "create the exchange (or set destination.declare_exchange), and grant the "
                "user write permission on it",
                retryable=False,
                delivered=delivered,
            )
        if not isinstance(exc, BaseException):  # a Basic.Nack: the broker could not take it
            return SinkError(
                f"RabbitMQ: the broker refused a message (nack) for {where}{count}",
                "check the broker's disk and memory alarms and its log",
                retryable=True,
                delivered=delivered,
            )
        return SinkError(
            f"RabbitMQ: {type(exc).__name__}: {exc or 'timed out'} on {url_for_messages(self.url, 5672)}{count}",
            "check that RabbitMQ is up and reachable at destination.url",
            retryable=True,
            delivered=delivered,
        )

    def test_connection(self) -> None:
        async def probe() -> None:
            ch = await self._channel()
            if self.config.exchange and not self.config.declare_exchange:
                await ch.exchange_declare(self.config.exchange, passive=True)

        try:
            aio.run(probe(), self.config.timeout * 2)
        except SinkError:
            raise
        except Exception as exc:
            _CHANNELS.forget(
                lambda url, _: url == self.url
            )  # a failed passive declare closes the channel
            raise SinkError(
                f"RabbitMQ: {type(exc).__name__}: {exc} on {url_for_messages(self.url, 5672)}",
                "check destination.url; create destination.exchange or set declare_exchange",
                retryable=not isinstance(exc, _aiormq().exceptions.ChannelNotFoundEntity),
            ) from exc


def _confirmed(result: Any) -> bool:
    """A publish result is an acknowledgement (Basic.Ack), not a nack or an exception."""
    from pamqp import commands as spec

    return isinstance(result, spec.Basic.Ack)
