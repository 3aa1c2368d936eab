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
_SECRET_WORDS = ("password", "secret", "token", "credential")


def _duration(value: Any) -> Any:
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


Duration = Annotated[float, BeforeValidator(_duration), Field(ge=0)]


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

    _name = field_validator("name")(_check_name)
    _dsn = field_validator("dsn")(_check_dsn)

    @property
    def slot_name(self) -> str:
        return self.slot or "walstream_" + self.name.replace("-", "_")

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot_name


class KafkaDestination(Model):
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


class FileDestination(Model):
    type: Literal["file"]
    path: Annotated[Path, BeforeValidator(_absolute)]
    format: Literal["jsonl", "parquet"] = "jsonl"


Inner = Annotated[
    Union[KafkaDestination, FileDestination, "FaultyDestination"],
    Field(discriminator="type"),
]


class FaultyDestination(Model):
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


FaultyDestination.model_rebuild()  # `inner` may be faulty too: two failure rules at once

Destination = Annotated[
    KafkaDestination | FileDestination | FaultyDestination, Field(discriminator="type")
]


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
    destination: Destination

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


class Config(Model):
    state: StateConfig = StateConfig.model_validate({})
    spark: SparkConfig = Field(default_factory=lambda: SparkConfig.model_validate({}))
    sources: list[SourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Config:
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
        return self

    def source(self, name: str) -> SourceConfig:
        return next(s for s in self.sources if s.name == name)

    def sinks_of(self, source: str) -> list[SinkConfig]:
        return [s for s in self.sinks if s.source == source]

    @property
    def state_dsn(self) -> str:
        dsn = self.state.dsn or self.sources[0].dsn
        return dsn.get_secret_value()


def redacted(settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of client settings with secret-looking values hidden, for logs and snapshots."""
    return {
        k: "**********" if any(w in k.lower() for w in _SECRET_WORDS) else v
        for k, v in settings.items()
    }


def sink_snapshot(sink: SinkConfig) -> dict[str, Any]:
    """The sink's settings as JSON, secrets hidden: stored with each dead letter."""
    data = sink.model_dump(mode="json", by_alias=True)
    dest = data.get("destination", {})
    if isinstance(dest.get("producer"), dict):
        dest["producer"] = redacted(dest["producer"])
    return data


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


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("kafka", "file") and out.endswith("destination"):
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
