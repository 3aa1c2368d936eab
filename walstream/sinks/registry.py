"""Which Sink class serves which `destination.type`."""

from __future__ import annotations

from typing import Any

from walstream.sinks.base import Sink


def sink_for(destination: Any) -> Sink:
    """A new Sink for a destination config (imports the sink's module only when used)."""
    kind = destination.type
    if kind == "kafka":
        from walstream.sinks.kafka import KafkaSink

        return KafkaSink(destination)
    if kind == "file":
        from walstream.sinks.file import FileSink

        return FileSink(destination)
    if kind == "redis_stream":
        from walstream.sinks.redis_stream import RedisStreamSink

        return RedisStreamSink(destination)
    if kind == "nats":
        from walstream.sinks.nats import NatsSink

        return NatsSink(destination)
    if kind == "rabbitmq":
        from walstream.sinks.rabbitmq import RabbitMqSink

        return RabbitMqSink(destination)
    if kind == "webhook":
        from walstream.sinks.webhook import WebhookSink

        return WebhookSink(destination)
    if kind == "postgres":
        from walstream.sinks.postgres import PostgresSink

        return PostgresSink(destination)
    if kind == "stream":
        from walstream.sinks.stream import StreamSink

        return StreamSink(destination)
    if kind == "faulty":
        from walstream.sinks.faulty import FaultySink

        return FaultySink(destination)
    raise ValueError(f"no sink for destination type {kind!r}")
