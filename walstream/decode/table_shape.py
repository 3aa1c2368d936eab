"""A source table as typed columns: each Postgres column's Spark/Arrow type, and the key.

Typed reads (a table sink's rows and backfills) take their types from the source's
catalog as the table is when a batch is written; the mapping is docs/lakehouse.md's
table (integers, floats, decimals up to 38 digits, booleans, dates, timestamps with
and without zone, bytea, one-dimensional arrays of those; everything else as text;
domains as their base type). A value that does not fit its column type (numeric
'NaN', a date 'infinity', a multi-dimensional array) is never written as NULL: the
batch stops with an error naming the column (see `lake/writer.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import SinkError

_COLUMNS = """
SELECT a.attname, a.atttypid::int8, a.atttypmod, a.attnotnull, a.attrelid::int8
FROM pg_attribute a
WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum"""
#: The primary key, else the replica identity index.
_KEY = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))
  AND (i.indisprimary OR i.indisreplident)
ORDER BY i.indisprimary DESC, array_position(i.indkey::int2[], a.attnum)"""
_TYPE = """
SELECT t.typname, t.typtype, t.typelem::int8, t.typbasetype::int8, t.typtypmod, t.typcategory,
       n.nspname
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s"""

_SCALARS = {
    "int2": "INT",
    "int4": "INT",
    "int8": "BIGINT",
    "oid": "BIGINT",
    "xid": "BIGINT",
    "float4": "FLOAT",
    "float8": "DOUBLE",
    "bool": "BOOLEAN",
    "date": "DATE",
    "timestamptz": "TIMESTAMP",
    "timestamp": "TIMESTAMP_NTZ",
    "bytea": "BINARY",
}


def numeric_type(typmod: int) -> str:
    """numeric(p, s) as DECIMAL(p, s) when Spark's decimals hold it, else STRING."""
    if typmod < 4:  # no precision given: any number of digits
        return "STRING"
    precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    if precision > 38 or scale > precision:
        return "STRING"
    return f"DECIMAL({precision},{scale})"


def column_type(name: str, typmod: int, category: str = "", element: str | None = None) -> str:
    """The column type (Spark DDL) of a built-in Postgres type by its `typname`.

    `element`: for an array, its element's column type (already mapped).
    """
    if element is not None:
        return f"ARRAY<{element}>"
    if name == "numeric":
        return numeric_type(typmod)
    return _SCALARS.get(name, "STRING")


_DECIMAL = re.compile(r"^DECIMAL\((\d+),(\d+)\)$")


def arrow_type(ddl: str) -> Any:
    """The Arrow type of a lake column type (Spark DDL, as `column_type` gives it)."""
    import pyarrow as pa

    if ddl.startswith("ARRAY<") and ddl.endswith(">"):
        return pa.list_(arrow_type(ddl[6:-1]))
    m = _DECIMAL.match(ddl)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    simple = {
        "INT": pa.int32(),
        "BIGINT": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "TIMESTAMP_NTZ": pa.timestamp("us"),
        "BINARY": pa.binary(),
        "STRING": pa.string(),
    }
    return simple[ddl]


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Spark DDL: INT, DECIMAL(10,2), ARRAY<STRING> ...
    nullable: bool = True


@dataclass(frozen=True)
class TableShape:
    """A source table's columns as the lake holds them, and its key columns."""

    schema: str
    table: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    #: Postgres' own type per column (`format_type`-like, for messages).
    pg_types: dict[str, str] = field(default_factory=dict, compare=False)
    #: The source table's OID (0: not read from the catalog); it stays through a rename.
    oid: int = field(default=0, compare=False)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def ddl(self, as_text: tuple[str, ...] = ()) -> str:
        """The columns as a Spark DDL struct body (`from_json`'s schema); columns whose type
        starts with one of `as_text` are STRING."""
        return ", ".join(
            f"`{c.name.replace('`', '``')}` {'STRING' if c.type.startswith(as_text) else c.type}"
            for c in self.columns
        )

    def arrow_schema(self) -> Any:
        """The columns as an Arrow schema in their lake types."""
        import pyarrow as pa

        return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in self.columns])

    def select(self, include: list[str] | None, exclude: list[str] | None) -> TableShape:
        """Only the columns `include` names (all when None), without those `exclude` names;
        the key columns are always kept."""
        keep = [
            c
            for c in self.columns
            if c.name in self.key
            or ((include is None or c.name in include) and c.name not in (exclude or ()))
        ]
        return TableShape(self.schema, self.table, tuple(keep), self.key, self.pg_types, self.oid)


#: What to do when a lake sink meets changes of a table that is gone under its name.
RENAMED_FIX = (
    "lake sinks do not follow a renamed table yet, and a dropped table's changes cannot be "
    "typed: leave the old name out of the sink (tables: [...]) and restart; for a rename, "
    "then `walstream backfill SINK --table SCHEMA.NEW` fills the new name's lake table (the "
    "old one keeps the rows it had)"
)


class TableGone(SinkError):
    """The table is not in the source's catalog under its name (dropped, or renamed away)."""


def load_shape(conn: Any, schema: str, table: str, *, need_key: bool = True) -> TableShape:
    """The table's shape from the catalog (`conn`: a psycopg 3 connection to the source)."""
    rows = conn.execute(_COLUMNS, (schema, table)).fetchall()
    if not rows:
        raise TableGone(
            f"table {schema}.{table} does not exist in the source (any more)",
            RENAMED_FIX,
            retryable=False,
        )
    key = tuple(dict.fromkeys(r[0] for r in conn.execute(_KEY, (schema, table)).fetchall()))
    if need_key and not key:
        raise SinkError(
            f"{schema}.{table} has neither a primary key nor a replica identity index, so its "
            "changes cannot be applied by key",
            f"add a primary key to {schema}.{table}, or write it with `mode: changelog`",
            retryable=False,
        )
    columns, pg_types = [], {}
    for name, oid, typmod, not_null, _ in rows:
        spark_type, pg_name = _type_of(conn, int(oid), int(typmod))
        columns.append(Column(name, spark_type, not bool(not_null)))
        pg_types[name] = pg_name
    return TableShape(schema, table, tuple(columns), key, pg_types, int(rows[0][4]))


#: pg_type rows by (database, OID): a type's row does not change while its OID exists (a
#: type dropped and created again gets a new OID), so each is read once per process.
_PG_TYPES: dict[tuple[str, int], tuple[Any, ...] | None] = {}


def _pg_type(conn: Any, oid: int) -> tuple[Any, ...] | None:
    key = (conn.info.dsn, oid)
    if key not in _PG_TYPES:
        _PG_TYPES[key] = conn.execute(_TYPE, (oid,)).fetchone()
    return _PG_TYPES[key]


def _type_of(conn: Any, oid: int, typmod: int) -> tuple[str, str]:
    """(column type, Postgres type name) of a type OID: domains by their base, arrays by
    their element."""
    row = _pg_type(conn, oid)
    if row is None:
        return "STRING", str(oid)
    name, typtype, elem, base, base_typmod, category, nsp = row
    if typtype == "d":  # a domain: its base type (with the domain's own typmod)
        return _type_of(conn, int(base), int(base_typmod))
    if category == "A" and elem:
        inner, inner_name = _type_of(conn, int(elem), typmod)
        return (f"ARRAY<{inner}>" if not inner.startswith("ARRAY") else "STRING"), inner_name + "[]"
    if nsp != "pg_catalog" or typtype in ("e", "c", "r", "m"):
        return "STRING", name  # enums, composites, ranges, extension types: their text
    return column_type(name, typmod, category), name


def publication_tables(conn: Any, publication: str) -> list[tuple[str, str]]:
    """The (schema, table) pairs a publication covers, sorted."""
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(str(s), str(t)) for s, t in rows]


def rows_by_key(
    conn: Any, shape: TableShape, keys: list[tuple[Any, ...]]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table's rows now of these keys (values as the shape's lake types take them: a
    STRING column read as Postgres' text), by key; a key the table does not have is absent."""
    from psycopg import errors, sql

    def column(c: Column) -> Any:
        name = sql.Identifier(c.name)
        if c.type == "STRING":
            return sql.SQL("{}::text AS {}").format(name, name)
        if c.type == "ARRAY<STRING>":
            return sql.SQL("{}::text[] AS {}").format(name, name)
        return name

    key = list(shape.key)
    one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(key)))
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for at in range(0, len(keys), 500):
        part = keys[at : at + 500]
        query = sql.SQL("SELECT {} FROM {} WHERE ({}) IN ({})").format(
            sql.SQL(", ").join(column(c) for c in shape.columns),
            sql.Identifier(shape.schema, shape.table),
            sql.SQL(", ").join(sql.Identifier(k) for k in key),
            sql.SQL(", ").join([one] * len(part)),
        )
        try:
            cur = conn.execute(query, [v for k in part for v in k])
            found = cur.fetchall()  # values are converted here
        except errors.InsufficientPrivilege as exc:
            raise SinkError(
                f"lake: cannot read {shape.schema}.{shape.table} for the unchanged TOAST values "
                f"of changes to rows the lake table does not have yet: {exc}",
                f"GRANT SELECT ON {shape.schema}.{shape.table} to walstream's source user (a "
                "backfill needs it too), or set REPLICA IDENTITY FULL on the table",
                retryable=False,
            ) from exc
        except errors.DataError as exc:  # a value Python has no type for (an infinite date)
            raise SinkError(
                f"lake: {shape.schema}.{shape.table}: a row read for the unchanged TOAST values "
                f"of changes to rows the lake table does not have yet has a value its lake "
                f"column cannot hold: {exc}",
                "leave the column out of the sink (columns: exclude: [...]), or set REPLICA "
                "IDENTITY FULL on the table so Postgres sends every value",
                retryable=False,
            ) from exc
        names = [d.name for d in cur.description or ()]
        for values in found:
            row = dict(zip(names, values, strict=True))
            out[tuple(row[k] for k in key)] = row
    return out
