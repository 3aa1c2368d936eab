"""The options of `spark.readStream.format("walstream")`, validated with clear errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from walstream.errors import ConfigError
from walstream.postgres.publication import NO_OPTIONS, PublicationOptions


@dataclass(frozen=True)
class SourceOptions:
    dsn: str
    slot: str
    publication: str
    name: str
    tables: tuple[str, ...]
    max_changes_per_batch: int
    heartbeat_interval: float
    heartbeat_timeout: float
    max_buffer_bytes: int
    partition_bytes: int
    replay_timeout: float
    #: walstream's state schema when the state database is this source's: changes of its
    #: tables (ledger, parking, streams ...) are walstream's own and never captured; the
    #: event outbox (`<schema>.events`) is.
    internal_schema: str | None = None
    #: The primary's DSN when `dsn` is a physical standby: heartbeats, the
    #: AvailableNow mark and the publication are written there (postgres/standby.py).
    primary_dsn: str | None = None
    #: What the publication walstream creates publishes (partitions as their root,
    #: generated columns).
    publication_options: PublicationOptions = NO_OPTIONS
    #: Ask Postgres to stream transactions while they run (protocol 2) and spool them
    #: under `spill_dir` (None: the system's temporary directory) until they commit.
    streaming: bool = False
    spill_dir: str | None = None
    #: Where another tool left the slot (config.sections.Handover): (commit end, processed).
    handover: tuple[int, int] | None = None

    @property
    def writes_dsn(self) -> str:
        return self.primary_dsn or self.dsn

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        dsn = opts.get("dsn", "").strip()
        if not dsn:
            raise ConfigError(
                'option "dsn" is required',
                '.option("dsn", "postgresql://user@host:5432/db")',
            )
        slot = opts.get("slot", "walstream").strip()
        _identifier("slot", slot)
        publication = opts.get("publication", slot).strip()
        _identifier("publication", publication)
        tables = tuple(t.strip() for t in opts.get("tables", "").split(",") if t.strip())
        heartbeat = _number(opts, "heartbeatinterval", 5.0, minimum=0.0)
        return cls(
            dsn=dsn,
            slot=slot,
            publication=publication,
            name=opts.get("name", slot).strip() or slot,
            tables=tables,
            max_changes_per_batch=int(_number(opts, "maxchangesperbatch", 200_000, minimum=1)),
            heartbeat_interval=heartbeat,
            heartbeat_timeout=_number(
                opts, "heartbeattimeout", max(60.0, 6 * heartbeat), minimum=1.0
            ),
            max_buffer_bytes=int(_number(opts, "maxbufferbytes", 32 << 20, minimum=1 << 20)),
            partition_bytes=int(_number(opts, "partitionbytes", 4 << 20, minimum=64 << 10)),
            replay_timeout=_number(opts, "replaytimeout", 300.0, minimum=1.0),
            internal_schema=opts.get("internalschema", "").strip() or None,
            primary_dsn=opts.get("primarydsn", "").strip() or None,
            publication_options=PublicationOptions(
                _flag(opts, "publishviapartitionroot"), _flag(opts, "publishgeneratedcolumns")
            ),
            streaming=_flag(opts, "streaming"),
            spill_dir=opts.get("spilldir", "").strip() or None,
            handover=_handover(opts.get("handover", "")),
        )


def _handover(raw: str) -> tuple[int, int] | None:
    """`"<commit end>:<processed>"` (two decimal LSNs), or None."""
    if not raw.strip():
        return None
    end, _, processed = raw.partition(":")
    try:
        return int(end), max(int(end), int(processed or end))
    except ValueError:
        raise ConfigError(
            f'option "handover" is {raw!r}',
            'two LSNs as decimal numbers, e.g. .option("handover", "23851240:23851352")',
        ) from None


_NAMES = {
    "heartbeatinterval": "heartbeatInterval",
    "heartbeattimeout": "heartbeatTimeout",
    "maxchangesperbatch": "maxChangesPerBatch",
    "maxbufferbytes": "maxBufferBytes",
    "partitionbytes": "partitionBytes",
    "replaytimeout": "replayTimeout",
    "publishviapartitionroot": "publishViaPartitionRoot",
    "publishgeneratedcolumns": "publishGeneratedColumns",
    "streaming": "streaming",
}


def _number(opts: Mapping[str, str], key: str, default: float, minimum: float) -> float:
    raw = opts.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw.rstrip("s")) if key.endswith(("interval", "timeout")) else float(raw)
    except ValueError:
        value = float("nan")
    if not value >= minimum:
        raise ConfigError(
            f'option "{_NAMES[key]}" is {raw!r}; it must be a number >= {minimum:g}',
            f'e.g. .option("{_NAMES[key]}", "{default:g}")',
        )
    return value


def _flag(opts: Mapping[str, str], key: str) -> bool:
    raw = opts.get(key, "false").strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(
            f'option "{_NAMES[key]}" is {raw!r}; it must be true or false',
            f'e.g. .option("{_NAMES[key]}", "true")',
        )
    return raw == "true"


def _identifier(option: str, value: str) -> None:
    ok = value and all(c.isascii() and (c.isalnum() or c == "_") for c in value)
    if not ok or value[0].isdigit() or value != value.lower():
        raise ConfigError(
            f'option "{option}" is {value!r}: use lowercase letters, digits and underscores, '
            "not starting with a digit",
            f'e.g. .option("{option}", "walstream_app")',
        )
