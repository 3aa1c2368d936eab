"""The two sides `walstream verify` reads: a source table, and what a sink holds of it.

A side gives every row it has now (`batches`: Arrow in the sink's column types, one chunk
or file batch at a time, in whatever order it reads fastest; a Postgres side marks the end
of each key range with a `Boundary`, where a pass can resume) and the rows of some keys
(`rows`). `where` (a backfill predicate) keeps a pass to the rows it selects: Postgres
evaluates it on a Postgres side, DuckDB on a lake table's rows. A Postgres table (the
source, or a Postgres mirror's copy of it) is read with ADBC in the backfill's key-range
chunks, each in a short READ ONLY transaction of its own: nothing is locked and no snapshot
is held across a pass. A lake table is read by the library of its format, which applies
its deletion vectors or delete files (`TableSink.scan`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.backfill.arrow_read import read_batches, select_list
from walstream.backfill.chunks import Key, Table, chunk_query, describe, plan
from walstream.backfill.predicate import Predicate
from walstream.decode.table_shape import TableShape
from walstream.errors import ConfigError, WalstreamError
from walstream.lake.plain import plain
from walstream.postgres.replication import connect
from walstream.verify.hashing import quoted

#: Keys per lookup query of `PostgresTable.rows`.
LOOKUP = 5_000


@dataclass(frozen=True)
class Boundary:
    """In a pass over a Postgres side: every row up to the key `upto` was read (a pass
    given `after=upto` goes on from there)."""

    upto: Key


class Side(ABC):
    """One side of a comparison: `name` says which in the report."""

    def __init__(self, name: str, shape: TableShape, where: Predicate | None = None) -> None:
        self.name = name
        self.shape = shape
        self.where = where

    @abstractmethod
    def batches(self, after: Key | None = None) -> Iterator[Any]:
        """Every row the side has now (selected by `where`), as Arrow record batches of the
        shape's columns, and `Boundary` marks (only a side read in key ranges has them;
        only such a side is given `after`)."""

    @abstractmethod
    def rows(self, keys: Any) -> Iterator[Any]:
        """The rows of `keys` (a pyarrow Table of the key columns) the side has now."""

    def _typed(self, batch: Any) -> Any:
        """`batch`'s shape columns in the shape's types (a reader may give other widths): a
        pyarrow Table."""
        import pyarrow as pa

        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        table = plain(table.select(self.shape.names))
        return table.cast(self.shape.arrow_schema())


class PostgresTable(Side):
    """`schema.table` in the Postgres at `dsn`, read in key ranges of `chunk_size` rows."""

    def __init__(
        self,
        name: str,
        dsn: str,
        schema: str,
        table: str,
        shape: TableShape,
        chunk_size: int,
        where: Predicate | None = None,
    ) -> None:
        super().__init__(name, shape, where)
        self.dsn, self.schema, self.table, self.chunk_size = dsn, schema, table, chunk_size

    def _describe(self, conn: Any) -> Table | None:
        try:
            return describe(conn, self.schema, self.table)
        except ConfigError:
            exists = conn.execute(
                "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                (self.schema, self.table),
            ).fetchone()[0]
            if exists:
                raise  # no primary key: it cannot be read in key ranges
            return None  # no such table: it has no rows

    def batches(self, after: Key | None = None) -> Iterator[Any]:
        import psycopg

        from walstream.backfill import adbc

        with connect(self.dsn, autocommit=True) as conn:
            table = self._describe(conn)
            if table is None:
                return
            reader = adbc.connect(self.dsn)
            columns = select_list(self.shape)
            try:
                for r in plan(conn, table, self.chunk_size, self.where, after):
                    query, params = chunk_query(table, r, self.where, columns)
                    text = psycopg.ClientCursor(conn).mogrify(query, params)
                    for batch in read_batches(reader, self.shape, text):
                        yield self._typed(batch)
                    if r.upto is not None:
                        yield Boundary(r.upto)
            finally:
                reader.close()

    def sums(self, buckets: int, after: Key | None = None) -> Iterator[Any]:
        """Per key range (`Boundary` after each), each bucket's rows and sum of row hashes
        as Postgres computes them (`row_hash`, `bucket_of`): nothing but the sums leaves
        the server, and SUM_CONNECTIONS connections hash as many key ranges at a time."""
        from collections import deque
        from concurrent.futures import Future, ThreadPoolExecutor

        with connect(self.dsn, autocommit=True) as conn:
            table = self._describe(conn)
            if table is None:
                return
            workers = [connect(self.dsn, autocommit=True) for _ in range(SUM_CONNECTIONS)]
            free = list(workers)

            def run(r: Any) -> tuple[list[tuple[int, int, int]], Any]:
                worker = free.pop()
                try:
                    query, params = _sums_query(table, self.shape, r, self.where, buckets)
                    rows = worker.execute(query, params).fetchall()
                finally:
                    free.append(worker)
                return [(int(b), int(n), int(h)) for b, n, h in rows], r

            def done(future: Future[Any]) -> Iterator[Any]:
                parts, r = future.result()
                yield parts
                if r.upto is not None:
                    yield Boundary(r.upto)

            try:
                with ThreadPoolExecutor(SUM_CONNECTIONS) as pool:
                    running: deque[Future[Any]] = deque()  # in key order: one per connection
                    for r in plan(conn, table, self.chunk_size, self.where, after):
                        running.append(pool.submit(run, r))
                        if len(running) == SUM_CONNECTIONS:
                            yield from done(running.popleft())
                    while running:
                        yield from done(running.popleft())
            finally:
                for worker in workers:
                    worker.close()

    def batches_of(self, buckets: int, wanted: set[int]) -> Iterator[Any]:
        """The rows of `wanted` buckets (of `buckets`, as `sums` places them): their keys
        found by Postgres, then the rows of those keys."""
        import pyarrow as pa

        with connect(self.dsn, autocommit=True) as conn:
            table = self._describe(conn)
            if table is None:
                return
            texts = [
                sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"_k{i}"))
                for i, k in enumerate(table.pk)
            ]
            bucket = sql.SQL("{} AS _walstream_bucket").format(bucket_of(table.pk, buckets))
            for r in plan(conn, table, self.chunk_size, self.where):
                query, params = chunk_query(table, r, self.where, [*texts, bucket])
                picked = sql.SQL("SELECT * FROM ({}) s WHERE _walstream_bucket = ANY({})").format(
                    query, sql.Literal(sorted(wanted))
                )
                found = conn.execute(picked, params).fetchall()
                if found:
                    keys = pa.table(
                        {
                            k: pa.array([f[i] for f in found], pa.string())
                            for i, k in enumerate(table.pk)
                        }
                    )
                    yield from self.rows(keys)

    def rows(self, keys: Any) -> Iterator[Any]:
        import psycopg
        import pyarrow as pa
        import pyarrow.compute as pc

        from walstream.backfill import adbc

        with connect(self.dsn, autocommit=True) as conn:
            table = self._describe(conn)
            if table is None or keys.num_rows == 0:
                return
            texts = [pc.cast(keys.column(k), pa.string()).to_pylist() for k in table.pk]
            reader = adbc.connect(self.dsn)
            try:
                for start in range(0, keys.num_rows, LOOKUP):
                    part = [t[start : start + LOOKUP] for t in texts]
                    text = psycopg.ClientCursor(conn).mogrify(_lookup(table, self.shape), part)
                    for batch in read_batches(reader, self.shape, text):
                        yield self._typed(batch)
            finally:
                reader.close()


#: Connections a Postgres side's sums are computed on, each a key range at a time.
SUM_CONNECTIONS = 2


def row_hash(columns: list[str]) -> sql.Composed:
    """A row's hash in Postgres: of its columns' text, as a row (NULL and '' differ). The
    text of times, floats and bytes depends on the session: `connect` sets walstream's
    (`decode.types.SESSION_SETTINGS`) on every connection, on both sides alike."""
    return sql.SQL("hashtextextended(ROW({})::text, 0)").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


def bucket_of(key: list[str], buckets: int) -> sql.Composed:
    """A row's bucket in Postgres: its key's hash, modulo `buckets` (not negative)."""
    n = sql.Literal(int(buckets))
    return sql.SQL("mod(mod({}, {}) + {}, {})").format(row_hash(key), n, n, n)


def _sums_query(
    table: Table, shape: TableShape, r: Any, where: Predicate | None, buckets: int
) -> tuple[sql.Composed, list[str]]:
    inner = [
        sql.SQL("{} AS b").format(bucket_of(table.pk, buckets)),
        sql.SQL("{} AS h").format(row_hash(shape.names)),
    ]
    query, params = chunk_query(table, r, where, inner)
    return sql.SQL("SELECT b, count(*), sum(h) FROM ({}) s GROUP BY b").format(query), params


def key_arrays(types: list[str]) -> sql.Composed:
    """Parameters for keys given as text arrays, one per key column, each cast to an array
    of its column's type (`types`: as `format_type` names them, from the catalog)."""
    return sql.SQL(", ").join(sql.SQL("%s::text[]::" + t + "[]") for t in types)


def _lookup(table: Table, shape: TableShape) -> sql.Composed:
    """The rows whose key is among arrays of key texts, one array per key column."""
    return sql.SQL("SELECT {} FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))").format(
        sql.SQL(", ").join(select_list(shape)),
        table.ident,
        sql.SQL(", ").join(sql.Identifier(k) for k in table.pk),
        key_arrays(table.pk_types),
    )


class LakeTable(Side):
    """A lake sink's table of one source table: a mirror's rows, or a history's current
    versions (`is_current`)."""

    def __init__(
        self,
        name: str,
        table_sink: Any,
        schema: str,
        table: str,
        shape: TableShape,
        history: bool,
        where: Predicate | None = None,
    ) -> None:
        super().__init__(name, shape, where)
        self.table_sink, self.schema, self.table, self.history = table_sink, schema, table, history

    def batches(self, after: Key | None = None) -> Iterator[Any]:
        assert after is None, "a lake table is read whole"
        return self._scan(self.where)

    def _scan(self, where: Predicate | None) -> Iterator[Any]:
        import pyarrow.compute as pc

        columns = self.shape.names + (["is_current"] if self.history else [])
        reader = self.table_sink.scan(self.schema, self.table, columns)
        if reader is None:
            return
        selected = _Selected(where) if where is not None else None
        try:
            for read in gathered(reader, SCAN_ROWS):
                batch = plain(read)  # before a filter takes
                if self.history:
                    batch = batch.filter(pc.fill_null(batch.column("is_current"), False))
                if selected is not None and batch.num_rows:
                    batch = selected(batch)
                if batch.num_rows:
                    yield self._typed(batch)
        finally:
            if selected is not None:
                selected.close()

    def rows(self, keys: Any) -> Iterator[Any]:
        """One pass over the table, keeping the rows of `keys`."""
        import duckdb
        import pyarrow as pa

        con = duckdb.connect()
        try:
            con.register("_keys", keys)
            using = ", ".join(quoted(k) for k in self.shape.key)
            for batch in self._scan(None):  # a re-check looks keys up whatever their values
                con.register("_batch", batch)
                found = pa.table(
                    con.execute(f"SELECT * FROM _batch SEMI JOIN _keys USING ({using})").arrow()
                )
                con.unregister("_batch")
                if found.num_rows:
                    yield found.cast(self.shape.arrow_schema())
        finally:
            con.close()


#: Rows a lake table's scan hands on at a time: its reader's batches (8,192 rows with
#: delta-rs) gathered, as each DuckDB query and Arrow step costs the same for few rows as
#: for many (hashing 8,192 rows at a time ran at 1.8M rows/s, 131,072 at 9M).
SCAN_ROWS = 131_072


def gathered(reader: Any, rows: int) -> Iterator[Any]:
    """A reader's record batches as pyarrow Tables of at least `rows` rows, but the last
    and those before a batch of another schema (a file written with other encodings)."""
    import pyarrow as pa

    held: list[Any] = []
    count = 0
    for batch in reader:
        if held and batch.schema != held[0].schema:
            yield pa.Table.from_batches(held)
            held, count = [], 0
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(held)
            held, count = [], 0
    if held:
        yield pa.Table.from_batches(held)


class _Selected:
    """The rows of Arrow batches that a backfill predicate selects, evaluated by DuckDB (on
    the sink's column types: a Postgres-only function or operator is an error saying so)."""

    def __init__(self, where: Predicate) -> None:
        import duckdb

        self.where = where
        self.con = duckdb.connect()

    def __call__(self, batch: Any) -> Any:
        import duckdb
        import pyarrow as pa

        self.con.register("_batch", batch)
        try:
            # read before the batch is unregistered: DuckDB's result is a lazy stream
            return pa.table(
                self.con.execute(f"SELECT * FROM _batch WHERE ({self.where.sql})").arrow()
            )
        except duckdb.Error as exc:
            raise WalstreamError(
                f"the sink's rows cannot be selected by --where {self.where.sql!r}: DuckDB, "
                f"which reads the lake table, says: {str(exc).splitlines()[0]}",
                "give a predicate both Postgres and DuckDB read (comparisons of columns with "
                "constants, IN, BETWEEN, IS NULL, AND/OR/NOT)",
            ) from None
        finally:
            self.con.unregister("_batch")

    def close(self) -> None:
        self.con.close()
