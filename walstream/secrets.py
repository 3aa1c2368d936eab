"""Secrets never leave: what counts as one, and how texts are cleaned of them.

A secret is any `SecretStr` of the config (passwords, tokens, signing secrets, DSNs,
Redis/RabbitMQ URLs) and the secret parts of plain settings: a password or user in a
URL (`nats://user:pass@host`), a URL's path and query (a Slack-style webhook URL *is*
its secret), libpq's `password` and `sslpassword`, and every Kafka producer setting
not on a short list of known-safe ones (`ssl.key.pem`, `sasl.oauthbearer.config`,
... hold key material).

`secret_values` collects them from a config or any part of it; `scrub` replaces each
in a text with `**********`. Sink errors are scrubbed with their sink's secrets where
they are caught (delivery, retrier, destination checks), `walstream run`'s log lines
with the whole config's, and the API scrubs what it serves from the state database.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, SecretStr

from walstream.errors import SinkError

MASK = "**********"
#: Shorter values are not masked in texts (a 2-letter password would blank every "ab").
MIN_LENGTH = 4

#: Kafka producer settings shown as they are; every other setting is hidden.
SAFE_KAFKA_SETTINGS = frozenset(
    {
        "acks",
        "request.required.acks",
        "compression.type",
        "compression.codec",
        "compression.level",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.size",
        "batch.num.messages",
        "message.max.bytes",
        "enable.idempotence",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "retries",
        "message.send.max.retries",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "request.timeout.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "socket.keepalive.enable",
        "socket.timeout.ms",
        "client.id",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "ssl.endpoint.identification.algorithm",
        "partitioner",
        "statistics.interval.ms",
        "topic.metadata.refresh.interval.ms",
        "metadata.max.age.ms",
        "api.version.request",
        "broker.address.family",
        "sticky.partitioning.linger.ms",
    }
)

#: libpq connection parameters that are secrets.
LIBPQ_SECRETS = ("password", "sslpassword")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"()`,]+", re.I)


def safe_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Kafka producer settings fit to show: the known-safe ones, the others hidden."""
    return {k: v if k in SAFE_KAFKA_SETTINGS else MASK for k, v in settings.items()}


def url_parts(url: str) -> set[str]:
    """The secret parts of a URL: user and password, path and query (beyond a bare `/`)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return set()
    out = {parts.password or ""}
    if parts.username and parts.password:
        out.add(parts.username)
    if parts.scheme in ("http", "https"):
        out.add(parts.query)
        if parts.path not in ("", "/"):
            out.add(parts.path + (f"?{parts.query}" if parts.query else ""))
            out.add(parts.path)
    return {p for p in out if p}


def dsn_parts(dsn: str) -> set[str]:
    """libpq's secret parameters of a connection string (URI or key=value)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # not a DSN: nothing to take apart
        return set()
    return {str(params[k]) for k in LIBPQ_SECRETS if params.get(k)}


def secret_values(obj: Any) -> set[str]:
    """Every secret in a config model (or dict, list, value), see the module docstring."""
    out: set[str] = set()
    _collect(obj, "", out)
    return {v for v in out if len(v) >= MIN_LENGTH}


def _collect(obj: Any, name: str, out: set[str]) -> None:
    if isinstance(obj, SecretStr):
        value = obj.get_secret_value()
        out.add(value)
        out |= url_parts(value) | dsn_parts(value)
    elif isinstance(obj, BaseModel):
        for field in type(obj).model_fields:
            _collect(getattr(obj, field), field, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # the config's Plan
        for f in dataclasses.fields(obj):
            _collect(getattr(obj, f.name), f.name, out)
    elif isinstance(obj, dict):
        if name == "producer":  # key material, passwords, OAuth configs ...
            out |= {
                v
                for k, v in obj.items()
                if k not in SAFE_KAFKA_SETTINGS and isinstance(v, str) and len(v) >= 8
            }
        for k, v in obj.items():
            _collect(v, str(k), out)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _collect(v, name, out)
    elif isinstance(obj, str) and name in ("url", "servers", "dsn", "source_dsn"):
        for url in _URL.findall(obj) or [obj]:  # a URL, or URLs inside an expression
            out |= url_parts(url)
        out |= dsn_parts(obj) if name.endswith("dsn") else set()


def scrub(text: str, values: Iterable[str]) -> str:
    """`text` with every secret (and its URL-encoded form) replaced by `**********`."""
    if not text:
        return text
    for value in sorted(values, key=len, reverse=True):
        for form in {value, quote(value, safe=""), quote(value)}:
            if form in text:
                text = text.replace(form, MASK)
    return text


def scrub_json(data: Any, values: Iterable[str]) -> Any:
    """A JSON value with every string scrubbed."""
    values = list(values)
    if isinstance(data, str):
        return scrub(data, values)
    if isinstance(data, dict):
        return {k: scrub_json(v, values) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub_json(v, values) for v in data]
    return data


def scrubbed(exc: SinkError, values: Iterable[str]) -> SinkError:
    """The same error with secrets scrubbed from its problem and fix (and without the
    client library's exception as its cause, whose text may hold them)."""
    values = list(values)
    problem, fix = scrub(exc.problem, values), scrub(exc.fix, values) if exc.fix else None
    if problem == exc.problem and fix == exc.fix:
        return exc
    return SinkError(
        problem,
        fix,
        retryable=exc.retryable,
        delivered=exc.delivered,
        retry_after=exc.retry_after,
        pause=exc.pause,
    )


class SecretFilter(logging.Filter):
    """Scrubs every record a handler emits (message and arguments, formatted first)."""

    def __init__(self, values: Iterable[str]) -> None:
        super().__init__()
        self.values = sorted(set(values), key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.values:
            message = record.getMessage()
            clean = scrub(message, self.values)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and record.exc_info[1] is not None:
                text = logging.Formatter().formatException(record.exc_info)
                record.exc_text = scrub(text, self.values)
                record.exc_info = None
        return True


def guard_logs(values: Iterable[str]) -> SecretFilter:
    """Scrub `values` from everything the root logger's handlers (and Python's last-resort
    handler) write from now on, in this process."""
    secret_filter = SecretFilter(values)
    handlers = [*logging.getLogger().handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        handler.addFilter(secret_filter)
    return secret_filter
