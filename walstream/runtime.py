"""`walstream run`: config → SparkSession → one supervised streaming query per source.

A query that fails (a sink out of retries, a dropped connection) is restarted from
its checkpoint with backoff: Spark replays the unfinished batch, the delivery
ledger skips what was already delivered, nothing is confirmed to Postgres before
it is delivered. A configuration error stops everything instead.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from walstream.backfill.coordinator import Coordinator
from walstream.backfill.coordinator import request as request_backfill
from walstream.backfill.merge import BackfillMerge, Staging
from walstream.backfill.store import BackfillStore
from walstream.config import Config, SourceConfig
from walstream.delivery.ledger import Ledger
from walstream.delivery.parking import ParkingLot
from walstream.delivery.retrier import Retrier
from walstream.errors import ConfigError, SetupError, SinkError, WalstreamError
from walstream.events import Outbox, ensure_outbox
from walstream.leadership import Leadership
from walstream.postgres.prepare import prepare_capture
from walstream.secrets import scrub, scrubbed, secret_values
from walstream.server import Server
from walstream.server.metrics import Metrics
from walstream.server.monitor import Monitor
from walstream.sinks.postgres_targets import check_targets
from walstream.spark.checkpoint import remove_partial_writes
from walstream.spark.pipeline import Pipeline, SinkProgress, validate
from walstream.spark.session import build_spark
from walstream.streams.store import StreamStore

log = logging.getLogger(__name__)

_ERROR_LINE = re.compile(r"walstream\.errors\.(\w+): (.*)")


def database_name(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(dsn).get("dbname") or "")


def concise(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) of a query failure: our error if one is inside it."""
    text = str(exc)
    matches = _ERROR_LINE.findall(text)
    if matches:
        kind, message = matches[-1]
        fix = re.search(r"\n\s*fix: (.*)", text[text.rfind(message) :])
        return kind, message + (f" — fix: {fix.group(1)}" if fix else "")
    if isinstance(exc, WalstreamError):
        return type(exc).__name__, exc.problem + (f" — fix: {exc.fix}" if exc.fix else "")
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return type(exc).__name__, first.strip()[:500]


def _restart_delay(failures: int) -> float:
    """Seconds before restarting a query after its n-th failure in a row: 2, 4, ... 30."""
    return min(2.0 ** min(failures, 5), 30.0)


@dataclass
class SourceQuery:
    source: SourceConfig
    pipeline: Pipeline
    query: Any = None
    failures: int = 0
    restart_at: float = 0.0
    last_error: str | None = None  # "Kind: message" (may quote row values: token holders only)
    last_error_kind: str | None = None  # "Kind" alone: what /health shows to anyone
    started: threading.Event = field(default_factory=threading.Event)
    query_id: str = ""
    restarts: int = 0  # failures since start (`failures` counts those in a row)
    leader: bool = True  # False while another walstream holds the source (standby)
    # From the query's progress reports: changes read, batches, when the last one ran.
    ingested: int = 0
    batches: int = 0
    last_batch_at: float = 0.0
    seen_batch: int = -1
    lock: Leadership | None = None


class Runtime:
    """Runs the pipelines of a config until `stop()`; see the module docstring."""

    def __init__(self, config: Config, spark: Any | None = None) -> None:
        self.config = config
        self.spark = spark
        self.owns_spark = spark is None
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
        self._expired_at = 0.0
        self.streams: StreamStore | None = None  # pull subscriptions' messages
        self.secrets = secret_values(config)  # scrubbed from errors it shows
        self._streams_expired_at: dict[str, float] = {}

    # -- start --------------------------------------------------------------------------------
    def start(self) -> Runtime:
        cfg = self.config
        if cfg.events is not None:  # the outbox exists (and is published) before the slot
            source = cfg.source(cfg.events.source)
            ensure_outbox(source.dsn.get_secret_value(), cfg.state.schema_, source.publication_name)
            self.outbox = Outbox(source.dsn.get_secret_value(), cfg.state.schema_)
        # Slots first: every change committed after start() returns is kept for us.
        for source in cfg.sources:
            prepare_capture(
                source.dsn.get_secret_value(), source.slot_name, source.publication_name,
                source.tables, source.name,
            )  # fmt: skip
        check_targets(cfg)  # mirrors: no feedback loop, no two sources in one table
        ledger = Ledger(cfg.state_dsn, cfg.state.schema_)
        ledger.ensure()
        self.parking = parking = ParkingLot(cfg.state_dsn, cfg.state.schema_)
        parking.ensure()
        self.backfills = backfills = BackfillStore(cfg.state_dsn, cfg.state.schema_)
        backfills.ensure()
        if cfg.streams():
            self.streams = StreamStore(cfg.state_dsn, cfg.state.schema_)
            self.streams.ensure()
        self._backfills_on_create(backfills)
        if self.spark is None:
            self.spark = build_spark(cfg, quiet=not log.isEnabledFor(logging.DEBUG))
        import walstream

        walstream.register(self.spark)
        for sink in cfg.sinks:
            validate(self.spark, sink)
        parallelism = self.spark.sparkContext.defaultParallelism
        for source in cfg.sources:
            sq = SourceQuery(source, None)  # type: ignore[arg-type]
            sq.pipeline = Pipeline(
                source, cfg.sinks_of(source.name), ledger, parking,
                database_name(source.dsn.get_secret_value()), parallelism,
                query_id=functools.partial(self._wait_query_id, sq),
                backfills=BackfillMerge(
                    backfills, source.name, Staging(cfg.spark.checkpoint_dir, source.name)
                ),
                metrics=self.metrics,
            )  # fmt: skip
            self.queries.append(sq)
            sq.lock = Leadership(cfg.state_dsn, cfg.state.schema_, source.name)
            if sq.lock.try_acquire():
                self._start_query(sq)
            else:
                sq.leader = False
                log.warning(
                    "source %s: another walstream leads it (it holds the lock on %s); standing "
                    "by to take over", source.name, sq.lock.name,
                )  # fmt: skip
        self.retrier = Retrier(
            cfg.sinks, parking, on_delivered=self._retried, leads=self.leads
        ).start()
        self.coordinator = Coordinator(cfg, self.spark, backfills, leads=self.leads).start()
        if cfg.server.enabled:
            self.server = Server(self, self.monitor, self.metrics).start()
        return self

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
                "never lead it at once (standing by to take over again)", sq.source.name,
            )  # fmt: skip
            q, sq.query = sq.query, None
            if q is not None:
                try:
                    q.stop()
                except Exception as exc:
                    log.warning("source %s: stop: %s", sq.source.name, exc)
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
                        sink.name, b.id, b.qualified,
                    )  # fmt: skip

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

    def _start_query(self, sq: SourceQuery) -> None:
        s = sq.source
        sq.started.clear()
        remove_partial_writes(self.checkpoint(s))  # no query of ours uses it now
        reader = (
            self.spark.readStream.format("walstream")  # type: ignore[union-attr]
            .option("dsn", s.dsn.get_secret_value())
            .option("slot", s.slot_name)
            .option("publication", s.publication_name)
            .option("name", s.name)
            .option("maxChangesPerBatch", str(s.max_changes_per_batch))
            .option("partitionBytes", str(s.partition_bytes))
            .option("heartbeatInterval", str(s.heartbeat_interval))
        )
        if s.tables:
            reader = reader.option("tables", ",".join(s.tables))
        if self.config.state_dsn == s.dsn.get_secret_value():  # walstream's state is here
            reader = reader.option("internalSchema", self.config.state.schema_)
        interval = self.config.spark.trigger_interval
        sq.query = (
            reader.load()
            .writeStream.queryName(f"walstream_{s.name.replace('-', '_')}")
            .foreachBatch(sq.pipeline)
            .option("checkpointLocation", self.checkpoint(s))
            .trigger(processingTime=f"{interval:g} seconds")
            .start()
        )
        sq.query_id = str(sq.query.id)
        sq.started.set()
        log.info("source %s: streaming (slot %s, query %s)", s.name, s.slot_name, sq.query_id)

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
                kind, message = concise(exc) if exc is not None else ("stopped", "query stopped")
                if kind == ConfigError.__name__:
                    self.fatal = ConfigError(f"source {sq.source.name}: {message}")
                    self.stopping.set()
                    return
                sq.failures += 1
                sq.restarts += 1
                delay = _restart_delay(sq.failures)
                sq.last_error, sq.last_error_kind = self._scrub(f"{kind}: {message}"), kind
                sq.restart_at = now + delay
                log.error(
                    "source %s: %s; restarting in %.0fs (attempt %d). Nothing is lost: the "
                    "batch is replayed from the checkpoint.",
                    sq.source.name, sq.last_error, delay, sq.failures,
                )  # fmt: skip
                log.debug("source %s: the full failure:\n%s", sq.source.name, exc)
            elif now >= sq.restart_at and not self.stopping.is_set():
                try:
                    self._start_query(sq)
                except Exception as exc:  # the source fails at start: try again later
                    sq.failures += 1
                    sq.restart_at = now + _restart_delay(sq.failures)
                    kind, message = concise(exc)
                    sq.last_error, sq.last_error_kind = self._scrub(f"{kind}: {message}"), kind
                    log.error("source %s: cannot start: %s", sq.source.name, sq.last_error)

    def healthy_since_restart(self, sq: SourceQuery) -> None:
        if sq.failures and sq.query is not None and sq.query.lastProgress:
            sq.failures = 0

    def _expire_events(self, every: float = 600.0) -> None:
        """The leader of the events source deletes events past `events.retention`."""
        ev = self.config.events
        if ev is None or self.outbox is None or not self.leads(ev.source):
            return
        now = time.monotonic()
        if now - self._expired_at < every:
            return
        self._expired_at = now
        try:
            n = self.outbox.expire(ev.retention)
        except Exception as exc:  # the database is away: next time
            log.warning("events: cannot delete expired events: %s", exc)
            return
        if n:
            log.info("events: deleted %d event(s) older than the retention", n)

    def _expire_streams(self) -> None:
        """Delete stream messages past retention or max_bytes: done by a process that leads
        one of the stream's sources, every quarter of the retention (1 s to 30 s)."""
        if self.streams is None:
            return
        now = time.monotonic()
        for name, sinks in self.config.streams().items():
            dest = sinks[0].destination
            every = min(30.0, max(1.0, dest.retention / 4))  # type: ignore[union-attr]
            if now - self._streams_expired_at.get(name, 0.0) < every:
                continue
            if not any(self.leads(s.source) for s in sinks):
                continue
            self._streams_expired_at[name] = now
            try:
                n = self.streams.expire(name, dest.retention, dest.max_bytes)  # type: ignore[union-attr]
                kept, size, _ = self.streams.stats(name)
            except Exception as exc:  # the state database is away: next time
                log.warning("stream %s: cannot delete expired messages: %s", name, exc)
                continue
            self.metrics.stream_kept.labels(name).set(kept)
            self.metrics.stream_kept_bytes.labels(name).set(size)
            if n:
                log.info("stream %s: deleted %d message(s) past its retention", name, n)

    def _collect_progress(self, sq: SourceQuery) -> None:
        """Count the changes of batches the query reported since the last look (it keeps
        the last 100 reports, far more than a tick sees)."""
        q = sq.query
        if q is None:
            return
        try:
            reports = q.recentProgress
        except Exception:  # the query is going away: its next run reports again
            return
        for r in reports:
            batch = int(r.get("batchId", -1)) if isinstance(r, dict) else int(r.batchId)
            if batch <= sq.seen_batch:
                continue
            rows = r.get("numInputRows", 0) if isinstance(r, dict) else r.numInputRows
            sq.seen_batch = batch
            sq.ingested += int(rows or 0)
            sq.batches += 1
            sq.last_batch_at = time.time()

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
            for sq in self.queries:
                self.healthy_since_restart(sq)
                self._collect_progress(sq)
            self._update_rates()
            self._expire_events()
            self._expire_streams()
            if on_tick is not None:
                on_tick(self)
            (stop or self.stopping).wait(tick)

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
        if self.retrier is not None:
            self.retrier.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        for sq in self.queries:
            sq.pipeline.draining.set()
        deadline = time.monotonic() + grace
        for sq in self.queries:
            if sq.query is None or sq.pipeline.idle.is_set():
                continue
            log.info("source %s: finishing the batch in flight (Ctrl-C again to abandon it)",
                     sq.source.name)  # fmt: skip
            while not sq.pipeline.idle.wait(0.2):
                if self.abandon.is_set() or time.monotonic() > deadline:
                    log.warning(
                        "source %s: abandoning the batch in flight; the next start replays it",
                        sq.source.name,
                    )
                    break
        for sq in self.queries:
            if sq.query is not None:
                try:
                    sq.query.stop()
                except Exception as exc:  # stopping must go on for the other queries
                    log.warning("source %s: stop: %s", sq.source.name, exc)
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


def check_destinations(config: Config) -> list[tuple[str, SinkError | None]]:
    """`test_connection` of every sink: (sink name, the error or None)."""
    from walstream.sinks.registry import sink_for

    out: list[tuple[str, SinkError | None]] = []
    for sink in config.sinks:
        try:
            sink_for(sink.destination).test_connection()
            out.append((sink.name, None))
        except SinkError as exc:
            out.append((sink.name, scrubbed(exc, secret_values(sink))))
    return out
