"""Which sinks `walstream verify` can compare with their source, their sides from the config,
and repairs: the keys that differ re-backfilled through the sink's normal backfill path.

A Postgres mirror is compared table for table (the copy in its target database); a Delta
or Iceberg mirror with its table, a history table by its current versions; a Kafka sink
by the latest message of each key in its compacted topic (`topic.py`). Everything else
cannot be compared row for row with the source, and `sink_kind` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from walstream.backfill.predicate import Predicate
from walstream.config import Plan, SinkConfig
from walstream.decode.table_shape import TableShape, load_shape
from walstream.errors import ConfigError, WalstreamError
from walstream.postgres.replication import connect
from walstream.verify.sides import LakeTable, PostgresTable, Side, key_arrays

#: A repair's `where` (a backfill predicate) stays under the predicate's length limit; more
#: keys than fit re-backfill the whole table.
REPAIR_TEXT = 3_800


def sink_kind(sink: SinkConfig) -> str:
    """ "postgres" or "lake" (a mirror or history table), or a ConfigError saying why the
    sink cannot be verified."""
    dest = sink.destination.unwrapped()
    mode = getattr(dest, "mode", None)
    kafka = _kafka_why(sink) if dest.type == "kafka" else None
    kind = (
        "postgres"
        if dest.type == "postgres"
        else "lake"
        if dest.type in ("delta", "iceberg") and mode in ("mirror", "history")
        else "kafka"
        if dest.type == "kafka" and kafka is None
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
        else kafka
        if kafka is not None
        else f"a {dest.type} sink sends messages: what its consumers made of them is not "
        "in walstream's reach"
    )
    raise ConfigError(
        f"sink {sink.name} cannot be verified: {why}",
        "verify a Postgres mirror, a Delta or Iceberg sink in mode mirror or history, or a "
        "Kafka sink of format sequin (or record, with tombstones) to a compacted topic",
    )


def _kafka_why(sink: SinkConfig) -> str | None:
    """Why a Kafka sink's topic cannot be compared with its source, if it cannot."""
    dest: Any = sink.destination.unwrapped()
    if sink.format == "debezium":  # a topic per table, or the one named
        if dest.route_expression() is not None or sink.transform is not None:
            return "its topic or messages are expressions of its own, not Debezium's records"
        return None
    if dest.topic is None or dest.route_expression() is not None:
        return "its topic is an expression: verify compares one named topic"
    if not sink.plain_messages() and (sink.transform or not dest.default_key()):
        return "its messages are made or keyed by expressions of its own, not the rows"
    if sink.format == "record" and not sink.tombstones:
        return (
            "format record does not say which messages are deletes (tombstones: true "
            "makes a delete remove its key)"
        )
    return None


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
    #: The source's key columns, which the report's keys are of (a topic's: their texts
    #: joined by `,`, the message key)
    key: tuple[str, ...]
    #: A topic's: of two sides' rows, the keys equal but for what its messages leave out
    #: (`Verification.equivalent`).
    equivalent: Callable[[list[Any], list[Any]], set[Any]] | None = None
    #: A topic's whose report keys are not the key columns' texts joined by `,`: a report
    #: key as those texts (format debezium's keys are the key's JSON).
    joined: Callable[[str], str] | None = None


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
    shared: dict[str, Any] | None = None,
) -> Pair:
    """The two sides of one table, in the sink's column types (the rows `where` selects);
    `shared`: what the tables of one verification share (a topic read once)."""
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
        elif sink_kind(sink) == "postgres":
            shape = load_shape(conn, schema, table).select(sent, None)
        estimate = estimate_rows(conn, prepared.table, prepared.where)
    if sink_kind(sink) == "kafka":
        return _topic_pair(sink, name, prepared, dsn, chunk_size, estimate, shared)
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
    return Pair(name, target, src, snk, estimate, shape.key)


def _topic_pair(
    sink: SinkConfig,
    name: str,
    prepared: Any,
    dsn: str,
    chunk_size: int,
    estimate: int | None,
    shared: dict[str, Any] | None,
) -> Pair:
    """A table of a Kafka sink: the source's rows as its messages carry them, and each
    key's latest message in the (compacted) topic."""
    from walstream.verify.topic import (
        Latest,
        SourceRecords,
        TopicTable,
        check_compacted,
        consumer_settings,
        debezium_rows,
        equivalent,
    )

    dest: Any = sink.destination.unwrapped()
    shared = {} if shared is None else shared
    t = prepared.table
    records = None
    if sink.format == "debezium":
        records, topic = debezium_rows(sink, dsn, t)
    else:
        topic = dest.topic
    latest = shared.get(topic)
    if latest is None:
        settings = consumer_settings(dest)
        check_compacted(settings, topic, sink.name)
        latest = shared[topic] = Latest(settings, topic, sink.format, (t.schema, t.name))
    src = SourceRecords(dsn, prepared, chunk_size, prepared.where, records)
    sink_side = TopicTable(latest, t.schema, t.name)
    alike = equivalent if records is None else records.equivalent
    joined = None if records is None else records.joined
    return Pair(name, topic, src, sink_side, estimate, tuple(t.pk), alike, joined)


def remove_extra(
    plan: Plan, sink: SinkConfig, schema: str, table: str, keys: list[tuple[Any, ...]]
) -> int:
    """Delete from a Postgres mirror's copy of `schema.table` the rows of `keys` the source
    does not have now: the rows only in the sink. How many it deleted.

    Under a lock on the copy that the sink's writes wait for (SHARE ROW EXCLUSIVE): the
    copy stays at the position its pipeline had applied, the source is asked after that,
    and a key the source lacks at a later position than the copy's is right to delete —
    a change of it still in flight ends with the key gone (a delete of a row the copy no
    longer has removes nothing; an update before it is undone by it), and a key the source
    has again is left for the stream to bring."""
    from walstream.backfill.chunks import describe

    source = plan.source(sink.source)
    dest: Any = sink.destination.unwrapped()
    target = sql.Identifier(getattr(dest, "schema_", None) or schema, table)
    texts = [[_text(k[i]) for k in keys] for i in range(len(keys[0]) if keys else 0)]
    with connect(dest.dsn.get_secret_value()) as mirror, mirror.transaction():
        mirror.execute("SET LOCAL lock_timeout = '60s'")
        try:
            mirror.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(target))
        except psycopg.errors.LockNotAvailable:
            raise WalstreamError(
                f"sink {sink.name}: {schema}.{table}'s copy stayed locked by another "
                "transaction for 60s, so its rows only in the sink were not deleted",
                "find what holds it (pg_locks), and verify --repair again",
            ) from None
        with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
            t = describe(conn, schema, table)
            absent = conn.execute(_absent(t.ident, t.pk, t.pk_types), texts).fetchall()
        gone = [keys[int(i) - 1] for (i,) in absent]
        if not gone:
            return 0
        texts = [[_text(k[i]) for k in gone] for i in range(len(t.pk))]
        asked = sql.SQL("SELECT * FROM unnest({})").format(key_arrays(t.pk_types))
        pk = sql.SQL(", ").join(sql.Identifier(k) for k in t.pk)
        deleted = mirror.execute(
            sql.SQL("DELETE FROM {} WHERE ({}) IN ({})").format(target, pk, asked), texts
        )
        return deleted.rowcount


def _absent(table: sql.Composable, pk: list[str], types: list[str]) -> sql.Composed:
    """The ordinals (from 1) of the keys given as text arrays, one per key column, that
    `table` has no row of: compared in the key's types, by Postgres."""
    names = [sql.Identifier(f"_k{i}") for i in range(len(pk))]
    return sql.SQL(
        "SELECT a._i FROM unnest({}) WITH ORDINALITY AS a({}, _i) "
        "WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE ({}) = ({}))"
    ).format(
        key_arrays(types),
        sql.SQL(", ").join(names),
        table,
        sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in pk),
        sql.SQL(", ").join(sql.SQL("a.{}").format(n) for n in names),
    )


def repair_where(
    dsn: str, key: tuple[str, ...], keys: list[tuple[Any, ...]], joined: bool = False
) -> str | None:
    """A backfill predicate selecting `keys` (their values as quoted literals, which Postgres
    reads in the key columns' types), or None when they do not fit: the whole table.
    `joined`: each of `keys` is a message key, the key columns' texts joined by `,`."""
    with connect(dsn, autocommit=True) as conn:
        rows = [
            "(" + ", ".join(sql.Literal(_text(v)).as_string(conn) for v in k) + ")" for k in keys
        ]
    columns = ", ".join(sql.Identifier(c).as_string(None) for c in key)
    if joined:
        texts = ", ".join(sql.Identifier(c).as_string(None) + "::text" for c in key)
        columns = f"concat_ws(',', {texts})"
    text = f"({columns}) IN ({', '.join(rows)})"
    return text if len(text) <= REPAIR_TEXT else None


def _text(v: Any) -> str:
    from datetime import datetime

    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return "\\x" + v.hex()
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
    id and what it read, for the report. A Kafka sink's keys are message keys."""
    from walstream.backfill.requests import request
    from walstream.backfill.store import CANCELLED, DONE, FAILED, BackfillStore

    source = plan.source(sink.source)
    joined = sink_kind(sink) == "kafka"
    where = repair_where(source.dsn.get_secret_value(), key, keys, joined)
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
