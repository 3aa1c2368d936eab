"""Read one chunk of a table between two watermarks (runs in a Spark task on an executor).

For chunk n of backfill b (attempt a):

1. emit the low watermark: a transactional logical message (prefix
   `walstream:backfill`) committed on its own;
2. `SELECT ... WHERE pk in range` — a snapshot taken after the low watermark
   committed — read as Arrow through ADBC's binary COPY, each column as its Postgres
   text (`values.columns.select_texts`), and turned into the canonical `record` and `pk`
   column by column (`values.columns.records`: the decoder's codecs as Arrow kernels), so a
   read row is what the stream would send for the same values; the rows go to a
   Parquet file in the staging directory (written under a temporary name, then
   renamed);
3. emit the high watermark, once the file is complete.

The stream's pipeline sees both watermarks at their place in the WAL. When it
reaches the high one the file exists, and rows whose key changed between the
two are dropped there (DBLog). Memory is one Arrow batch of rows at a time.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from walstream.change import parse_lsn
from walstream.decode.decoder import WATERMARK_PREFIX
from walstream.decode.table_shape import TableShape
from walstream.decode.types import PgType, TypeRegistry
from walstream.values.columns import json_nulls, records

#: How long a chunk read on a standby waits for it to replay the chunk's low watermark
#: (then the read fails as one that may succeed later, and the chunk is read again).
REPLAY_WAIT = 60.0


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
    #: Where the watermarks are written: `dsn`, or its primary when `dsn` is a standby
    #: (then the rows are read once the standby replayed the low one, standby.py).
    marks_dsn: str = ""


@dataclass(frozen=True)
class ChunkResult:
    backfill: int
    n: int
    attempt: int
    rows: int
    seconds: float


def staged_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("pk", pa.list_(pa.string())),
            ("record", pa.string()),
            ("ord", pa.int32()),
            ("backfill", pa.int64()),
            ("chunk", pa.int32()),
            ("json_nulls", pa.list_(pa.string())),
        ]
    )


def watermark_content(task: ChunkTask, mark: str, **extra: Any) -> str:
    """The content of the chunk's `mark` watermark (`capture.wal_buffer.is_low_mark` knows
    a low one by its `"mark": "low"`)."""
    return json.dumps(
        {
            "source": task.source,
            "backfill": task.backfill,
            "chunk": task.n,
            "attempt": task.attempt,
            "mark": mark,
            **extra,
        }
    )


def watermark(conn: Any, task: ChunkTask, mark: str, **extra: Any) -> int:
    """Emit the chunk's `mark` watermark through `conn`; its LSN."""
    content = watermark_content(task, mark, **extra)
    return parse_lsn(
        conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)::text", (WATERMARK_PREFIX, content)
        ).fetchone()[0]
    )


def stage_chunk(
    task: ChunkTask, schema: Any, batches: Callable[[Any], Iterator[Any]]
) -> ChunkResult:
    """Between the chunk's two watermarks, the record batches `batches(conn)` reads (`conn`:
    an ADBC connection) staged as one Parquet file of `schema`: written under a temporary
    name, then renamed, before the high watermark is emitted."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from walstream.backfill.adbc import connect as arrow_connect
    from walstream.postgres.replication import connect
    from walstream.postgres.standby import in_recovery, wait_replayed

    t0 = time.monotonic()
    filesystem, path = pafs.FileSystem.from_uri(task.path)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    tmp = path + ".tmp"
    rows = 0
    marks_dsn = task.marks_dsn or task.dsn
    with connect(marks_dsn, autocommit=True) as marks, closing(arrow_connect(task.dsn)) as conn:
        low = watermark(marks, task, "low")
        if marks_dsn != task.dsn:  # a standby: read once it has the low watermark
            with connect(task.dsn, autocommit=True) as standby:
                if in_recovery(standby):
                    wait_replayed(standby, low, REPLAY_WAIT)
        with (
            filesystem.open_output_stream(tmp) as out,
            pq.ParquetWriter(out, schema, compression="snappy") as writer,
        ):
            for batch in read_ahead(batches(conn)):
                writer.write_batch(batch)
                rows += batch.num_rows
        filesystem.move(tmp, path)
        watermark(marks, task, "high", rows=rows)
    return ChunkResult(task.backfill, task.n, task.attempt, rows, time.monotonic() - t0)


def read_ahead(batches: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """`batches`, read up to `depth` ahead in a thread of their own: ADBC's reader and the
    Parquet writer both work without the GIL, so the next batch is read (and decoded)
    while this one is written. An error of the reading is raised here; when the consumer
    stops early, the reading stops and `batches` is closed (its transaction ends)."""
    items: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(end)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    reader = threading.Thread(target=produce, name="walstream-chunk-read", daemon=True)
    reader.start()
    try:
        while True:
            item = items.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()


def read_chunk(task: ChunkTask) -> ChunkResult:
    """The chunk's rows as change rows (`record`, `pk`), staged (`stage_chunk`)."""
    import pyarrow as pa

    from walstream.backfill.adbc import fetch_batches

    registry = TypeRegistry(task.types)
    codecs = [registry.codec(o) for o in task.type_oids]
    schema = staged_schema()

    def staged(conn: Any) -> Iterator[Any]:
        done = 0
        # the query selects each column as the text its kernel takes (`select_texts`)
        for batch in fetch_batches(conn, task.query):
            n = batch.num_rows
            record, pk = records(batch.columns, task.columns, codecs, task.key_idx)
            ids = [
                pa.repeat(pa.scalar(task.backfill, pa.int64()), n),
                pa.repeat(pa.scalar(task.n, pa.int32()), n),
            ]
            ords = pa.array(range(done, done + n), pa.int32())
            nulls = json_nulls(batch.columns, task.columns, codecs)
            yield pa.RecordBatch.from_arrays([pk, record, ords, *ids, nulls], schema=schema)
            done += n

    return stage_chunk(task, schema, staged)
