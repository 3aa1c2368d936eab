"""The driver thread of `walstream run` that carries backfills out: plan chunks, read them.

It takes backfills of this config's sinks from the state database (`pending` ones
are checked and started: table, key, predicate, estimate; see `requests.py`), plans
key-range chunks a few at a time (`chunks.next_boundary`), and reads up to
`parallelism` chunks at once as the tasks of one Spark job (`read.read_chunk`:
watermarks, rows as Arrow, records built in Arrow, staged Parquet; for a lake sink
`arrow_read.read_typed_chunk`: rows as typed Arrow), planning the next chunks while they are read. One task
slot is left to the stream. The pipeline places each chunk where the stream reaches its
high watermark (`merge`). The chunk size moves toward `target_seconds` per chunk.

After a crash, chunks that were being read are read again under a new attempt
number; whichever attempt's high watermark the stream reaches first is emitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg

from walstream.backfill.arrow_read import select_list
from walstream.backfill.chunks import (
    KeyRange,
    chunk_query,
    estimate_rows,
    next_boundary,
)
from walstream.backfill.merge import Staging
from walstream.backfill.predicate import parse
from walstream.backfill.read import ChunkResult, ChunkTask
from walstream.backfill.requests import Prepared, check_sink, prepare_table
from walstream.backfill.store import PENDING, RUNNING, Backfill, BackfillStore
from walstream.backfill.typed import lake_shape, read_task
from walstream.config import Plan, SinkConfig, SourceConfig
from walstream.decode.types import TypeRegistry
from walstream.errors import Kind, WalstreamError, error_summary
from walstream.periodic import Periodic
from walstream.postgres.replication import connect
from walstream.values.columns import select_texts

log = logging.getLogger(__name__)

MIN_CHUNK, MAX_CHUNK = 500, 200_000
MAX_TYPED_CHUNK = 2_000_000  # typed chunks (lake sinks) are read at up to ~1M rows/s
MAX_FAILURES = 5
#: Seconds between steps of an idle coordinator; a new request wakes it at once.
IDLE = 0.5


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
            "walstream-backfill",
            self._step,
            IDLE,
            first=0.0,
            on_error=5.0,
            what="backfill (trying again in 5s)",
            cleanup=self._close_listener,
            logger=log,
        )
        #: The state database connection that hears new requests (`BackfillStore.listener`).
        self._listener: Any = None
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
            b.id
            for b in self.store.find(active_only=True)
            if b.sink in self.sinks and self.leads(b.source) and source in (None, b.source)
        ]
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
        if self.step():
            return 0.0
        # Idle: the next step comes when a backfill is requested (the store's NOTIFY), or
        # after IDLE seconds (a backfill's status changed otherwise, a notice was missed).
        try:
            if self._listener is None:
                self._listener = self.store.listener()
            self.store.requested(self._listener, IDLE)
        except Exception:
            self._close_listener()
            raise
        return 0.0

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _mine(self) -> list[Backfill]:
        return [
            b
            for b in self.store.find(active_only=True)
            if b.sink in self.sinks and self.leads(b.source)
        ]

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
        # While the chunks are read, the next ones are planned (an index scan of a chunk's
        # keys each), so the next read starts as soon as this one ends.
        reading = threading.Thread(target=self._read, args=(tasks,), name="walstream-backfill-read")
        reading.start()
        try:
            for b in self._mine():
                if b.status == RUNNING:
                    self._plan(b, self.parallelism)
        finally:
            reading.join()
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
        self.store.start(b.id, estimate, prepared.table.pk, prepared.table.oid)
        log.warning(
            "backfill %d: %s to sink %s, about %s rows%s",
            b.id,
            b.qualified,
            b.sink,
            f"{estimate:,}" if estimate is not None else "?",
            f" where {b.where}" if b.where else "",
        )

    def _prepare(self, b: Backfill) -> Prepared:
        found = self._prepared.get(b.id)
        if found is None:
            source = self.sources[b.source]
            with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
                found = prepare_table(
                    conn,
                    source.publication_name,
                    b.schema,
                    b.table,
                    parse(b.where) if b.where else None,
                )
                found = replace(found, shape=lake_shape(conn, self.sinks[b.sink], found.table))
            self._prepared[b.id] = found
        return found

    def _plan(self, b: Backfill, k: int) -> list[int]:
        """Up to `k` chunks of `b` planned and not read yet (planning more as needed)."""
        dsn = self.sources[b.source].dsn.get_secret_value()
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
        return planned

    def _next_tasks(self, b: Backfill, k: int) -> list[ChunkTask]:
        source = self.sources[b.source]
        dsn = source.dsn.get_secret_value()
        prepared = self._prepare(b)
        planned = self._plan(b, k)
        if not planned:
            return []
        attempts = self.store.reading(b.id, planned)
        chunks = {c.n: c for c in self.store.chunks(b.id)}
        staging = Staging(self.config.spark.checkpoint_dir, b.source)
        registry = TypeRegistry(prepared.types)
        codecs = [registry.codec(o) for o in prepared.type_oids]
        tasks = []
        with connect(dsn, autocommit=True) as conn, psycopg.ClientCursor(conn) as cur:
            for n, attempt in sorted(attempts.items()):
                c = chunks[n]
                shape = prepared.shape
                columns = (
                    select_list(shape)
                    if shape is not None
                    else select_texts(prepared.table.columns, codecs, prepared.type_oids)
                )
                query, params = chunk_query(
                    prepared.table, KeyRange(c.after, c.upto), prepared.where, columns
                )
                text = cur.mogrify(query, params)
                tasks.append(
                    ChunkTask(
                        dsn,
                        b.source,
                        b.id,
                        n,
                        attempt,
                        text,
                        tuple(prepared.table.columns),
                        prepared.type_oids,
                        prepared.key_idx,
                        prepared.types,
                        staging.chunk(b.id, n, attempt),
                        shape,
                        source.writes_dsn,
                    )
                )
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
                        id_,
                        self._failures[id_],
                        kind,
                        message,
                    )
            self.store.requeue_reading(ids)
            log.error("backfill: reading chunks failed (%s: %s); trying again", kind, message)
            self.stopping.wait(2.0)
            return
        for r in results:
            self._failures.pop(r.backfill, None)
            self.store.staged(r.backfill, r.n, r.attempt, r.rows, r.seconds)
        log.info(
            "backfill: read %d chunk(s), %d rows in %.2fs",
            len(results),
            sum(r.rows for r in results),
            time.monotonic() - t0,
        )
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
