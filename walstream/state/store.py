"""The base of every store walstream keeps in a state schema: ledger, parking, backfills..."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from walstream.state.db import execute, state_connection


class Store:
    """Tables in schema `schema` of the database `dsn`.

    Picklable (only the DSN and schema travel; executors open their own connection).
    A subclass names its tables in `_setup` and its DDL in `ddl()`; `ensure()` makes
    the schema and runs that DDL (driver side, once at start).
    """

    def __init__(self, dsn: str, schema: str = "walstream") -> None:
        self.dsn = dsn
        self.schema = schema
        self._setup()

    def _setup(self) -> None:
        """Per-instance attributes (table identifiers, thread-locals): also after unpickling."""

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.dsn, self.schema = state["dsn"], state["schema"]
        self._setup()

    def ident(self, table: str) -> sql.Identifier:
        """`schema.table` as an identifier."""
        return sql.Identifier(self.schema, table)

    def ddl(self) -> list[sql.Composable]:
        """The statements that make this store's tables (each `IF NOT EXISTS`)."""
        return []

    def ensure(self) -> None:
        self._exec(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        for statement in self.ddl():
            self._exec(statement)

    def _conn(self) -> psycopg.Connection[Any]:
        return state_connection(self.dsn)

    def _exec(self, query: sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
        return execute(self.dsn, query, params)

    def transaction(self) -> Any:
        """A transaction on this thread's state connection (other stores' writes join it)."""
        return self._conn().transaction()
