"""A sink's settings: which changes, in which shape, to which destination, and what on failure."""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from walstream.fields import Duration, Model, Name
from walstream.sinks.base import Kind
from walstream.sinks.registry import capabilities, destination_union

Action = Literal["insert", "update", "delete", "truncate", "read"]
ACTIONS: tuple[Action, ...] = ("insert", "update", "delete", "truncate", "read")

if TYPE_CHECKING:
    from walstream.sinks.base import DestinationSettings as Destination
else:
    #: A `destination:` section: the settings of any registered sink, chosen by `type`.
    Destination = destination_union()


class BackoffConfig(Model):
    """Delay between attempts of a parked message: initial * 2^(n-1), at most max, ±20%."""

    initial: Duration = 1.0
    max: Duration = 600.0


class VerifySchedule(Model):
    """`verify:` — `walstream run` compares the sink with its source every `every`
    (docs/verify.md, "Scheduled verification")."""

    every: Annotated[Duration, Field(ge=60)]
    tables: list[str] = Field(default_factory=list)  # schema.table; default: every one
    repair: bool = False  # re-backfill the keys that differ
    wait: Duration = 300.0  # for the sink to apply the source up to a read
    chunk_size: int = Field(100_000, ge=1)


class SinkConfig(Model):
    name: Name
    source: str
    tables: list[str] = Field(default_factory=list)  # default: every table of the source
    actions: list[Action] = Field(default_factory=lambda: list(ACTIONS))
    filter: str | None = None  # Spark SQL boolean expression over the change columns
    transform: dict[str, str] | str | None = None  # {field: SQL expression} or "module:function"
    group_by: list[str] | None = None  # default: schema, table, pk
    format: Literal["sequin", "debezium", "record"] = "sequin"
    #: `format: debezium`'s settings, by Debezium's property names (formats/debezium.py).
    debezium: dict[str, str | int | bool] | None = None
    batch_size: int = Field(500, ge=1, le=100_000)
    partitions: int | None = Field(None, ge=1, le=1024)  # delivery parallelism
    tombstones: bool = False  # Kafka: a null-value message with the same key after each delete
    # When a message fails after the inline retries (destination.retry_timeout): parking.
    max_attempts: int = Field(10, ge=1, le=10_000)  # then a dead letter
    backoff: BackoffConfig = Field(default_factory=lambda: BackoffConfig.model_validate({}))
    max_parked: int = Field(100_000, ge=1)  # parked messages of this sink, at most
    on_full: Literal["pause", "discard"] = "pause"  # when max_parked is reached
    #: on_create: the first `walstream run` that has this sink backfills its tables.
    backfill: Literal["on_create"] | None = None
    #: A subscription to ingested events of these types (the outbox table's inserts).
    event_types: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    #: Compare the sink with its source on a schedule (docs/verify.md: which sinks can be).
    verify: VerifySchedule | None = None
    destination: Destination
    #: `(schema, table)` of the outbox when events are on (set by the plan): sinks without
    #: event_types and without tables leave it out.
    _outbox: tuple[str, str] | None = PrivateAttr(None)

    @field_validator("transform")
    @classmethod
    def _transform(cls, v: Any) -> Any:
        if isinstance(v, str) and not re.match(r"^[\w.]+:[A-Za-z_]\w*$", v):
            raise ValueError("a Python transform is 'module:function', e.g. 'myapp.cdc:shape'")
        if isinstance(v, dict) and not v:
            raise ValueError("give at least one field: {field: Spark SQL expression}")
        return v

    @model_validator(mode="after")
    def _table_rules(self) -> SinkConfig:
        if capabilities(self.destination).kind is not Kind.TABLES:
            return self
        kind = self.destination.type
        if self.transform is not None:
            raise ValueError(
                f"transform: a {kind} destination writes each table's own columns; remove the "
                "transform (choose columns with destination.columns, rows with filter / tables)"
            )
        if self.group_by is not None:
            raise ValueError(
                f"group_by: a {kind} destination writes each table's changes of a batch in one "
                "commit; remove group_by"
            )
        if "format" in self.model_fields_set:
            raise ValueError(f"format: a {kind} destination writes typed columns; remove format")
        return self

    @model_validator(mode="after")
    def _mirror_rules(self) -> SinkConfig:
        if self.destination.message_format() != "mirror":
            return self
        if self.transform is not None:
            raise ValueError(
                "transform: a postgres destination mirrors rows as they are; remove the "
                "transform (or use filter / tables to choose rows)"
            )
        if self.group_by is not None and self.group_by != self.destination.group_by():
            raise ValueError(
                "group_by: a postgres destination applies each table's changes in order in "
                "one transaction per chunk, so it groups by table; remove group_by"
            )
        return self

    @model_validator(mode="after")
    def _debezium_rules(self) -> SinkConfig:
        from walstream.errors import ConfigError
        from walstream.formats.debezium import DebeziumSettings

        if self.format != "debezium":
            if self.debezium is not None:
                raise ValueError("debezium: these settings are format: debezium's; set it")
            if self.destination.format_routes():
                raise ValueError(
                    "destination.topic: name the topic (a name or a Spark SQL expression); "
                    "only format: debezium names each table's topic itself"
                )
            return self
        if self.transform is not None:
            raise ValueError(
                "transform: format: debezium sends Debezium's records as they are; a transform "
                "makes a message of its own: use format sequin or record with it"
            )
        if self.destination.pull_stream() is not None:
            raise ValueError(
                "format: debezium: a pull stream keeps one message per change, and Debezium "
                "sends a primary-key update as a delete and a create; use format sequin or "
                "record for a pull stream, or a kafka destination for Debezium's records"
            )
        if self.tombstones:
            raise ValueError(
                "tombstones: format: debezium sends a tombstone after each delete as Debezium "
                "does; remove the setting (debezium: {tombstones.on.delete: false} turns "
                "them off)"
            )
        try:
            DebeziumSettings.of(self.debezium)
        except ConfigError as exc:
            raise ValueError(f"{exc.problem}; {exc.fix}") from None
        return self

    def debezium_settings(self) -> Any:
        """The sink's `debezium:` block, read (formats/debezium.py `DebeziumSettings`)."""
        from walstream.formats.debezium import DebeziumSettings

        return DebeziumSettings.of(self.debezium)

    def taken_actions(self) -> list[str]:
        """The actions the sink takes: `actions` but Debezium's `skipped.operations`."""
        if self.format != "debezium":
            return list(self.actions)
        skipped = self.debezium_settings().skipped
        return [a for a in self.actions if a not in skipped]

    @model_validator(mode="after")
    def _tombstones_need_kafka(self) -> SinkConfig:
        if self.tombstones and not capabilities(self.destination).tombstones:
            raise ValueError(
                "tombstones: only a Kafka destination has tombstones (a null-value message "
                "that lets log compaction drop the key); remove the setting"
            )
        return self

    def plain_messages(self) -> bool:
        """The sink's messages are its format's as they are: default key and grouping, no
        route expression, filter, event types or transform; and it takes read rows."""
        dest = self.destination
        return (
            self.transform is None
            and self.filter is None
            and not self.event_types
            and not self.group_by
            and dest.group_by() is None
            and dest.route_expression() is None
            and dest.default_key()
            and "read" in self.actions
        )

    def wants_table(self, schema: str, table: str) -> bool:
        return not self.tables or any(
            fnmatch.fnmatchcase(f"{schema}.{table}", t) for t in self.tables
        )


def sink_snapshot(sink: SinkConfig) -> dict[str, Any]:
    """The sink's settings as JSON, secrets hidden (see `walstream.secrets`): stored with
    each dead letter."""
    from walstream.secrets import safe_settings, scrub_json, secret_values

    data = sink.model_dump(mode="json", by_alias=True)
    dest = data.get("destination", {})
    while isinstance(dest, dict):
        if isinstance(dest.get("producer"), dict):
            dest["producer"] = safe_settings(dest["producer"])
        dest = dest.get("inner")
    return dict(scrub_json(data, secret_values(sink)))
