"""The delivery ledger: what each sink delivered of the micro-batch Spark may replay.

One row per (sink, batch id, partition): the cursor through which that partition's
messages are acknowledged by the destination, written after each acknowledged
chunk. When Spark replays a batch (a crash between the sink's write and Spark's
commit log), the same changes land in the same partitions in the same order, so
the replay skips every message at or below that cursor.

Duplicate window: the messages of one chunk (`batch_size`) per partition that the
destination acknowledged but whose ledger write did not happen before a crash.

Rows belong to one query (`query_id`, stable across restarts from the same
checkpoint): a new checkpoint never skips anything because of an old one. Rows of
batches before the current one are deleted when the next batch starts, since
Spark never replays a batch whose successor started.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql

from walstream.errors import ConnectionFailed

_CONNS: dict[tuple[str, int], psycopg.Connection[Any]] = {}
_LOCK = threading.Lock()

Cursor = tuple[int, int]


def state_connection(dsn: str) -> psycopg.Connection[Any]:
    """One autocommit connection per state database per thread (executors reuse workers).

    Per thread: the driver's retrier runs transactions while the batch thread writes
    the ledger, and statements of one must never land inside the other's transaction.
    """
    key = (dsn, threading.get_ident())
    with _LOCK:
        conn = _CONNS.get(key)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        try:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise ConnectionFailed(
                f"cannot reach the state database: {str(exc).strip()}",
                "check state.dsn (default: the first source's dsn) and that the server is up",
            ) from exc
        _CONNS[key] = conn
        return conn


def execute(dsn: str, query: sql.Composed | sql.SQL, params: Any = None) -> list[tuple[Any, ...]]:
    """Run a statement on this thread's state connection; its rows (none for DDL/DML).

    A connection a server restart dropped is reopened once, never inside a transaction
    (half a transaction is never replayed).
    """
    for attempt in (1, 2):
        conn = state_connection(dsn)
        in_transaction = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        try:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []
        except psycopg.OperationalError:
            if attempt == 2 or in_transaction:
                raise
            conn.close()
    raise AssertionError("unreachable")


class Ledger:
    def __init__(self, dsn: str, schema: str = "walstream") -> None:
        self.dsn = dsn
        self.schema = schema
        self.table = sql.Identifier(schema, "delivery_ledger")

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dsn"], state["schema"])  # type: ignore[misc]

    def _exec(self, query: sql.Composed | sql.SQL, params: Any = None) -> list[tuple[Any, ...]]:
        return execute(self.dsn, query, params)

    def ensure(self) -> None:
        """Create the schema and table when missing (driver, once at start)."""
        self._exec(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        self._exec(
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                     sink text NOT NULL, batch_id bigint NOT NULL, partition int NOT NULL,
                     partitions int NOT NULL, query_id text NOT NULL,
                     lsn bigint NOT NULL, seq int NOT NULL, delivered bigint NOT NULL,
                     updated_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (sink, batch_id, partition))"""
            ).format(self.table)
        )

    def delivered_through(
        self, sink: str, query_id: str, batch_id: int, partition: int, partitions: int
    ) -> Cursor | None:
        rows = self._exec(
            sql.SQL(
                "SELECT lsn, seq FROM {} WHERE sink = %s AND batch_id = %s AND partition = %s "
                "AND partitions = %s AND query_id = %s"
            ).format(self.table),
            (sink, batch_id, partition, partitions, query_id),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def record(
        self,
        sink: str,
        query_id: str,
        batch_id: int,
        partition: int,
        partitions: int,
        cursor: Cursor,
        delivered: int,
    ) -> None:
        self._exec(
            sql.SQL(
                """INSERT INTO {} (sink, batch_id, partition, partitions, query_id, lsn, seq, delivered)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (sink, batch_id, partition) DO UPDATE SET
                     partitions = EXCLUDED.partitions, query_id = EXCLUDED.query_id,
                     lsn = EXCLUDED.lsn, seq = EXCLUDED.seq, delivered = EXCLUDED.delivered,
                     updated_at = now()"""
            ).format(self.table),
            (sink, batch_id, partition, partitions, query_id, cursor[0], cursor[1], delivered),
        )

    def start_batch(self, sink: str, query_id: str, batch_id: int) -> None:
        """Batch `batch_id` is starting: earlier batches (and other queries) are never replayed."""
        self._exec(
            sql.SQL("DELETE FROM {} WHERE sink = %s AND (batch_id < %s OR query_id <> %s)").format(
                self.table
            ),
            (sink, batch_id, query_id),
        )
