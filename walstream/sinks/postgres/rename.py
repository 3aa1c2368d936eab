"""The Postgres mirror following a renamed source table.

A change row names its table, not its OID, so a source table renamed from `t` to `u`
(`ALTER TABLE ... RENAME TO`, or `SET SCHEMA`) first shows as changes of a table the
mirror has not seen. The mirror reads `u`'s OID from the source's catalog with its
definition; when a target table the sink created is claimed for another source name
with that OID, `u` is `t` renamed, and the target follows: `ALTER TABLE ... RENAME TO`
(and `SET SCHEMA`), the claim moved with it.

Not in the batch that first carries `u`'s changes: the sink applies each table's changes
in its own partition, so that batch may still be applying `t`'s changes (all from
before the rename) in another task. Renaming the target under them would fail them,
and applying `u`'s changes first could let an older change of a row overwrite a newer
one. So that batch records the rename (`<schema>.mirror_renames`) and refuses `u`'s
changes: dead letters, each with its row's key, saying why. The next batch — every
change of `t` is applied by then, since batches follow the WAL — renames the target
and applies `u`'s changes. Retrying the dead letters (`walstream dead-letters retry`)
then applies each one whose row no later change rewrote, and refuses the others as
superseded, as for any dead letter of the mirror.

A name taken over by another table (each change carries its table's OID): `t` renamed
away and another table renamed to `t` (a blue/green swap), or `t` dropped and created
again. The target `t` holds the earlier table's rows, which no change of the new one will
delete. The first change of the new `t` moves that target out of the way, in its chunk's
transaction, after every change of the earlier `t` (the chunk's partition holds all
changes under the name, in WAL order): to the earlier table's new name when it still
exists (its changes there, refused until then as a pending rename, apply); to
`<t>_dropped_<oid>` when it was dropped, kept for you to drop; to `<t>_moved_<oid>` when
its new name's target is another table's (two tables traded names), until `follow` moves
it there. The new `t` then fills its own target.

Only tables the sink creates (`create_tables: true`) are renamed; with tables you made,
the changes under the new name go to a target table of that name, as before.
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
        sink, name, table.source_oid, old_oid, table.target, *to,
        " (the earlier table was dropped: drop it when you no longer need it)" if now is None
        else f" (the earlier table is {now[0]}.{now[1]} now)",
    )  # fmt: skip


def _qualified(schema: str, table: str) -> str:
    return f"{ident(schema)}.{ident(table)}"
