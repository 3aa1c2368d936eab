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
    if kind == "faulty":
        from walstream.sinks.faulty import FaultySink

        return FaultySink(destination)
    raise ValueError(f"no sink for destination type {kind!r}")
