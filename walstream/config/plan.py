"""resolve(): a validated Config -> the immutable Plan the runtime runs.

The plan is what the YAML means once every default and shorthand is spelled out:
a sharded source is one source per shard (and each of its sinks one sink per
shard); event subscriptions read the outbox table; every sink's destination knows
its source and the state database (`DestinationSettings.resolved`). Nothing here
changes a validated model: each step makes new ones.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from walstream.config.model import Config
from walstream.config.sections import (
    EventsConfig,
    ServerConfig,
    SourceConfig,
    SparkConfig,
    StateConfig,
)
from walstream.config.sink import SinkConfig
from walstream.errors import ConfigError
from walstream.sinks.base import DestinationSettings, SinkContext


@dataclass(frozen=True)
class Plan:
    """What `walstream run` runs: sources and sinks after sharding, events and wiring."""

    state: StateConfig
    spark: SparkConfig
    server: ServerConfig
    events: EventsConfig | None
    sources: tuple[SourceConfig, ...]
    sinks: tuple[SinkConfig, ...]
    state_dsn: str = field(repr=False)  # may hold a password: never printed

    def source(self, name: str) -> SourceConfig:
        return next(s for s in self.sources if s.name == name)

    def sink(self, name: str) -> SinkConfig:
        found = next((s for s in self.sinks if s.name == name), None)
        if found is None:
            raise ConfigError(
                f"no sink named {name!r} in the config",
                f"use one of: {', '.join(s.name for s in self.sinks)}",
            )
        return found

    def sinks_of(self, source: str) -> list[SinkConfig]:
        return [s for s in self.sinks if s.source == source]

    def streams(self) -> dict[str, list[SinkConfig]]:
        """Each stream (`type: stream` destinations) and the sinks feeding it."""
        out: dict[str, list[SinkConfig]] = {}
        for sink in self.sinks:
            stream = sink.destination.pull_stream()
            if stream is not None:
                out.setdefault(stream, []).append(sink)
        return out


def resolve(config: Config) -> Plan:
    """The Plan of a validated Config; a problem between sections is a ValueError."""
    sources, sinks = _shards(list(config.sources), list(config.sinks))
    _unique(sources, sinks)
    known = [s.name for s in sources]
    for i, sink in enumerate(sinks):
        if sink.source not in known:
            raise ValueError(
                f"sinks[{i}].source: {sink.source!r} is not a source; sources are {known}"
            )
    state_dsn = config.state_dsn
    sources, sinks = _events(config, sources, sinks)
    by_name = {s.name: s for s in sources}
    sinks = [
        k.model_copy(
            update={
                "destination": k.destination.resolved(
                    SinkContext(
                        source=k.source,
                        source_dsn=by_name[k.source].dsn.get_secret_value(),
                        state_dsn=state_dsn,
                        state_schema=config.state.schema_,
                    )
                )
            }
        )
        for k in sinks
    ]
    by_type: dict[type[DestinationSettings], list[tuple[int, SinkConfig]]] = {}
    for i, sink in enumerate(sinks):  # each sink type's checks across its sinks
        by_type.setdefault(type(sink.destination), []).append((i, sink))
    for settings, of_type in by_type.items():
        settings.check_sinks(of_type)
    return Plan(
        state=config.state,
        spark=config.spark,
        server=config.server,
        events=config.events,
        sources=tuple(sources),
        sinks=tuple(sinks),
        state_dsn=state_dsn,
    )


def _unique(sources: list[SourceConfig], sinks: list[SinkConfig]) -> None:
    for kind, names in (
        ("sources", [s.name for s in sources]),
        ("sinks", [s.name for s in sinks]),
        ("sources (slot)", [s.slot_name for s in sources]),
    ):
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"{kind}: names must be unique, {sorted(dup)} appear twice")


def _shards(
    sources: list[SourceConfig], sinks: list[SinkConfig]
) -> tuple[list[SourceConfig], list[SinkConfig]]:
    """A sharded source becomes one source per shard, `<name>-<i>` (slot and publication
    `<slot>_<i>`, `<publication>_<i>`, the shard's tables), and each of its sinks one
    sink per shard, `<sink>-<i>` (see `DestinationSettings.for_shard`)."""
    sharded = {s.name: s for s in sources if s.shards}
    if not sharded:
        return sources, sinks
    out_sources: list[SourceConfig] = []
    for s in sources:
        if not s.shards:
            out_sources.append(s)
            continue
        for i, tables in enumerate(s.shards, 1):
            out_sources.append(
                s.model_copy(
                    update={
                        "name": f"{s.name}-{i}",
                        "slot": f"{s.slot_name}_{i}",
                        "publication": f"{s.publication_name}_{i}",
                        "tables": list(tables),
                        "shards": None,
                    }
                )
            )
    out_sinks: list[SinkConfig] = []
    for k in sinks:
        parent = sharded.get(k.source)
        if parent is None or parent.shards is None:
            out_sinks.append(k)
            continue
        for i in range(1, len(parent.shards) + 1):
            out_sinks.append(
                k.model_copy(
                    update={
                        "name": f"{k.name}-{i}",
                        "source": f"{parent.name}-{i}",
                        "destination": k.destination.for_shard(i),
                    }
                )
            )
    return out_sources, out_sinks


def _events(
    config: Config, sources: list[SourceConfig], sinks: list[SinkConfig]
) -> tuple[list[SourceConfig], list[SinkConfig]]:
    """Event subscriptions read the outbox's inserts; other sinks leave the outbox out."""
    ev = config.events
    names = [s.name for s in sources]
    if ev is not None and ev.source not in names:
        raise ValueError(f"events.source: {ev.source!r} is not a source; sources are {names}")
    outbox = (config.state.schema_, "events")
    out: list[SinkConfig] = []
    for i, sink in enumerate(sinks):
        if sink.event_types is None:
            sink = sink.model_copy()
            if ev is not None and sink.source == ev.source:
                sink._outbox = outbox
            out.append(sink)
            continue
        if ev is None or sink.source != ev.source:
            raise ValueError(
                f"sinks[{i}].event_types: events come from the outbox of events.source; "
                + ("add an events: section" if ev is None else f"set source: {ev.source}")
            )
        update: dict[str, Any] = {}
        if not sink.tables:
            update["tables"] = [f"{outbox[0]}.{outbox[1]}"]
        if "actions" not in sink.model_fields_set:
            update["actions"] = ["insert"]
        if "format" not in sink.model_fields_set:
            update["format"] = "record"  # the event itself: id, event_type, payload, ...
        out.append(sink.model_copy(update=update))
    if ev is not None:
        name = f"{outbox[0]}.{outbox[1]}"
        sources = [
            s.model_copy(update={"tables": [*s.tables, name]})
            if s.name == ev.source
            and s.tables
            and not any(fnmatch.fnmatchcase(name, t) for t in s.tables)
            else s
            for s in sources
        ]
    return sources, out
