"""Key-range chunks of a table, for backfills (docs/architecture.md §6).

A table is cut into ranges of its primary key, in key order: each range holds up
to `size` rows (of those matching an optional `where` predicate) and is read with
one indexed query, `WHERE (pk) > after AND (pk) <= upto`. Composite keys compare
as row values, so `(a, b) > (1, 'x')` follows the index. Boundaries are the key
values as text with the key columns' types, so a plan can be stored (to resume
after a crash) and read back on any process.

Boundaries are found one at a time (`next_boundary`: an index range scan of
`size` entries), so the size can change between chunks, e.g. toward a target
time per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.backfill.predicate import BadPredicate, Predicate
from walstream.errors import ConfigError

Key = tuple[str, ...]  # key values as text, in key order


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    pk: list[str]
    pk_types: list[str]  # format_type of each key column
    columns: list[str]
    oid: int = 0  # the table's OID when it was described

    @property
    def ident(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.name))

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class KeyRange:
    after: Key | None  # exclusive lower bound; None: from the first key
    upto: Key | None  # inclusive upper bound; None: to the last key


def describe(conn: Any, schema: str, table: str) -> Table:
    """The table's key and columns; a table without a primary key cannot be chunked."""
    row = conn.execute(
        "SELECT r, r::oid::int8 FROM to_regclass(format('%%I.%%I', %s::text, %s::text)) r",
        (schema, table),
    ).fetchone()
    if row is None or row[0] is None:
        raise ConfigError(
            f"table {schema}.{table} does not exist",
            "check the name (schema.table) and that the source's database has it",
        )
    oid = row[0]
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (oid,),
        ).fetchall()
    ]
    keys = conn.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_index i
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
           WHERE i.indrelid = %s::regclass AND i.indisprimary
           ORDER BY array_position(i.indkey::int2[], a.attnum)""",
        (oid,),
    ).fetchall()
    if not keys:
        raise ConfigError(
            f"table {schema}.{table} has no primary key, so it cannot be read in key ranges",
            f"add one (ALTER TABLE {schema}.{table} ADD PRIMARY KEY (...)), or leave the "
            "table out of the backfill",
        )
    return Table(schema, table, [k[0] for k in keys], [k[1] for k in keys], cols, int(row[1]))


def _where(where: Predicate | None) -> sql.Composable:
    """A checked predicate (printed from its parse tree, see `predicate`), with `%` kept
    literal beside the parameters."""
    if where is None:
        return sql.SQL("")
    return sql.SQL(" AND ({})").format(sql.SQL(where.sql.replace("%", "%%")))


@contextmanager
def read_only(conn: Any, timeout_ms: int | None = None) -> Iterator[None]:
    """A READ ONLY transaction on an autocommit connection (and a statement timeout in it):
    whatever a predicate would try, it cannot write."""
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        if timeout_ms is not None:
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(timeout_ms),))
        yield


def _row(table: Table) -> sql.Composed:
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k) for k in table.pk))


def _bound(table: Table) -> sql.Composed:
    """`(%s::type1, %s::type2)`: a key given as text, compared with the key's own types."""
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.SQL("%s::" + t) for t in table.pk_types))


def _range(table: Table, r: KeyRange) -> tuple[sql.Composable, list[str]]:
    parts: list[sql.Composable] = []
    params: list[str] = []
    if r.after is not None:
        parts.append(sql.SQL(" AND {} > {}").format(_row(table), _bound(table)))
        params.extend(r.after)
    if r.upto is not None:
        parts.append(sql.SQL(" AND {} <= {}").format(_row(table), _bound(table)))
        params.extend(r.upto)
    return sql.Composed(parts), params


def check_where(conn: Any, table: Table, where: Predicate | None) -> None:
    """Plan (not run) the predicate against the table, in a READ ONLY transaction through
    the extended protocol (one statement): a mistake is a BadPredicate naming it."""
    if where is None:
        return
    import psycopg

    where.check_columns(table.qualified, table.columns)
    try:
        with read_only(conn, timeout_ms=10_000):
            # The parameter keeps psycopg on the extended protocol: one statement, always.
            conn.execute(
                sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE %s{}").format(table.ident, _where(where)),
                (True,),
            )
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0]
        raise BadPredicate(
            where.sql, f"it is not a valid predicate on {table.qualified}: {reason}"
        ) from None


def estimate_rows(conn: Any, table: Table, where: Predicate | None) -> int | None:
    """The planner's estimate of the rows matching `where` (no scan); None if unknown."""
    import psycopg

    try:
        with read_only(conn, timeout_ms=10_000):
            row = conn.execute(
                sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE %s{}").format(
                    table.ident, _where(where)
                ),
                (True,),
            ).fetchone()
        return int(row[0][0]["Plan"]["Plan Rows"])
    except (psycopg.Error, LookupError, TypeError, ValueError):
        return None


def next_boundary(
    conn: Any, table: Table, after: Key | None, size: int, where: Predicate | None = None
) -> Key | None:
    """The key `size` rows after `after` (the end of the next chunk), or None when the rest
    of the table fits in one chunk."""
    rng, params = _range(table, KeyRange(after, None))
    # The key as text only for the two rows kept: in the inner SELECT, every skipped row's
    # key was converted (half the query's time for a bigint key).
    keys = [sql.Identifier(k) for k in table.pk]
    query = sql.SQL(
        "SELECT {} FROM (SELECT {} FROM {} AS _t WHERE true{}{} ORDER BY {} OFFSET %s LIMIT 2) _k"
    ).format(
        sql.SQL(", ").join(sql.SQL("_k.{}::text").format(k) for k in keys),
        sql.SQL(", ").join(sql.SQL("_t.{}").format(k) for k in keys),
        table.ident,
        rng,
        _where(where),
        sql.SQL(", ").join(sql.SQL("_t.{}").format(k) for k in keys),
    )
    with read_only(conn):
        rows = conn.execute(query, [*params, size - 1]).fetchall()
    return tuple(rows[0]) if len(rows) == 2 else None  # one row: it is the table's last


def plan(
    conn: Any, table: Table, size: int, where: Predicate | None = None, after: Key | None = None
) -> Iterator[KeyRange]:
    """Every chunk of the table (after the key `after`, when given), in key order: together
    they cover each row exactly once."""
    while True:
        upto = next_boundary(conn, table, after, size, where)
        yield KeyRange(after, upto)
        if upto is None:
            return
        after = upto


def chunk_query(
    table: Table,
    r: KeyRange,
    where: Predicate | None = None,
    columns: Sequence[sql.Composable] | None = None,
) -> tuple[sql.Composed, list[str]]:
    """The query that reads one chunk's rows, in key order, and its parameters.
    `columns`: what it selects (default: the table's columns)."""
    rng, params = _range(table, r)
    query = sql.SQL("SELECT {} FROM {} WHERE true{}{} ORDER BY {}").format(
        sql.SQL(", ").join(columns or [sql.Identifier(c) for c in table.columns]),
        table.ident,
        rng,
        _where(where),
        # the table's columns: a bare name would sort by a `::text` output column
        sql.SQL(", ").join(
            sql.SQL("{}.{}").format(table.ident, sql.Identifier(k)) for k in table.pk
        ),
    )
    return query, params
