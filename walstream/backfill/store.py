"""Backfills in the state database: what was asked, each chunk's progress, the watermarks seen.

Three tables in the state schema:

- `backfills`: one row per (sink, table) backfill — status (`pending` until
  `walstream run` takes it, `running`, `done`, `cancelled`, `failed`), the
  predicate, the chunk size it adapts, the estimated row count.
- `backfill_chunks`: one row per key range, written by the coordinator as it
  plans (`planned`), reads (`reading`, with an attempt number) and stages
  (`staged`, with the row count) a chunk; the pipeline sets `emitted` with the
  batch that delivered it. A crash leaves chunks in `reading`: they are read
  again under a new attempt; the first attempt whose high watermark the stream
  reaches is the one emitted, later ones are ignored.
- `backfill_marks`: the watermarks the pipeline saw, with their WAL cursor and
  batch, so a window that spans batches (and a replayed batch) is placed the
  same way every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from walstream.backfill.records import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    Backfill,
    Chunk,
    Mark,
)
from walstream.errors import ConfigError
from walstream.state import Store
from walstream.state.db import dedicated_connection

__all__ = [
    "ACTIVE",
    "CANCELLED",
    "DONE",
    "FAILED",
    "PENDING",
    "RUNNING",
    "Backfill",
    "BackfillStore",
    "Chunk",
    "Mark",
]

_BACKFILL_COLUMNS = """b.id, b.sink, b.source, b.table_schema, b.table_name, b."where",
    b.chunk_size, b.target_seconds, b.status, b.error, b.rows_estimated, b.created_at,
    b.started_at, b.finished_at, b.planned_all,
    (SELECT count(*) FROM {chunks} c WHERE c.backfill = b.id),
    (SELECT count(*) FROM {chunks} c WHERE c.backfill = b.id AND c.status = 'emitted'),
    (SELECT coalesce(sum(c.rows), 0)::bigint FROM {chunks} c
      WHERE c.backfill = b.id AND c.status IN ('staged', 'emitted'))"""


class BackfillStore(Store):
    """Access to the backfill tables (driver side; picklable, as every store)."""

    def _setup(self) -> None:
        self.tables = {
            "backfills": self.ident("backfills"),
            "chunks": self.ident("backfill_chunks"),
            "marks": self.ident("backfill_marks"),
            "schema": sql.Identifier(self.schema),
        }

    def _run(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A statement with `{backfills}`, `{chunks}`, `{marks}` standing for the tables."""
        return self._exec(sql.SQL(query).format(**self.tables), params)

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {backfills} (
                 id bigserial PRIMARY KEY,
                 sink text NOT NULL, source text NOT NULL,
                 table_schema text NOT NULL, table_name text NOT NULL, "where" text,
                 chunk_size int NOT NULL, target_seconds float8 NOT NULL,
                 status text NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'running', 'done', 'cancelled', 'failed')),
                 error text, rows_estimated bigint, planned_all boolean NOT NULL DEFAULT false,
                 key_columns text[],
                 created_at timestamptz NOT NULL DEFAULT now(),
                 started_at timestamptz, finished_at timestamptz)"""
            ).format(**self.tables),
            # the source table's OID when the backfill started (books made before it: NULL)
            sql.SQL("ALTER TABLE {backfills} ADD COLUMN IF NOT EXISTS table_oid bigint").format(
                **self.tables
            ),
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {chunks} (
                 backfill bigint NOT NULL REFERENCES {backfills} ON DELETE CASCADE,
                 n int NOT NULL, after text[], upto text[],
                 attempt int NOT NULL DEFAULT 0,
                 status text NOT NULL DEFAULT 'planned'
                   CHECK (status IN ('planned', 'reading', 'staged', 'emitted')),
                 rows bigint, seconds float8,
                 emitted_attempt int, emitted_batch bigint, emitted_query text,
                 cleaned boolean NOT NULL DEFAULT false,
                 PRIMARY KEY (backfill, n))"""
            ).format(**self.tables),
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {marks} (
                 backfill bigint NOT NULL REFERENCES {backfills} ON DELETE CASCADE,
                 chunk int NOT NULL, attempt int NOT NULL, mark text NOT NULL,
                 lsn bigint NOT NULL, seq int NOT NULL, batch bigint NOT NULL,
                 query_id text NOT NULL,
                 PRIMARY KEY (backfill, chunk, attempt, mark))"""
            ).format(**self.tables),
        ]

    # -- backfills ----------------------------------------------------------------------------
    def create(
        self,
        sink: str,
        source: str,
        schema: str,
        table: str,
        where: str | None,
        chunk_size: int,
        target_seconds: float,
        rows_estimated: int | None,
    ) -> int:
        busy = self._run(
            "SELECT id FROM {backfills} WHERE sink = %s AND table_schema = %s AND table_name = %s "
            "AND status IN ('pending', 'running')",
            (sink, schema, table),
        )
        if busy:
            raise ConfigError(
                f"backfill {busy[0][0]} of {schema}.{table} to sink {sink} is not finished",
                f"wait for it (`walstream backfill status`) or cancel it "
                f"(`walstream backfill cancel {busy[0][0]}`) first",
            )
        rows = self._run(
            """INSERT INTO {backfills} (sink, source, table_schema, table_name, "where",
                 chunk_size, target_seconds, rows_estimated)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (sink, source, schema, table, where, chunk_size, target_seconds, rows_estimated),
        )
        # wakes the coordinators listening (`requested`): delivered when the request commits
        self._run("SELECT pg_notify(%s, %s)", (self.channel, str(rows[0][0])))
        return int(rows[0][0])

    @property
    def channel(self) -> str:
        """The channel a new backfill is announced on (one per state schema)."""
        return f"walstream_backfills_{self.schema}"[:63]  # NAMEDATALEN - 1

    def listener(self) -> Any:
        """A connection of its own that hears each new backfill (`requested`)."""
        conn = dedicated_connection(self.dsn)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        return conn

    @staticmethod
    def requested(listener: Any, timeout: float) -> bool:
        """Wait until a backfill is requested or `timeout` seconds pass; whether one was."""
        return any(True for _ in listener.notifies(timeout=timeout, stop_after=1))

    def _select(self, where: str, params: Any) -> list[Backfill]:
        rows = self._run(
            f"SELECT {_BACKFILL_COLUMNS} FROM {{backfills}} b WHERE {where} ORDER BY b.id", params
        )
        return [Backfill(*r) for r in rows]

    def get(self, id_: int) -> Backfill | None:
        found = self._select("b.id = %s", (id_,))
        return found[0] if found else None

    def find(self, sink: str | None = None, active_only: bool = False) -> list[Backfill]:
        conds, params = ["true"], []
        if sink is not None:
            conds.append("b.sink = %s")
            params.append(sink)
        if active_only:
            conds.append("b.status IN ('pending', 'running')")
        return self._select(" AND ".join(conds), params)

    def active_ids(
        self, source: str, query_id: str, batch_id: int
    ) -> dict[int, tuple[str, str, str]]:
        """Backfills of a source a batch takes part in: id -> (sink, schema, table). The
        running ones, and any that had a chunk emitted by this very batch before (a replay
        must deliver the same rows, even when the backfill ended or was cancelled since)."""
        rows = self._run(
            """SELECT b.id, b.sink, b.table_schema, b.table_name FROM {backfills} b
               WHERE b.source = %s AND (b.status = 'running' OR EXISTS (
                 SELECT 1 FROM {chunks} c WHERE c.backfill = b.id AND c.emitted_query = %s
                   AND c.emitted_batch >= %s))""",
            (source, query_id, batch_id),
        )
        return {int(r[0]): (r[1], r[2], r[3]) for r in rows}

    def has_any(self, sink: str) -> bool:
        return bool(self._run("SELECT 1 FROM {backfills} WHERE sink = %s LIMIT 1", (sink,)))

    def start(
        self, id_: int, rows_estimated: int | None, key_columns: Sequence[str], table_oid: int = 0
    ) -> None:
        self._run(
            "UPDATE {backfills} SET status = 'running', started_at = coalesce(started_at, now()), "
            "rows_estimated = coalesce(%s, rows_estimated), key_columns = %s, "
            "table_oid = coalesce(table_oid, nullif(%s, 0)) WHERE id = %s AND status = 'pending'",
            (rows_estimated, list(key_columns), table_oid, id_),
        )

    def key_columns(self, ids: Sequence[int]) -> dict[int, tuple[list[str], int | None]]:
        """Per backfill: its table's key columns, and the table's OID (None if unknown)."""
        rows = self._run(
            "SELECT id, key_columns, table_oid FROM {backfills} WHERE id = ANY(%s)", (list(ids),)
        )
        return {int(r[0]): (list(r[1] or []), r[2]) for r in rows}

    def fail(self, id_: int, error: str) -> None:
        self._run(
            "UPDATE {backfills} SET status = 'failed', error = %s, finished_at = now() "
            "WHERE id = %s AND status IN ('pending', 'running')",
            (error, id_),
        )

    def cancel(self, ids: Sequence[int]) -> list[int]:
        rows = self._run(
            "UPDATE {backfills} SET status = 'cancelled', finished_at = now() "
            "WHERE id = ANY(%s) AND status IN ('pending', 'running') RETURNING id",
            (list(ids),),
        )
        return sorted(int(r[0]) for r in rows)

    def set_chunk_size(self, id_: int, size: int) -> None:
        self._run("UPDATE {backfills} SET chunk_size = %s WHERE id = %s", (size, id_))

    def finish_delivered(self, source: str) -> list[int]:
        """Running backfills of `source` with every chunk planned and emitted are done
        (called once a batch is delivered; a replay of it still includes them)."""
        rows = self._run(
            """UPDATE {backfills} b SET status = 'done', finished_at = now()
               WHERE b.source = %s AND b.status = 'running' AND b.planned_all
                 AND NOT EXISTS (SELECT 1 FROM {chunks} c WHERE c.backfill = b.id
                   AND c.status <> 'emitted')
               RETURNING b.id""",
            (source,),
        )
        return sorted(int(r[0]) for r in rows)

    # -- chunks (the coordinator) -------------------------------------------------------------
    def add_chunk(
        self, id_: int, n: int, after: Sequence[str] | None, upto: Sequence[str] | None
    ) -> None:
        self._run(
            "INSERT INTO {chunks} (backfill, n, after, upto) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (backfill, n) DO NOTHING",
            (
                id_,
                n,
                list(after) if after is not None else None,
                list(upto) if upto is not None else None,
            ),
        )
        if upto is None:
            self._run("UPDATE {backfills} SET planned_all = true WHERE id = %s", (id_,))

    def chunks(self, id_: int, status: str | None = None) -> list[Chunk]:
        cond = "" if status is None else " AND status = %s"
        rows = self._run(
            "SELECT backfill, n, after, upto, attempt, status, rows FROM {chunks} "
            f"WHERE backfill = %s{cond} ORDER BY n",
            (id_,) if status is None else (id_, status),
        )
        return [
            Chunk(
                r[0],
                r[1],
                tuple(r[2]) if r[2] is not None else None,
                tuple(r[3]) if r[3] is not None else None,
                r[4],
                r[5],
                r[6],
            )
            for r in rows
        ]

    def last_chunk(self, id_: int) -> Chunk | None:
        found = self._run(
            "SELECT backfill, n, after, upto, attempt, status, rows FROM {chunks} "
            "WHERE backfill = %s ORDER BY n DESC LIMIT 1",
            (id_,),
        )
        if not found:
            return None
        r = found[0]
        return Chunk(
            r[0],
            r[1],
            tuple(r[2]) if r[2] is not None else None,
            tuple(r[3]) if r[3] is not None else None,
            r[4],
            r[5],
            r[6],
        )

    def reading(self, id_: int, ns: Sequence[int]) -> dict[int, int]:
        """Chunks `ns` start a new read: their attempt numbers."""
        rows = self._run(
            "UPDATE {chunks} SET status = 'reading', attempt = attempt + 1 "
            "WHERE backfill = %s AND n = ANY(%s) AND status IN ('planned', 'reading') "
            "RETURNING n, attempt",
            (id_, list(ns)),
        )
        return {int(r[0]): int(r[1]) for r in rows}

    def staged(self, id_: int, n: int, attempt: int, rows: int, seconds: float) -> None:
        """A read finished: its high watermark is in the WAL (the pipeline may be past it)."""
        self._run(
            "UPDATE {chunks} SET rows = %s, seconds = %s, "
            "status = CASE WHEN status = 'reading' THEN 'staged' ELSE status END "
            "WHERE backfill = %s AND n = %s AND attempt = %s",
            (rows, seconds, id_, n, attempt),
        )

    def requeue(self, id_: int, n: int, attempt: int) -> None:
        """The pipeline cannot place this attempt of a chunk: read it again."""
        self._run(
            "UPDATE {chunks} SET status = 'planned' WHERE backfill = %s AND n = %s "
            "AND attempt = %s AND status <> 'emitted'",
            (id_, n, attempt),
        )

    def requeue_reading(self, ids: Sequence[int]) -> int:
        """After a restart: reads that were in flight are read again (a new attempt)."""
        rows = self._run(
            "UPDATE {chunks} SET status = 'planned' WHERE backfill = ANY(%s) AND status = 'reading' "
            "RETURNING n",
            (list(ids),),
        )
        return len(rows)

    # -- marks (the pipeline) -----------------------------------------------------------------
    def record_marks(self, marks: Sequence[Mark], query_id: str) -> None:
        for m in marks:  # few per batch
            self._run(
                "INSERT INTO {marks} (backfill, chunk, attempt, mark, lsn, seq, batch, query_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (backfill, chunk, attempt, mark) DO NOTHING",
                (m.backfill, m.chunk, m.attempt, m.mark, m.lsn, m.seq, m.batch, query_id),
            )

    def open_lows(self, ids: Sequence[int]) -> list[Mark]:
        """Low watermarks of chunks not emitted whose attempt's high was not seen yet."""
        rows = self._run(
            """SELECT l.backfill, l.chunk, l.attempt, l.mark, l.lsn, l.seq, l.batch
               FROM {marks} l JOIN {chunks} c ON c.backfill = l.backfill AND c.n = l.chunk
               WHERE l.backfill = ANY(%s) AND l.mark = 'low' AND c.status <> 'emitted'
                 AND NOT EXISTS (SELECT 1 FROM {marks} h WHERE h.backfill = l.backfill
                   AND h.chunk = l.chunk AND h.attempt = l.attempt AND h.mark = 'high')""",
            (list(ids),),
        )
        return [Mark(*r) for r in rows]

    def low(self, backfill: int, chunk: int, attempt: int) -> Mark | None:
        rows = self._run(
            "SELECT backfill, chunk, attempt, mark, lsn, seq, batch FROM {marks} "
            "WHERE backfill = %s AND chunk = %s AND attempt = %s AND mark = 'low'",
            (backfill, chunk, attempt),
        )
        return Mark(*rows[0]) if rows else None

    def emit(self, backfill: int, chunk: int, attempt: int, batch: int, query_id: str) -> bool:
        """Claim the chunk for this batch. True for the first high watermark of the chunk,
        and again when the same batch is replayed; False for any other attempt."""
        rows = self._run(
            """UPDATE {chunks} SET status = 'emitted', emitted_attempt = %s, emitted_batch = %s,
                 emitted_query = %s
               WHERE backfill = %s AND n = %s AND (emitted_attempt IS NULL OR (
                 emitted_attempt = %s AND emitted_batch = %s AND emitted_query = %s))
               RETURNING n""",
            (attempt, batch, query_id, backfill, chunk, attempt, batch, query_id),
        )
        return bool(rows)

    def committed_chunks(self, source: str, query_id: str, batch_id: int) -> list[tuple[int, int]]:
        """(backfill, chunk) emitted by a committed batch whose staged files are still there."""
        rows = self._run(
            """SELECT c.backfill, c.n FROM {chunks} c JOIN {backfills} b ON b.id = c.backfill
               WHERE b.source = %s AND c.status = 'emitted' AND NOT c.cleaned
                 AND (c.emitted_query <> %s OR c.emitted_batch < %s)""",
            (source, query_id, batch_id),
        )
        return [(int(r[0]), int(r[1])) for r in rows]

    def window_floor(self, source: str, query_id: str, batch_id: int) -> int | None:
        """The first batch holding a low watermark of a chunk of `source` that is not
        emitted, or is emitted by this batch or a later one (a replay emits it again)."""
        rows = self._run(
            """SELECT min(l.batch) FROM {marks} l
               JOIN {chunks} c ON c.backfill = l.backfill AND c.n = l.chunk
               JOIN {backfills} b ON b.id = l.backfill
               WHERE b.source = %s AND l.mark = 'low' AND l.query_id = %s
                 AND ((b.status = 'running' AND c.status <> 'emitted')
                      OR (c.emitted_query = %s AND c.emitted_batch >= %s))""",
            (source, query_id, query_id, batch_id),
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def abandoned_chunks(self, source: str) -> list[tuple[int, int]]:
        """(backfill, chunk) of cancelled or failed backfills never emitted: files to remove."""
        rows = self._run(
            """SELECT c.backfill, c.n FROM {chunks} c JOIN {backfills} b ON b.id = c.backfill
               WHERE b.source = %s AND b.status IN ('cancelled', 'failed')
                 AND c.status <> 'emitted' AND NOT c.cleaned""",
            (source,),
        )
        return [(int(r[0]), int(r[1])) for r in rows]

    def cleaned(self, chunks: Sequence[tuple[int, int]]) -> None:
        for b, n in chunks:
            self._run("UPDATE {chunks} SET cleaned = true WHERE backfill = %s AND n = %s", (b, n))
