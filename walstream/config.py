"""walstream.yaml: pydantic models, `${ENV}` interpolation, errors that name the key."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from walstream.errors import ConfigError

Action = Literal["insert", "update", "delete", "truncate", "read"]
ACTIONS: tuple[Action, ...] = ("insert", "update", "delete", "truncate", "read")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def parse_duration(value: Any) -> Any:
    """'500ms', '5s', '2m', '1h' or a number of seconds -> seconds as float."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"]
            return float(m.group(1)) * scale
    raise ValueError(
        f"{value!r} is not a duration: write e.g. 500ms, 5s, 2m or a number of seconds"
    )


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$")
_SIZE_UNITS = {
    "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}  # fmt: skip


def _size(value: Any) -> Any:
    """'512MiB', '1GB', '4096' or a number of bytes -> bytes as int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"])
    raise ValueError(f"{value!r} is not a size: write e.g. 512MiB, 1GiB or a number of bytes")


Size = Annotated[int, BeforeValidator(_size), Field(ge=0)]


def _check_dsn(value: SecretStr) -> SecretStr:
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(value.get_secret_value())
    except Exception as exc:
        raise ValueError(
            f"not a Postgres connection string ({exc}); write postgresql://user@host:5432/db"
        ) from None
    return value


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("use lowercase letters, digits, '_' and '-', starting with a letter")
    return value


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StateConfig(Model):
    """Where walstream keeps its own state (delivery ledger)."""

    dsn: SecretStr | None = None  # default: the first source's database
    schema_: str = Field("walstream", alias="schema", pattern=r"^[a-z_][a-z0-9_]*$")

    _dsn = field_validator("dsn")(lambda v: v if v is None else _check_dsn(v))


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def _token(value: SecretStr | None, env: str) -> str | None:
    """A bearer token from the config, else from the environment variable; None: neither."""
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    return os.environ.get(env) or None


class ServerConfig(Model):
    """The HTTP server `walstream run` starts: health, metrics, management API, console."""

    enabled: bool = True
    host: str = "127.0.0.1"
    #: 0: any free port. Default: `WALSTREAM_SERVER_PORT`, else 8376.
    port: int = Field(
        default_factory=lambda: int(os.environ.get("WALSTREAM_SERVER_PORT") or 8376), ge=0, le=65535
    )
    #: Bearer token of the management calls (pause, resume, retry, discard, backfills) and of
    #: every read. Without one the writes are disabled. `WALSTREAM_API_TOKEN` when unset.
    token: SecretStr | None = None
    #: Bearer token of the reads that may show row values (dead letters, parked messages,
    #: backfills, errors): for dashboards and on-call. `WALSTREAM_API_READ_TOKEN` when unset.
    read_token: SecretStr | None = None
    #: Host header values the server answers (a browser page cannot reach it through DNS
    #: rebinding). Default: loopback names and `host` when it is an address; "*": any.
    allowed_hosts: list[Annotated[str, Field(min_length=1)]] | None = None
    #: Largest request body (413 above it, before it is parsed or authenticated).
    max_body_bytes: Size = 1 << 20
    #: Open long-polls and SSE subscriptions, at most, per stream and per client address.
    max_stream_connections: int = Field(200, ge=1)
    max_client_connections: int = Field(16, ge=1)

    def api_token(self) -> str | None:
        return _token(self.token, "WALSTREAM_API_TOKEN")

    def reader_tokens(self) -> list[str]:
        """Every token that may read row data: the read token and the management token."""
        read = _token(self.read_token, "WALSTREAM_API_READ_TOKEN")
        return [t for t in (read, self.api_token()) if t]

    def hosts(self) -> frozenset[str] | None:
        """The allowed Host names (lowercase, no port); None: any."""
        names = list(self.allowed_hosts) if self.allowed_hosts is not None else [*LOOPBACK_HOSTS]
        if "*" in names:
            return None
        if self.allowed_hosts is None and self.host not in ("0.0.0.0", "::", ""):
            names.append(self.host)
        return frozenset(n.lower().strip("[]") for n in names)


class EventsConfig(Model):
    """The event ingestion API (`POST /v1/events`): an outbox table in a source database."""

    source: str  # the source whose database holds the outbox (`<state schema>.events`)
    #: Producers' bearer token. Unset: `WALSTREAM_EVENTS_TOKEN`; neither: ingestion is off.
    token: SecretStr | None = None
    max_bytes: int = Field(262_144, ge=64, le=64 << 20)  # a request body, at most
    retention: Duration = 7 * 86400.0  # events older than this are deleted (with their keys)

    def producer_token(self) -> str | None:
        return _token(self.token, "WALSTREAM_EVENTS_TOKEN")


def _absolute(value: Any) -> Any:
    """A local path relative to where walstream runs, not to where the JVM or executors run."""
    text = str(value)
    if "://" in text or text.startswith("file:"):
        return text  # a URI (s3a://, hdfs://, file:/...): used as given
    return str(Path(text).expanduser().absolute())


class SparkConfig(Model):
    master: str = "local[*]"
    # a local directory or a URI every node can reach (hdfs://, s3a://)
    checkpoint_dir: Annotated[str, BeforeValidator(_absolute)] = Field(
        ".walstream/checkpoints", validate_default=True
    )
    conf: dict[str, str] = Field(default_factory=dict)
    trigger_interval: Duration = 0.0

    @field_validator("conf", mode="before")
    @classmethod
    def _strings(cls, v: Any) -> Any:
        return (
            {k: str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}
            if isinstance(v, dict)
            else v
        )


class SourceConfig(Model):
    name: str
    dsn: SecretStr
    slot: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]*$")
    publication: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]*$")
    tables: list[str] = Field(default_factory=list)
    heartbeat_interval: Duration = 5.0
    max_changes_per_batch: int = Field(50_000, ge=1)
    partition_bytes: int = Field(4 << 20, ge=64 << 10)  # raw WAL bytes per Spark task
    #: Split the source into slot/publication pairs by table, each its own query: the
    #: source runs as `<name>-1` ... `<name>-N` (see Config._shards).
    shards: list[Annotated[list[str], Field(min_length=1)]] | None = Field(None, min_length=2)

    _name = field_validator("name")(_check_name)
    _dsn = field_validator("dsn")(_check_dsn)

    @model_validator(mode="after")
    def _tables_or_shards(self) -> SourceConfig:
        if self.shards and self.tables:
            raise ValueError(
                "tables and shards: give one; with shards, each shard lists its own tables"
            )
        return self

    @property
    def slot_name(self) -> str:
        return self.slot or "walstream_" + self.name.replace("-", "_")

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot_name


def is_name(value: str, extra: str = "._-") -> bool:
    """A plain name (topic, stream, subject...) rather than a Spark SQL expression."""
    return bool(value) and all(c.isalnum() or c in extra for c in value)


class DestinationModel(Model):
    """Base of every destination's settings: how the pipeline keys and routes its messages.

    `key_expression`: the message key (Spark SQL), kept with every message (Kafka's key,
    the key a dead letter is listed by). `route_expression`: where each message goes, when
    that is computed per change (a topic, stream, subject, URL... given as an expression);
    None when every message goes to the one place the settings name.
    """

    def key_expression(self) -> str:
        return "concat_ws(',', pk)"

    def route_expression(self) -> str | None:
        return None

    def message_format(self) -> str | None:
        """A format this destination needs whatever the sink's `format` says (or None)."""
        return None

    def group_by(self) -> list[str] | None:
        """The grouping this destination needs (None: the sink's `group_by`, default per row)."""
        return None


class KafkaDestination(DestinationModel):
    type: Literal["kafka"]
    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)  # a topic name, or a Spark SQL expression
    key: str = "pk"  # "pk" (key values joined by ','), or a Spark SQL expression
    producer: dict[str, str | int | float | bool] = Field(default_factory=dict)
    create_topics: bool = False
    topic_partitions: int = Field(1, ge=1)
    retry_timeout: Duration = 60.0  # retry inside a batch this long before the batch fails

    def client_settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.producer}

    def key_expression(self) -> str:
        return super().key_expression() if self.key == "pk" else self.key

    def route_expression(self) -> str | None:
        return None if is_name(self.topic) else self.topic


class FileDestination(DestinationModel):
    type: Literal["file"]
    path: Annotated[Path, BeforeValidator(_absolute)]
    format: Literal["jsonl", "parquet"] = "jsonl"


class RedisStreamDestination(DestinationModel):
    """Redis Streams: one XADD per message (fields `message`, `idempotency_key`, `key`),
    pipelined per chunk on one connection, so a stream receives them in order."""

    type: Literal["redis_stream"]
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")  # may hold a password
    stream: str = Field(min_length=1)  # a stream name, or a Spark SQL expression
    maxlen: int | None = Field(None, ge=1)  # trim each stream to about this many entries
    timeout: Duration = 10.0  # socket timeout per chunk
    retry_timeout: Duration = 60.0

    def route_expression(self) -> str | None:
        return None if is_name(self.stream, "._-:{}") else self.stream


class NatsDestination(DestinationModel):
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
    retry_timeout: Duration = 60.0

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


class RabbitMqDestination(DestinationModel):
    """RabbitMQ: persistent messages with publisher confirms; `message_id` is the
    idempotency key. The exchange must exist (or `declare_exchange`)."""

    type: Literal["rabbitmq"]
    url: SecretStr = SecretStr("amqp://guest:guest@127.0.0.1:5672/%2F")
    exchange: str = ""  # "" is the default exchange: the routing key names a queue
    routing_key: str = Field(min_length=1)  # a routing key, or a Spark SQL expression
    declare_exchange: str | None = None  # e.g. "topic": declare `exchange` durable, this type
    timeout: Duration = 10.0
    retry_timeout: Duration = 60.0

    def route_expression(self) -> str | None:
        return None if is_name(self.routing_key, "._-*#") else self.routing_key


#: Shortest signing secret accepted (bytes after base64; Standard Webhooks: 24 to 64).
MIN_WEBHOOK_SECRET = 24


class WebhookDestination(DestinationModel):
    """HTTP webhooks: one request per message, or per chunk with `batch: true`
    (`{"data": [...]}`), signed per the Standard Webhooks spec when `secrets` are set."""

    type: Literal["webhook"]
    url: str = Field(min_length=1)  # an http(s) URL, or a Spark SQL expression giving one
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    headers: dict[str, SecretStr] = Field(default_factory=dict)  # e.g. Authorization
    timeout: Duration = 30.0  # per request
    batch: bool = False
    gzip: bool = False
    secrets: list[SecretStr] = Field(default_factory=list)  # whsec_...; several while rotating
    concurrency: int = Field(1, ge=1, le=256)  # requests at once (per task); order kept per group
    retry_timeout: Duration = 60.0

    @field_validator("secrets")
    @classmethod
    def _whsec(cls, v: list[SecretStr]) -> list[SecretStr]:
        import base64
        import binascii

        generate = (
            'generate one with: python -c "import base64,os; '
            "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\""
        )
        for s in v:
            raw = s.get_secret_value()
            try:
                key = base64.b64decode(raw.removeprefix("whsec_"), validate=True)
            except binascii.Error:
                raise ValueError(
                    "a signing secret is 'whsec_' followed by base64 (Standard Webhooks); "
                    + generate
                ) from None
            if len(key) < MIN_WEBHOOK_SECRET:
                raise ValueError(
                    f"a signing secret of {len(key)} bytes is too short to sign with: at least "
                    f"{MIN_WEBHOOK_SECRET} random bytes; " + generate
                )
        return v

    def route_expression(self) -> str | None:
        literal = re.match(r"^https?://[^\s'\"()`]+$", self.url)
        return None if literal else self.url


class PostgresDestination(DestinationModel):
    """A copy of every source table in another Postgres database, or another schema.

    Tables are created from the source's definitions (types, user-defined types,
    primary key) and changes applied in WAL order, one transaction per chunk, with
    each table's WAL cursor stored in the same transaction: a replay never goes
    backwards. `source_dsn` is filled in from the sink's source.
    """

    type: Literal["postgres"]
    dsn: SecretStr
    schema_: str | None = Field(None, alias="schema", pattern=r"^[a-z_][a-z0-9_]*$")
    create_tables: bool = True
    source_dsn: SecretStr | None = None
    retry_timeout: Duration = 60.0

    _dsn = field_validator("dsn")(_check_dsn)

    def message_format(self) -> str | None:
        return "mirror"

    def group_by(self) -> list[str] | None:
        return ["schema", "table"]  # a table's changes in one partition, in WAL order


class StreamDestination(DestinationModel):
    """Messages kept in the state database for pull consumers (`GET /v1/streams/{stream}`).

    Several sinks, each of another source, may feed one stream: consumers read one merged
    stream whose progress markers carry every source's position. Messages are kept for
    `retention` and while the stream holds at most `max_bytes`; a consumer behind by more
    than `catch_up_threshold` messages may ask for coalesced changes.
    """

    type: Literal["stream"]
    stream: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    retention: Duration = 3600.0
    max_bytes: Size = 1 << 30
    catch_up_threshold: int = Field(10_000, ge=1)
    #: Consumers' bearer token. Unset: `WALSTREAM_STREAMS_TOKEN`; neither: the stream's
    #: read API is off (403).
    token: SecretStr | None = None
    # Filled in by Config: the sink's source, and where the state database is.
    _source: str = PrivateAttr("")
    _dsn: str = PrivateAttr("")
    _schema: str = PrivateAttr("walstream")

    def consumer_token(self) -> str | None:
        return _token(self.token, "WALSTREAM_STREAMS_TOKEN")


Inner = Annotated[
    Union[
        KafkaDestination, FileDestination, RedisStreamDestination, NatsDestination,
        RabbitMqDestination, WebhookDestination, PostgresDestination, StreamDestination,
        "FaultyDestination",
    ],
    Field(discriminator="type"),
]  # fmt: skip


class FaultyDestination(DestinationModel):
    """A fault-injecting wrapper around another destination (chaos tests, rehearsals).

    While it is active (always, or while the file `while_exists` exists), messages
    whose key is in `fail_keys` (every message when the list is empty) fail with a
    retryable or non-retryable SinkError; the others go to `inner`, which may be
    another faulty destination (two rules at once).
    """

    type: Literal["faulty"]
    inner: Inner
    fail_keys: list[str] = Field(default_factory=list)
    retryable: bool = True
    while_exists: Annotated[Path, BeforeValidator(_absolute)] | None = None
    retry_timeout: Duration = 0.5  # inline retries before a failed message is parked

    def key_expression(self) -> str:  # keyed and routed as the destination it wraps
        return self.inner.key_expression()

    def route_expression(self) -> str | None:
        return self.inner.route_expression()

    def message_format(self) -> str | None:
        return self.inner.message_format()

    def group_by(self) -> list[str] | None:
        return self.inner.group_by()


FaultyDestination.model_rebuild()  # `inner` may be faulty too: two failure rules at once

Destination = Annotated[
    KafkaDestination | FileDestination | RedisStreamDestination | NatsDestination
    | RabbitMqDestination | WebhookDestination | PostgresDestination | StreamDestination
    | FaultyDestination,
    Field(discriminator="type"),
]  # fmt: skip


class BackoffConfig(Model):
    """Delay between attempts of a parked message: initial * 2^(n-1), at most max, ±20%."""

    initial: Duration = 1.0
    max: Duration = 600.0


class SinkConfig(Model):
    name: str
    source: str
    tables: list[str] = Field(default_factory=list)  # default: every table of the source
    actions: list[Action] = Field(default_factory=lambda: list(ACTIONS))
    filter: str | None = None  # Spark SQL boolean expression over the change columns
    transform: dict[str, str] | str | None = None  # {field: SQL expression} or "module:function"
    group_by: list[str] | None = None  # default: schema, table, pk
    format: Literal["sequin", "debezium", "record"] = "sequin"
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
    destination: Destination
    #: `(schema, table)` of the outbox when events are on (set by Config): sinks without
    #: event_types and without tables leave it out.
    _outbox: tuple[str, str] | None = PrivateAttr(None)

    _name = field_validator("name")(_check_name)

    @field_validator("transform")
    @classmethod
    def _transform(cls, v: Any) -> Any:
        if isinstance(v, str) and not re.match(r"^[\w.]+:[A-Za-z_]\w*$", v):
            raise ValueError("a Python transform is 'module:function', e.g. 'myapp.cdc:shape'")
        if isinstance(v, dict) and not v:
            raise ValueError("give at least one field: {field: Spark SQL expression}")
        return v

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
    def _tombstones_need_kafka(self) -> SinkConfig:
        dest = self.destination
        while isinstance(dest, FaultyDestination):
            dest = dest.inner
        if self.tombstones and not isinstance(dest, KafkaDestination):
            raise ValueError(
                "tombstones: only a Kafka destination has tombstones (a null-value message "
                "that lets log compaction drop the key); remove the setting"
            )
        return self

    def wants_table(self, schema: str, table: str) -> bool:
        return not self.tables or any(
            fnmatch.fnmatchcase(f"{schema}.{table}", t) for t in self.tables
        )


def _for_shard(dest: Any, i: int) -> Any:
    """A sink's destination for shard i: file sinks write under `shard-<i>` (batch ids of
    the shards' queries overlap); the others are shared."""
    if isinstance(dest, FileDestination):
        return dest.model_copy(update={"path": dest.path / f"shard-{i}"})
    if isinstance(dest, FaultyDestination):
        return dest.model_copy(update={"inner": _for_shard(dest.inner, i)})
    return dest.model_copy()  # its own object: Config fills stream sinks' source into it


def _fill_source_dsn(dest: Any, dsn: Any) -> Any:
    """A postgres destination (also inside faulty ones) reads table definitions from its source."""
    if not isinstance(dest, dict):
        return dest
    if dest.get("type") == "postgres" and dest.get("source_dsn") is None:
        return {**dest, "source_dsn": dsn}
    if dest.get("type") == "faulty":
        return {**dest, "inner": _fill_source_dsn(dest.get("inner"), dsn)}
    return dest


class Config(Model):
    state: StateConfig = StateConfig.model_validate({})
    spark: SparkConfig = Field(default_factory=lambda: SparkConfig.model_validate({}))
    server: ServerConfig = Field(default_factory=lambda: ServerConfig.model_validate({}))
    events: EventsConfig | None = None
    sources: list[SourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _source_dsns(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("sinks"), list):
            return data
        dsns = {
            s.get("name"): s.get("dsn") for s in data.get("sources") or [] if isinstance(s, dict)
        }
        sinks = [
            {**k, "destination": _fill_source_dsn(k.get("destination"), dsns.get(k.get("source")))}
            if isinstance(k, dict) and k.get("source") in dsns
            else k
            for k in data["sinks"]
        ]
        return {**data, "sinks": sinks}

    @model_validator(mode="after")
    def _references(self) -> Config:
        self._shards()
        for kind, names in (
            ("sources", [s.name for s in self.sources]),
            ("sinks", [s.name for s in self.sinks]),
            ("sources (slot)", [s.slot_name for s in self.sources]),
        ):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{kind}: names must be unique, {sorted(dup)} appear twice")
        known = [s.name for s in self.sources]
        for i, sink in enumerate(self.sinks):
            if sink.source not in known:
                raise ValueError(
                    f"sinks[{i}].source: {sink.source!r} is not a source; sources are {known}"
                )
        self._events()
        self._streams()
        return self

    def _streams(self) -> None:
        """Stream sinks learn their source and the state database; the sinks feeding one
        stream come from different sources and agree on its settings."""
        seen: dict[str, tuple[int, SinkConfig]] = {}
        for i, sink in enumerate(self.sinks):
            dest = sink.destination
            if not isinstance(dest, StreamDestination):
                continue
            dest._source, dest._dsn, dest._schema = sink.source, self.state_dsn, self.state.schema_
            if dest.stream not in seen:
                seen[dest.stream] = (i, sink)
                continue
            j, first = seen[dest.stream]
            if first.source == sink.source:
                raise ValueError(
                    f"sinks[{i}].destination.stream: sinks[{j}] ({first.name}) already feeds "
                    f"stream {dest.stream!r} from source {sink.source!r}; one sink per source "
                    "and stream (merge their tables and filters into one sink)"
                )
            other = first.destination
            assert isinstance(other, StreamDestination)
            for key in ("retention", "max_bytes", "catch_up_threshold", "token"):
                if getattr(dest, key) != getattr(other, key):
                    raise ValueError(
                        f"sinks[{i}].destination.{key}: differs from sinks[{j}] ({first.name}), "
                        f"which feeds the same stream {dest.stream!r}; give both the same {key}"
                    )

    def streams(self) -> dict[str, list[SinkConfig]]:
        """Each stream (`type: stream` destinations) and the sinks feeding it."""
        out: dict[str, list[SinkConfig]] = {}
        for sink in self.sinks:
            if isinstance(sink.destination, StreamDestination):
                out.setdefault(sink.destination.stream, []).append(sink)
        return out

    def _shards(self) -> None:
        """A sharded source becomes one source per shard, `<name>-<i>` (slot and publication
        `<slot>_<i>`, `<publication>_<i>`, the shard's tables), and each of its sinks one
        sink per shard, `<sink>-<i>` (a file sink writes under `<path>/shard-<i>`)."""
        sharded = {s.name: s for s in self.sources if s.shards}
        if not sharded:
            return
        sources: list[SourceConfig] = []
        for s in self.sources:
            if not s.shards:
                sources.append(s)
                continue
            for i, tables in enumerate(s.shards, 1):
                sources.append(s.model_copy(update={
                    "name": f"{s.name}-{i}", "slot": f"{s.slot_name}_{i}",
                    "publication": f"{s.publication_name}_{i}", "tables": list(tables),
                    "shards": None,
                }))  # fmt: skip
        sinks: list[SinkConfig] = []
        for k in self.sinks:
            parent = sharded.get(k.source)
            if parent is None or parent.shards is None:
                sinks.append(k)
                continue
            for i in range(1, len(parent.shards) + 1):
                sinks.append(k.model_copy(update={
                    "name": f"{k.name}-{i}", "source": f"{parent.name}-{i}",
                    "destination": _for_shard(k.destination, i),
                }))  # fmt: skip
        self.sources[:] = sources
        self.sinks[:] = sinks

    def _events(self) -> None:
        """Event subscriptions read the outbox's inserts; other sinks leave the outbox out."""
        ev = self.events
        names = [s.name for s in self.sources]
        if ev is not None and ev.source not in names:
            raise ValueError(f"events.source: {ev.source!r} is not a source; sources are {names}")
        outbox = (self.state.schema_, "events")
        for i, sink in enumerate(self.sinks):
            if sink.event_types is None:
                if ev is not None and sink.source == ev.source:
                    sink._outbox = outbox
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
            self.sinks[i] = sink.model_copy(update=update)
        if ev is not None:
            source = self.source(ev.source)
            name = f"{outbox[0]}.{outbox[1]}"
            if source.tables and not any(fnmatch.fnmatchcase(name, t) for t in source.tables):
                source.tables.append(name)

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

    @property
    def state_dsn(self) -> str:
        dsn = self.state.dsn or self.sources[0].dsn
        return dsn.get_secret_value()


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


def interpolate(data: Any, path: str = "") -> Any:
    """Replace `${VAR}` / `${VAR:-default}` in every string; a missing variable names its key."""
    if isinstance(data, dict):
        return {k: interpolate(v, f"{path}.{k}" if path else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate(v, f"{path}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, str):

        def env(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                raise ConfigError(
                    f"{path}: environment variable {m.group(1)} is not set",
                    f"export {m.group(1)}=... or write ${{{m.group(1)}:-default}}",
                )
            return value

        return _ENV.sub(env, data)
    return data


_DESTINATION_TYPES = (
    "kafka", "file", "redis_stream", "nats", "rabbitmq", "webhook", "postgres", "stream", "faulty",
)  # fmt: skip


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _DESTINATION_TYPES and out.endswith(("destination", "inner")):
            continue  # pydantic names the union member; the user wrote `destination`
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        where = _where(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling and level)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        value = err.get("input")
        shown = (
            ""
            if err["type"] in ("missing", "extra_forbidden") or isinstance(value, dict | list)
            else f" (got {value!r})"
        )
        if "dsn" in where:
            shown = ""  # never echo a connection string: it may hold a password
        lines.append(f"{where}: {msg}{shown}")
    return "\n".join(lines)


def parse_config(data: Any, origin: str = "walstream.yaml") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of sections (sources, sinks, ...)", None)
    try:
        return Config.model_validate(interpolate(data))
    except ValidationError as exc:
        raise ConfigError(
            f"{origin} is invalid:\n{_explain(exc)}",
            "correct the keys above; the README's 'Configuration' section lists every key",
        ) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a walstream.yaml; every problem is a ConfigError naming the key."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"config file {p} does not exist",
            "pass -c path/to/walstream.yaml, or run `walstream demo` for a working example",
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}", "fix the YAML syntax") from None
    return parse_config(data, str(p))
