"""The Postgres mirror following a renamed source table (docs/sinks.md, "Renamed tables").

A change names its table and carries its OID. A name the mirror has not seen whose
OID a target it created is claimed for is that table renamed: the batch that first
carries it records the rename and refuses its changes as dead letters (another task
may still be applying the old name's changes); the next batch renames the target
and applies them. A name taken over by another table (a swap, a drop and create)
moves the earlier target out of the way first, in the chunk's transaction. Only
tables the sink creates are renamed.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg import sql

from walstream.errors import SinkError
from walstream.sinks.postgres.definitions import load_definition
from walstream.sinks.postgres.sql import TableDef, ident

log = logging.getLogger(__name__)

Ident = tuple[str, str]


class RenamePending(SinkError):
    """A source table's new name, refused in the batch that first saw it."""

    def __init__(self, problem: str, fix: str, table: TableDef) -> None:
        super().__init__(problem, fix, retryable=False)
        self.table = table  # the definition under the new name: the refusal's row keys

    def __reduce__(self) -> tuple[object, ...]:
        return (RenamePending, (self.problem, self.fix, self.table))


def exists(conn: Any, target: str) -> bool:
    """Whether the table `target` (quoted, qualified) exists in the target database."""
    return conn.execute("SELECT to_regclass(%s)", (target,)).fetchone()[0] is not None


def _old_claim(conn: Any, schema: str, sink: str, table: TableDef, source: str) -> Ident | None:
    """The target table `sink` fills from the same source table (by OID) under another
    name, if it still exists: (target schema, target table)."""
    row = conn.execute(
        sql.SQL(
            "SELECT target_schema, target_table FROM {}.mirror_tables WHERE sink = %s "
            "AND source_oid = %s AND source_table <> %s "
            "AND to_regclass(format('%%I.%%I', target_schema, target_table)) IS NOT NULL"
        ).format(sql.Identifier(schema)),
        (sink, table.source_oid, source),
    ).fetchone()
    return (row[0], row[1]) if row is not None else None


def follow(
    conn: Any, schema: str, sink: str, table: TableDef, source: Ident, batch: int
) -> Ident | None:
    """Rename the target of `table` (the source table `source`, its definition just read)
    from its old name when the source renamed it, in the batch after the one that first
    saw the new name (RenamePending in that one); the old name, if it did. `schema`: the
    bookkeeping schema."""
    if not table.source_oid:
        return None
    name = f"{source[0]}.{source[1]}"
    if exists(conn, table.target):
        return None  # a target of the new name exists: it is filled as it is
    old = _old_claim(conn, schema, sink, table, name)
    if old is None:
        return None
    s = sql.Identifier(schema)
    seen = conn.execute(
        sql.SQL(
            "SELECT batch_id FROM {}.mirror_renames WHERE sink = %s AND source_table = %s"
        ).format(s),
        (sink, name),
    ).fetchone()
    if seen is None:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.mirror_renames (sink, source_table, renamed_from, batch_id) "
                "VALUES (%s, %s, %s, %s)"
            ).format(s),
            (sink, name, ".".join(old), batch),
        )
    if seen is None or seen[0] == batch:
        raise RenamePending(
            f"Postgres mirror: source table {name} is the table this sink mirrors into "
            f"{'.'.join(old)}, renamed (same OID {table.source_oid}); the target is renamed "
            "in the next batch, once every change from before the rename is applied",
            "nothing to do now; then `walstream dead-letters retry --sink "
            f"{sink}` applies this change (or refuses it if a later change rewrote its row)",
            table,
        )
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)))
    moved = sql.Identifier(*old)
    if old[0] != table.schema:
        conn.execute(
            sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(moved, sql.Identifier(table.schema))
        )
        moved = sql.Identifier(table.schema, old[1])
    if old[1] != table.name:
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(moved, sql.Identifier(table.name))
        )
    conn.execute(
        sql.SQL(
            "UPDATE {}.mirror_tables SET target_schema = %s, target_table = %s, source_table = %s "
            "WHERE target_schema = %s AND target_table = %s AND sink = %s"
        ).format(s),
        (table.schema, table.name, name, *old, sink),
    )
    conn.execute(
        sql.SQL("DELETE FROM {}.mirror_renames WHERE sink = %s AND source_table = %s").format(s),
        (sink, name),
    )
    return old


def swapped(changes: list[Any]) -> bool:
    """Whether a name in `changes` is two source tables' (the changes carry OIDs): the
    chunk must be applied change by change, each after the one before (see `evict`)."""
    names = {(c["schema"], c["table"]) for c in changes}
    return len({(c["schema"], c["table"], c.get("oid")) for c in changes}) > len(names)


def _claimed(conn: Any, schema: str, sink: str, **where: Any) -> tuple[Any, ...] | None:
    """The claim of `sink` matching `where` (target_schema/target_table, or source_oid):
    (target schema, target table, source table, source OID), locked for this chunk."""
    cond = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in where)
    row = conn.execute(
        sql.SQL(
            "SELECT target_schema, target_table, source_table, source_oid FROM {}.mirror_tables "
            "WHERE sink = %s AND {} FOR UPDATE"
        ).format(sql.Identifier(schema), cond),
        (sink, *where.values()),
    ).fetchone()
    return tuple(row) if row is not None else None


def definition(
    source: Any, conn: Any, schema: str, sink: str, change: Ident, target_schema: str, oid: int
) -> TableDef:
    """The definition of the change's table (`oid`, else by its name `change`), to be
    held in `target_schema`. A table dropped since: the definition of the target it fills
    (the target was made from it), when there is one."""
    try:
        return load_definition(source, *change, target_schema, oid)
    except SinkError:
        there = "SELECT 1 FROM pg_class WHERE oid = %s::oid"
        if not oid or source.execute(there, (oid,)).fetchone() is not None:
            raise  # the table is there (without a key, say): its own error
        claim = _claimed(conn, schema, sink, source_oid=oid)
        if claim is None or not exists(conn, _qualified(claim[0], claim[1])):
            raise
        found = load_definition(conn, claim[0], claim[1], target_schema)
        found.name, found.source_oid = change[1], oid
        return found


def evict(
    conn: Any, source: Any, schema: str, sink: str, table: TableDef, override: str | None
) -> None:
    """When the target of `table` is filled from the source table of its name as it was
    before another table (another OID) took the name, move it out of the way (see the
    module's text). `override`: the sink's `schema`, where every target is."""
    claim = _claimed(conn, schema, sink, target_schema=table.schema, target_table=table.name)
    name = ".".join(table.filled_by[1:])
    if claim is None or claim[2] != name or not claim[3] or not table.source_oid:
        return  # a target of another source table's name: `mirror_book.claim` refuses it
    if claim[3] == table.source_oid:
        return
    old_oid = int(claim[3])
    now = source.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = %s::oid",
        (old_oid,),
    ).fetchone()
    # Beside the earlier table's new name; else (dropped, or that name's target is another
    # table's) aside, where `follow` finds it when the earlier table shows up by a name
    # that is free: the claim keeps the name it had.
    live = None if now is None else (override or now[0], now[1])
    suffix = f"_{'dropped' if now is None else 'moved'}_{old_oid}"
    cut = table.name.encode()[: 63 - len(suffix)].decode(errors="ignore")  # NAMEDATALEN
    aside = (table.schema, cut + suffix)
    to = aside if live is None or exists(conn, _qualified(*live)) else live
    if exists(conn, _qualified(*to)):
        raise SinkError(
            f"Postgres mirror: source table {name} is another table now "
            f"(OID {table.source_oid}), and its target still holds the rows of the earlier "
            f"one (OID {old_oid}); walstream would move that target to {to[0]}.{to[1]}, "
            "which exists",
            f"rename or drop {table.target} (or {to[0]}.{to[1]}) in the target database",
            retryable=False,
        )
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(to[0])))
    moved = sql.Identifier(table.schema, table.name)
    if to[0] != table.schema:
        conn.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(moved, sql.Identifier(to[0])))
        moved = sql.Identifier(to[0], table.name)
    if to[1] != table.name:
        conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(moved, sql.Identifier(to[1])))
    s = sql.Identifier(schema)
    source_name = f"{now[0]}.{now[1]}" if now is not None and to == live else claim[2]
    conn.execute(
        sql.SQL(
            "UPDATE {}.mirror_tables SET target_schema = %s, target_table = %s, source_table = %s "
            "WHERE target_schema = %s AND target_table = %s AND sink = %s"
        ).format(s),
        (*to, source_name, table.schema, table.name, sink),
    )
    conn.execute(  # a rename of the earlier table waiting for this target: it is done
        sql.SQL("DELETE FROM {}.mirror_renames WHERE sink = %s AND source_table = %s").format(s),
        (sink, source_name),
    )
    log.warning(
        "Postgres mirror %s: source table %s is another table now (OID %d, was %d); the "
        "earlier one's target %s moved to %s.%s%s",
        sink,
        name,
        table.source_oid,
        old_oid,
        table.target,
        *to,
        " (the earlier table was dropped: drop it when you no longer need it)"
        if now is None
        else f" (the earlier table is {now[0]}.{now[1]} now)",
    )


def _qualified(schema: str, table: str) -> str:
    return f"{ident(schema)}.{ident(table)}"
