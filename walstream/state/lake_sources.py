"""Which source table each lake sink's tables were written from, by the table's OID.

A change row names its table, not its OID, so a source table renamed from `t` to `u`
shows as changes of `u`, whose lake table does not exist yet: written as they come,
they would start a new lake table holding only the rows changed since, while `t`'s
lake table keeps the rest. The lake writer (`spark/tables.py`) asks `renamed_from`
before it writes a table: when the sink last wrote this OID under another name, the
sink pauses, saying so and what to do. The new name is recorded then, so after
`walstream resume` the sink goes on (into the lake table the operator moved there, or a
new one to backfill).
"""

from __future__ import annotations

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
            ).format(self.table)
        ]

    def renamed_from(self, sink: str, oid: int, schema: str, table: str) -> tuple[str, str] | None:
        """The name the source table `oid` had when `sink` last wrote it, when another than
        `schema.table`; records `schema.table` as its name from now on."""
        key = (sink, oid, schema, table)
        if not oid or key in self._known:
            return None
        if not self._ready:
            self.ensure()
            self._ready = True
        with self.transaction():
            rows: list[Any] = self._exec(
                sql.SQL(
                    "SELECT table_schema, table_name FROM {} WHERE sink = %s AND source_oid = %s "
                    "FOR UPDATE"
                ).format(self.table),
                (sink, oid),
            )
            self._exec(
                sql.SQL(
                    "INSERT INTO {} (sink, source_oid, table_schema, table_name) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (sink, source_oid) DO UPDATE SET "
                    "table_schema = EXCLUDED.table_schema, table_name = EXCLUDED.table_name"
                ).format(self.table),
                (sink, oid, schema, table),
            )
        self._known.add(key)
        old = (rows[0][0], rows[0][1]) if rows else None
        return old if old is not None and old != (schema, table) else None
