"""Postgres mirror sink (`type: postgres`): a copy of each source table in another Postgres.

The contract (docs/sinks.md, "Postgres mirror"): a table's first change creates it
from the source's definition (`definitions.py`); each chunk is one transaction that
applies each table's consecutive changes as one statement per run (`sql.py`) and
stores the table's WAL cursor, so a replay never moves a row backwards; a refused
change becomes a dead letter listed in the target (`book.py`) while the table goes
on; each target table is claimed by one source table (`targets.py`); renames are
followed (`rename.py`). Values arrive as the decoder's JSON and are cast back from
Postgres' text input for their column type.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr

import walstream.sinks.postgres.book as mirror_book
import walstream.sinks.postgres.rename as mirror_rename
import walstream.sinks.postgres.sql as mirror_sql
import walstream.sinks.postgres.targets as mirror_targets
from walstream.errors import SinkError
from walstream.fields import Dsn
from walstream.sinks.base import Message, MessageDestination, MessageSink, SinkContext
from walstream.sinks.clients import Clients
from walstream.sinks.postgres.book import APPLY, SUPERSEDED, row_key
from walstream.sinks.postgres.definitions import conform, load_definition, retype
from walstream.sinks.postgres.rename import RenamePending, exists
from walstream.sinks.postgres.sql import (
    Run,
    TableDef,
    missing,
    operations,
    row_keys,
)
from walstream.sinks.postgres.unsent import fill_unsent
from walstream.sinks.registry import register


class PostgresDestination(MessageDestination):
    """A copy of every source table in another Postgres database, or another schema.

    Tables are created from the source's definitions (types, user-defined types,
    primary key) and changes applied in WAL order, one transaction per chunk, with
    each table's WAL cursor stored in the same transaction: a replay never goes
    backwards. `source_dsn` is filled in from the sink's source.
    """

    type: Literal["postgres"]
    dsn: Dsn
    schema_: str | None = Field(None, alias="schema", pattern=r"^[a-z_][a-z0-9_]*$")
    create_tables: bool = True
    source_dsn: SecretStr | None = None
    _book_schema: str = PrivateAttr("walstream")  # set by the plan (`resolved`)

    def message_format(self) -> str | None:
        return "mirror"

    @classmethod
    def preflight(cls, plan: Any, sinks: Sequence[Any]) -> None:
        """No feedback loop, no two source tables in one target table (`mirror_targets`)."""
        mirror_targets.check_targets(plan, sinks)

    def resolved(self, context: SinkContext) -> PostgresDestination:
        copy = self.model_copy(
            update={}
            if self.source_dsn is not None
            else {"source_dsn": SecretStr(context.source_dsn)}
        )
        copy._book_schema = context.state_schema
        return copy

    @property
    def book_schema(self) -> str:
        """The target's schema of the mirror's bookkeeping: named like the state schema."""
        return self._book_schema

    def group_by(self) -> list[str] | None:
        return ["schema", "table"]  # a table's changes in one partition, in WAL order


_CONNECTIONS: Clients[Any] = Clients(per_thread=True)
#: (target dsn, target schema, table) -> definition: keyed by where the rows go.
_TABLES: dict[tuple[str, str, str], TableDef] = {}
#: Per target table: the source's columns its changes never carry (generated ones, a
#: publication's column list), so a row without them is no reason to look again.
_UNSENT: dict[tuple[str, str, str], frozenset[str]] = {}


def _psycopg() -> Any:
    import psycopg

    return psycopg


def _connection(dsn: str) -> Any:
    """An autocommit connection per DSN per thread; transactions are explicit blocks."""
    return _CONNECTIONS.get(
        dsn,
        lambda: _psycopg().connect(dsn, autocommit=True, connect_timeout=10),
        lambda conn: not conn.closed,
    )


def _forget(dsn: str) -> None:
    _CONNECTIONS.forget(lambda key, _: key == dsn, lambda conn: conn.close())


@register
class PostgresSink(MessageSink):
    settings_model = PostgresDestination
    config: PostgresDestination

    def __init__(self, config: PostgresDestination) -> None:
        super().__init__(config)
        self.dsn = config.dsn.get_secret_value()
        if config.source_dsn is None:
            raise SinkError(
                "Postgres mirror: no source connection to read table definitions from",
                "declare the sink in walstream.yaml with its `source` (source_dsn is filled in)",
                retryable=False,
            )
        self.source_dsn = config.source_dsn.get_secret_value()
        self.book_schema = config.book_schema

    @property
    def name(self) -> str:
        """The sink's name (its cursors are its own); known once `begin` was called."""
        batch = getattr(self, "batch", None)
        return batch.sink if batch is not None else "postgres"

    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        psycopg = _psycopg()
        changes = [json.loads(m.value or b"null") for m in messages]
        try:
            try:
                self._apply(messages, changes, isolate=False)
            except SinkError as exc:  # e.g. a table without a key: the others still apply
                if exc.retryable:
                    raise
                self._apply(messages, changes, isolate=True)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                raise
            except psycopg.Error:  # a change the target refuses: find which, apply the others
                self._apply(messages, changes, isolate=True)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            _forget(self.dsn)
            raise SinkError(
                f"Postgres mirror: {str(exc).strip()}",
                "check that the target database in destination.dsn is up and reachable",
                retryable=True,
            ) from exc
        except psycopg.Error as exc:  # outside any one change (the cursor table, say)
            raise SinkError(
                f"Postgres mirror: {type(exc).__name__}: {str(exc).strip()}",
                "check the target database's log; walstream retries the chunk",
                retryable=True,
            ) from exc

    # -- applying ---------------------------------------------------------------------------------
    def _apply(self, messages: Sequence[Message], changes: list[Any], *, isolate: bool) -> None:
        created: list[tuple[str, str, str]] = []
        self._created = created
        try:
            self._apply_in_transaction(messages, changes, isolate=isolate)
        except BaseException:
            for key in created:  # rolled back with the transaction: create them again
                _TABLES.pop(key, None)
            raise

    def _apply_in_transaction(
        self, messages: Sequence[Message], changes: list[Any], *, isolate: bool
    ) -> None:
        conn = _connection(self.dsn)
        failed: dict[int, str] = {}
        fixes: dict[int, str | None] = {}  # what to do, where it is not the usual
        with conn.transaction():
            book = self._book(conn, {(c["schema"], c["table"]) for c in changes})
            todo = []
            for i, (m, c) in enumerate(zip(messages, changes, strict=True)):
                verdict = book.verdict((c["schema"], c["table"]), m.cursor)
                if verdict == SUPERSEDED:
                    failed[i] = book.superseded_reason((c["schema"], c["table"]), m.cursor)
                elif verdict == APPLY:
                    todo.append(i)
            self._fill_unsent(conn, changes, todo)
            # a name taken over by another table (mirror_rename.evict): change by change
            one_by_one = isolate or mirror_rename.swapped(changes)
            runs = None if one_by_one else self._runs(conn, messages, changes, todo)
            if runs is not None:
                for target, kind, ops in runs:
                    self._statement(conn, target, kind, [c for _, c in ops])
                for i in todo:
                    c = changes[i]
                    # The keys (and so the table's definition) only when a refusal needs them.
                    book.applied(
                        (c["schema"], c["table"]),
                        messages[i].cursor,
                        functools.partial(self._row_keys, conn, c),
                    )
            else:
                self._apply_each(conn, book, messages, changes, todo, failed, fixes)
            mirror_book.save(conn, self.book_schema, self.name, book)
        if failed:
            first = min(failed)
            c = changes[first]
            raise SinkError(
                f"Postgres mirror: {c['schema']}.{c['table']} refused a change: "
                f"{failed[first]} ({len(failed)} of {len(messages)} changes)",
                fixes.get(first)
                or "the target's table differs from the source (types, constraints, triggers); "
                "fix it, then `walstream dead-letters retry`",
                retryable=False,
                delivered=frozenset(range(len(messages))) - failed.keys(),
            )

    def _apply_each(
        self,
        conn: Any,
        book: mirror_book.Book,
        messages: Sequence[Message],
        changes: list[Any],
        todo: list[int],
        failed: dict[int, str],
        fixes: dict[int, str | None],
    ) -> None:
        """Apply the changes `todo` one statement each, noting in `failed` (and `fixes`) those
        the target refuses: what `_runs` cannot batch, or a retry that isolates them."""
        psycopg = _psycopg()
        for i in todo:
            m, c = messages[i], changes[i]
            table: TableDef | None = None
            try:
                table = self._table(conn, c)  # outside the savepoint: it stays
                try:
                    self._apply_one(conn, table, c)
                except psycopg.DataError:  # a value of a changed type?
                    retyped = self._retyped(conn, c)
                    if retyped is None:
                        raise
                    table = retyped
                    self._apply_one(conn, table, c)
                except psycopg.errors.UndefinedTable:  # renamed by another process?
                    _TABLES.pop((self.dsn, table.schema, table.name), None)
                    table = self._table(conn, c)
                    self._apply_one(conn, table, c)
                book.applied(
                    (c["schema"], c["table"]),
                    m.cursor,
                    functools.partial(row_keys, table, c),
                )
            except (psycopg.OperationalError, psycopg.InterfaceError):
                raise
            except (SinkError, psycopg.Error) as exc:
                failed[i] = (
                    exc.problem.removeprefix("Postgres mirror: ")
                    if isinstance(exc, SinkError)
                    else str(exc).strip().splitlines()[0]
                )
                if isinstance(exc, RenamePending):
                    table, fixes[i] = exc.table, exc.fix
                elif isinstance(exc, SinkError) and exc.fix:  # e.g. no target table
                    fixes[i] = f"{exc.fix}; then `walstream dead-letters retry`"
                key = row_key(table.pk, c.get("record") or {}) if table else None
                book.refused(key, (c["schema"], c["table"]), m.cursor)

    def _fill_unsent(self, conn: Any, changes: list[Any], todo: list[int]) -> None:
        """Unsent TOAST values of rows the target lacks, from the source (`unsent.py`)."""
        psycopg = _psycopg()
        try:
            fill_unsent(
                conn,
                lambda: _connection(self.source_dsn),
                changes,
                todo,
                lambda c: self._table(conn, c),
            )
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                raise
            raise SinkError(
                f"Postgres mirror: cannot read unchanged TOAST values from the source: "
                f"{str(exc).strip()}",
                "a row the target does not have yet needs the values Postgres did not send; "
                "grant SELECT on the source's tables to the user of the source's dsn",
                retryable=True,
            ) from exc

    def _apply_one(self, conn: Any, table: TableDef, change: Any) -> None:
        with conn.transaction():  # a savepoint per change
            for kind, op in operations(table, change):
                self._statement(conn, table, kind, [op])

    def _retyped(self, conn: Any, change: Any) -> TableDef | None:
        """The table after its columns took the types their source columns have now, when
        any differ and the table is walstream's (create_tables); else None."""
        table = self._table(conn, change)
        if not self.config.create_tables:
            return None
        source, oid = _connection(self.source_dsn), change.get("oid")
        fresh = load_definition(source, change["schema"], change["table"], table.schema, oid)
        fresh.filled_by = table.filled_by
        changed = [
            c
            for n, c in fresh.columns.items()
            if n in table.columns and table.columns[n].type_sql != c.type_sql
        ]
        if not changed:
            return None
        for ddl in fresh.types:
            conn.execute(ddl)
        for col in changed:
            retype(conn, fresh, col)
        key = (self.dsn, table.schema, table.name)
        _TABLES[key] = fresh
        self._created.append(key)  # forgotten if the transaction rolls back
        return fresh

    def _row_keys(self, conn: Any, change: Any) -> list[str] | None:
        return row_keys(self._table(conn, change), change)

    def _runs(
        self, conn: Any, messages: Sequence[Message], changes: list[Any], todo: list[int]
    ) -> list[Run]:
        return mirror_sql.runs(changes, todo, lambda c: self._table(conn, c))

    def _statement(self, conn: Any, table: TableDef, kind: str, changes: list[Any]) -> None:
        text, params = mirror_sql.statement(table, kind, changes)
        conn.execute(text, params)

    # -- tables and cursors -----------------------------------------------------------------------
    def _table(self, conn: Any, change: Any) -> TableDef:
        schema, name, oid = change["schema"], change["table"], change.get("oid") or 0
        target_schema = self.config.schema_ or schema
        key = (self.dsn, target_schema, name)  # where the rows go, not where they come from
        table = _TABLES.get(key)
        record = change.get("record") or {}
        filled_by = (self.name, schema, name)
        if (
            table is not None
            and table.filled_by == filled_by
            and oid in (0, table.source_oid)
            and all(k in table.columns for k in record)
            and missing(table, change) <= _UNSENT.get(key, frozenset())
        ):
            return table
        source = _connection(self.source_dsn)
        book, sink = self.book_schema, self.name
        fresh = mirror_rename.definition(
            source, conn, book, sink, (schema, name), target_schema, oid
        )
        fresh.filled_by = filled_by
        if table is not None and (
            not exists(conn, fresh.target) or table.source_oid != fresh.source_oid
        ):  # renamed (by another process) or dropped since this one saw it, or swapped
            table = None
        if table is None or table.filled_by != filled_by:
            if self.config.create_tables:  # the source renamed it? (mirror_rename.py)
                mirror_rename.evict(conn, source, book, sink, fresh, self.config.schema_)
                batch = self.batch.batch_id if hasattr(self, "batch") else -1
                if old := mirror_rename.follow(conn, book, sink, fresh, (schema, name), batch):
                    _TABLES.pop((self.dsn, *old), None)
            mirror_book.claim(
                conn,
                self.book_schema,
                self.name,
                (schema, name),
                (target_schema, name),
                fresh.source_oid,
            )
            self._create(conn, fresh)
        # the target as the source is now: columns added, dropped (ours only) or retyped,
        # as its own catalog says (the target may predate what this process saw)
        conform(conn, fresh, record.keys(), self.config.create_tables)
        _TABLES[key] = fresh
        # the columns the source has but does not send: no reason to look again for them
        _UNSENT[key] = frozenset(c for c in missing(fresh, change) if c in fresh.columns)
        self._created.append(key)
        return fresh

    def _create(self, conn: Any, table: TableDef) -> None:
        if exists(conn, table.target):
            return
        if not self.config.create_tables:
            raise SinkError(
                f"Postgres mirror: table {table.target} does not exist in the target",
                "create it, or set destination.create_tables: true",
                retryable=False,
            )
        for ddl in mirror_sql.create_table(table):
            conn.execute(ddl)

    def _book(self, conn: Any, tables: set[tuple[str, str]]) -> mirror_book.Book:
        if (self.dsn, "", "") not in _TABLES:  # once per process: the bookkeeping tables
            mirror_book.ensure(conn, self.book_schema)
            _TABLES[(self.dsn, "", "")] = TableDef(self.book_schema, "mirror_cursors")
            self._created.append((self.dsn, "", ""))
        return mirror_book.load(conn, self.book_schema, self.name, tables)

    def test_connection(self) -> None:
        psycopg = _psycopg()
        for what, dsn in (("target (destination.dsn)", self.dsn), ("source", self.source_dsn)):
            try:
                with psycopg.connect(dsn, connect_timeout=10) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error as exc:
                raise SinkError(
                    f"Postgres mirror: cannot connect to the {what}: {str(exc).strip()}",
                    "check the connection string and that the server is up",
                    retryable=True,
                ) from exc
