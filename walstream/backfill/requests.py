"""A backfill request: which tables of a sink, checked against the database, and what
reading their chunks needs (`Prepared`). The coordinator (`coordinator.py`) carries the
backfills out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from walstream.backfill.chunks import Table, check_where, describe, estimate_rows
from walstream.backfill.predicate import Predicate, parse
from walstream.backfill.store import Backfill, BackfillStore
from walstream.backfill.typed import reads_typed
from walstream.config import Plan, SinkConfig
from walstream.decode.catalog import load_metadata
from walstream.decode.table_shape import TableShape
from walstream.errors import ConfigError
from walstream.postgres.generated import publishes
from walstream.postgres.replication import connect

DEFAULT_CHUNK_SIZE = 20_000
DEFAULT_TARGET_SECONDS = 2.0
#: Typed chunks (lake sinks) are read as Arrow at most of a million rows a second: bigger.
DEFAULT_TYPED_CHUNK_SIZE = 1_000_000


@dataclass(frozen=True)
class Prepared:
    """What reading a backfill's chunks needs, worked out once on the driver."""

    table: Table  # columns: those the publication sends
    where: Predicate | None  # the operator's predicate and the publication's row filter
    type_oids: tuple[int, ...]
    key_idx: tuple[int, ...]
    types: tuple[Any, ...]
    #: A lake sink's backfill: the lake columns its rows are read in (as Arrow).
    shape: TableShape | None = None


def published_tables(conn: Any, publication: str) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def prepare_table(
    conn: Any, publication: str, schema: str, table: str, where: Predicate | None
) -> Prepared:
    """The table's key, the columns pgoutput sends for it (no dropped columns, no generated
    ones unless the publication sends them; the publication's column list) and their
    types, and the full predicate."""
    t = describe(conn, schema, table)
    check_where(conn, t, where)
    # stored generated columns where the publication sends them (18+, generated.py)
    cols = conn.execute(
        "SELECT attname, atttypid::int8 FROM pg_attribute "
        "WHERE attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) "
        "AND attnum > 0 AND NOT attisdropped AND (attgenerated = '' OR (attgenerated = 's' "
        "AND %s)) ORDER BY attnum",
        (schema, table, bool(publishes(conn, publication))),
    ).fetchall()
    predicate = where
    if conn.info.server_version >= 150000:
        row = conn.execute(
            "SELECT attnames, rowfilter FROM pg_publication_tables "
            "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            (publication, schema, table),
        ).fetchone()
        if row is not None:
            if row[0] is not None:
                listed = set(row[0])
                cols = [c for c in cols if c[0] in listed]
            if row[1]:
                rowfilter = Predicate.trusted(row[1])
                predicate = where.also(rowfilter) if where else rowfilter
    names = [c[0] for c in cols]
    missing = [k for k in t.pk if k not in names]
    if missing:
        raise ConfigError(
            f"the publication {publication} does not send key column(s) {', '.join(missing)} "
            f"of {schema}.{table}",
            "add them to the publication's column list",
        )
    oids = tuple(int(c[1]) for c in cols)
    meta = load_metadata(conn)
    types = tuple(meta.types.catalog.values())
    return Prepared(
        replace(t, columns=names),
        predicate,
        oids,
        tuple(names.index(k) for k in t.pk),
        types,
    )


def check_sink(sink: SinkConfig, schema: str, table: str) -> None:
    if "read" not in sink.actions:
        raise ConfigError(
            f"sink {sink.name} does not take action 'read', so it would drop every backfilled row",
            f"add read to sinks[{sink.name}].actions",
        )
    if not sink.wants_table(schema, table):
        raise ConfigError(
            f"sink {sink.name} does not select {schema}.{table} (tables: {', '.join(sink.tables)})",
            "backfill one of its tables, or add the table to the sink's tables",
        )


def request(
    config: Plan,
    store: BackfillStore,
    sink_name: str,
    tables: Sequence[str] = (),
    where: str | None = None,
    chunk_size: int | None = None,
    target_seconds: float | None = None,
) -> list[Backfill]:
    """Create backfills of a sink's tables (all it selects when none are named), checked
    against the database: the rows arrive once `walstream run` takes them."""
    sink = config.sink(sink_name)
    source = config.source(sink.source)
    dsn = source.dsn.get_secret_value()
    predicate = parse(where) if where else None
    created = []
    with connect(dsn, autocommit=True) as conn:
        published = published_tables(conn, source.publication_name)
        if tables:
            wanted = []
            for name in tables:
                schema, _, table = name.rpartition(".")
                wanted.append((schema or "public", table))
        else:
            wanted = [(s, t) for s, t in published if sink.wants_table(s, t)]
            if not wanted:
                raise ConfigError(
                    f"sink {sink.name} selects no table of publication {source.publication_name}",
                    "name the tables with --table, or check the sink's tables and the source",
                )
        plans = []
        for schema, table in wanted:
            check_sink(sink, schema, table)
            prepared = prepare_table(conn, source.publication_name, schema, table, predicate)
            if published and (schema, table) not in published:
                raise ConfigError(
                    f"{schema}.{table} is not in publication {source.publication_name}, so its "
                    "changes would not follow the backfilled rows",
                    f"add it to the source's tables (or ALTER PUBLICATION "
                    f"{source.publication_name} ADD TABLE {schema}.{table})",
                )
            plans.append((schema, table, estimate_rows(conn, prepared.table, prepared.where)))
    for schema, table, estimate in plans:
        id_ = store.create(
            sink.name,
            source.name,
            schema,
            table,
            predicate.sql if predicate else None,
            chunk_size or (DEFAULT_TYPED_CHUNK_SIZE if reads_typed(sink) else DEFAULT_CHUNK_SIZE),
            DEFAULT_TARGET_SECONDS if target_seconds is None else target_seconds,
            estimate,
        )
        found = store.get(id_)
        assert found is not None
        created.append(found)
    return created
