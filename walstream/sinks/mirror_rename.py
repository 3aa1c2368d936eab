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

Only tables the sink creates (`create_tables: true`) are renamed; with tables you made,
the changes under the new name go to a target table of that name, as before.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from walstream.errors import SinkError
from walstream.sinks.mirror_sql import TableDef

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
