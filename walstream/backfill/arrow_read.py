"""Read table rows as typed Arrow with a C reader of Postgres' binary COPY (ADBC).

The lake sinks' backfill path (issue 22): a chunk's rows come out of Postgres as
Arrow, already in the lake table's column types (`decode/table_shape.py`), with no
Python step per row and no JSON. `adbc-driver-postgresql` runs the query as
`COPY (...) TO STDOUT (FORMAT binary)` and decodes it in C.

Columns the lake keeps as text (uuid, enums, json, time, interval, numeric without
precision, char(n), inet, ...) are selected as their type's output text
(`values.columns.output_text`; `::text` differs for char(n) and inet), so their text is
Postgres' own — the text the stream's decoder reads from pgoutput, with the same
session settings (`SESSION_SETTINGS`). Other columns are read in their binary form and cast to the lake
type; a value that does not fit (numeric NaN into a decimal) fails the read, as it
pauses a streaming batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql

from walstream.backfill.adbc import fetch_batches
from walstream.backfill.read import ChunkResult, ChunkTask, stage_chunk
from walstream.decode.table_shape import TableShape
from walstream.errors import SinkError
from walstream.values.columns import TEXT_AS_SENT, output_text


def select_list(shape: TableShape) -> list[sql.Composable]:
    """The shape's columns as a SELECT list, named as the columns: text ones as their
    type's output text (text types as they are: their binary form is that text), arrays
    of text as `::text[]`, the others as they are."""
    out: list[sql.Composable] = []
    for c in shape.columns:
        col = sql.Identifier(c.name)
        if c.type == "STRING" and shape.pg_types.get(c.name) in TEXT_AS_SENT:
            out.append(col)
        elif c.type == "STRING":  # the type's output text, as the stream has it
            out.append(sql.SQL("{} AS {}").format(output_text(col), col))
        elif c.type == "ARRAY<STRING>":
            out.append(sql.SQL("{}::text[] AS {}").format(col, col))
        else:
            out.append(col)
    return out


def select(shape: TableShape, where: sql.Composable | None = None) -> sql.Composed:
    """`SELECT` of the shape's columns (text ones as `::text`), optionally with a WHERE."""
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(select_list(shape)), sql.Identifier(shape.schema, shape.table)
    )
    return query if where is None else sql.SQL("{} WHERE {}").format(query, where)


def read_batches(
    conn: Any, shape: TableShape, query: sql.Composed | str, params: Sequence[Any] = ()
) -> Iterator[Any]:
    """The query's rows as Arrow record batches in the shape's lake types, read in a READ
    ONLY transaction (a backfill's predicate cannot write)."""
    schema = shape.arrow_schema()
    for batch in fetch_batches(conn, query, params):
        yield _cast(batch, schema, shape)


def read_typed_chunk(task: ChunkTask) -> ChunkResult:
    """`read.read_chunk` for a lake sink: the chunk's rows between the two watermarks,
    staged as Parquet in the lake types of `task.shape` (row order: the key's)."""
    shape = task.shape
    assert shape is not None, "a typed chunk task names its shape"
    return stage_chunk(
        task, shape.arrow_schema(), lambda conn: read_batches(conn, shape, task.query)
    )


def _cast(batch: Any, schema: Any, shape: TableShape) -> Any:
    import pyarrow as pa

    columns = []
    for i, field in enumerate(schema):
        col = batch.column(i)
        if isinstance(col.type, pa.ExtensionType):
            col = col.storage
        try:
            columns.append(col.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SinkError(
                f"backfill of {shape.schema}.{shape.table}: column {field.name} (Postgres "
                f"{shape.pg_types.get(field.name, '?')}) has a value its lake column "
                f"({field.type}) cannot hold: {exc}",
                "leave the column out of the sink (columns: exclude: [...]), or change the "
                "value (numeric NaN and infinite dates have no typed column)",
                retryable=False,
            ) from exc
    return pa.RecordBatch.from_arrays(columns, schema=schema)
