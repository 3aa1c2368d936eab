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

from psycopg import sql

from walstream.state import Store

Cursor = tuple[int, int]


class Ledger(Store):
    """`delivery_ledger` in the state schema (see the module docstring); picklable."""

    def _setup(self) -> None:
        self.table = self.ident("delivery_ledger")

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                     sink text NOT NULL, batch_id bigint NOT NULL, partition int NOT NULL,
                     partitions int NOT NULL, query_id text NOT NULL,
                     lsn bigint NOT NULL, seq int NOT NULL, delivered bigint NOT NULL,
                     updated_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (sink, batch_id, partition))"""
            ).format(self.table)
        ]

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

    def start_batch(self, sink: str, query_id: str, batch_id: int) -> bool:
        """Batch `batch_id` is starting: earlier batches (and other queries) are never replayed.
        True when the ledger holds nothing of this batch yet (it is not a replay)."""
        rows = self._exec(
            sql.SQL(
                "WITH gone AS (DELETE FROM {} WHERE sink = %s AND (batch_id < %s OR query_id <> %s)) "
                "SELECT NOT EXISTS (SELECT 1 FROM {} WHERE sink = %s AND batch_id = %s "
                "AND query_id = %s)"
            ).format(self.table, self.table),
            (sink, batch_id, query_id, sink, batch_id, query_id),
        )
        return bool(rows[0][0])
