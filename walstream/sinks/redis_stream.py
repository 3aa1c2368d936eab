"""Redis Streams sink (`type: redis_stream`): XADD per message, one pipeline per chunk.

Each entry has the fields `message` (the formatted change), `idempotency_key`
(base64 "lsn:seq") and `key` (the message key, e.g. the primary key). A chunk is
sent as one non-transactional pipeline on one connection, so Redis applies the
XADDs in order; each reply says whether that entry was added. `maxlen` trims each
stream with `MAXLEN ~` (approximate, cheap). Redis assigns entry IDs and cannot
recognise a replayed message: a batch replayed after a crash adds its entries
again, which the consumer drops by `idempotency_key`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, SecretStr

from walstream.errors import SinkError, optional_import
from walstream.fields import Duration, is_name
from walstream.sinks.base import Message, MessageDestination, MessageSink, url_for_messages
from walstream.sinks.clients import Clients
from walstream.sinks.registry import register


class RedisStreamDestination(MessageDestination):
    """Redis Streams: one XADD per message (fields `message`, `idempotency_key`, `key`),
    pipelined per chunk on one connection, so a stream receives them in order."""

    type: Literal["redis_stream"]
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")  # may hold a password
    stream: str = Field(min_length=1)  # a stream name, or a Spark SQL expression
    maxlen: int | None = Field(None, ge=1)  # trim each stream to about this many entries
    timeout: Duration = 10.0  # socket timeout per chunk

    def route_expression(self) -> str | None:
        return None if is_name(self.stream, "._-:{}") else self.stream


_CLIENTS: Clients[Any] = Clients()

#: Replies that say Redis could take the command later (memory, replicas, loading).
_TRANSIENT = ("OOM", "BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOREPLICAS")
#: redis-py turns these replies into their own classes and drops the code from the text.
_CODE_OF = {
    "OutOfMemoryError": "OOM",
    "ReadOnlyError": "READONLY",
    "BusyLoadingError": "LOADING",
    "TryAgainError": "TRYAGAIN",
    "MasterDownError": "MASTERDOWN",
}


def _reply(err: Exception) -> str:
    """An error reply as Redis sent it: its code first."""
    text = str(err)
    code = _CODE_OF.get(type(err).__name__)
    return f"{code} {text}" if code and not text.startswith(code) else text


def _redis() -> Any:
    return optional_import("redis", "redis (the Redis Streams sink)", "redis")


def client_for(url: str, timeout: float) -> Any:
    """One client (with its connection pool) per URL per worker process."""
    return _CLIENTS.get(
        (url, timeout),
        lambda: _redis().Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        ),
    )


@register
class RedisStreamSink(MessageSink):
    settings_model = RedisStreamDestination
    extra = "redis"
    config: RedisStreamDestination

    def __init__(self, config: RedisStreamDestination) -> None:
        super().__init__(config)
        self.url = config.url.get_secret_value()

    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        redis = _redis()
        client = client_for(self.url, self.config.timeout)
        maxlen = self.config.maxlen
        pipe = client.pipeline(transaction=False)
        for m in messages:
            fields = {
                "message": m.value or b"",
                "idempotency_key": m.idempotency_key,
                "key": m.key or b"",
            }
            pipe.xadd(m.route or self.config.stream, fields, maxlen=maxlen, approximate=True)
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.AuthenticationError as exc:
            raise self._auth_error(exc) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Some commands may have been applied before the connection broke: none is
            # known to be delivered, so a retry can add entries twice (see the docstring).
            # LOADING comes this way too (redis-py counts it as a connection error).
            loading = isinstance(exc, redis.exceptions.BusyLoadingError)
            raise SinkError(
                f"Redis: {_reply(exc) if loading else f'{type(exc).__name__}: {exc}'} on "
                f"{url_for_messages(self.url, 6379)}",
                "Redis is reading its data back after a restart; walstream retries"
                if loading
                else "check that Redis is up and reachable at destination.url",
                retryable=True,
            ) from exc
        failed = {i: r for i, r in enumerate(replies) if isinstance(r, Exception)}
        if not failed:
            return
        first = min(failed)
        err = failed[first]
        text = _reply(err)
        transient = text.startswith(_TRANSIENT)
        stream = messages[first].route or self.config.stream
        fix = (
            "Redis is short of memory or busy: raise maxmemory, trim streams (destination.maxlen)"
            if transient
            else f"the key {stream!r} holds another type: route to another stream name, or "
            "delete that key"
            if text.startswith("WRONGTYPE")
            else "see the Redis error"
        )
        raise SinkError(
            f"Redis: XADD to {stream!r} failed: {text} ({len(failed)} of {len(messages)} "
            f"entries) on {url_for_messages(self.url, 6379)}",
            fix,
            retryable=transient,
            delivered=frozenset(range(len(messages))) - failed.keys(),
        )

    def _auth_error(self, exc: Exception) -> SinkError:
        return SinkError(
            f"Redis: authentication failed on {url_for_messages(self.url, 6379)}: {exc}",
            "put the right user and password in destination.url",
            retryable=False,
        )

    def test_connection(self) -> None:
        redis = _redis()
        try:
            client_for(self.url, self.config.timeout).ping()
        except redis.AuthenticationError as exc:
            raise self._auth_error(exc) from exc
        except redis.RedisError as exc:
            raise SinkError(
                f"Redis: cannot reach {url_for_messages(self.url, 6379)}: {exc}",
                "check destination.url and that Redis is up",
                retryable=True,
            ) from exc
