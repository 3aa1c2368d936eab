"""The canonical change row: WAL cursor, column list, Spark schema, idempotency key."""

from __future__ import annotations

import json
import re
from binascii import b2a_base64
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from walstream.errors import WalstreamError

_LSN_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")

#: Postgres timestamps on the wire count microseconds from this instant.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
PG_EPOCH_UNIX_US = 946_684_800_000_000


def parse_lsn(text: str) -> int:
    """Parse Postgres' `X/Y` LSN text into a 64-bit integer."""
    m = _LSN_RE.match(text)
    if not m:
        raise WalstreamError(
            f"invalid LSN {text!r}",
            "write an LSN as Postgres prints it: two hex numbers separated by '/', e.g. 0/16B3748",
        )
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def format_lsn(lsn: int) -> str:
    """Format a 64-bit LSN the way Postgres prints it (`16/B374D848`)."""
    if not 0 <= lsn < 1 << 64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass(frozen=True, order=True, slots=True)
class WalCursor:
    """Position of one change: commit LSN of its transaction and its index inside it.

    Totally ordered; unique per change; the basis of Spark offsets and of the
    idempotency key every sink passes on.
    """

    lsn: int
    seq: int

    def __post_init__(self) -> None:
        if self.lsn < 0 or self.seq < 0:
            raise ValueError(
                f"WalCursor needs non-negative lsn and seq, got {self.lsn}, {self.seq}"
            )

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.lsn, self.seq)

    def to_json(self) -> dict[str, int]:
        return {"lsn": self.lsn, "seq": self.seq}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WalCursor:
        try:
            return cls(int(data["lsn"]), int(data["seq"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise WalstreamError(
                f"invalid WAL cursor {data!r}: {exc}",
                'a cursor is a JSON object {"lsn": <int>, "seq": <int>}',
            ) from exc

    def __str__(self) -> str:
        return f"{format_lsn(self.lsn)}:{self.seq}"


def idempotency_key(lsn: int, seq: int, part: int = 0) -> str:
    """`base64("lsn:seq")` with the LSN as a decimal integer: stable across replays. A
    change's further records (`part` 1, 2: Debezium's tombstone and create after a
    primary-key update's delete) have `base64("lsn:seq:part")`, so that a destination
    dropping repeated keys (NATS' Nats-Msg-Id) keeps each."""
    text = f"{lsn}:{seq}" if part == 0 else f"{lsn}:{seq}:{part}"
    return b2a_base64(text.encode(), newline=False).decode("ascii")


def read_idempotency_key(backfill: int, pk: list[str | None]) -> str:
    """A backfill row's key: `base64("read:<backfill id>:<pk as JSON>")`.

    Stable when a chunk is read again (after a crash the re-read lands at another
    LSN), so a consumer drops the copy; a later backfill of the same rows gets new keys.
    """
    text = f"read:{backfill}:{json.dumps(pk, ensure_ascii=False, separators=(',', ':'))}"
    return b2a_base64(text.encode(), newline=False).decode("ascii")


def change_key(c: ChangeRow) -> str:
    """The idempotency key of a change row: its WAL cursor, or backfill id + pk for reads."""
    if c.backfill is not None:
        return read_idempotency_key(c.backfill, c.pk)
    return idempotency_key(c.lsn, c.seq)


def pg_timestamp_to_datetime(us_since_2000: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=us_since_2000)


class ChangeRow(NamedTuple):
    """One change in the canonical shape (docs/architecture.md §2).

    `committed_at_us` is microseconds since the Unix epoch (UTC); the Spark
    column is a timestamp. `unchanged_toast` lists columns left out of `record`
    because Postgres did not send their (unchanged, TOASTed) value. `table_oid` is the
    source table's OID (pgoutput's relation id): the same table under a new name keeps
    it, a new table under an old name has another; None on watermarks. `json_nulls` lists
    the json/jsonb columns of `record` whose value is the JSON null (`record` has `null`
    for them, as for SQL NULL), None when there are none. `backfill` is
    the backfill's id on rows a backfill read (action `read`), else None; it is not
    a column of the stream's schema (the pipeline adds it where backfill rows join).
    `change_lsn` is the LSN of the change's own WAL record (`lsn` is its commit's) and
    `last_commit_lsn` the end of the commit before its transaction in the slot's stream
    (Debezium's `source.sequence`: None for the first transaction a new slot sends), both
    None on a backfill's rows.
    """

    source: str
    lsn: int
    seq: int
    xid: int | None
    committed_at_us: int
    action: str
    schema: str
    table: str
    pk: list[str | None]
    record: str | None
    old: str | None
    annotations: str | None
    unchanged_toast: list[str] | None
    table_oid: int | None = None
    json_nulls: list[str] | None = None
    change_lsn: int | None = None
    last_commit_lsn: int | None = None
    backfill: int | None = None

    @property
    def cursor(self) -> WalCursor:
        return WalCursor(self.lsn, self.seq)

    @property
    def committed_at(self) -> datetime:
        return datetime.fromtimestamp(0, UTC) + timedelta(microseconds=self.committed_at_us)


ACTIONS = ("insert", "update", "delete", "truncate", "read")


class Column(NamedTuple):
    """One column of the canonical change schema."""

    name: str
    type: str  # string, bigint, int, timestamp, array<string>
    nullable: bool = True
    #: For an array: whether it may hold NULL elements (a key's parts may be NULL).
    elements_nullable: bool = False


#: The canonical change schema (docs/architecture.md §2), the one definition the Spark
#: DDL, Spark and Arrow schemas are made from; column order is the contract.
CHANGE_SCHEMA: tuple[Column, ...] = (
    Column("source", "string", False),
    Column("lsn", "bigint", False),
    Column("seq", "int", False),
    Column("xid", "bigint"),
    Column("committed_at", "timestamp", False),
    Column("action", "string", False),
    Column("schema", "string", False),
    Column("table", "string", False),
    Column("pk", "array<string>", False, elements_nullable=True),
    Column("record", "string"),
    Column("old", "string"),
    Column("annotations", "string"),
    Column("unchanged_toast", "array<string>"),
    Column("table_oid", "bigint"),
    Column("json_nulls", "array<string>"),
    Column("change_lsn", "bigint"),
    Column("last_commit_lsn", "bigint"),
)

#: The canonical change schema as a Spark DDL string.
CHANGE_SCHEMA_DDL = ", ".join(f"{c.name} {c.type.upper()}" for c in CHANGE_SCHEMA)

CHANGE_COLUMNS = tuple(c.name for c in CHANGE_SCHEMA)


def spark_schema() -> Any:
    """The canonical schema as a `pyspark.sql.types.StructType` (imports pyspark lazily)."""
    from pyspark.sql import types as T

    scalar = {
        "string": T.StringType(),
        "bigint": T.LongType(),
        "int": T.IntegerType(),
        "timestamp": T.TimestampType(),
    }

    def spark_type(c: Column) -> Any:
        if c.type.startswith("array<"):
            return T.ArrayType(scalar[c.type[6:-1]], c.elements_nullable)
        return scalar[c.type]

    return T.StructType([T.StructField(c.name, spark_type(c), c.nullable) for c in CHANGE_SCHEMA])


def arrow_schema() -> Any:
    """The canonical schema as a `pyarrow.Schema` (every field nullable, as Spark's Arrow
    batches hand them over; imports pyarrow lazily)."""
    import pyarrow as pa

    scalar = {
        "string": pa.string(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }

    def arrow_type(c: Column) -> Any:
        if c.type.startswith("array<"):
            return pa.list_(scalar[c.type[6:-1]])
        return scalar[c.type]

    return pa.schema([(c.name, arrow_type(c)) for c in CHANGE_SCHEMA])
