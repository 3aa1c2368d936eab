"""The Postgres mirror's table definitions, read from the source's catalog.

Every column with its exact type (`format_type`), NOT NULL, the primary key, and the
DDL of the user-defined types it uses (enums, domains with their checks, composite
types), each created only when missing in the target.
"""

from __future__ import annotations

from typing import Any

from walstream.errors import SinkError
from walstream.sinks.postgres.sql import Column, TableDef, column_kind, ident, if_missing, literal

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(nullif(t.typelem, 0), t.oid) AS base, t.typcategory = 'A' AND t.typelem <> 0,
       coalesce(e.typdelim, ','), a.attrelid::bigint
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type e ON e.oid = t.typelem
WHERE a.attrelid = {rel}
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum"""
_PK = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = {rel} AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)"""
_TYPE = """
SELECT n.nspname, t.typname, t.typtype, t.typbasetype, format_type(t.typbasetype, t.typtypmod),
       t.typnotnull, t.typrelid, (SELECT b.typname FROM pg_type b WHERE b.oid = t.typbasetype)
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s"""


_BY_NAME = "to_regclass(format('%%I.%%I', %s::text, %s::text))"


def load_definition(
    source: Any, schema: str, table: str, target_schema: str, oid: int | None = None
) -> TableDef:
    """The source table's columns, key and user-defined types, as the target will hold them
    (in `target_schema`, named `table`): the table named `schema.table`, or the one whose
    OID is `oid` when given (a change's own table, whatever its name is now)."""
    rel, args = ("%s::oid", (oid,)) if oid else (_BY_NAME, (schema, table))
    rows = source.execute(_COLUMNS.format(rel=rel), args).fetchall()
    if not rows:
        raise SinkError(
            f"Postgres mirror: table {schema}.{table} does not exist in the source (any more)",
            "a change of a dropped table cannot be mirrored; discard the dead letter",
            retryable=False,
        )
    pk = [r[0] for r in source.execute(_PK.format(rel=rel), args).fetchall()]
    if not pk:
        raise SinkError(
            f"Postgres mirror: {schema}.{table} has no primary key, so changes cannot be "
            "applied by key",
            f"add a primary key to {schema}.{table}, or leave the table out of this sink "
            "(tables: [...])",
            retryable=False,
        )
    d = TableDef(target_schema, table, pk=pk, source_oid=int(rows[0][6]))
    seen: set[int] = set()
    for name, type_sql, not_null, base, is_array, delim, _ in rows:
        kind, _ = _user_types(source, int(base), d.types, seen)
        d.columns[name] = Column(name, type_sql, bool(not_null), kind, bool(is_array), delim)
    return d


def _user_types(source: Any, oid: int, ddl: list[str], seen: set[int]) -> tuple[str, str]:
    """(value kind, type name) of a type; appends the DDL of user-defined types it needs."""
    row = source.execute(_TYPE, (oid,)).fetchone()
    nsp, name, typtype, basetype, base_sql, notnull, relid, base_name = row
    qualified = f"{ident(nsp)}.{ident(name)}"
    if nsp in ("pg_catalog", "information_schema") or oid in seen:
        return column_kind(name), name
    seen.add(oid)
    create = f"CREATE SCHEMA IF NOT EXISTS {ident(nsp)}"
    if typtype == "e":
        labels = [
            r[0]
            for r in source.execute(
                "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder", (oid,)
            ).fetchall()
        ]
        body = f"CREATE TYPE {qualified} AS ENUM ({', '.join(literal(x) for x in labels)})"
        ddl.extend([create, if_missing(nsp, name, body)])
        return "scalar", name
    if typtype == "d":
        kind, _ = _user_types(source, int(basetype), ddl, seen)
        checks = [
            r[0]
            for r in source.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE contypid = %s", (oid,)
            ).fetchall()
        ]
        body = f"CREATE DOMAIN {qualified} AS {base_sql}" + (" NOT NULL" if notnull else "")
        body += "".join(f" {c}" for c in checks)
        ddl.extend([create, if_missing(nsp, name, body)])
        return column_kind(base_name) if kind == "scalar" else kind, name
    if typtype == "c" and relid:
        attrs = source.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid FROM pg_attribute a "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (relid,),
        ).fetchall()
        for _, _, attr_type in attrs:
            _user_types(source, int(attr_type), ddl, seen)
        fields = ", ".join(f"{ident(a)} {t}" for a, t, _ in attrs)
        ddl.extend([create, if_missing(nsp, name, f"CREATE TYPE {qualified} AS ({fields})")])
        return "scalar", name
    return "scalar", name  # ranges, base types of extensions: expected to exist in the target


# -- the sink ------------------------------------------------------------------------------------


#: The target table's columns: name, type, whether the type is built in (its text the same
#: in every database, so comparable with the source's `format_type`).
_TARGET = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid < 16384
FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"""


def conform(conn: Any, fresh: TableDef, sent: Any, create_tables: bool) -> None:
    """Bring the target table's columns to the source's now (`fresh`), as the target has
    them in its own catalog (not as this process last saw them: another process, or this
    one before a restart, may have seen the source before its change): add the columns it
    lacks; with `create_tables` (the table is walstream's), drop those the source dropped
    (not one `sent` still names: a change from before the drop) and retype the built-in
    columns whose type changed (through text, as the lazy retype on a refused value). A
    retype the rows cannot take (a narrowed type) is left for that refused value to name."""
    import psycopg

    have = {r[0]: (r[1], r[2]) for r in conn.execute(_TARGET, (fresh.target,)).fetchall()}
    for ddl in fresh.types:
        conn.execute(ddl)
    for col in fresh.columns.values():
        if col.name not in have:
            conn.execute(
                f"ALTER TABLE {fresh.target} ADD COLUMN IF NOT EXISTS {ident(col.name)} "
                f"{col.type_sql}"
            )
    if not create_tables:
        return
    for name in have.keys() - fresh.columns.keys() - set(sent):
        conn.execute(f"ALTER TABLE {fresh.target} DROP COLUMN IF EXISTS {ident(name)}")
    for col in fresh.columns.values():
        type_sql, built_in = have.get(col.name, (col.type_sql, False))
        if not built_in or type_sql == col.type_sql:
            continue
        try:
            with conn.transaction():  # a savepoint: a failed retype leaves the rest
                retype(conn, fresh, col)
        except psycopg.Error:
            continue


def retype(conn: Any, table: TableDef, col: Column) -> None:
    """The target's column `col.name` given the type `col` has, through text: every type
    has a text form."""
    conn.execute(
        f"ALTER TABLE {table.target} ALTER COLUMN {ident(col.name)} TYPE {col.type_sql} "
        f"USING {ident(col.name)}::text::{col.type_sql}"
    )
