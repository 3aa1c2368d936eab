"""Which sinks `walstream verify` can compare with their source, their sides from the config,
and repairs: the keys that differ re-backfilled through the sink's normal backfill path.

A Postgres mirror is compared table for table (the copy in its target database); a Delta
or Iceberg mirror with its table, a history table by its current versions. Everything
else cannot be compared row for row with the source, and `sink_kind` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.backfill.predicate import Predicate
from walstream.config import Plan, SinkConfig
from walstream.decode.table_shape import TableShape, load_shape
from walstream.errors import ConfigError, WalstreamError
from walstream.postgres.replication import connect
from walstream.verify.sides import LakeTable, PostgresTable, Side

#: A repair's `where` (a backfill predicate) stays under the predicate's length limit; more
#: keys than fit re-backfill the whole table.
REPAIR_TEXT = 3_800


def sink_kind(sink: SinkConfig) -> str:
    """ "postgres" or "lake" (a mirror or history table), or a ConfigError saying why the
    sink cannot be verified."""
    dest = sink.destination.unwrapped()
    mode = getattr(dest, "mode", None)
    kind = (
        "postgres"
        if dest.type == "postgres"
        else "lake"
        if dest.type in ("delta", "iceberg") and mode in ("mirror", "history")
        else None
    )
    partial = _partial(sink)
    if kind is not None and partial is None:
        return kind
    if partial is not None:
        raise ConfigError(
            f"sink {sink.name} cannot be verified: {partial}, so it does not hold the rows "
            "its source has",
            "verify a sink that takes every insert, update and delete of its tables",
        )
    why = (
        "a changelog table keeps every change, not the rows the source has"
        if mode == "changelog"
        else f"a {dest.type} sink sends messages: what its consumers made of them is not "
        "in walstream's reach (a compacted topic's latest values are not compared yet)"
    )
    raise ConfigError(
        f"sink {sink.name} cannot be verified: {why}",
        "verify a Postgres mirror, or a Delta or Iceberg sink in mode mirror or history",
    )


def _partial(sink: SinkConfig) -> str | None:
    """Why the sink holds only part of its source's rows by its own settings, if it does."""
    if sink.filter is not None:
        return f"its filter ({sink.filter}) keeps some changes out"
    left = [a for a in ("insert", "update", "delete") if a not in sink.taken_actions()]
    if left:
        return f"it does not take the {'/'.join(left)} changes (actions)"
    return None


@dataclass(frozen=True)
class Pair:
    """One source table and what the sink holds of it."""

    table: str  # schema.table at the source
    target: str  # where the sink keeps it, for the report
    source: Side
    sink: Side
    estimate: int | None


def tables_of(plan: Plan, sink: SinkConfig, named: list[str]) -> list[tuple[str, str]]:
    """The source tables to compare: those named, else every one the sink selects."""
    from walstream.backfill.requests import published_tables

    source = plan.source(sink.source)
    with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
        published = published_tables(conn, source.publication_name)
    if named:
        wanted = [(n.rpartition(".")[0] or "public", n.rpartition(".")[2]) for n in named]
        for schema, table in wanted:
            if not sink.wants_table(schema, table) or (schema, table) not in published:
                raise ConfigError(
                    f"sink {sink.name} does not take {schema}.{table} from publication "
                    f"{source.publication_name}",
                    "name one of its tables: " + ", ".join(f"{s}.{t}" for s, t in published),
                )
        return wanted
    return [(s, t) for s, t in published if sink.wants_table(s, t)]


def pair(
    plan: Plan,
    sink: SinkConfig,
    schema: str,
    table: str,
    chunk_size: int,
    where: Predicate | None = None,
) -> Pair:
    """The two sides of one table, in the sink's column types (the rows `where` selects)."""
    from walstream.backfill.chunks import estimate_rows
    from walstream.backfill.requests import prepare_table
    from walstream.sinks.registry import sink_for

    source = plan.source(sink.source)
    dsn = source.dsn.get_secret_value()
    dest = sink.destination.unwrapped()
    name = f"{schema}.{table}"
    with connect(dsn, autocommit=True) as conn:
        # the source's rows: those `where` and the publication's row filter select
        prepared = prepare_table(conn, source.publication_name, schema, table, where)
        sent = list(prepared.table.columns)
        shape: TableShape
        if sink_kind(sink) == "lake":
            shape = dest.typed_shape(conn, schema, table, sent)
        else:
            shape = load_shape(conn, schema, table).select(sent, None)
        estimate = estimate_rows(conn, prepared.table, prepared.where)
    src = PostgresTable("source", dsn, schema, table, shape, chunk_size, prepared.where)
    if sink_kind(sink) == "postgres":
        target_schema = getattr(dest, "schema_", None) or schema
        target_dsn = dest.dsn.get_secret_value()  # type: ignore[attr-defined]
        snk: Side = PostgresTable(
            "sink", target_dsn, target_schema, table, shape, chunk_size, where
        )
        target = f"{target_schema}.{table}"
    else:
        table_sink = sink_for(dest)
        history = getattr(dest, "mode", None) == "history"
        snk = LakeTable("sink", table_sink, schema, table, shape, history, where)
        target = table_sink.target(schema, table)  # type: ignore[attr-defined]
    return Pair(name, target, src, snk, estimate)


def repair_where(dsn: str, key: tuple[str, ...], keys: list[tuple[Any, ...]]) -> str | None:
    """A backfill predicate selecting `keys` (their values as quoted literals, which Postgres
    reads in the key columns' types), or None when they do not fit: the whole table."""
    with connect(dsn, autocommit=True) as conn:
        rows = [
            "(" + ", ".join(sql.Literal(_text(v)).as_string(conn) for v in k) + ")" for k in keys
        ]
    columns = ", ".join(sql.Identifier(c).as_string(None) for c in key)
    text = f"({columns}) IN ({', '.join(rows)})"
    return text if len(text) <= REPAIR_TEXT else None


def _text(v: Any) -> str:
    from datetime import datetime

    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def repair(
    plan: Plan,
    sink: SinkConfig,
    schema: str,
    table: str,
    keys: list[tuple[Any, ...]],
    key: tuple[str, ...],
    timeout: float,
    progress: Callable[[str], None],
) -> str:
    """Re-backfill `keys` of one table into the sink (all of the table when they do not fit
    in one predicate) and wait until the running pipeline has delivered them: the backfill's
    id and what it read, for the report."""
    from walstream.backfill.requests import request
    from walstream.backfill.store import CANCELLED, DONE, FAILED, BackfillStore

    source = plan.source(sink.source)
    where = repair_where(source.dsn.get_secret_value(), key, keys)
    store = BackfillStore(plan.state_dsn, plan.state.schema_)
    store.ensure()
    (backfill,) = request(plan, store, sink.name, [f"{schema}.{table}"], where)
    what = f"backfill {backfill.id} of " + (
        f"{len(keys):,} key(s)" if where is not None else "the whole table"
    )
    deadline = time.monotonic() + timeout
    while True:
        found = store.get(backfill.id)
        status = getattr(found, "status", None)
        if status == DONE:
            return what
        if status in (FAILED, CANCELLED):
            raise WalstreamError(
                f"the repair's {what} of {schema}.{table} ended {status}: "
                f"{getattr(found, 'error', None) or 'no reason given'}",
                "see `walstream backfill status`, fix what it names and verify again",
            )
        if time.monotonic() > deadline:
            raise WalstreamError(
                f"the repair's {what} of {schema}.{table} did not finish within {timeout:g}s",
                "is `walstream run` running? It carries backfills out; see `walstream "
                "backfill status`, and verify again once it is done",
            )
        progress(f"{schema}.{table}: repairing: {what} {status}")
        time.sleep(0.5)
