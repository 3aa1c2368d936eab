"""NATS JetStream sink (`type: nats`): every message acknowledged by its stream.

Each message is published with the header `Nats-Msg-Id` = its idempotency key
(base64 "lsn:seq"), so JetStream drops a message it has seen within the stream's
duplicate window (2 minutes by default): a batch replayed after a crash adds
nothing. Also `walstream-table` and `walstream-action` headers. A chunk is
published in order on one connection without waiting for each acknowledgement
(`publish_async`), then every acknowledgement is awaited.

nats-py is asyncio: the connections live on the worker's shared loop (`sinks/aio.py`),
and `deliver` waits for its chunk there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from walstream.errors import SinkError, optional_import
from walstream.fields import Duration, is_name
from walstream.sinks import aio
from walstream.sinks.base import Message, MessageDestination, MessageSink, servers_for_messages
from walstream.sinks.clients import Clients
from walstream.sinks.registry import register


class NatsDestination(MessageDestination):
    """NATS JetStream: a publish per message with the `Nats-Msg-Id` header (the idempotency
    key), acknowledged by the stream, which drops a replayed message as a duplicate."""

    type: Literal["nats"]
    servers: str = "nats://127.0.0.1:4222"  # comma-separated
    subject: str = Field(min_length=1)  # a subject, or a Spark SQL expression
    stream: str | None = None  # expect this stream (its subjects must cover `subject`)
    create_stream: bool = False  # create `stream` for the subject(s) if it is missing
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    timeout: Duration = 10.0  # connect and acknowledgement timeout

    def route_expression(self) -> str | None:
        return None if is_name(self.subject, "._-*>") else self.subject

    @model_validator(mode="after")
    def _creatable(self) -> NatsDestination:
        if self.create_stream and (self.stream is None or self.route_expression() is not None):
            raise ValueError(
                "create_stream: needs `stream` and a plain `subject` (the stream is made for "
                "that subject); with a subject expression, create the stream yourself "
                "(nats stream add NAME --subjects 'prefix.>')"
            )
        return self


log = logging.getLogger(__name__)

#: Connections live on the shared loop; only its thread reads or writes them.
_CONNECTIONS: Clients[Any] = Clients()
_STREAMS_READY: set[tuple[Any, ...]] = set()

#: JetStream API error codes that a retry cannot fix (wrong stream, too large, ...).
_FATAL_CODES = {10060, 10054, 10055, 10026}


def _headers(m: Message) -> dict[str, str]:
    return {
        "Nats-Msg-Id": m.idempotency_key,
        "walstream-table": m.table,
        "walstream-action": m.action,
    }


def _nats() -> Any:
    nats = optional_import("nats", "nats-py (the NATS JetStream sink)", "nats")
    optional_import("nats.js.errors", "nats-py (the NATS JetStream sink)", "nats")
    return nats


@register
class NatsSink(MessageSink):
    settings_model = NatsDestination
    extra = "nats"
    config: NatsDestination

    def __init__(self, config: NatsDestination) -> None:
        super().__init__(config)
        c = config
        self.servers = [s.strip() for s in c.servers.split(",") if s.strip()]
        self.key = (
            tuple(self.servers),
            c.user,
            c.password.get_secret_value() if c.password else None,
            c.token.get_secret_value() if c.token else None,
        )

    # -- running coroutines on the shared loop -----------------------------------------------
    def _run(self, coro: Any, timeout: float) -> Any:
        try:
            return aio.run(coro, timeout)
        except TimeoutError:
            raise SinkError(
                f"NATS: no answer within {timeout:.0f}s from {servers_for_messages(self.config.servers)}",
                "check that the NATS servers are up and JetStream is enabled (-js)",
                retryable=True,
            ) from None

    async def _connection(self) -> Any:
        nc = _CONNECTIONS.find(self.key, lambda c: not c.is_closed)
        if nc is not None:
            return nc
        nats = _nats()
        c = self.config
        seen: list[Exception] = []  # what the server said while connecting

        async def on_error(exc: Exception) -> None:
            seen.append(exc)
            log.debug("NATS: %s: %s", type(exc).__name__, exc)

        try:
            nc = await nats.connect(
                servers=self.servers,
                user=c.user,
                password=c.password.get_secret_value() if c.password else None,
                token=c.token.get_secret_value() if c.token else None,
                connect_timeout=c.timeout,
                allow_reconnect=True,
                max_reconnect_attempts=3,
                reconnect_time_wait=0.5,
                error_cb=on_error,
            )
        except Exception as exc:
            # A refused login comes as an error per attempt, then NoServersError.
            denied = [
                e
                for e in [exc, *seen]
                if isinstance(e, nats.errors.AuthorizationError)
                or "authorization violation" in str(e).lower()
            ]
            if denied:
                raise SinkError(
                    f"NATS: authorization failed on {servers_for_messages(c.servers)}: {denied[0]}",
                    "put the right destination.user and password (or token); the server "
                    "refuses these",
                    retryable=False,
                ) from exc
            raise SinkError(
                f"NATS: cannot connect to {servers_for_messages(c.servers)}: {type(exc).__name__}: {exc}",
                "check destination.servers (and user/password/token) and that NATS is up",
                retryable=True,
            ) from exc
        _CONNECTIONS.put(self.key, nc)
        return nc

    async def _ensure_stream(self, js: Any) -> None:
        c = self.config
        ready = (self.key, c.stream)
        if not c.create_stream or c.stream is None or ready in _STREAMS_READY:
            return
        nats = _nats()
        try:
            await js.stream_info(c.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(name=c.stream, subjects=[c.subject])
        _STREAMS_READY.add(ready)

    async def _publish(self, messages: Sequence[Message]) -> list[Any]:
        """Each message's acknowledgement (or exception), in order. A message larger than
        the server takes is not sent, nor is any after it: theirs is a MaxPayloadError."""
        nc = await self._connection()
        js = nc.jetstream(timeout=self.config.timeout)
        await self._ensure_stream(js)
        default = self.config.subject
        futures = []
        too_large: list[Any] = []
        for i, m in enumerate(messages):
            if len(m.value or b"") > nc.max_payload:
                too_large = [_nats().errors.MaxPayloadError()] * (len(messages) - i)
                break
            futures.append(
                await js.publish_async(
                    m.route or default,
                    m.value or b"",
                    headers=_headers(m),
                    stream=self.config.stream,
                )
            )
        await nc.flush(self.config.timeout)
        acks = await asyncio.gather(
            *(asyncio.wait_for(f, self.config.timeout) for f in futures), return_exceptions=True
        )
        return [*acks, *too_large]

    async def _publish_one(self, m: Message) -> Any:
        nc = await self._connection()
        js = nc.jetstream(timeout=self.config.timeout)
        return await js.publish(
            m.route or self.config.subject,
            m.value or b"",
            headers=_headers(m),
            stream=self.config.stream,
        )

    # -- the contract ------------------------------------------------------------------------
    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        try:
            acks = self._run(self._publish(messages), self.config.timeout * 3 + 5)
        except SinkError:
            raise
        except Exception as exc:  # connection lost before all were sent: none known delivered
            raise self._error(exc, messages[0], frozenset()) from exc
        failed = {i: a for i, a in enumerate(acks) if isinstance(a, BaseException)}
        if failed and isinstance(failed[min(failed)], TimeoutError):
            # nats-py (2.16) never resolves publish_async's future when JetStream refuses
            # the message (wrong expected stream, ...): it looks like a timeout. Publish the
            # first one again, waiting for its answer (the same Nats-Msg-Id: JetStream keeps
            # one copy), to learn why.
            first = min(failed)
            try:
                self._run(self._publish_one(messages[first]), self.config.timeout * 2 + 5)
            except SinkError:
                raise
            except Exception as exc:
                failed[first] = exc
            else:
                del failed[first]
        if failed:
            first = min(failed)
            delivered = frozenset(range(len(messages))) - failed.keys()
            raise self._error(failed[first], messages[first], delivered, len(failed))

    def _error(
        self, exc: BaseException, m: Message, delivered: frozenset[int], n: int = 0
    ) -> SinkError:
        nats = _nats()
        subject = m.route or self.config.subject
        count = f" ({n} of the chunk)" if n else ""
        if isinstance(exc, nats.errors.NoRespondersError | nats.js.errors.NoStreamResponseError):
            return SinkError(
                f"NATS: no JetStream stream takes subject {subject!r}{count}",
                "add a stream whose subjects cover it, or set destination.stream and "
                "create_stream: true",
                retryable=False,
                delivered=delivered,
            )
        if isinstance(exc, nats.errors.MaxPayloadError):
            return SinkError(
                f"NATS: a message is larger than the server's max_payload{count}",
                "raise max_payload on the server, or filter/transform the large rows",
                retryable=False,
                delivered=delivered,
            )
        if isinstance(exc, nats.js.errors.APIError):
            code = getattr(exc, "err_code", None)
            return SinkError(
                f"NATS: JetStream refused a message on {subject!r}: {exc}{count}",
                "check destination.stream against the stream that holds the subject"
                if code in _FATAL_CODES
                else "check the stream's limits and the server log",
                retryable=code not in _FATAL_CODES,
                delivered=delivered,
            )
        return SinkError(
            f"NATS: {type(exc).__name__}: {exc or 'timed out'} on {subject!r}{count}",
            "check that the NATS servers are up and JetStream is enabled (-js)",
            retryable=True,
            delivered=delivered,
        )

    def test_connection(self) -> None:
        async def probe() -> None:
            nc = await self._connection()
            js = nc.jetstream(timeout=self.config.timeout)
            await js.account_info()
            if self.config.stream and not self.config.create_stream:
                await js.stream_info(self.config.stream)

        try:
            self._run(probe(), self.config.timeout * 2 + 5)
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"NATS: JetStream is not usable on {servers_for_messages(self.config.servers)}: "
                f"{type(exc).__name__}: {exc}",
                "start the server with JetStream (-js); create destination.stream or set "
                "create_stream: true",
                retryable=True,
            ) from exc
