"""Backfills of lake sinks: rows read and placed as typed Arrow, never as change rows.

A lake sink (`type: delta`/`iceberg`) keeps typed columns, so its backfill chunks are
read with ADBC's binary COPY reader straight into the lake column types and staged as
Parquet (`arrow_read.read_typed_chunk`). Where the stream reaches a chunk's high
watermark, the pipeline hands the sink a `TypedReads`: the chunk files and the stream's
changes inside each chunk's window. The sink's writer (`lake/writer.py`) drops the
rows whose key changed there (DBLog: the stream's newer version wins) with an Arrow
anti-join on the typed key, and writes the rest in the batch's one commit per table.
A row goes through neither JSON nor Spark; only history mode's plan steps through
rows in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walstream.backfill.arrow_read import read_typed_chunk
from walstream.backfill.chunks import Table
from walstream.backfill.read import ChunkResult, ChunkTask, read_chunk
from walstream.config import SinkConfig
from walstream.decode.table_shape import TableShape
from walstream.sinks.base import Kind
from walstream.sinks.registry import capabilities


def lake_shape(conn: Any, sink: SinkConfig, table: Table) -> TableShape | None:
    """The lake columns a table sink's backfill of `table` reads (the sink's columns of
    those the publication sends: `table.columns`), or None when it is not read typed."""
    if not reads_typed(sink):
        return None
    shape: TableShape = sink.destination.typed_shape(conn, table.schema, table.name, table.columns)
    return shape


def read_task(task: ChunkTask) -> ChunkResult:
    """Read one chunk (in a Spark task): typed for a lake sink, else as change rows."""
    return read_typed_chunk(task) if task.shape is not None else read_chunk(task)


def reads_typed(sink: SinkConfig) -> bool:
    """Whether the sink's backfills are read typed: a lake sink, unless a SQL filter (or
    event types) over the change row must see the read rows as change rows."""
    tables = capabilities(sink.destination).kind is Kind.TABLES
    return tables and sink.filter is None and not sink.event_types


@dataclass(frozen=True)
class TypedChunk:
    """A chunk a batch places: its staged typed rows, their table and their place (the
    high watermark's cursor and commit time)."""

    backfill: int
    chunk: int
    attempt: int
    schema: str
    table: str
    path: str  # the staged Parquet file
    lsn: int
    seq: int
    committed_us: int


@dataclass(frozen=True)
class TypedReads:
    """A lake sink's read rows in one batch."""

    chunks: tuple[TypedChunk, ...]
    #: The stream's changes inside the chunks' windows (a Spark DataFrame, one row per
    #: change and chunk: `backfill`, `chunk`, `schema`, `table`, `action`, `record`, `old`),
    #: or None when the windows' batches had no change at all.
    inside: Any


@dataclass(frozen=True)
class ReadRows:
    """A message sink's read rows in one batch.

    `rows`: a Spark DataFrame of change rows (action `read`, the DBLog filter applied).
    `chunks` and `inside` are what they came from: the staged chunks (whose rows hold
    `pk`, `record`, `ord`) and the stream's changes inside their windows (None: there
    were none, and `changed` and `cut` are 0), for a sink
    that delivers them straight from the files (`pipeline/reads.py`). `changed`, `cut`
    and `moved` count those changes: key changes, truncates, updates that moved a key.
    """

    rows: Any
    chunks: tuple[TypedChunk, ...]
    inside: Any
    changed: int
    cut: int
    moved: int
