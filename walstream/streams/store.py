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
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from psycopg import sql

from walstream.delivery.ledger import execute, state_connection
from walstream.streams.markers import START, Cursor

_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
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


@dataclass(frozen=True)
class Stored:
    """One kept message."""

    source: str
    lsn: int
    seq: int
    table: str
    action: str
    key: str | None
    ikey: str
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
_TICK = timedelta(microseconds=1)

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


class StreamStore:
    """The tables above, in the state database (`dsn`, `schema`); picklable."""

    def __init__(self, dsn: str, schema: str = "walstream") -> None:
        self.dsn = dsn
        self.schema = schema
        self.messages = sql.Identifier(schema, "stream_messages")
        self.positions_table = sql.Identifier(schema, "stream_positions")
        self.groups = sql.Identifier(schema, "stream_groups")
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dsn"], state["schema"])  # type: ignore[misc]

    def _exec(self, query: sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
        return execute(self.dsn, query, params)  # type: ignore[arg-type]

    def ensure(self) -> None:
        """Create the tables when missing (driver, once at start)."""
        self._exec(
            sql.SQL(_DDL).format(
                schema=sql.Identifier(self.schema),
                messages=self.messages,
                positions=self.positions_table,
                groups=self.groups,
            )
        )

    # -- writing (executors) -------------------------------------------------------------
    def write(self, rows: Sequence[Row]) -> None:
        """Keep messages; those already kept (a replayed batch) are left as they are."""
        if not rows:
            return
        conn = state_connection(self.dsn)
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
        """Delete what is past `retention` or over `max_bytes` (oldest first), per source
        a prefix of its messages; remember the last deleted cursor. Returns rows deleted."""
        conn = state_connection(self.dsn)
        deleted = 0
        with conn.transaction():
            cutoff = conn.execute(
                "SELECT now() - make_interval(secs => %s)", (retention,)
            ).fetchone()[0]  # type: ignore[index]
            total = conn.execute(
                sql.SQL("SELECT coalesce(sum(bytes), 0) FROM {} WHERE stream = %s").format(
                    self.messages
                ),
                (stream,),
            ).fetchone()[0]  # type: ignore[index]
            if total > max_bytes:  # the newest messages that fit; everything older goes
                row = conn.execute(
                    sql.SQL(
                        """SELECT stored_at FROM (
                             SELECT stored_at, sum(bytes) OVER (ORDER BY stored_at DESC,
                               source, lsn DESC, seq DESC) AS newer
                             FROM {} WHERE stream = %s) x
                           WHERE newer > %s ORDER BY stored_at DESC LIMIT 1"""
                    ).format(self.messages),
                    (stream, max_bytes),
                ).fetchone()
                if row is not None:
                    cutoff = max(cutoff, row[0] + _TICK)
            sources = conn.execute(
                sql.SQL(
                    "SELECT source, visible_lsn, visible_seq FROM {} WHERE stream = %s FOR UPDATE"
                ).format(self.positions_table),
                (stream,),
            ).fetchall()
            for source, vlsn, vseq in sources:
                last = conn.execute(
                    sql.SQL(
                        "SELECT lsn, seq FROM {} WHERE stream = %s AND source = %s "
                        "AND stored_at < %s AND (lsn, seq) <= (%s, %s) "
                        "ORDER BY lsn DESC, seq DESC LIMIT 1"
                    ).format(self.messages),
                    (stream, source, cutoff, vlsn, vseq),
                ).fetchone()
                if last is None:
                    continue
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
        """fn(*args) on this thread's reading connection; after a failure the connection is
        closed and fn runs once more on a new one (Expired and Ahead are answers: raised)."""
        for attempt in (1, 2):
            try:
                return fn(*args)
            except (Expired, Ahead):
                raise
            except Exception:
                conn, self._local.conn = getattr(self._local, "conn", None), None
                if conn is not None:
                    conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

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

        conn = state_connection(self.dsn)
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
