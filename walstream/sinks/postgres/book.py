"""The Postgres mirror's bookkeeping in its target database, written with each chunk.

Its tables are in the target database's schema named like the state schema (`state.schema`,
default `walstream`):

- `<schema>.mirror_cursors`: per sink and source table, the cursor of the newest
  change applied; it only moves forward. A change at or before it is a replay.
- `<schema>.mirror_refused`: changes the target refused (they become dead letters),
  with their row's key. A later applied change of the same row (or a truncate of the
  table) marks one superseded. A retried dead letter still listed is applied even
  behind the cursor; a superseded one is refused again, saying why.
- `<schema>.mirror_tables`: which sink and source table (and the source table's OID)
  fill each target table. A second claim on one target table is a ConfigError (two
  sources would mix rows).
- `<schema>.mirror_renames`: a source table seen under a new name, and the batch that
  first saw it (`mirror_rename.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from walstream.errors import ConfigError

Cursor = tuple[int, int]
Ident = tuple[str, str]  # a source table: (schema, table)

APPLY, SKIP, SUPERSEDED = "apply", "skip", "superseded"

DDL = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    "CREATE TABLE IF NOT EXISTS {s}.mirror_cursors (sink text, source_table text, "
    "lsn bigint NOT NULL, seq int NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), "
    "PRIMARY KEY (sink, source_table))",
    "CREATE TABLE IF NOT EXISTS {s}.mirror_refused (sink text, source_table text, "
    "lsn bigint, seq int, pk text, superseded_lsn bigint, superseded_seq int, "
    "refused_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, source_table, lsn, seq))",
    "CREATE TABLE IF NOT EXISTS {s}.mirror_tables (target_schema text, target_table text, "
    "sink text NOT NULL, source_table text NOT NULL, source_oid bigint, "
    "PRIMARY KEY (target_schema, target_table))",
    "ALTER TABLE {s}.mirror_tables ADD COLUMN IF NOT EXISTS source_oid bigint",  # older books
    # A source table renamed, first seen in `batch_id` (mirror_rename.py)
    "CREATE TABLE IF NOT EXISTS {s}.mirror_renames (sink text, source_table text, "
    "renamed_from text NOT NULL, batch_id bigint NOT NULL, PRIMARY KEY (sink, source_table))",
)


def row_key(pk: list[str], record: dict[str, Any]) -> str:
    return json.dumps([record.get(k) for k in pk], ensure_ascii=False)


@dataclass
class Refusal:
    pk: str | None  # None: the table's problem, not a row's (no key, not in the target)
    superseded_by: Cursor | None = None


@dataclass
class Book:
    """One chunk's view of its tables' cursors and refusals, and what the chunk did."""

    cursors: dict[Ident, Cursor]
    refusals: dict[Ident, dict[Cursor, Refusal]]
    done: dict[Ident, Cursor] = field(default_factory=dict)  # newest applied per table
    resolved: list[tuple[Ident, Cursor]] = field(default_factory=list)
    new: list[tuple[Ident, Cursor, str | None]] = field(default_factory=list)
    superseded: list[tuple[Ident, Cursor, Cursor]] = field(default_factory=list)

    def verdict(self, ident: Ident, cursor: Cursor) -> str:
        refusal = self.refusals.get(ident, {}).get(cursor)
        if refusal is not None:
            return APPLY if refusal.superseded_by is None else SUPERSEDED
        if ident in self.cursors and cursor <= self.cursors[ident]:
            return SKIP  # applied before: a replay
        return APPLY

    def superseded_reason(self, ident: Ident, cursor: Cursor) -> str:
        by = self.refusals[ident][cursor].superseded_by
        assert by is not None
        return (
            f"a later change of the same row ({by[0]}:{by[1]}) was applied after this one was "
            "refused, so applying it now would move the row back; the target's row is current "
            "— discard this dead letter"
        )

    def applied(self, ident: Ident, cursor: Cursor, keys: Callable[[], list[str] | None]) -> None:
        """A change was applied; `keys()`: its rows' keys (None: a truncate of the table),
        asked only when the table has refused changes."""
        if cursor > self.done.get(ident, (-1, -1)):
            self.done[ident] = cursor
        listed = self.refusals.get(ident)
        if not listed:
            return
        if cursor in listed:
            del listed[cursor]
            self.resolved.append((ident, cursor))
        touched = keys()
        for at, refusal in listed.items():
            if refusal.superseded_by is not None or at >= cursor:
                continue
            if touched is None or (refusal.pk is not None and refusal.pk in touched):
                refusal.superseded_by = cursor
                self.superseded.append((ident, at, cursor))

    def refused(self, pk: str | None, ident: Ident, cursor: Cursor) -> None:
        self.new.append((ident, cursor, pk))
        # Listed at once: a later change of the row in this same chunk supersedes it.
        self.refusals.setdefault(ident, {})[cursor] = Refusal(pk)


def _statement(text: str, schema: str) -> sql.Composed:
    """A statement with `{s}` standing for the bookkeeping schema."""
    return sql.SQL(text).format(s=sql.Identifier(schema))


def ensure(conn: Any, schema: str) -> None:
    for statement in DDL:
        conn.execute(_statement(statement, schema))


def _name(ident: Ident) -> str:
    return f"{ident[0]}.{ident[1]}"


def load(conn: Any, schema: str, sink: str, tables: set[Ident]) -> Book:
    names = {_name(t): t for t in tables}
    rows = conn.execute(
        _statement(
            "SELECT source_table, lsn, seq FROM {s}.mirror_cursors "
            "WHERE sink = %s AND source_table = ANY(%s)",
            schema,
        ),
        (sink, list(names)),
    ).fetchall()
    cursors = {names[r[0]]: (int(r[1]), int(r[2])) for r in rows}
    refusals: dict[Ident, dict[Cursor, Refusal]] = {}
    for table, lsn, seq, pk, s_lsn, s_seq in conn.execute(
        _statement(
            "SELECT source_table, lsn, seq, pk, superseded_lsn, superseded_seq "
            "FROM {s}.mirror_refused WHERE sink = %s AND source_table = ANY(%s)",
            schema,
        ),
        (sink, list(names)),
    ).fetchall():
        by = (int(s_lsn), int(s_seq)) if s_lsn is not None else None
        refusals.setdefault(names[table], {})[(int(lsn), int(seq))] = Refusal(pk, by)
    return Book(cursors, refusals)


def save(conn: Any, schema: str, sink: str, book: Book) -> None:
    """Write what the chunk did, in its transaction; a table's cursor never moves back."""
    for ident, (lsn, seq) in book.done.items():
        conn.execute(
            _statement(
                "INSERT INTO {s}.mirror_cursors AS c (sink, source_table, lsn, seq) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (sink, source_table) DO UPDATE SET "
                "lsn = EXCLUDED.lsn, seq = EXCLUDED.seq, updated_at = now() "
                "WHERE (c.lsn, c.seq) < (EXCLUDED.lsn, EXCLUDED.seq)",
                schema,
            ),
            (sink, _name(ident), lsn, seq),
        )
    for ident, (lsn, seq), pk in book.new:
        conn.execute(
            _statement(
                "INSERT INTO {s}.mirror_refused (sink, source_table, lsn, seq, pk) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                schema,
            ),
            (sink, _name(ident), lsn, seq, pk),
        )
    for ident, (lsn, seq) in book.resolved:
        conn.execute(
            _statement(
                "DELETE FROM {s}.mirror_refused "
                "WHERE sink = %s AND source_table = %s AND lsn = %s AND seq = %s",
                schema,
            ),
            (sink, _name(ident), lsn, seq),
        )
    for ident, (lsn, seq), (by_lsn, by_seq) in book.superseded:
        conn.execute(
            _statement(
                "UPDATE {s}.mirror_refused SET superseded_lsn = %s, superseded_seq = %s "
                "WHERE sink = %s AND source_table = %s AND lsn = %s AND seq = %s",
                schema,
            ),
            (by_lsn, by_seq, sink, _name(ident), lsn, seq),
        )


def claim(conn: Any, schema: str, sink: str, source: Ident, target: Ident, oid: int) -> None:
    """Record that `sink` fills `target` from `source` (whose OID is `oid`); ConfigError if
    another does."""
    conn.execute(
        _statement(
            "INSERT INTO {s}.mirror_tables AS m (target_schema, target_table, sink, source_table, "
            "source_oid) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (target_schema, target_table) "
            "DO UPDATE SET source_oid = EXCLUDED.source_oid WHERE m.sink = EXCLUDED.sink "
            "AND m.source_table = EXCLUDED.source_table "
            "AND m.source_oid IS DISTINCT FROM EXCLUDED.source_oid",
            schema,
        ),
        (*target, sink, _name(source), oid),
    )
    owner, table = conn.execute(
        _statement(
            "SELECT sink, source_table FROM {s}.mirror_tables "
            "WHERE target_schema = %s AND target_table = %s",
            schema,
        ),
        target,
    ).fetchone()
    if (owner, table) != (sink, _name(source)):
        raise ConfigError(
            f"sink {sink} would mirror {_name(source)} into {_name(target)}, which sink "
            f"{owner} already fills from {table}: two source tables in one target table "
            "would mix their rows",
            "give one of the sinks its own destination.schema (or database); if the other "
            f"sink is gone, DELETE FROM {schema}.mirror_tables WHERE target_schema = "
            f"'{target[0]}' AND target_table = '{target[1]}'",
        )
