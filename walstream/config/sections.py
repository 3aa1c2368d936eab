"""The settings sections besides sinks: state, server, events, spark, sources."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator

from walstream.fields import Dsn, Duration, Identifier, Location, Model, Name, Size, token_from
from walstream.postgres.publication import PublicationOptions


class StateConfig(Model):
    """Where walstream keeps its own state (delivery ledger)."""

    dsn: Dsn | None = None  # default: the first source's database
    schema_: Identifier = Field("walstream", alias="schema")


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


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
    #: The gRPC PullerService (`pip install 'walstream[grpc]'`) on this port of `host`,
    #: beside the HTTP API: the same streams, markers and consumer tokens. 0: any free
    #: port. Unset: off.
    grpc_port: int | None = Field(None, ge=0, le=65535)

    def api_token(self) -> str | None:
        return token_from(self.token, "WALSTREAM_API_TOKEN")

    def reader_tokens(self) -> list[str]:
        """Every token that may read row data: the read token and the management token."""
        read = token_from(self.read_token, "WALSTREAM_API_READ_TOKEN")
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
        return token_from(self.token, "WALSTREAM_EVENTS_TOKEN")


class SparkConfig(Model):
    master: str = "local[*]"
    # a local directory or a URI every node can reach (hdfs://, s3a://)
    checkpoint_dir: Location = Field(".walstream/checkpoints", validate_default=True)
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


class Handover(Model):
    """Where another tool left the slot (`walstream import debezium` writes it from
    Debezium's offset): every transaction that committed before `commit_end` was delivered
    by it, and of the next one the changes up to `processed`. A query that starts afresh
    on the slot delivers only what comes after; once it committed a batch, this is moot."""

    commit_end: str  # an LSN as Postgres prints it (Debezium's `lsn_commit`)
    processed: str | None = None  # Debezium's `lsn_proc`; None: commit_end

    @field_validator("commit_end", "processed")
    @classmethod
    def _lsn(cls, v: str | None) -> str | None:
        from walstream.change import parse_lsn
        from walstream.errors import WalstreamError

        if v is not None:
            try:
                parse_lsn(v)
            except WalstreamError as exc:
                raise ValueError(f"{exc.problem}; {exc.fix}") from None
        return v

    def positions(self) -> tuple[int, int]:
        """(commit end, processed) as numbers."""
        from walstream.change import parse_lsn

        end = parse_lsn(self.commit_end)
        return end, max(end, parse_lsn(self.processed)) if self.processed else end


class SourceConfig(Model):
    name: Name
    dsn: Dsn
    #: When `dsn` is a physical standby (PostgreSQL 16+ decodes there): its primary.
    #: Heartbeats, backfill watermarks, the publication and the event outbox are written
    #: there; the slot, the changes and backfill reads stay on the standby.
    primary_dsn: Dsn | None = None
    slot: Identifier | None = None
    publication: Identifier | None = None
    tables: list[str] = Field(default_factory=list)
    #: Partitions' changes arrive as their root table (the publication's setting when
    #: walstream creates it; an existing one must agree). False: under each partition's name.
    publish_via_partition_root: bool = False
    #: Stored generated columns are sent (PostgreSQL 18+; before, they never are).
    publish_generated_columns: bool = False
    #: Postgres streams a transaction larger than its `logical_decoding_work_mem` while it
    #: runs (protocol 2); walstream spools it under `spill_dir` (None: the system's
    #: temporary directory) and delivers it once it commits, drops it if it aborts.
    streaming: bool = False
    spill_dir: str | None = None
    heartbeat_interval: Duration = 5.0
    max_changes_per_batch: int = Field(200_000, ge=1)
    #: Raw WAL bytes per Spark task. None: `task_bytes` picks (one task per batch on a
    #: local master with at most 2 cores, else 4 MiB).
    partition_bytes: int | None = Field(None, ge=64 << 10)
    #: Raw WAL read ahead of Spark, at most (reading pauses when full; the WAL waits in Postgres).
    max_buffer_bytes: int = Field(32 << 20, ge=1 << 20)
    #: Split the source into slot/publication pairs by table, each its own query: the
    #: source runs as `<name>-1` ... `<name>-N` (see plan.py).
    shards: list[Annotated[list[str], Field(min_length=1)]] | None = Field(None, min_length=2)
    #: Taking over a slot another tool read (Debezium): where it left off (`Handover`).
    handover: Handover | None = None

    @model_validator(mode="after")
    def _tables_or_shards(self) -> SourceConfig:
        if self.shards and self.tables:
            raise ValueError(
                "tables and shards: give one; with shards, each shard lists its own tables"
            )
        if self.shards and self.handover:
            raise ValueError(
                "handover and shards: a handover is where another tool left one slot; take "
                "the slot over without shards, then split the source"
            )
        return self

    @property
    def primary(self) -> str | None:
        """`primary_dsn`'s value, when set."""
        return self.primary_dsn.get_secret_value() if self.primary_dsn else None

    @property
    def publication_options(self) -> PublicationOptions:
        return PublicationOptions(self.publish_via_partition_root, self.publish_generated_columns)

    @property
    def writes_dsn(self) -> str:
        """Where walstream writes in the source's database: the primary, when `dsn` is a standby."""
        return (self.primary_dsn or self.dsn).get_secret_value()

    @property
    def slot_name(self) -> str:
        return self.slot or "walstream_" + self.name.replace("-", "_")

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot_name
