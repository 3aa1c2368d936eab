"""Where a stream's messages wait for pull consumers: three tables in the state database.

- `stream_messages`: one row per message, keyed (stream, source, lsn, seq). Executors
  write a partition's messages in one transaction per chunk, `ON CONFLICT DO NOTHING`:
  a replayed batch writes the same rows again and changes nothing.
- `stream_positions`: per (stream, source), the `visible` cursor — readers see messages
  at or below it only — and the `expired` cursor — retention deleted everything at or
  below it. The driver moves `visible` to a batch's last cursor once every partition
  of the batch has written (`make_visible`): the partitions write in parallel, so a
  reader never sees a later message of a source before an earlier one.
- `stream_groups`: consumer groups' checkpoints (positions as JSON).

A reader's position is one cursor per source (markers.py). A read runs in one
REPEATABLE READ snapshot: the positions and the rows it returns agree, also while
retention deletes rows; a position below `expired` is a gap (`Expired`).
"""

from __future__ import annotations

import heapq
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg import sql

from walstream.state.db import once_more
from walstream.state.streams import StreamTables
from walstream.streams.markers import START, Cursor


@dataclass(frozen=True)
class Stored:
    """One kept message."""

    source: str
    lsn: int
    seq: int
    table: str
    action: str
    key: str | None
    idempotency_key: str
    value: str | None
    stored_at: float

    @property
    def cursor(self) -> Cursor:
        return (self.lsn, self.seq)


@dataclass(frozen=True)
class Position:
    visible: Cursor = START  # readers see messages at or below this cursor
    expired: Cursor = START  # retention deleted every message at or below this cursor


class Expired(Exception):
    """A position below what retention kept: the consumer missed messages."""

    def __init__(self, source: str, at: Cursor, expired: Cursor) -> None:
        super().__init__(source, at, expired)
        self.source, self.at, self.expired = source, at, expired


class Ahead(Exception):
    """A position past what the stream holds (a marker of another deployment, or the
    state database was reset)."""

    def __init__(self, source: str, at: Cursor, visible: Cursor) -> None:
        super().__init__(source, at, visible)
        self.source, self.at, self.visible = source, at, visible


@dataclass(frozen=True)
class Page:
    messages: list[Stored]  # in merged order, each source's in WAL order
    positions: dict[str, Position]
    behind: int | None  # messages after the start position, when counted (at most the cap)


T = TypeVar("T")


class StreamStore(StreamTables):
    """Reads of the stream tables (the server) on top of the writes (`StreamTables`)."""

    def _setup(self) -> None:
        super()._setup()
        self._local = threading.local()

    # -- reading (the server) ----------------------------------------------------------------
    def _reader(self) -> Any:
        from walstream.postgres.replication import connect

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._local.conn = connect(self.dsn, autocommit=True)
        return conn

    def _snapshot(self) -> Any:
        """A read-only REPEATABLE READ transaction on this thread's reading connection."""
        conn = self._reader()
        tx = conn.transaction()
        tx.__enter__()
        try:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        except BaseException as exc:
            tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return conn, tx

    def _positions(self, conn: Any, stream: str) -> dict[str, Position]:
        rows = conn.execute(
            sql.SQL(
                "SELECT source, visible_lsn, visible_seq, expired_lsn, expired_seq FROM {} "
                "WHERE stream = %s"
            ).format(self.positions_table),
            (stream,),
        ).fetchall()
        return {r[0]: Position((r[1], r[2]), (r[3], r[4])) for r in rows}

    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on this thread's reading connection, with the state database's retry
        policy (`once_more`: a dropped connection is replaced and fn runs once more)."""
        return once_more(self._reader, lambda _conn: fn(*args))

    def positions(self, stream: str) -> dict[str, Position]:
        return self._retrying(lambda: self._positions(self._reader(), stream))

    def read(
        self,
        stream: str,
        sources: Iterable[str],
        after: dict[str, Cursor],
        limit: int,
        count_up_to: int | None = None,
    ) -> Page:
        """Up to `limit` visible messages after `after`, merged over `sources` by when they
        were kept, each source's in WAL order. Raises Expired or Ahead for a position the
        stream no longer or never held. `count_up_to`: count the messages behind too."""
        return self._retrying(self._read, stream, sources, after, limit, count_up_to)

    def _read(
        self,
        stream: str,
        sources: Iterable[str],
        after: dict[str, Cursor],
        limit: int,
        count_up_to: int | None,
    ) -> Page:
        conn, tx = self._snapshot()
        try:
            positions = self._positions(conn, stream)
            lists: list[list[Stored]] = []
            behind = 0 if count_up_to is not None else None
            for source in sources:
                pos = positions.get(source, Position())
                at = after.get(source, START)
                if at < pos.expired:
                    raise Expired(source, at, pos.expired)
                if at > pos.visible:
                    raise Ahead(source, at, pos.visible)
                if at == pos.visible:
                    continue
                where = sql.SQL(
                    "stream = %s AND source = %s AND (lsn, seq) > (%s, %s) AND (lsn, seq) <= (%s, %s)"
                )
                params = (stream, source, at[0], at[1], *pos.visible)
                rows = conn.execute(
                    sql.SQL(
                        "SELECT lsn, seq, tbl, action, key, ikey, value, "
                        "extract(epoch FROM stored_at)::float8 FROM {} WHERE {} "
                        "ORDER BY lsn, seq LIMIT %s"
                    ).format(self.messages, where),
                    (*params, limit),
                ).fetchall()
                lists.append([Stored(source, *r) for r in rows])
                if count_up_to is not None and behind is not None and behind < count_up_to:
                    behind += conn.execute(
                        sql.SQL(
                            "SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT %s) x"
                        ).format(self.messages, where),
                        (*params, count_up_to - behind),
                    ).fetchone()[0]
        except BaseException as exc:
            tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        tx.__exit__(None, None, None)
        merged = heapq.merge(*lists, key=lambda m: m.stored_at)
        return Page([m for _, m in zip(range(limit), merged, strict=False)], positions, behind)

    def stats(self, stream: str) -> tuple[int, int, float | None]:
        """(messages kept, their bytes, when the oldest was kept) of a stream."""
        (n, size, oldest), *_ = self._exec(
            sql.SQL(
                "SELECT count(*), coalesce(sum(bytes), 0), extract(epoch FROM min(stored_at)) "
                "FROM {} WHERE stream = %s"
            ).format(self.messages),
            (stream,),
        )
        return int(n), int(size), float(oldest) if oldest is not None else None

    # -- consumer groups ------------------------------------------------------------------
    def group(self, stream: str, name: str, start: dict[str, Cursor]) -> dict[str, Cursor]:
        """A group's checkpoint; a new group starts at `start` (and keeps it)."""
        self._exec(
            sql.SQL(
                "INSERT INTO {} (stream, name, positions) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING"
            ).format(self.groups),
            (stream, name, _positions_json(start)),
        )
        rows = self._exec(
            sql.SQL("SELECT positions FROM {} WHERE stream = %s AND name = %s").format(self.groups),
            (stream, name),
        )
        return _cursors(rows[0][0])

    def ack(self, stream: str, name: str, at: dict[str, Cursor]) -> dict[str, Cursor]:
        """Move a group's checkpoint to `at`, per source never backwards (consumers of one
        group ack in any order); returns the checkpoint."""
        from walstream.streams.markers import furthest

        conn = self._conn()
        with conn.transaction():
            row = conn.execute(
                sql.SQL(
                    "SELECT positions FROM {} WHERE stream = %s AND name = %s FOR UPDATE"
                ).format(self.groups),
                (stream, name),
            ).fetchone()
            merged = furthest(_cursors(row[0]), at) if row is not None else dict(at)
            conn.execute(
                sql.SQL(
                    """INSERT INTO {} (stream, name, positions) VALUES (%s, %s, %s)
                       ON CONFLICT (stream, name) DO UPDATE
                         SET positions = EXCLUDED.positions, updated_at = now()"""
                ).format(self.groups),
                (stream, name, _positions_json(merged)),
            )
        return merged


def _positions_json(positions: dict[str, Cursor]) -> str:
    return json.dumps({k: list(v) for k, v in positions.items()})


def _cursors(value: Any) -> dict[str, Cursor]:
    data = json.loads(value) if isinstance(value, str) else value
    return {k: (int(v[0]), int(v[1])) for k, v in data.items()}
