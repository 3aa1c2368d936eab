"""The driver thread of `walstream run` that carries backfills out: plan chunks, read them.

It takes backfills of this config's sinks from the state database (`pending` ones
are checked and started: table, key, predicate, estimate), plans key-range chunks
a few at a time (`chunks.next_boundary`), and reads up to `parallelism` chunks at
once as the tasks of one Spark job (`read.read_chunk`: watermarks, COPY, staged
Parquet; for a lake sink `arrow_read.read_typed_chunk`: binary COPY into typed Arrow). The pipeline places each chunk where the stream reaches its high
watermark (`merge`). The chunk size moves toward `target_seconds` per chunk.

After a crash, chunks that were being read are read again under a new attempt
number; whichever attempt's high watermark the stream reaches first is emitted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from walstream.backfill.arrow_read import select_list
from walstream.backfill.merge import Staging
from walstream.backfill.read import ChunkResult, ChunkTask
from walstream.backfill.store import PENDING, RUNNING, Backfill, BackfillStore
from walstream.backfill.typed import lake_shape, read_task, reads_typed
from walstream.config import Plan, SinkConfig, SourceConfig
from walstream.errors import ConfigError, Kind, WalstreamError, error_summary
from walstream.periodic import Periodic
from walstream.postgres.catalog import load_metadata
from walstream.postgres.chunks import (
    KeyRange,
    Table,
    check_where,
    chunk_query,
    describe,
    estimate_rows,
    next_boundary,
)
from walstream.postgres.predicate import Predicate, parse
from walstream.postgres.replication import connect
from walstream.postgres.table_shape import TableShape

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 20_000
DEFAULT_TARGET_SECONDS = 2.0
MIN_CHUNK, MAX_CHUNK = 500, 200_000
#: Typed chunks (lake sinks) are read as Arrow at most of a million rows a second: bigger.
DEFAULT_TYPED_CHUNK_SIZE, MAX_TYPED_CHUNK = 250_000, 1_000_000
MAX_FAILURES = 5


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
    """The table's key, the columns pgoutput sends for it (no generated or dropped columns;
    the publication's column list) and their types, and the full predicate."""
    t = describe(conn, schema, table)
    check_where(conn, t, where)
    cols = conn.execute(
        "SELECT attname, atttypid::int8 FROM pg_attribute "
        "WHERE attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) "
        "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (schema, table),
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
        replace(t, columns=names), predicate, oids,
        tuple(names.index(k) for k in t.pk), types,
    )  # fmt: skip


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
            sink.name, source.name, schema, table, predicate.sql if predicate else None,
            chunk_size or (DEFAULT_TYPED_CHUNK_SIZE if reads_typed(sink) else DEFAULT_CHUNK_SIZE),
            DEFAULT_TARGET_SECONDS if target_seconds is None else target_seconds, estimate,
        )  # fmt: skip
        found = store.get(id_)
        assert found is not None
        created.append(found)
    return created


class Coordinator:
    """Plans and reads the chunks of this config's backfills (one thread in the driver)."""

    def __init__(
        self,
        config: Plan,
        spark: Any,
        store: BackfillStore,
        parallelism: int | None = None,
        leads: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        #: Whether this process leads a source (high availability): a standby reads nothing.
        self.leads = leads or (lambda source: True)
        self.spark = spark
        self.store = store
        self.sources: dict[str, SourceConfig] = {s.name: s for s in config.sources}
        self.sinks: dict[str, SinkConfig] = {s.name: s for s in config.sinks}
        # One task slot is left to the stream: it places chunks while others are read.
        self.parallelism = parallelism or max(1, spark.sparkContext.defaultParallelism - 1)
        # Steps back to back while there is work, every 0.5 s when there is none; 5 s
        # after a failure (the state database or a source is away).
        self.task = Periodic(
            "walstream-backfill", self._step, 0.5, first=0.0, on_error=5.0,
            what="backfill (trying again in 5s)", logger=log,
        )  # fmt: skip
        self.stopping = self.task.stopping
        self._prepared: dict[int, Prepared] = {}
        self._failures: dict[int, int] = {}
        self._group = f"walstream-backfill-{id(self)}"

    def start(self) -> Coordinator:
        self.take_over()
        self.task.start()
        return self

    def take_over(self, source: str | None = None) -> None:
        """Reads of chunks this process now leads that a stop (or a dead leader) cut short
        are read again. `source`: only its backfills (this process just became its leader)."""
        mine = [
            b.id for b in self.store.find(active_only=True)
            if b.sink in self.sinks and self.leads(b.source) and source in (None, b.source)
        ]  # fmt: skip
        again = self.store.requeue_reading(mine)
        if again:
            log.warning(
                "backfill: %d chunk read(s) interrupted by the last stop are read again", again
            )

    def stop(self) -> None:
        self.stopping.set()
        try:
            self.spark.sparkContext.cancelJobGroup(self._group)
        except Exception as exc:  # the context may be stopping already
            log.debug("backfill: cancel: %s", exc)
        self.task.stop(30)

    def _step(self) -> float | None:
        return 0.0 if self.step() else None

    def _mine(self) -> list[Backfill]:
        return [
            b for b in self.store.find(active_only=True)
            if b.sink in self.sinks and self.leads(b.source)
        ]  # fmt: skip

    def step(self) -> bool:
        """Start pending backfills, read the next chunks; False when there was nothing to read."""
        for b in self._mine():
            if b.status == PENDING:
                self._begin(b)
        tasks: list[ChunkTask] = []
        for b in self._mine():
            if b.status == RUNNING and len(tasks) < self.parallelism:
                tasks += self._next_tasks(b, self.parallelism - len(tasks))
        if not tasks:
            return False
        self._read(tasks)
        return True

    def _begin(self, b: Backfill) -> None:
        source = self.sources.get(b.source)
        if source is None:
            self.store.fail(b.id, f"source {b.source} is not in the config")
            return
        try:
            check_sink(self.sinks[b.sink], b.schema, b.table)
            prepared = self._prepare(b)
            with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
                estimate = estimate_rows(conn, prepared.table, prepared.where)
        except WalstreamError as exc:
            log.error("backfill %d of %s to sink %s: %s", b.id, b.qualified, b.sink, exc)
            self.store.fail(b.id, f"{exc.problem} — fix: {exc.fix}" if exc.fix else exc.problem)
            return
        self.store.start(b.id, estimate, prepared.table.pk)
        log.warning(
            "backfill %d: %s to sink %s, about %s rows%s",
            b.id, b.qualified, b.sink, f"{estimate:,}" if estimate is not None else "?",
            f" where {b.where}" if b.where else "",
        )  # fmt: skip

    def _prepare(self, b: Backfill) -> Prepared:
        found = self._prepared.get(b.id)
        if found is None:
            source = self.sources[b.source]
            with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
                found = prepare_table(
                    conn, source.publication_name, b.schema, b.table,
                    parse(b.where) if b.where else None,
                )  # fmt: skip
                found = replace(found, shape=lake_shape(conn, self.sinks[b.sink], found.table))
            self._prepared[b.id] = found
        return found

    def _next_tasks(self, b: Backfill, k: int) -> list[ChunkTask]:
        source = self.sources[b.source]
        dsn = source.dsn.get_secret_value()
        prepared = self._prepare(b)
        planned = [c.n for c in self.store.chunks(b.id, "planned")][:k]
        if len(planned) < k and not b.planned_all:
            last = self.store.last_chunk(b.id)
            after = last.upto if last is not None else None
            n = last.n + 1 if last is not None else 0
            if last is None or after is not None:
                with connect(dsn, autocommit=True) as conn:
                    while len(planned) < k:
                        upto = next_boundary(
                            conn, prepared.table, after, b.chunk_size, prepared.where
                        )
                        self.store.add_chunk(b.id, n, after, upto)
                        planned.append(n)
                        if upto is None:
                            break
                        after, n = upto, n + 1
        if not planned:
            return []
        attempts = self.store.reading(b.id, planned)
        chunks = {c.n: c for c in self.store.chunks(b.id)}
        staging = Staging(self.config.spark.checkpoint_dir, b.source)
        tasks = []
        with connect(dsn, autocommit=True) as conn, psycopg.ClientCursor(conn) as cur:
            for n, attempt in sorted(attempts.items()):
                c = chunks[n]
                shape = prepared.shape
                query, params = chunk_query(
                    prepared.table, KeyRange(c.after, c.upto), prepared.where,
                    select_list(shape) if shape is not None else None,
                )  # fmt: skip
                text = cur.mogrify(query, params)
                tasks.append(ChunkTask(
                    dsn, b.source, b.id, n, attempt, text, tuple(prepared.table.columns),
                    prepared.type_oids, prepared.key_idx, prepared.types,
                    staging.chunk(b.id, n, attempt), shape,
                ))  # fmt: skip
        return tasks

    def _read(self, tasks: list[ChunkTask]) -> None:
        sc = self.spark.sparkContext
        ids = sorted({t.backfill for t in tasks})
        sc.setJobGroup(self._group, f"walstream backfill {', '.join(map(str, ids))}", True)
        sc.setLocalProperty("spark.scheduler.pool", "walstream-backfill")  # FAIR mode only
        t0 = time.monotonic()
        try:
            results: list[ChunkResult] = sc.parallelize(tasks, len(tasks)).map(read_task).collect()
        except Exception as exc:
            if self.stopping.is_set():
                return

            kind, message, nature = error_summary(exc)
            # A read that cannot succeed as it is (a value its lake column cannot hold)
            # fails its backfill at once when the job read only that backfill's chunks.
            hopeless = nature is not Kind.TRANSIENT and len(ids) == 1
            for id_ in ids:
                self._failures[id_] = self._failures.get(id_, 0) + 1
                if hopeless or self._failures[id_] >= MAX_FAILURES:
                    self.store.fail(id_, f"{kind}: {message}")
                    log.error(
                        "backfill %d failed (%d tries), last: %s: %s",
                        id_, self._failures[id_], kind, message,
                    )  # fmt: skip
            self.store.requeue_reading(ids)
            log.error("backfill: reading chunks failed (%s: %s); trying again", kind, message)
            self.stopping.wait(2.0)
            return
        for r in results:
            self._failures.pop(r.backfill, None)
            self.store.staged(r.backfill, r.n, r.attempt, r.rows, r.seconds)
        log.info(
            "backfill: read %d chunk(s), %d rows in %.2fs",
            len(results), sum(r.rows for r in results), time.monotonic() - t0,
        )  # fmt: skip
        self._adapt(results)

    def _adapt(self, results: list[ChunkResult]) -> None:
        """Move each backfill's chunk size toward its target seconds per chunk."""
        for id_ in {r.backfill for r in results}:
            b = self.store.get(id_)
            if b is None or b.target_seconds <= 0:
                continue
            mine = [r for r in results if r.backfill == id_ and r.rows]
            if not mine:
                continue
            per_row = sum(r.seconds for r in mine) / sum(r.rows for r in mine)
            ideal = b.target_seconds / max(per_row, 1e-7)
            prepared = self._prepared.get(id_)
            most = MAX_TYPED_CHUNK if prepared is not None and prepared.shape else MAX_CHUNK
            size = int(min(max(ideal, b.chunk_size / 2, MIN_CHUNK), b.chunk_size * 2, most))
            if size != b.chunk_size:
                self.store.set_chunk_size(id_, size)
