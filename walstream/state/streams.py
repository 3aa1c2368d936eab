"""The pull subscriptions' tables: messages kept per stream, each source's positions, groups.

The stream sink writes here (executors) and makes batches visible (driver); the
read side is `walstream.streams.store.StreamStore`, which extends this class.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from psycopg import sql

from walstream.state.store import Store

Cursor = tuple[int, int]  # (lsn, seq)

_DDL = """
CREATE TABLE IF NOT EXISTS {messages} (
    stream text NOT NULL,
    source text NOT NULL,
    lsn bigint NOT NULL,
    seq int NOT NULL,
    tbl text NOT NULL,
    action text NOT NULL,
    key text,
    ikey text NOT NULL,
    value text,
    bytes int NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, source, lsn, seq)
);
CREATE INDEX IF NOT EXISTS stream_messages_stored_at ON {messages} (stream, stored_at);
CREATE TABLE IF NOT EXISTS {positions} (
    stream text NOT NULL,
    source text NOT NULL,
    visible_lsn bigint NOT NULL DEFAULT -1,
    visible_seq int NOT NULL DEFAULT -1,
    expired_lsn bigint NOT NULL DEFAULT -1,
    expired_seq int NOT NULL DEFAULT -1,
    PRIMARY KEY (stream, source)
);
CREATE TABLE IF NOT EXISTS {groups} (
    stream text NOT NULL,
    name text NOT NULL,
    positions jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, name)
);
"""

#: The columns a writer sends, in this order.
COLUMNS = ("stream", "source", "lsn", "seq", "tbl", "action", "key", "ikey", "value", "bytes")
Row = tuple[str, str, int, int, str, str, str | None, str, str | None, int]


# In-process wake-up: readers in the driver's process see new messages at once (others,
# e.g. a standby's server, look at the positions table every second).
_versions = itertools.count(1)
_version = 0


def version() -> int:
    """Changes each time a stream of this process got new visible messages."""
    return _version


def _bump() -> None:
    global _version
    _version = next(_versions)


class StreamTables(Store):
    """The tables above, in the state database (`dsn`, `schema`); picklable."""

    def _setup(self) -> None:
        self.messages = self.ident("stream_messages")
        self.positions_table = self.ident("stream_positions")
        self.groups = self.ident("stream_groups")

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(_DDL).format(
                messages=self.messages, positions=self.positions_table, groups=self.groups
            )
        ]

    # -- writing (executors) -------------------------------------------------------------
    def write(self, rows: Sequence[Row]) -> None:
        """Keep messages; those already kept (a replayed batch) are left as they are."""
        if not rows:
            return
        conn = self._conn()
        staging = sql.Identifier("walstream_stream_in")
        cols = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) "
                    "ON COMMIT DELETE ROWS"
                ).format(staging, self.messages)
            )
            with conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(staging, cols)) as copy:
                    for row in rows:
                        copy.write_row(row)
                cur.execute(
                    sql.SQL(
                        "INSERT INTO {} ({cols}) SELECT {cols} FROM {} ON CONFLICT DO NOTHING"
                    ).format(self.messages, staging, cols=cols)
                )

    # -- the driver ------------------------------------------------------------------------
    def make_visible(self, stream: str, source: str, cursor: Cursor) -> None:
        """Every message of `source` at or below `cursor` is written: readers may see them."""
        self._exec(
            sql.SQL(
                """INSERT INTO {t} AS p (stream, source, visible_lsn, visible_seq)
                   VALUES (%s, %s, %s, %s)
                   ON CONFLICT (stream, source) DO UPDATE
                     SET visible_lsn = EXCLUDED.visible_lsn, visible_seq = EXCLUDED.visible_seq
                   WHERE (p.visible_lsn, p.visible_seq)
                         < (EXCLUDED.visible_lsn, EXCLUDED.visible_seq)"""
            ).format(t=self.positions_table),
            (stream, source, cursor[0], cursor[1]),
        )
        _bump()

    def expire(self, stream: str, retention: float, max_bytes: int) -> int:
        """Delete what is past `retention` or over `max_bytes` (the oldest first: the newest
        messages that fit stay), per source a prefix of its visible messages; remember the
        last deleted cursor. Returns rows deleted."""
        conn = self._conn()
        deleted = 0
        with conn.transaction():
            cutoff = conn.execute(
                "SELECT now() - make_interval(secs => %s)", (retention,)
            ).fetchone()[0]  # type: ignore[index]
            # Per source, the newest message that does not fit in max_bytes (newest first:
            # within a source that order is its cursor order, so what goes is a prefix).
            over = {
                source: (lsn, seq)
                for source, lsn, seq in conn.execute(
                    sql.SQL(
                        """SELECT DISTINCT ON (source) source, lsn, seq FROM (
                             SELECT source, lsn, seq, sum(bytes) OVER (ORDER BY stored_at DESC,
                               source, lsn DESC, seq DESC) AS newer
                             FROM {} WHERE stream = %s) x
                           WHERE newer > %s ORDER BY source, lsn DESC, seq DESC"""
                    ).format(self.messages),
                    (stream, max_bytes),
                ).fetchall()
            }
            sources = conn.execute(
                sql.SQL(
                    "SELECT source, visible_lsn, visible_seq FROM {} WHERE stream = %s FOR UPDATE"
                ).format(self.positions_table),
                (stream,),
            ).fetchall()
            for source, vlsn, vseq in sources:
                old = conn.execute(
                    sql.SQL(
                        "SELECT lsn, seq FROM {} WHERE stream = %s AND source = %s "
                        "AND stored_at < %s AND (lsn, seq) <= (%s, %s) "
                        "ORDER BY lsn DESC, seq DESC LIMIT 1"
                    ).format(self.messages),
                    (stream, source, cutoff, vlsn, vseq),
                ).fetchone()
                found = [c for c in (old, over.get(source)) if c is not None]
                if not found:
                    continue
                last = min(max(tuple(c) for c in found), (vlsn, vseq))  # visible ones only
                cur = conn.execute(
                    sql.SQL(
                        "DELETE FROM {} WHERE stream = %s AND source = %s AND (lsn, seq) <= (%s, %s)"
                    ).format(self.messages),
                    (stream, source, last[0], last[1]),
                )
                deleted += cur.rowcount or 0
                conn.execute(
                    sql.SQL(
                        """UPDATE {} SET expired_lsn = %s, expired_seq = %s
                           WHERE stream = %s AND source = %s
                             AND (expired_lsn, expired_seq) < (%s, %s)"""
                    ).format(self.positions_table),
                    (last[0], last[1], stream, source, last[0], last[1]),
                )
        return deleted
