"""Destinations, and the SDK to write one: a sink is a module (or package) of its settings
and its class, one of the kinds below, decorated `@register`; walstream finds the
modules of this package and those its `walstream.sinks` entry points name (a package
of your own names its module there). CONTRIBUTING.md, "Adding a sink", walks through
each kind; table sinks derive from `walstream.lake.contract.TableSink`.
"""

from walstream.errors import SinkError
from walstream.sinks.base import (
    BatchInfo,
    BatchSink,
    Capabilities,
    DestinationSettings,
    Kind,
    Message,
    MessageDestination,
    MessageSink,
    Sink,
    SinkContext,
)
from walstream.sinks.registry import register

__all__ = [
    "BatchInfo",
    "BatchSink",
    "Capabilities",
    "DestinationSettings",
    "Kind",
    "Message",
    "MessageDestination",
    "MessageSink",
    "Sink",
    "SinkContext",
    "SinkError",
    "register",
]
