"""`walstream run`: config → SparkSession → one supervised streaming query per source.

A query that fails (a sink out of retries, a dropped connection) is restarted from
its checkpoint with backoff: Spark replays the unfinished batch, the delivery
ledger skips what was already delivered, nothing is confirmed to Postgres before
it is delivered. A configuration error stops everything instead.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from walstream.backfill.coordinator import Coordinator
from walstream.backfill.merge import BackfillMerge, Staging
from walstream.backfill.requests import request as request_backfill
from walstream.backfill.store import BackfillStore
from walstream.backfill.typed import reads_typed
from walstream.backoff import QUERY_RESTART
from walstream.config import Plan, SourceConfig
from walstream.delivery.ledger import Ledger
from walstream.delivery.parking import ParkingLot
from walstream.delivery.progress import SinkProgress
from walstream.delivery.retrier import Retrier
from walstream.engine.planners import release_after_planning
from walstream.engine.session import start_spark
from walstream.errors import ConfigError, ErrorSummary, Kind, SetupError, error_summary
from walstream.periodic import Periodic
from walstream.pipeline.batches import Pipeline, validate
from walstream.postgres.prepare import prepare_capture
from walstream.runtime.query import (
    SourceQuery,
    collect_progress,
    database_name,
    finish_batch,
    start_query,
    stop_query,
)
from walstream.runtime.retention import retention_tasks
from walstream.runtime.verifying import Schedule
from walstream.secrets import scrub, secret_values
from walstream.server import Server
from walstream.server.metrics import Metrics
from walstream.server.monitor import Monitor
from walstream.server.status import SourceStatus
from walstream.sinks.registry import preflight
from walstream.source.checkpoint import check_staging, committed_lsn, is_remote
from walstream.source.datasource import register as register_source
from walstream.state.leadership import Leadership
from walstream.state.outbox import Outbox, ensure_outbox
from walstream.streams.store import StreamStore
from walstream.verify.sinks import sink_kind
from walstream.verify.store import VerificationStore

log = logging.getLogger("walstream.runtime")  # the name operators know


class Runtime:
    """Runs the pipelines of a config until `stop()`; see the module docstring."""

    def __init__(
        self,
        config: Plan,
        spark: Any | None = None,
        until_caught_up: bool = False,
        say: Any = None,
    ) -> None:
        self.config = config
        #: Tells what start() is doing and waiting for (`walstream run` prints it).
        self.say = say or (lambda text: log.info("%s", text))
        self.spark = spark
        #: Each query reads what its slot has when it starts (Trigger.AvailableNow), then
        #: ends; `run` returns once every source is caught up.
        self.until_caught_up = until_caught_up
        self.owns_spark = spark is None
        #: End Spark's planning processes once the queries run (engine/planners.py): only
        #: in a session of its own, where no one else plans; `planning`: a query started since
        self.end_planners, self.planning = self.owns_spark, True
        self.stopping = threading.Event()
        self.abandon = threading.Event()  # stop now, even with a batch in flight
        self.queries: list[SourceQuery] = []
        self.fatal: BaseException | None = None
        self.rates: dict[str, float] = {}  # delivered per second, per sink
        self._rate_base: tuple[float, dict[str, int]] = (time.monotonic(), {})
        self.parking: ParkingLot | None = None
        self.retrier: Retrier | None = None
        self.backfills: BackfillStore | None = None
        self.coordinator: Coordinator | None = None
        self.metrics = Metrics()
        self.monitor = Monitor(self)
        self.metrics.bind(self.monitor)
        self.server: Server | None = None
        self.outbox: Outbox | None = None
        self.streams: StreamStore | None = None  # pull subscriptions' messages
        self.verifications: VerificationStore | None = None  # the last result of each sink
        self.secrets = secret_values(config)  # scrubbed from errors it shows
        self.housekeeping: list[Periodic] = []  # retention of events and stream messages

    # -- start --------------------------------------------------------------------------------
    def start(self) -> Runtime:
        cfg = self.config
        if cfg.events is not None:  # the outbox exists (and is published) before the slot
            source = cfg.source(cfg.events.source)
            ensure_outbox(source.writes_dsn, cfg.state.schema_, source.publication_name)
            self.outbox = Outbox(source.writes_dsn, cfg.state.schema_)
        # The leader locks first: a standby finds the slot in use by the leader, and
        # that is no reason to stop. Then the slots: every change committed after
        # start() returns is kept for us.
        locks = {s.name: Leadership(cfg.state_dsn, cfg.state.schema_, s.name) for s in cfg.sources}
        for lock in locks.values():
            lock.try_acquire()
        if self.spark is None and any(is_remote(self.checkpoint(s)) for s in cfg.sources):
            # first: its Hadoop file system reads where those checkpoints resume
            self.spark = start_spark(cfg, self.say, quiet=not log.isEnabledFor(logging.DEBUG))
        for source in cfg.sources:
            self.say(
                f"source {source.name}: checking its slot {source.slot_name} and "
                f"publication {source.publication_name}"
            )
            prepare_capture(
                source.dsn.get_secret_value(),
                source.slot_name,
                source.publication_name,
                source.tables,
                source.name,
                standby=not locks[source.name].held,
                resume_from=committed_lsn(self.checkpoint(source), self.spark),
                primary=source.primary,
                options=source.publication_options,
            )
        if is_remote(cfg.spark.checkpoint_dir):
            check_staging(cfg.spark.checkpoint_dir)  # else every batch would fail on it
        preflight(cfg)  # each sink type's checks (mirrors: no feedback loop, no mixed tables)
        for sink in cfg.sinks:
            if sink.verify is not None:
                sink_kind(sink)  # `verify:` on a sink that cannot be verified says why
        ledger = Ledger(cfg.state_dsn, cfg.state.schema_)
        ledger.ensure()
        self.parking = parking = ParkingLot(cfg.state_dsn, cfg.state.schema_)
        parking.ensure()
        self.backfills = backfills = BackfillStore(cfg.state_dsn, cfg.state.schema_)
        backfills.ensure()
        if cfg.streams():
            self.streams = StreamStore(cfg.state_dsn, cfg.state.schema_)
            self.streams.ensure()
        self.verifications = VerificationStore(cfg.state_dsn, cfg.state.schema_)
        self.verifications.ensure()
        self._backfills_on_create(backfills)
        if self.spark is None:
            self.spark = start_spark(cfg, self.say, quiet=not log.isEnabledFor(logging.DEBUG))
        # The sinks' SQL is checked beside registering the source (both wait on the JVM
        # and on Python processes); an invalid expression still stops the start here.
        with ThreadPoolExecutor(1, thread_name_prefix="walstream-validate") as pool:
            checked = pool.map(functools.partial(validate, self.spark), cfg.sinks)
            register_source(self.spark)
            list(checked)
        self._start_queries(ledger, parking, backfills, locks)
        self.retrier = Retrier(
            cfg.sinks, parking, on_delivered=self._retried, leads=self.leads
        ).start()
        self.coordinator = Coordinator(cfg, self.spark, backfills, leads=self.leads).start()
        tasks = retention_tasks(self.config, self.outbox, self.streams, self.leads, self.metrics)
        if any(s.verify is not None for s in cfg.sinks) and not self.until_caught_up:
            tasks.append(Schedule(cfg, self.leads).task)
        self.housekeeping = [t.start() for t in tasks]
        if cfg.server.enabled:
            self.server = Server(self, self.monitor, self.metrics).start()
        return self

    def _start_queries(
        self,
        ledger: Ledger,
        parking: ParkingLot,
        backfills: BackfillStore,
        locks: dict[str, Leadership],
    ) -> None:
        """Each source's pipeline, and its query where this process leads the source."""
        cfg = self.config
        assert self.spark is not None
        parallelism = self.spark.sparkContext.defaultParallelism
        for source in cfg.sources:
            sq = SourceQuery(source, None)  # type: ignore[arg-type]
            sq.pipeline = Pipeline(
                source,
                cfg.sinks_of(source.name),
                ledger,
                parking,
                database_name(source.dsn.get_secret_value()),
                parallelism,
                query_id=functools.partial(self._wait_query_id, sq),
                backfills=BackfillMerge(
                    backfills,
                    source.name,
                    Staging(cfg.spark.checkpoint_dir, source.name),
                    typed={s.name for s in cfg.sinks_of(source.name) if reads_typed(s)},
                ),
                metrics=self.metrics,
                lake_stage=f"{cfg.spark.checkpoint_dir.rstrip('/')}/_lake/{source.name}",
            )
            self.queries.append(sq)
            sq.lock = locks[source.name]
            if sq.lock.held:
                start_query(
                    self.spark, self.config, sq, self.checkpoint(sq.source), self.until_caught_up
                )
                self.say(
                    f"source {source.name}: streaming from slot {source.slot_name}; "
                    "the first batch waits for its first changes"
                )
            else:
                sq.leader = False
                log.warning(
                    "source %s: another walstream leads it (it holds the lock on %s); standing "
                    "by to take over",
                    source.name,
                    sq.lock.name,
                )

    def _scrub(self, text: str) -> str:
        """`text` without any secret of the config (errors are shown by the API)."""
        return scrub(text, self.secrets)

    def leads(self, source: str) -> bool:
        """Whether this process leads `source` now (streams it, retries, backfills)."""
        return any(sq.leader for sq in self.queries if sq.source.name == source)

    def _check_leadership(self, sq: SourceQuery) -> None:
        """A leader that lost its lock stops at once; a standby takes a free lock over."""
        if sq.lock is None:
            return
        if sq.leader:
            if sq.lock.holds():
                return
            sq.leader = False
            log.error(
                "source %s: lost the leader lock; stopping its query so that two walstreams "
                "never lead it at once (standing by to take over again)",
                sq.source.name,
            )
            q, sq.query = sq.query, None
            if q is not None:
                stop_query(sq.source.name, q)
        elif sq.lock.try_acquire():
            sq.leader = True
            sq.failures = 0
            sq.restart_at = 0.0  # poll() starts the query now (and retries it if that fails)
            log.warning("source %s: this walstream leads it now; starting", sq.source.name)
            sq.pipeline.draining.clear()
            if self.coordinator is not None:
                try:
                    self.coordinator.take_over(sq.source.name)
                except Exception as exc:  # the state database is away: reads resume later
                    log.warning("source %s: backfill take-over: %s", sq.source.name, exc)

    def _backfills_on_create(self, store: BackfillStore) -> None:
        """`backfill: on_create`: a sink that never had a backfill gets one of its tables."""
        for sink in self.config.sinks:
            if sink.backfill == "on_create" and not store.has_any(sink.name):
                for b in request_backfill(self.config, store, sink.name):
                    log.warning(
                        "sink %s is new: backfill %d of %s (backfill: on_create)",
                        sink.name,
                        b.id,
                        b.qualified,
                    )

    def _retried(self, sink: str, n: int) -> None:
        for sq in self.queries:
            if any(s.name == sink for s in sq.pipeline.sinks):
                with sq.pipeline.lock:
                    sq.pipeline.progress.setdefault(sink, SinkProgress()).retried += n

    def _wait_query_id(self, sq: SourceQuery) -> str:
        if not sq.started.wait(120):
            raise SetupError("the streaming query did not report its id", "restart walstream")
        return sq.query_id

    def checkpoint(self, source: SourceConfig) -> str:
        return f"{self.config.spark.checkpoint_dir.rstrip('/')}/{source.name}"

    # -- supervise ----------------------------------------------------------------------------
    def poll(self) -> None:
        """Restart failed queries with backoff; a configuration error stops everything."""
        if self.stopping.is_set():
            return
        now = time.monotonic()
        for sq in self.queries:
            self._check_leadership(sq)
            if not sq.leader:
                continue
            q = sq.query
            if q is not None and q.isActive:
                continue
            if q is not None:
                exc = q.exception()
                sq.query = None
                if exc is None and self.stopping.is_set():
                    continue
                if exc is None and self.until_caught_up:
                    sq.caught_up = True
                    log.info("source %s: caught up; its query ended", sq.source.name)
                    continue
                summary = (
                    error_summary(exc)
                    if exc is not None
                    else ErrorSummary("stopped", "query stopped", Kind.TRANSIENT)
                )
                kind, message = summary.name, summary.message
                if summary.kind is Kind.CONFIG:  # a restart cannot help: stop
                    self.fatal = ConfigError(f"source {sq.source.name}: {message}")
                    self.stopping.set()
                    return
                sq.failures += 1
                sq.restarts += 1
                delay = QUERY_RESTART.delay(sq.failures)
                sq.last_error, sq.last_error_kind = self._scrub(f"{kind}: {message}"), kind
                sq.restart_at = now + delay
                log.error(
                    "source %s: %s; restarting in %.0fs (attempt %d). Nothing is lost: the "
                    "batch is replayed from the checkpoint.",
                    sq.source.name,
                    sq.last_error,
                    delay,
                    sq.failures,
                )
                log.debug("source %s: the full failure:\n%s", sq.source.name, exc)
            elif now >= sq.restart_at and not self.stopping.is_set() and not sq.caught_up:
                try:
                    start_query(
                        self.spark,
                        self.config,
                        sq,
                        self.checkpoint(sq.source),
                        self.until_caught_up,
                    )
                    self.planning = True
                except Exception as exc:  # the source fails at start: try again later
                    sq.failures += 1
                    sq.restart_at = now + QUERY_RESTART.delay(sq.failures)
                    kind, message, _ = error_summary(exc)
                    sq.last_error, sq.last_error_kind = self._scrub(f"{kind}: {message}"), kind
                    log.error("source %s: cannot start: %s", sq.source.name, sq.last_error)

    def healthy_since_restart(self, sq: SourceQuery) -> None:
        if sq.failures and sq.query is not None and sq.query.lastProgress:
            sq.failures = 0

    def sources(self) -> list[SourceStatus]:
        """Each source's status, published for the server (see `server/status.py`)."""
        out = []
        for sq in self.queries:
            q = sq.query
            out.append(
                SourceStatus(
                    name=sq.source.name,
                    slot=sq.source.slot_name,
                    dsn=sq.source.dsn.get_secret_value(),
                    leader=sq.leader,
                    streaming=q is not None and bool(q.isActive),
                    failures=sq.failures,
                    restarts=sq.restarts,
                    last_error=sq.last_error,
                    last_error_kind=sq.last_error_kind,
                    failed=q is None,
                    ingested=sq.ingested,
                    batches=sq.batches,
                    last_batch_at=sq.last_batch_at,
                    holding=dict(sq.pipeline.holding),
                )
            )
        return out

    def progress(self) -> dict[str, SinkProgress]:
        out: dict[str, SinkProgress] = {}
        for sq in self.queries:
            with sq.pipeline.lock:
                out.update({k: SinkProgress(**vars(v)) for k, v in sq.pipeline.progress.items()})
        return out

    def _update_rates(self) -> None:
        now = time.monotonic()
        t0, base = self._rate_base
        if now - t0 < 2.0:
            return
        counts = {k: v.delivered for k, v in self.progress().items()}
        self.rates = {k: (n - base.get(k, 0)) / (now - t0) for k, n in counts.items()}
        self._rate_base = (now, counts)

    def supervise(
        self,
        until: float | None = None,
        on_tick: Any = None,
        tick: float = 1.0,
        stop: threading.Event | None = None,
    ) -> None:
        """Restart failed queries and update rates until `stopping`, `stop` or `until`."""
        while not self.stopping.is_set() and not (stop is not None and stop.is_set()):
            if until is not None and time.monotonic() >= until:
                break
            self.poll()
            if self.fatal is not None:
                return
            if self.planning and self.end_planners:
                self.planning = not release_after_planning(self.spark, self.queries)
            if self.caught_up:
                break
            for sq in self.queries:
                self.healthy_since_restart(sq)
                collect_progress(sq)
            self._update_rates()
            if on_tick is not None:
                on_tick(self)
            (stop or self.stopping).wait(tick)

    @property
    def caught_up(self) -> bool:
        """`until_caught_up`: every source this walstream leads read its slot to the end."""
        leading = [sq for sq in self.queries if sq.leader]
        return self.until_caught_up and bool(leading) and all(sq.caught_up for sq in leading)

    def run(self, until: float | None = None, on_tick: Any = None, tick: float = 1.0) -> None:
        """Supervise until stopped (or `until`, a monotonic deadline); raise a fatal error."""
        self.supervise(until, on_tick, tick)
        self.stop()
        if self.fatal is not None:
            raise self.fatal

    def stop(self, grace: float = 30.0) -> None:
        """Stop the queries: a batch in flight gets `grace` seconds to finish (or until
        `abandon` is set); then it is abandoned, to be replayed on the next start."""
        self.stopping.set()
        for task in self.housekeeping:
            task.stop()
        if self.retrier is not None:
            self.retrier.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        for sq in self.queries:
            sq.pipeline.draining.set()
        deadline = time.monotonic() + grace
        for sq in self.queries:
            finish_batch(sq, deadline, self.abandon)
        for sq in self.queries:
            if sq.query is not None:
                stop_query(sq.source.name, sq.query)
                sq.query = None
        if self.owns_spark and self.spark is not None:
            self.spark.stop()
            self.spark = None
        for sq in self.queries:
            if sq.lock is not None:
                sq.lock.release()
        if self.server is not None:
            self.server.stop()
            self.server = None
