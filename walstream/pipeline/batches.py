"""The foreachBatch of a source's query: for each sink select, filter, transform, route, deliver.

Per sink: tables/actions selection and the SQL filter, then the columns delivery
needs — `_group` (the group key), `_key` and `_route` (Kafka key and topic when they
are expressions), `_message` (a SQL transform or format). The query's streaming
DataFrame carries them from its start (`streamed.py`: Spark plans them with each
batch); a batch with backfill rows builds them per batch (`SinkSteps`). Then
`mapInArrow` delivers each partition on an executor in WAL order and returns its
counts. A batch in one partition is one stage with one task; a larger one is first
spread by group key (`repartition`, `sortWithinPartitions(lsn, seq)`). The batch is
done when every sink's job finished; only then does Spark write its commit log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from walstream.backfill.merge import BackfillMerge
from walstream.backoff import Backoff
from walstream.config import SinkConfig, SourceConfig, sink_snapshot
from walstream.delivery.deliver import DeliveryPlan, Stats
from walstream.delivery.ledger import Ledger
from walstream.delivery.parking import ParkingLot
from walstream.delivery.progress import SinkProgress
from walstream.delivery.route import Batch, Route, route
from walstream.engine.frames import empty_frame, planned_partitions
from walstream.errors import ConfigError
from walstream.formats import RECORD_FORMATS
from walstream.lake.contract import TableSink
from walstream.lake.sources import LakeSources
from walstream.lake.writer import Upkeep, write_or_pause, write_tables
from walstream.pipeline.expressions import projection
from walstream.pipeline.reads import (
    Direct,
    deliver_direct,
    grouped,
    plan_direct,
    tied_rows,
    with_reads,
)
from walstream.pipeline.steps import BatchPart, SinkSteps
from walstream.pipeline.streamed import StreamedSinks
from walstream.sinks.base import Kind, retry_timeout
from walstream.sinks.registry import capabilities, sink_for

log = logging.getLogger(__name__)
#: How often a batch held by a paused sink looks at the source's slot (`_check_slot`).
SLOT_CHECK_SECONDS = 10.0


def validate(spark: Any, sink: SinkConfig) -> None:
    """Analyze the sink's expressions against the change schema: a bad one is a ConfigError."""
    from pyspark.errors import AnalysisException, ParseException

    from walstream.change import spark_schema

    empty = empty_frame(spark, spark_schema())
    try:
        SinkSteps(spark, sink).prepare(empty).schema  # noqa: B018 - analysis happens here
    except (AnalysisException, ParseException) as exc:
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"sink {sink.name}: an expression is invalid: {reason}",
            "correct filter / transform / group_by / destination.topic / destination.key; "
            "they are Spark SQL over the change columns (source, lsn, seq, xid, committed_at, "
            "action, schema, table, pk, record, old, annotations)",
        ) from None


class Stopping(Exception):
    """A batch refused because walstream is stopping: it is replayed on the next start."""


@dataclass
class Pipeline:
    """The foreachBatch function of one source's query (driver side)."""

    source: SourceConfig
    sinks: list[SinkConfig]
    ledger: Ledger
    parking: ParkingLot
    db: str
    default_partitions: int
    query_id: Callable[[], str]
    progress: dict[str, SinkProgress] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Set by a graceful stop: batches not yet started are refused (they run on the next start).
    draining: threading.Event = field(default_factory=threading.Event)
    #: Set while no batch is being delivered.
    idle: threading.Event = field(default_factory=threading.Event)
    #: The last batch this pipeline delivered in full (-1: none yet). Spark records it in
    #: the checkpoint's commit log after the batch function returns: a stop waits for that.
    delivered_batch: int = -1
    #: Why batches wait now, per sink (paused, or too many parked messages).
    holding: dict[str, str] = field(default_factory=dict)
    #: Per sink: changes committed before this LSN are skipped (`walstream reset`).
    skips: dict[str, int] = field(default_factory=dict)
    #: Places backfill chunks where the stream reaches their high watermark.
    backfills: BackfillMerge | None = None
    #: Observes batch durations and latencies (walstream.server.metrics.Metrics).
    metrics: Any = None
    #: Lake sinks' `optimize.every`, between batches.
    upkeep: Upkeep = field(default_factory=Upkeep)
    #: Where executors write lake data files before the driver commits them (shared storage:
    #: under the checkpoint directory); None: lake rows are written from the driver.
    lake_stage: str | None = None
    #: The message sinks' columns on the streaming DataFrame (`stream`); None: each batch
    #: builds them (SinkSteps.prepare).
    streamed: StreamedSinks | None = None

    def __post_init__(self) -> None:
        self.idle.set()
        self._newest_us = 0  # the newest commit (µs) the current batch delivered
        # Stored with each dead letter; the config does not change while running.
        self.snapshots = {s.name: sink_snapshot(s) for s in self.sinks}
        self._built: dict[tuple[str, int | None, bool], SinkSteps] = {}
        self.parked: dict[str, int] = {}  # per sink, as the current batch started
        #: The lake sinks' source tables by OID: a renamed one pauses its sink (tables.py).
        self.lake_sources = LakeSources(self.parking.dsn, self.parking.schema)
        #: Each table sink, kept from batch to batch: what it holds between batches (a
        #: merge-on-read table's key index, its snapshot, its live files) is what makes
        #: a batch cost the batch and not the table.
        self._table_sinks: dict[str, TableSink] = {}

    def message_sinks(self) -> list[SinkConfig]:
        """The source's sinks that are not table sinks (their messages may be made in the
        streaming plan, and a batch's decoding overlaps their delivery)."""
        return [s for s in self.sinks if capabilities(s.destination).kind is not Kind.TABLES]

    def stream(self, df: Any) -> Any:
        """The query's streaming DataFrame `df` with its message sinks' columns (streamed.py)."""
        sinks = self.message_sinks()
        self.streamed = None
        if not sinks:
            return df
        streamed = StreamedSinks(df.sparkSession, sinks, self.db)
        df = streamed.add(df)
        self.streamed = streamed
        return df

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.draining.is_set():
            raise Stopping(f"walstream is stopping; batch {batch_id} runs on the next start")
        self.idle.clear()
        started, t0 = time.time(), time.monotonic()
        self._newest_us = 0
        try:
            self._hold(batch_id)
            query_id = self.query_id()
            running: dict[int, tuple[str, str, str]] = {}
            if self.backfills is not None:
                running = self.backfills.batch_started(query_id, batch_id)
            streamed = self.streamed if not running else None
            if running and self.streamed is not None:  # backfill rows join the change rows
                df = self.streamed.raw(df)
            cached = len(self.sinks) > 1 or bool(running)
            if cached:
                df = df.persist()
            try:
                reads: dict[str, Any] = {}
                empty = False  # the batch has watermarks only: no changes
                if running:
                    assert self.backfills is not None
                    reads = self.backfills.reads(df, batch_id, query_id, running)
                    empty = self.backfills.changes == 0
                for sink in self.sinks:
                    self._deliver(
                        df, sink, batch_id, query_id, reads.get(sink.name), empty, streamed
                    )
                if running:
                    assert self.backfills is not None
                    self.backfills.batch_delivered()
                self.delivered_batch = batch_id
            finally:
                if cached:
                    df.unpersist()
            if self.metrics is not None:
                self.metrics.batch(
                    self.source.name, started, time.monotonic() - t0, self._newest_us
                )
            log.debug(
                "batch %d of source %s: %.3fs%s",
                batch_id,
                self.source.name,
                time.monotonic() - t0,
                f" ({len(running)} backfill(s) running)" if running else "",
            )
        finally:
            self.idle.set()

    def _hold(self, batch_id: int) -> None:
        """Wait while a sink of this source is paused or full (max_parked, on_full: pause).

        The batch waits before anything is delivered, so nothing of it reaches any sink
        of this source and the slot stays where it is: the source's sinks share a slot.
        """
        said: dict[str, str] = {}
        checked = time.monotonic()
        while True:
            if time.monotonic() - checked >= SLOT_CHECK_SECONDS:
                self._check_slot()
                checked = time.monotonic()
            reasons = self.hold_reasons()
            with self.lock:
                self.holding = reasons
            if not reasons:
                if said:
                    log.warning("source %s: batch %d goes on", self.source.name, batch_id)
                return
            if reasons != said:
                others = [s.name for s in self.sinks if s.name not in reasons]
                log.warning(
                    "source %s: batch %d waits: %s%s",
                    self.source.name,
                    batch_id,
                    "; ".join(reasons.values()),
                    f" (and with it sink{'s' if len(others) > 1 else ''} {', '.join(others)}: "
                    "the sinks of a source share its slot)"
                    if others
                    else "",
                )
                said = reasons
            if self.draining.wait(1.0):
                raise Stopping(f"walstream is stopping; batch {batch_id} runs on the next start")

    def _check_slot(self) -> None:
        """SlotLost when Postgres invalidated (or someone dropped) the source's slot while a
        batch waits: nothing can be delivered from it any more, so the run stops instead of
        waiting for a resume."""
        from walstream.postgres.slots import check_slot_at

        check_slot_at(
            self.source.dsn.get_secret_value(),
            self.source.slot_name,
            self.source.name,
            None,
            dropped_while="while a batch waited for a paused sink",
        )

    def hold_reasons(self) -> dict[str, str]:
        paused, skips = self.parking.states()
        self.skips = skips
        counts = self.parking.parked_counts([s.name for s in self.sinks])
        self.parked = counts
        out = {}
        for sink in self.sinks:
            parked = counts.get(sink.name, 0)
            if sink.name in paused:
                why = f" ({paused[sink.name]})" if paused[sink.name] else ""
                out[sink.name] = f"sink {sink.name} is paused{why}; `walstream resume {sink.name}`"
            elif sink.on_full == "pause" and parked >= sink.max_parked:
                out[sink.name] = (
                    f"sink {sink.name} has {parked:,} parked messages (max_parked "
                    f"{sink.max_parked:,}); new batches wait until the retrier delivers some"
                )
        return out

    def _sink(self, sink: SinkConfig) -> Any:
        """The sink of `sink` for this batch: a table sink is kept from batch to batch (see
        `_table_sinks`), any other made anew."""
        with self.lock:
            kept = self._table_sinks.get(sink.name)
        if kept is not None:
            return kept
        made = sink_for(sink.destination)
        if isinstance(made, TableSink):
            with self.lock:
                made = self._table_sinks.setdefault(sink.name, made)
        return made

    def _deliver(
        self,
        df: Any,
        sink: SinkConfig,
        batch_id: int,
        query_id: str,
        reads: Any = None,
        empty: bool = False,
        streamed: StreamedSinks | None = None,
    ) -> None:
        """Deliver the batch to one sink; `reads`: backfill rows that join it there.
        `empty`: the batch is known to hold no changes. `streamed`: `df` carries the
        message sinks' columns (then `reads` is None)."""
        t0 = time.monotonic()
        driver_sink = self._sink(sink)
        caps = driver_sink.capabilities
        if caps.kind is Kind.TABLES:
            assert isinstance(driver_sink, TableSink)
            rows = df if streamed is None else streamed.raw(df)
            self._write_tables(rows, sink, driver_sink, batch_id, query_id, reads, empty)
            return
        if empty and reads is None:  # no job to run
            with self.lock:
                self.progress.setdefault(sink.name, SinkProgress()).batches += 1
            return
        skip = self.skips.get(sink.name)
        steps = self._steps(df.sparkSession, sink, driver_sink, skip, reads is not None)
        assert steps.plan is not None
        plan = replace(steps.plan, query_id=query_id, batch_id=batch_id)
        fresh = not caps.ledger or self.ledger.start_batch(sink.name, query_id, batch_id)
        unblocked = self.parked.get(sink.name, 0) == 0
        routes = route(
            caps,
            Batch(
                messages_made=steps.messages_made,
                tombstones=sink.tombstones,
                transform=plan.transform_function is not None,
                fresh=fresh,
                unblocked=unblocked,
                reads=reads is not None,
                plain=skip is None and sink.plain_messages(),
            ),
        )
        if streamed is not None:
            prepared = streamed.prepare(df, sink.name, skip)
        elif reads is not None:
            prepared = steps.prepare(df.selectExpr("*", "CAST(NULL AS BIGINT) AS backfill"))
        else:
            prepared = steps.prepare(df)
        spread = sink.partitions or self.default_partitions
        placed: tuple[Any, Direct | None, DeliveryPlan] | None
        if reads is None:
            placed = self._place_changes(prepared, steps, plan, spread)
        else:
            placed = self._place_reads(prepared, reads, steps, sink, plan, routes.reads, spread)
        if placed is None:  # no changes (a heartbeat-only batch): no job to run
            with self.lock:
                self.progress.setdefault(sink.name, SinkProgress()).batches += 1
            return
        job, direct, plan = placed
        driver_sink.prepare_batch(sink.name, batch_id, plan.partitions)
        steps.start(
            BatchPart(query_id, batch_id, plan.partitions, routes.changes, fresh, unblocked)
        )
        t_plan = time.monotonic() - t0
        stats = [] if job is None else [Stats(**r.asDict()) for r in job.collect()]
        if direct is not None:
            first = plan.partitions - len(direct.chunks)
            stats += deliver_direct(df.sparkSession, direct, plan, first)
            log.debug(
                "batch %d: sink %s: %d backfill chunk(s) delivered from their staged files",
                batch_id,
                sink.name,
                len(direct.chunks),
            )
        last = max(((s.last_lsn, s.last_seq) for s in stats if s.last_lsn >= 0), default=None)
        driver_sink.batch_delivered(sink.name, batch_id, last)
        self._delivered(sink.name, batch_id, stats, time.monotonic() - t0, t_plan)

    def _place_changes(
        self, prepared: Any, steps: SinkSteps, plan: DeliveryPlan, spread: int
    ) -> tuple[Any, None, DeliveryPlan] | None:
        """The job delivering a batch's changes, and the plan with its partition count;
        None when the batch has no changes for the sink.

        A batch in one source partition holds its changes in WAL order already: one
        task delivers them without a shuffle (the latency path). That job's plan says how
        many partitions the batch has; planning it pickles the batch's raw WAL, so when
        it is one, that plan is the one that runs."""
        job = steps.deliver(prepared)
        inputs = planned_partitions(job)
        if inputs == 0:
            return None
        if inputs > 1:  # spread by group key, each partition in WAL order
            return steps.deliver(grouped(prepared, spread)), None, replace(plan, partitions=spread)
        return job, None, plan

    def _place_reads(
        self,
        prepared: Any,
        reads: Any,
        steps: SinkSteps,
        sink: SinkConfig,
        plan: DeliveryPlan,
        reads_route: Route | None,
        spread: int,
    ) -> tuple[Any, Direct | None, DeliveryPlan]:
        """The job delivering a batch's changes with its backfill read rows (None: none
        goes through Spark), the chunks delivered from their staged files, and the plan
        with the partition count: the Spark job's partitions, then one per direct chunk."""
        read_rows = steps.prepare(reads.rows)
        direct = None
        if reads_route is Route.STAGED_CHUNKS:
            direct = plan_direct(reads, sink, plan, self.source.name, prepared)
        if direct is None:
            placed = with_reads(prepared, read_rows, sink, spread)
        elif direct.tied:  # free read rows go straight from their files; tied ones with
            placed = grouped(prepared.unionByName(tied_rows(read_rows, prepared)), spread)
        else:  # the batch has no changes for this sink: no Spark job
            placed = None
        first = 0 if placed is None else planned_partitions(placed)
        plan = replace(plan, partitions=first + (len(direct.chunks) if direct else 0))
        return None if placed is None else steps.deliver(placed), direct, plan

    def _delivered(
        self, sink: str, batch_id: int, stats: list[Stats], took: float, planning: float
    ) -> None:
        """Count what the batch's tasks delivered to `sink` (progress, metrics, the log)."""
        newest = max((s.max_committed_us for s in stats if s.delivered), default=0)
        with self.lock:
            self.progress.setdefault(sink, SinkProgress()).add_batch(
                sum(s.delivered for s in stats),
                newest,
                skipped=sum(s.skipped for s in stats),
                parked=sum(s.parked for s in stats),
                dead=sum(s.dead for s in stats),
                discarded=sum(s.discarded for s in stats),
                latest_us=max((s.max_committed_us for s in stats), default=0),
            )
        self._newest_us = max(self._newest_us, newest)
        if self.metrics is not None:
            self.metrics.delivered(sink, newest)
        log.debug(
            "batch %d: sink %s delivered %d, skipped %d, in %.3fs (planning %.3fs) over %d partitions",
            batch_id,
            sink,
            sum(s.delivered for s in stats),
            sum(s.skipped for s in stats),
            took,
            planning,
            len(stats),
        )

    def _steps(
        self, spark: Any, sink: SinkConfig, driver_sink: Any, skip: int | None, backfill: bool
    ) -> SinkSteps:
        """The sink's steps (built at its first batch, again after `walstream reset`)."""
        key = (sink.name, skip, backfill)
        steps = self._built.get(key)
        if steps is None:
            plan = DeliveryPlan(
                sink=sink.name,
                destination=sink.destination,
                format=sink.destination.message_format() or sink.format,
                db=self.db,
                batch_size=sink.batch_size,
                retry_timeout=retry_timeout(sink.destination),
                ledger=self.ledger,
                query_id="",  # per batch: BatchPart
                batch_id=-1,
                partitions=1,
                transform_function=sink.transform if isinstance(sink.transform, str) else None,
                tombstones=sink.tombstones,
                parking=self.parking if driver_sink.capabilities.ledger else None,
                max_attempts=sink.max_attempts,
                backoff=Backoff(sink.backoff.initial, sink.backoff.max),
                max_parked=sink.max_parked,
                on_full=sink.on_full,
                sink_config=self.snapshots[sink.name],
            )
            p = projection(sink, skip, backfill, self.db)
            plan = replace(plan, worker_format=p.worker_format)
            if plan.format in RECORD_FORMATS:  # debezium: records made by the task
                plan = replace(plan, debezium=sink.debezium_settings(), source_dsn=self.source.dsn)
            steps = SinkSteps(spark, sink, skip, backfill, self.db, plan)
            self._built = {
                k: v for k, v in self._built.items() if k[0] != sink.name or k[1] == skip
            }
            self._built[key] = steps
        return steps

    def _write_tables(
        self,
        df: Any,
        sink: SinkConfig,
        table_sink: TableSink,
        batch_id: int,
        query_id: str,
        reads: Any,
        empty: bool = False,
    ) -> None:
        """A lake sink: each table's changes of the batch in one commit (lake/writer.py)."""
        t0 = time.monotonic()
        out = write_or_pause(
            lambda: write_tables(
                df,
                sink,
                table_sink,
                query_id,
                batch_id,
                self.skips.get(sink.name),
                reads,
                self.source.publication_name,
                empty,
                self.lake_stage,
                self.lake_sources,
            ),
            sink.name,
            self.parking,
            lambda: self._hold(batch_id),
        )
        self.upkeep.after_batch(sink.name, table_sink, out)
        with self.lock:
            p = self.progress.setdefault(sink.name, SinkProgress())
            p.add_batch(out.changes, out.max_committed_us, skipped=out.skipped)
        self._newest_us = max(self._newest_us, out.max_committed_us)
        if self.metrics is not None:
            self.metrics.delivered(sink.name, out.max_committed_us)
        log.debug(
            "batch %d: sink %s wrote %d changes as %d rows into %d tables (%d replayed) in %.3fs",
            batch_id,
            sink.name,
            out.changes,
            out.rows,
            out.tables,
            out.replayed,
            time.monotonic() - t0,
        )
