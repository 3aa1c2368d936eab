"""The Kafka sink's producers: one per settings per worker process, librdkafka's log through
Python logging (each line at most once a minute), and why a message timed out when the
broker refused the login (librdkafka tells only its error callback)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from walstream.errors import optional_import
from walstream.sinks.clients import Clients

_PRODUCERS: Clients[Any] = Clients()
#: Topics known to exist, per producer (id): a metadata request only for a new topic.
_TOPICS: dict[int, set[str]] = {}
_LOCK = threading.Lock()


class _OncePerMinute(logging.Filter):
    """librdkafka repeats a failing connection's log line every few milliseconds per
    client; the same line passes at most once a minute (the batch's SinkError says the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text, now = record.getMessage(), time.monotonic()
        if now - self.last.get(text, -1e9) < 60:
            return False
        if len(self.last) > 1000:
            self.last.clear()
        self.last[text] = now
        return True


#: librdkafka's own log, through Python logging instead of raw stderr.
LIBRDKAFKA_LOG = logging.getLogger("walstream.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_OncePerMinute())


def confluent() -> Any:
    """The confluent_kafka module (an error naming the extra to install when it is missing)."""
    return optional_import("confluent_kafka", "confluent-kafka (the Kafka sink)", "kafka")


#: A producer's last refused login (its error_cb hears it): librdkafka only lets the
#: messages time out, and this says why (see `login_cause`).
_LOGIN_REFUSED: dict[int, Any] = {}


def producer_for(settings: dict[str, Any]) -> Any:
    """One producer per settings per worker process: connections and metadata are reused."""
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))

    def make() -> Any:
        E = confluent().KafkaError
        refused: list[Any] = []

        def on_error(err: Any) -> None:
            if err.code() in (E._AUTHENTICATION, E.SASL_AUTHENTICATION_FAILED):
                refused[:] = [err]
            LIBRDKAFKA_LOG.warning("%s", err.str())

        producer = confluent().Producer(
            {**settings, "logger": LIBRDKAFKA_LOG, "error_cb": on_error}
        )
        _LOGIN_REFUSED[id(producer)] = refused
        return producer

    return _PRODUCERS.get(key, make)


def login_cause(producer: Any, err: Any) -> Any:
    """The refused login behind a message that timed out or a broker that seemed
    unreachable, if there was one; else `err`."""
    E = confluent().KafkaError
    if err.code() not in (E._MSG_TIMED_OUT, E._TIMED_OUT, E._TRANSPORT):
        return err
    producer.poll(0)  # serves the error callbacks queued meanwhile
    refused = _LOGIN_REFUSED.get(id(producer))
    return refused[0] if refused else err


def known_topics(producer: Any) -> set[str]:
    """The topics known to exist for `producer`: the set itself, to add topics found."""
    with _LOCK:
        return _TOPICS.setdefault(id(producer), set())


def forget_topics(producer: Any) -> None:
    """Look every topic of `producer` up again (a deleted one is created again)."""
    with _LOCK:
        _TOPICS.pop(id(producer), None)


def forget_producer(producer: Any) -> None:
    """Drop `producer`: the next chunk gets a new one (and a new producer id)."""
    with _LOCK:
        _TOPICS.pop(id(producer), None)
        _LOGIN_REFUSED.pop(id(producer), None)
    _PRODUCERS.forget(lambda _, p: p is producer)
