"""Read one chunk of a table between two watermarks (runs in a Spark task on an executor).

For chunk n of backfill b (attempt a):

1. emit the low watermark: a transactional logical message (prefix
   `walstream:backfill`) committed on its own;
2. `COPY (SELECT ... WHERE pk in range) TO STDOUT` — a snapshot taken after the
   low watermark committed — and turn each row into the canonical `record` and
   `pk` with the decoder's own codecs, so a read row is what the stream would
   send for the same values; the rows go to a Parquet file in the staging
   directory (written under a temporary name, then renamed);
3. emit the high watermark, once the file is complete.

The stream's pipeline sees both watermarks at their place in the WAL. When it
reaches the high one the file exists, and rows whose key changed between the
two are dropped there (DBLog). Memory is one Arrow batch of rows at a time.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.postgres.chunks import read_only
from walstream.postgres.decoder import WATERMARK_PREFIX
from walstream.postgres.fastpath import compile_fields_encoder
from walstream.postgres.table_shape import TableShape
from walstream.postgres.types import PgType, TypeRegistry

ROWS_PER_BATCH = 8192

_ESCAPES = {b"\\": b"\\", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f",
            b"v": b"\v"}  # fmt: skip
_ESCAPE = re.compile(rb"\\(.)", re.S)


def _unescape(value: bytes) -> bytes:
    """COPY text format: `\\n`, `\\t`, `\\\\` ... back to their bytes (COPY TO emits no
    octal or hex escapes)."""
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), value)


def copy_fields(line: bytes) -> list[bytes | None]:
    """One line of COPY text output as its values (None for NULL)."""
    if b"\\" not in line:
        return line.split(b"\t")  # type: ignore[return-value]
    return [None if f == b"\\N" else (_unescape(f) if b"\\" in f else f) for f in line.split(b"\t")]


@dataclass(frozen=True)
class ChunkTask:
    """Everything a task needs to read one chunk (pickled into it)."""

    dsn: str
    source: str
    backfill: int
    n: int
    attempt: int
    query: str  # the chunk's SELECT, boundaries inlined as literals
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key_idx: tuple[int, ...]
    types: tuple[PgType, ...]
    path: str  # the staging file (a path or URI)
    #: A lake sink's backfill: the rows are staged typed, in these lake columns
    #: (`arrow_read.read_typed_chunk`), and `query` selects them.
    shape: TableShape | None = None


@dataclass(frozen=True)
class ChunkResult:
    backfill: int
    n: int
    attempt: int
    rows: int
    seconds: float


def staged_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("pk", pa.list_(pa.string())), ("record", pa.string()), ("ord", pa.int32()),
        ("backfill", pa.int64()), ("chunk", pa.int32()),
    ])  # fmt: skip


def watermark(conn: Any, task: ChunkTask, mark: str, **extra: Any) -> None:
    content = json.dumps({
        "source": task.source, "backfill": task.backfill, "chunk": task.n,
        "attempt": task.attempt, "mark": mark, **extra,
    })  # fmt: skip
    conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, content))


def read_chunk(task: ChunkTask) -> ChunkResult:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from walstream.postgres.replication import connect

    t0 = time.monotonic()
    registry = TypeRegistry(task.types)
    encode = compile_fields_encoder(
        task.columns, [registry.codec(o) for o in task.type_oids], task.key_idx
    )
    schema = staged_schema()
    filesystem, path = pafs.FileSystem.from_uri(task.path)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    tmp = path + ".tmp"
    rows = 0
    with connect(task.dsn, autocommit=True) as conn:
        watermark(conn, task, "low")
        with (
            read_only(conn),  # the query holds the operator's predicate: it must not write
            filesystem.open_output_stream(tmp) as out,
            pq.ParquetWriter(out, schema) as writer,
            conn.cursor() as cur,
            cur.copy(sql.SQL("COPY ({}) TO STDOUT").format(sql.SQL(task.query))) as copy,
        ):
            keys = len(task.key_idx)
            pks: list[str | None] = []  # every row's key values, flat: `keys` per row
            records: list[str] = []
            rest = b""

            def flush() -> None:
                nonlocal pks, records
                if records:
                    n = len(records)
                    ords = pa.array(range(rows - n, rows), pa.int32())
                    offsets = pa.array(range(0, n * keys + 1, keys), pa.int32())
                    pk = pa.ListArray.from_arrays(offsets, pa.array(pks, pa.string()))
                    ids = [pa.repeat(pa.scalar(task.backfill, pa.int64()), n),
                           pa.repeat(pa.scalar(task.n, pa.int32()), n)]  # fmt: skip
                    writer.write_batch(
                        pa.RecordBatch.from_arrays(
                            [pk, pa.array(records), ords, *ids], schema=schema
                        )
                    )
                    pks, records = [], []

            for block in copy:
                lines = (rest + bytes(block)).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    record, pk = encode(copy_fields(line))
                    records.append(record)
                    pks.extend(pk)
                rows += len(lines)
                if len(records) >= ROWS_PER_BATCH:
                    flush()
            if rest:
                raise ValueError(f"COPY output ended inside a row: {rest[:80]!r}")
            flush()
        filesystem.move(tmp, path)
        watermark(conn, task, "high", rows=rows)
    return ChunkResult(task.backfill, task.n, task.attempt, rows, time.monotonic() - t0)
