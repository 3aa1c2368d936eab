"""Postgres mirror sink (`type: postgres`): a copy of each source table in another Postgres.

Tables: the first change of a table creates it in the target (`schema`, default the
source table's own) from the source's definition: every column with its exact type
(`format_type`), NOT NULL, the primary key, and the user-defined types it uses
(enums, domains with their checks, composite types). A change with a column the
target lacks (the source added one) adds it first.

Changes: one transaction per chunk. Consecutive changes of a table are applied as
one statement each run: insert, update and read as `INSERT ... ON CONFLICT (pk) DO
UPDATE` (columns whose unchanged TOAST value Postgres did not send are left as
they are), delete as `DELETE ... USING`, truncate as `TRUNCATE`. The same
transaction stores each table's WAL cursor in `walstream.mirror_cursors`; a change
at or before it was applied already and is skipped, so a replayed batch never
moves a row backwards. The sink groups by table (one partition applies a table's
changes in WAL order).

Refused changes: a change the target refuses is recorded in `walstream.mirror_refused`
(in the chunk's transaction) and reported, so it becomes a dead letter while the
table's later changes go on. A later applied change of the same row marks it
superseded. When the dead letter is retried, a change still recorded there is
applied even though the table's cursor is past it (the cursor never moves back); a
superseded one fails again, loudly, and stays a dead letter — never "delivered"
without being applied.

Targets: each target table is claimed in `walstream.mirror_tables` by the sink and
source table that fill it; a second source table for it (another sink, or two source
schemas under one `schema:` override) is a ConfigError, never mixed rows.

Values arrive as the decoder's JSON (bytea base64, arrays as JSON arrays, ...);
each is turned back into Postgres' text input for its column type and cast there.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.config import PostgresDestination
from walstream.errors import SinkError
from walstream.sinks import mirror_book
from walstream.sinks.base import Message, Sink
from walstream.sinks.mirror_book import APPLY, SUPERSEDED, row_key

_CONNECTIONS: dict[tuple[str, int], Any] = {}
#: (target dsn, target schema, table) -> definition: keyed by where the rows go.
_TABLES: dict[tuple[str, str, str], TableDef] = {}
_LOCK = threading.Lock()
_BC = re.compile(r"^(-?)(\d{4,})(-\d\d-\d\d)(?:T(.*))?$")


@dataclass
class Column:
    name: str
    type_sql: str  # format_type(): "numeric(10,3)", "mood[]", "character varying(10)"
    not_null: bool
    kind: str  # how a JSON value becomes text input: bytea, json, date, scalar
    array: bool
    delim: str = ","  # between array elements (box uses ';')


@dataclass
class TableDef:
    schema: str  # in the target
    name: str
    columns: dict[str, Column] = field(default_factory=dict)
    pk: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)  # DDL of the user-defined types it uses
    #: (sink, source schema, source table) filling it: one per target table
    filled_by: tuple[str, str, str] = ("", "", "")

    @property
    def target(self) -> str:
        return f"{_ident(self.schema)}.{_ident(self.name)}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _psycopg() -> Any:
    import psycopg

    return psycopg


def _connection(dsn: str) -> Any:
    """An autocommit connection per DSN per thread; transactions are explicit blocks."""
    key = (dsn, threading.get_ident())
    with _LOCK:
        conn = _CONNECTIONS.get(key)
    if conn is None or conn.closed:
        conn = _psycopg().connect(dsn, autocommit=True, connect_timeout=10)
        with _LOCK:
            _CONNECTIONS[key] = conn
    return conn


def _forget(dsn: str) -> None:
    with _LOCK:
        for key in [k for k in _CONNECTIONS if k[0] == dsn]:
            conn = _CONNECTIONS.pop(key)
            with contextlib.suppress(Exception):
                conn.close()


# -- the source's definitions -----------------------------------------------------------------
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(nullif(t.typelem, 0), t.oid) AS base, t.typcategory = 'A' AND t.typelem <> 0,
       coalesce(e.typdelim, ',')
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type e ON e.oid = t.typelem
WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum"""
_PK = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)"""
_TYPE = """
SELECT n.nspname, t.typname, t.typtype, t.typbasetype, format_type(t.typbasetype, t.typtypmod),
       t.typnotnull, t.typrelid, (SELECT b.typname FROM pg_type b WHERE b.oid = t.typbasetype)
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s"""


def _kind(type_name: str) -> str:
    if type_name == "bytea":
        return "bytea"
    if type_name in ("json", "jsonb"):
        return "json"
    if type_name in ("date", "timestamp", "timestamptz"):
        return "date"
    return "scalar"


def load_definition(source: Any, schema: str, table: str, target_schema: str) -> TableDef:
    """The source table's columns, key and user-defined types, as the target will hold them."""
    rows = source.execute(_COLUMNS, (schema, table)).fetchall()
    if not rows:
        raise SinkError(
            f"Postgres mirror: table {schema}.{table} does not exist in the source (any more)",
            "a change of a dropped table cannot be mirrored; discard the dead letter",
            retryable=False,
        )
    pk = [r[0] for r in source.execute(_PK, (schema, table)).fetchall()]
    if not pk:
        raise SinkError(
            f"Postgres mirror: {schema}.{table} has no primary key, so changes cannot be "
            "applied by key",
            f"add a primary key to {schema}.{table}, or leave the table out of this sink "
            "(tables: [...])",
            retryable=False,
        )
    d = TableDef(target_schema, table, pk=pk)
    seen: set[int] = set()
    for name, type_sql, not_null, base, is_array, delim in rows:
        kind, _ = _user_types(source, int(base), d.types, seen)
        d.columns[name] = Column(name, type_sql, bool(not_null), kind, bool(is_array), delim)
    return d


def _user_types(source: Any, oid: int, ddl: list[str], seen: set[int]) -> tuple[str, str]:
    """(value kind, type name) of a type; appends the DDL of user-defined types it needs."""
    row = source.execute(_TYPE, (oid,)).fetchone()
    nsp, name, typtype, basetype, base_sql, notnull, relid, base_name = row
    qualified = f"{_ident(nsp)}.{_ident(name)}"
    if nsp in ("pg_catalog", "information_schema") or oid in seen:
        return _kind(name), name
    seen.add(oid)
    create = f"CREATE SCHEMA IF NOT EXISTS {_ident(nsp)}"
    if typtype == "e":
        labels = [r[0] for r in source.execute(
            "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder", (oid,)
        ).fetchall()]  # fmt: skip
        body = f"CREATE TYPE {qualified} AS ENUM ({', '.join(_literal(x) for x in labels)})"
        ddl.extend([create, _if_missing(nsp, name, body)])
        return "scalar", name
    if typtype == "d":
        kind, _ = _user_types(source, int(basetype), ddl, seen)
        checks = [r[0] for r in source.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE contypid = %s", (oid,)
        ).fetchall()]  # fmt: skip
        body = f"CREATE DOMAIN {qualified} AS {base_sql}" + (" NOT NULL" if notnull else "")
        body += "".join(f" {c}" for c in checks)
        ddl.extend([create, _if_missing(nsp, name, body)])
        return _kind(base_name) if kind == "scalar" else kind, name
    if typtype == "c" and relid:
        attrs = source.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid FROM pg_attribute a "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (relid,),
        ).fetchall()
        for _, _, attr_type in attrs:
            _user_types(source, int(attr_type), ddl, seen)
        fields = ", ".join(f"{_ident(a)} {t}" for a, t, _ in attrs)
        ddl.extend([create, _if_missing(nsp, name, f"CREATE TYPE {qualified} AS ({fields})")])
        return "scalar", name
    return "scalar", name  # ranges, base types of extensions: expected to exist in the target


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _if_missing(nsp: str, name: str, body: str) -> str:
    return (
        f"DO $walstream$ BEGIN IF to_regtype({_literal(_ident(nsp) + '.' + _ident(name))}) "
        f"IS NULL THEN EXECUTE {_literal(body)}; END IF; END $walstream$"
    )


# -- values: the decoder's JSON back to Postgres text input ------------------------------------
def _bc(text: str) -> str:
    """ISO dates with astronomical years ("-0043-03-15", "0000-...") as Postgres' "... BC"."""
    m = _BC.match(text)
    if not m or (not m.group(1) and int(m.group(2)) != 0):
        return text
    year = int(m.group(2)) + 1 if m.group(1) else 1
    time_part = f" {m.group(4)}" if m.group(4) else ""
    return f"{year:04d}{m.group(3)}{time_part} BC"


def _element(value: Any, kind: str) -> str | None:
    if value is None:
        return None
    if kind == "bytea":
        return "\\x" + base64.b64decode(value).hex()
    if kind == "json":
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _bc(value) if kind == "date" else value
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    return json.dumps(value, ensure_ascii=False)


def _array(value: Any, kind: str, delim: str = ",", top: bool = True) -> str:
    # A list inside a json[]/jsonb[] is a JSON value, not a dimension (read as 1-D).
    if isinstance(value, list) and (top or kind != "json"):
        return "{" + delim.join(_array(v, kind, delim, False) for v in value) + "}"
    text = _element(value, kind)
    if text is None:
        return "NULL"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_text(value: Any, col: Column) -> str | None:
    """A decoded JSON value as the text input of its column's type (None: SQL NULL)."""
    if value is None:
        return None
    if col.array and isinstance(value, list):
        return _array(value, col.kind, col.delim)
    return _element(value, col.kind)


def _operations(table: TableDef, change: Any) -> list[tuple[str, Any]]:
    """What applying a change takes: an update that changed the key also deletes the row
    under the old key (Postgres sends the old key then)."""
    action = change["action"]
    if action in ("truncate", "delete"):
        return [(action, change)]
    old = change.get("old") or {}
    record = change.get("record") or {}
    if action == "update" and old and any(k in old and old[k] != record.get(k) for k in table.pk):
        return [("delete", {"record": old}), ("upsert", change)]
    return [("upsert", change)]


def _keys(table: TableDef, change: Any) -> list[str] | None:
    """The keys of the rows a change touches (both keys of a key change); None: truncate."""
    if change["action"] == "truncate":
        return None
    return [row_key(table.pk, op.get("record") or {}) for _, op in _operations(table, change)]


# -- the sink ------------------------------------------------------------------------------------
class PostgresSink(Sink):
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
        psycopg = _psycopg()
        conn = _connection(self.dsn)
        failed: dict[int, str] = {}
        with conn.transaction():
            book = self._book(conn, {(c["schema"], c["table"]) for c in changes})
            todo = []
            for i, (m, c) in enumerate(zip(messages, changes, strict=True)):
                verdict = book.verdict((c["schema"], c["table"]), m.cursor)
                if verdict == SUPERSEDED:
                    failed[i] = book.superseded_reason((c["schema"], c["table"]), m.cursor)
                elif verdict == APPLY:
                    todo.append(i)
            runs = self._runs(conn, messages, changes, todo) if not isolate else None
            if runs is not None:
                for target, kind, ops in runs:
                    self._statement(conn, target, kind, [c for _, c in ops])
                for i in todo:
                    c = changes[i]
                    # The keys (and so the table's definition) only when a refusal needs them.
                    book.applied(
                        (c["schema"], c["table"]), messages[i].cursor,
                        functools.partial(self._row_keys, conn, c),
                    )  # fmt: skip
            else:
                for i in todo:
                    m, c = messages[i], changes[i]
                    table: TableDef | None = None
                    try:
                        table = self._table(conn, c)  # outside the savepoint: it stays
                        with conn.transaction():  # a savepoint per change
                            for kind, op in _operations(table, c):
                                self._statement(conn, table, kind, [op])
                        book.applied(
                            (c["schema"], c["table"]), m.cursor,
                            functools.partial(_keys, table, c),
                        )  # fmt: skip
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        raise
                    except (SinkError, psycopg.Error) as exc:
                        failed[i] = (
                            exc.problem
                            if isinstance(exc, SinkError)
                            else str(exc).strip().splitlines()[0]
                        )
                        key = row_key(table.pk, c.get("record") or {}) if table else None
                        book.refused(key, (c["schema"], c["table"]), m.cursor)
            mirror_book.save(conn, self.name, book)
        if failed:
            first = min(failed)
            c = changes[first]
            raise SinkError(
                f"Postgres mirror: {c['schema']}.{c['table']} refused a change: "
                f"{failed[first]} ({len(failed)} of {len(messages)} changes)",
                "the target's table differs from the source (types, constraints, triggers); "
                "fix it, then `walstream dead-letters retry`",
                retryable=False,
                delivered=frozenset(range(len(messages))) - failed.keys(),
            )

    def _row_keys(self, conn: Any, change: Any) -> list[str] | None:
        return _keys(self._table(conn, change), change)

    def _runs(
        self, conn: Any, messages: Sequence[Message], changes: list[Any], todo: list[int]
    ) -> list[tuple[TableDef, str, list[tuple[int, Any]]]]:
        """Consecutive operations that one statement can apply: same table, same kind, same
        columns, each key once. Each holds (index of its message, the change)."""
        runs: list[tuple[TableDef, str, list[tuple[int, Any]]]] = []
        run_key: Any = None
        keys: set[str] = set()
        for i in todo:
            c = changes[i]
            ident = (c["schema"], c["table"])
            table = self._table(conn, c)
            for kind, op in _operations(table, c):
                record = op.get("record") or {}
                cols = frozenset(record) - set(op.get("unchanged_toast") or ())
                pk = json.dumps([record.get(k) for k in table.pk])
                key = (ident, kind, cols)
                if key != run_key or pk in keys or kind == "truncate":
                    runs.append((table, kind, []))
                    run_key, keys = key, set()
                keys.add(pk)
                runs[-1][2].append((i, op))
        return runs

    def _statement(self, conn: Any, table: TableDef, kind: str, changes: list[Any]) -> None:
        if kind == "truncate":
            conn.execute(f"TRUNCATE {table.target}")
            return
        toast = set(changes[0].get("unchanged_toast") or ())
        names = [
            n for n in table.columns if n in (changes[0].get("record") or {}) and n not in toast
        ]
        if kind == "delete":
            names = table.pk
        cols = [table.columns[n] for n in names]
        rows = [
            {
                n: to_text((c.get("record") or {}).get(n), col)
                for n, col in zip(names, cols, strict=True)
            }
            for c in changes
        ]
        exprs = ", ".join(
            f"(r->>{_literal(n)})::{col.type_sql} AS {_ident(n)}"
            for n, col in zip(names, cols, strict=True)
        )
        data = json.dumps(rows, ensure_ascii=False)
        if kind == "delete":
            match = " AND ".join(f"t.{_ident(k)} = d.{_ident(k)}" for k in table.pk)
            conn.execute(
                f"DELETE FROM {table.target} t USING (SELECT {exprs} "
                f"FROM jsonb_array_elements(%s::jsonb) j(r)) d WHERE {match}",
                (data,),
            )
            return
        updates = [n for n in names if n not in table.pk]
        conflict = (
            "DO UPDATE SET " + ", ".join(f"{_ident(n)} = EXCLUDED.{_ident(n)}" for n in updates)
            if updates
            else "DO NOTHING"
        )
        conn.execute(
            f"INSERT INTO {table.target} ({', '.join(_ident(n) for n in names)}) "
            f"SELECT {exprs} FROM jsonb_array_elements(%s::jsonb) j(r) "
            f"ON CONFLICT ({', '.join(_ident(k) for k in table.pk)}) {conflict}",
            (data,),
        )

    # -- tables and cursors -----------------------------------------------------------------------
    def _table(self, conn: Any, change: Any) -> TableDef:
        schema, name = change["schema"], change["table"]
        target_schema = self.config.schema_ or schema
        key = (self.dsn, target_schema, name)  # where the rows go, not where they come from
        table = _TABLES.get(key)
        record = change.get("record") or {}
        filled_by = (self.name, schema, name)
        if (
            table is not None
            and table.filled_by == filled_by
            and all(k in table.columns for k in record)
        ):
            return table
        source = _connection(self.source_dsn)
        fresh = load_definition(source, schema, name, target_schema)
        fresh.filled_by = filled_by
        if table is None or table.filled_by != filled_by:
            mirror_book.claim(conn, self.name, (schema, name), (target_schema, name))
            self._create(conn, fresh)
        else:  # the source gained columns: add them
            for ddl in fresh.types:
                conn.execute(ddl)
            for col in fresh.columns.values():
                if col.name not in table.columns:
                    conn.execute(
                        f"ALTER TABLE {fresh.target} ADD COLUMN IF NOT EXISTS "
                        f"{_ident(col.name)} {col.type_sql}"
                    )
        _TABLES[key] = fresh
        self._created.append(key)
        return fresh

    def _create(self, conn: Any, table: TableDef) -> None:
        exists = conn.execute("SELECT to_regclass(%s)", (table.target,)).fetchone()[0]
        if exists is not None:
            return
        if not self.config.create_tables:
            raise SinkError(
                f"Postgres mirror: table {table.target} does not exist in the target",
                "create it, or set destination.create_tables: true",
                retryable=False,
            )
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(table.schema)}")
        for ddl in table.types:
            conn.execute(ddl)
        cols = ", ".join(
            f"{_ident(c.name)} {c.type_sql}{' NOT NULL' if c.not_null else ''}"
            for c in table.columns.values()
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table.target} ({cols}, "
            f"PRIMARY KEY ({', '.join(_ident(k) for k in table.pk)}))"
        )

    def _book(self, conn: Any, tables: set[tuple[str, str]]) -> mirror_book.Book:
        if (self.dsn, "", "") not in _TABLES:  # once per process: the bookkeeping tables
            mirror_book.ensure(conn)
            _TABLES[(self.dsn, "", "")] = TableDef("walstream", "mirror_cursors")
            self._created.append((self.dsn, "", ""))
        return mirror_book.load(conn, self.name, tables)

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
