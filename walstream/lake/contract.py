"""What the lake sinks (`type: delta`, `type: iceberg`) share: settings, batches, the contract.

A lake sink is not a message sink. It receives, on the driver, one `TableBatch` per
source table and micro-batch: the batch's changes of that table as typed columns
(see `decode/table_shape.py`), sorted by WAL cursor. It writes them into the
table's lake table in ONE commit that records the batch (Delta: an application
transaction; Iceberg: snapshot properties), so a replayed batch writes nothing
twice. Modes:

- `mirror` (SCD type 1): the lake table equals the source table. Per batch the
  newest version of each key (by `(lsn, seq)`) is merged: insert or replace, or
  delete; a truncate empties the table first.
- `history` (SCD type 2): every version is a row with `_op`, `_lsn`, `_seq`,
  `valid_from`, `valid_to` (NULL while current) and `is_current`; a new version
  closes the previous one; a delete closes it and adds a row with `_op = 'delete'`
  (never current); a truncate closes every current row.
- `changelog`: every change appended with `_op`, `_lsn`, `_seq`, `_committed_at`,
  the row after the change and `_before` (the row before, when Postgres sent it).
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from walstream.decode.table_shape import TableShape, load_shape
from walstream.fields import Duration, Model, Size
from walstream.sinks.base import Capabilities, DestinationSettings, Kind, Sink, SinkContext

Mode = Literal["mirror", "history", "changelog"]
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def check_template(template: str, what: str) -> str:
    """A target name template may use `{schema}` and `{table}` and nothing else."""
    unknown = [p for p in _PLACEHOLDER.findall(template) if p not in ("schema", "table")]
    if unknown:
        raise ValueError(
            f"{what} {template!r}: unknown placeholder {{{unknown[0]}}}; "
            "use {schema} and {table}"
        )
    return template


def fill_template(template: str, schema: str, table: str) -> str:
    return template.replace("{schema}", schema).replace("{table}", table)


class Columns(Model):
    """Which source columns the lake table has (the key columns are always kept)."""

    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)


class Optimize(Model):
    """Background maintenance: compaction of small files and cleanup of old snapshots."""

    every: Duration | None = None  # None: only `walstream lake optimize SINK`
    target_file_size: Size = 128 * 1024 * 1024
    retain: Duration = 7 * 86400.0  # snapshots / removed files kept this long (time travel)


class LakeDestination(DestinationSettings):
    """Settings every lake sink has: mode, partitioning, columns, maintenance."""

    mode: Mode = "mirror"
    partition_by: list[str] = Field(default_factory=list)
    columns: Columns = Field(default_factory=lambda: Columns.model_validate({}))
    optimize: Optimize = Field(default_factory=lambda: Optimize.model_validate({}))
    #: How a mirror replaces and deletes rows the table has: `copy_on_write` rewrites each
    #: data file that holds one; `merge_on_read` marks them deleted (Delta deletion vectors,
    #: Iceberg position deletes) and appends the new versions: a cost per change, not per
    #: file, for readers that apply deletes (docs/lakehouse.md, "Merge-on-read").
    updates: Literal["copy_on_write", "merge_on_read"] = "copy_on_write"
    #: The source's DSN (filled in by the plan): the catalog gives each table's types.
    source_dsn: SecretStr | None = None
    _state_dsn: str = PrivateAttr("")
    _state_schema: str = PrivateAttr("walstream")

    @field_validator("partition_by")
    @classmethod
    def _no_duplicates(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a column is named twice")
        return v

    @model_validator(mode="after")
    def _merge_on_read(self) -> LakeDestination:
        if self.updates == "merge_on_read" and self.mode == "changelog":
            raise ValueError(
                "updates: merge_on_read is for mode: mirror or history (a changelog only appends)"
            )
        if self.updates == "merge_on_read" and self.partition_by:
            raise ValueError("updates: merge_on_read does not take partition_by (yet)")
        return self

    def typed_shape(self, conn: Any, schema: str, table: str, columns: Any) -> TableShape:
        """The lake columns of `schema.table` (of those the publication sends, `columns`)."""
        shape = load_shape(conn, schema, table, need_key=self.mode != "changelog")
        return shape.select(self.columns.include, self.columns.exclude).select(columns, None)

    def resolved(self, context: SinkContext) -> Any:
        copy = self.model_copy(
            update={}
            if self.source_dsn is not None
            else {"source_dsn": SecretStr(context.source_dsn)}
        )
        copy._state_dsn = context.state_dsn
        copy._state_schema = context.state_schema
        return copy

    @property
    def state_dsn(self) -> str:
        return self._state_dsn

    @property
    def state_schema(self) -> str:
        return self._state_schema

    def location(self, schema: str, table: str) -> str:
        """Where a source table's lake table is (a path or URI, a catalog identifier)."""
        raise NotImplementedError

    def location_for_messages(self, schema: str, table: str) -> str:
        """`location` fit for logs and errors (no credentials)."""
        return self.location(schema, table)

    def group_by(self) -> list[str] | None:
        return ["schema", "table"]

    def message_format(self) -> str | None:
        return "record"


@dataclass(frozen=True)
class TableBatch:
    """One source table's changes in one micro-batch, typed, in WAL order.

    `rows` (a pyarrow Table): `_op` (insert/update/delete/truncate/read), `_lsn`,
    `_seq`, `_committed_at` (UTC timestamp), `_toast` (columns whose unchanged TOAST
    value Postgres did not send: unknown, never NULL), the shape's columns, and
    `_before` (a struct of the shape's columns: the row before, when known).
    """

    sink: str
    query_id: str
    batch_id: int
    shape: TableShape
    rows: Any
    #: Every change of the table is here (no filter, every action, no reset): an insert is
    #: a key the lake table does not have yet.
    complete: bool = False
    #: The source table's rows now, of some keys ({key: {column: value}}): where an
    #: unchanged TOAST value comes from when neither the batch nor the lake table has an
    #: earlier version of its row (`lake_plan.fill_toast`). None: such a value stops the batch.
    source_rows: Callable[[list[tuple[Any, ...]]], dict[tuple[Any, ...], dict[str, Any]]] | None = (
        field(default=None, compare=False)
    )

    #: Keys the executors planned and wrote already (a merge-on-read mirror's or history's,
    #: see `lake/files.py`): `rows` then holds only the changes of keys that need the
    #: table's current rows, and the commit adds these files and deletes (a history:
    #: closes) the touched keys' rows.
    staged: StagedRows | None = field(default=None, compare=False)

    @property
    def marker(self) -> str:
        """What the commit records: this query's batch (a replay finds it)."""
        return f"{self.query_id}:{self.batch_id}"


@dataclass(frozen=True)
class StagedRows:
    """Rows of some keys written by the executors as staged Parquet files in the table's
    columns (the batch's types): a mirror's newest version of each, a history's every
    version. `touched`: a mirror's keys upserted or deleted (a pyarrow Table of the key
    columns; None: every key is new to the table), whose rows the sink deletes; a
    history's keys with `ENDS`, when the table's current version of each ends, which the
    sink closes. Both in the batch's one commit, with the files added."""

    #: (staged file, a name unique to it in the table's data files)
    files: tuple[tuple[str, str], ...]
    touched: Any

    def ends(self, key: list[str]) -> dict[tuple[Any, ...], Any]:
        """A history's `touched` as {key: when its current version ends}."""
        if self.touched is None:
            return {}
        return {tuple(r[k] for k in key): r[ENDS] for r in self.touched.to_pylist()}


#: The column of a history's `StagedRows.touched`: when each key's current version ends.
ENDS = "_ends"


@dataclass(frozen=True)
class FilesBatch:
    """One table's new rows in a micro-batch as staged Parquet files in its lake columns: a
    mirror's backfill chunks from which nothing was dropped, or a changelog's rows the
    executors wrote. A sink may commit them as they are."""

    sink: str
    query_id: str
    batch_id: int
    shape: TableShape
    #: (staged file, a name unique to it in the table's data files)
    files: tuple[tuple[str, str], ...]

    @property
    def marker(self) -> str:
        return f"{self.query_id}:{self.batch_id}"


@dataclass(frozen=True)
class Written:
    """What a lake sink did with one TableBatch."""

    target: str
    rows: int  # rows added to the lake table
    replayed: bool = False  # the batch was committed already: nothing written


class TableSink(Sink):
    """A sink writing typed batches into tables on the driver (see the module docstring)."""

    capabilities = Capabilities(Kind.TABLES)
    config: LakeDestination

    @abstractmethod
    def target(self, schema: str, table: str) -> str:
        """Where a source table's rows go (a path, a catalog name), for messages."""

    @abstractmethod
    def write_batch(self, batch: TableBatch) -> Written:
        """Write one table's batch in one commit; nothing when the commit exists already."""

    def adopt_files(self, batch: FilesBatch) -> Written | None:
        """Commit the staged files as the batch's rows of one table, in one commit, when the
        table can take them as they are; None: the rows are written with `write_batch`."""
        return None

    @abstractmethod
    def optimize(self, schema: str, table: str) -> dict[str, Any]:
        """Compact small files and expire what `optimize.retain` no longer keeps."""

    @abstractmethod
    def scan(self, schema: str, table: str, columns: list[str]) -> Any | None:
        """The live rows of a source table's lake table now (deletes applied), as an Arrow
        RecordBatchReader of `columns`; None when the table does not exist (`walstream
        verify` reads a sink with it)."""
