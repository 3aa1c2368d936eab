"""The three sink kinds: each sink is the class its capabilities name; message sinks are
those whose settings take `retry_timeout` (inline retries, then parking), read by the
pipeline from one place (`sinks.base.retry_timeout`)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from walstream.lake.contract import TableSink
from walstream.sinks.base import (
    RETRY_TIMEOUT,
    BatchSink,
    Capabilities,
    Kind,
    MessageDestination,
    MessageSink,
    retry_timeout,
)
from walstream.sinks.registry import (
    capabilities,
    destination_union,
    sink_for,
    sink_types,
    task_sink_for,
)

MESSAGE_SINKS = {"kafka", "webhook", "redis_stream", "nats", "rabbitmq", "postgres", "faulty"}
#: The least each type needs besides `type` and `retry_timeout`.
REQUIRED = {
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic": "t"},
    "webhook": {"url": "http://127.0.0.1:9/hook"},
    "redis_stream": {"url": "redis://127.0.0.1:6379", "stream": "s"},
    "nats": {"servers": "nats://127.0.0.1:4222", "subject": "s"},
    "rabbitmq": {"url": "amqp://127.0.0.1:5672", "exchange": "x", "routing_key": "k"},
    "postgres": {"dsn": "postgresql://127.0.0.1/db"},
    "faulty": {"inner": {"type": "file", "path": "/tmp/walstream-faulty"}},
}


def test_the_message_sinks_are_those_whose_settings_are_message_settings() -> None:
    kinds = {name for name, cls in sink_types().items()
             if issubclass(cls.settings_model, MessageDestination)}  # fmt: skip
    assert kinds == MESSAGE_SINKS


@pytest.mark.parametrize("name", sorted(MESSAGE_SINKS))
def test_a_message_sink_takes_its_retry_timeout(name: str) -> None:
    adapter = TypeAdapter(destination_union())
    default = adapter.validate_python({"type": name, **REQUIRED[name]})
    assert retry_timeout(default) == (0.5 if name == "faulty" else RETRY_TIMEOUT)
    set_ = adapter.validate_python({"type": name, **REQUIRED[name], "retry_timeout": "7s"})
    assert retry_timeout(set_) == 7.0


def test_a_batch_sink_refuses_retry_timeout_and_keeps_the_default() -> None:
    adapter = TypeAdapter(destination_union())
    file = adapter.validate_python({"type": "file", "path": "/tmp/walstream-x"})
    assert retry_timeout(file) == RETRY_TIMEOUT
    with pytest.raises(ValidationError, match="retry_timeout"):
        adapter.validate_python({"type": "file", "path": "/tmp/walstream-x", "retry_timeout": "7s"})


KIND_CLASSES = {Kind.MESSAGES: MessageSink, Kind.BATCHES: BatchSink, Kind.TABLES: TableSink}


def test_every_sink_is_of_the_kind_its_capabilities_name() -> None:
    kinds = {}
    for name, cls in sink_types().items():
        if name == "faulty":  # a wrapper: the wrapped sink's kind, per instance
            continue
        caps = cls.capabilities
        assert issubclass(cls, KIND_CLASSES[caps.kind]), name
        assert caps.ledger == (caps.kind is Kind.MESSAGES)
        kinds[name] = caps.kind
    assert {n for n, k in kinds.items() if k is Kind.MESSAGES} == MESSAGE_SINKS - {"faulty"}
    assert {n for n, k in kinds.items() if k is Kind.BATCHES} == {"file", "stream"}
    assert {n for n, k in kinds.items() if k is Kind.TABLES} == {"delta", "iceberg"}


def test_only_kafka_has_tombstones_and_a_wrapper_has_its_inner_sinks_capabilities() -> None:
    adapter = TypeAdapter(destination_union())
    assert {n for n, c in sink_types().items() if c.capabilities.tombstones} == {"kafka"}
    wrapped = adapter.validate_python({"type": "faulty", "inner": {
        "type": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "t"}})  # fmt: skip
    assert capabilities(wrapped) == sink_types()["kafka"].capabilities
    faulty = sink_for(wrapped).capabilities  # it injects faults per message: no columns
    assert faulty == Capabilities(Kind.MESSAGES, columns=False, tombstones=True)
    file = adapter.validate_python({"type": "faulty", "inner": {"type": "file", "path": "/x"}})
    assert capabilities(file).kind is Kind.BATCHES
    with pytest.raises(TypeError, match="writes tables"):
        task_sink_for(adapter.validate_python({"type": "delta", "path": "/tmp/x"}))
