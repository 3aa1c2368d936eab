"""Which source table each lake sink's tables were written from, by the table's OID.

A change row names its table, not its OID, so a source table renamed from `t` to `u`
shows as changes of `u`, whose lake table does not exist yet: written as they come,
they would start a new lake table holding only the rows changed since, while `t`'s
lake table keeps the rest. And a table dropped and created again under its name would
write into the lake table that still holds the dropped one's rows (a DROP sends no
deletes). The lake writer (`lake/writer.py`) asks `changed` before it writes a table
(once per table and process): either pauses the sink, saying so and what to do. The
table is recorded as it is now, so after `walstream resume` the sink goes on.

A name taken by another table marks the earlier table's record `superseded`, not
deleted: when that table shows up under its new name later (renamed away, then a new
table created under the old name), its rename is still seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.state.store import Store


class LakeSources(Store):
    def _setup(self) -> None:
        self.table = self.ident("lake_sources")
        self._ready = False
        self._known: set[tuple[str, int, str, str]] = set()  # looked at in this process

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink text, source_oid bigint, "
                "table_schema text NOT NULL, table_name text NOT NULL, "
                "PRIMARY KEY (sink, source_oid))"
            ).format(self.table),
            sql.SQL(  # books made before superseded existed
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS superseded boolean NOT NULL DEFAULT false"
            ).format(self.table),
        ]

    def changed(self, sink: str, oid: int, schema: str, table: str) -> Change | None:
        """What became of the source table `schema.table` (OID `oid`) since `sink` last
        wrote it: renamed from another name, or a new table under a name the sink wrote
        for a dropped one; None when nothing did. Records it as it is now."""
        key = (sink, oid, schema, table)
        if not oid or key in self._known:
            return None
        if not self._ready:
            self.ensure()
            self._ready = True
        with self.transaction():
            rows: list[Any] = self._exec(
                sql.SQL(
                    "SELECT source_oid, table_schema, table_name FROM {} WHERE sink = %s AND "
                    "(source_oid = %s OR (table_schema = %s AND table_name = %s AND NOT "
                    "superseded)) FOR UPDATE"
                ).format(self.table),
                (sink, oid, schema, table),
            )
            self._exec(  # a name is one table's: the earlier one's record no longer holds it
                sql.SQL(
                    "UPDATE {} SET superseded = true WHERE sink = %s AND table_schema = %s "
                    "AND table_name = %s AND source_oid <> %s"
                ).format(self.table),
                (sink, schema, table, oid),
            )
            self._exec(
                sql.SQL(
                    "INSERT INTO {} (sink, source_oid, table_schema, table_name) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (sink, source_oid) DO UPDATE SET "
                    "table_schema = EXCLUDED.table_schema, table_name = EXCLUDED.table_name, "
                    "superseded = false"
                ).format(self.table),
                (sink, oid, schema, table),
            )
        self._known.add(key)
        for old_oid, old_schema, old_table in rows:
            if old_oid == oid and (old_schema, old_table) != (schema, table):
                return Change("renamed", (old_schema, old_table), int(old_oid))
        for old_oid, _, _ in rows:
            if old_oid != oid:
                return Change("recreated", (schema, table), int(old_oid))
        return None


@dataclass(frozen=True)
class Change:
    """`renamed`: the table had the name `was`; `recreated`: the sink wrote another table
    (OID `old_oid`, since dropped or renamed away) under this name."""

    what: str
    was: tuple[str, str]
    old_oid: int
