"""Prometheus metrics of `walstream run` (served at `/metrics`).

Counters and gauges are read from the running pipelines and the Monitor's snapshot
when Prometheus scrapes; the latency and batch-duration histograms are observed by
the pipelines as batches finish. Each Runtime has its own registry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from walstream.server.monitor import Monitor, Snapshot

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
STATUS_VALUES = ("ok", "warning", "error", "paused", "standby")


class Metrics:
    """The histograms pipelines observe, and the registry `/metrics` renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.batch_duration = Histogram(
            "walstream_batch_duration_seconds",
            "Wall time of a micro-batch in foreachBatch, every sink of the source included.",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ingestion_latency = Histogram(
            "walstream_ingestion_latency_seconds",
            "From the commit of a batch's newest change in Postgres to the start of the batch "
            "that carries it.",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "walstream_delivery_latency_seconds",
            "From the commit of a batch's newest change in Postgres to its delivery to the sink.",
            ["sink"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stream_gaps = Counter(
            "walstream_stream_gaps",
            "Reads of a stream refused with 410: the consumer's position was deleted by "
            "retention (or is past what the stream holds); it has a gap and must rebuild.",
            ["stream"],
            registry=self.registry,
        )
        self.stream_served = Counter(
            "walstream_stream_messages_served",
            "Messages (coalesced entries count once) pull consumers received.",
            ["stream"],
            registry=self.registry,
        )
        self.stream_kept = Gauge(
            "walstream_stream_kept_messages",
            "Messages a stream keeps for its consumers (as of the last retention pass).",
            ["stream"],
            registry=self.registry,
        )
        self.stream_kept_bytes = Gauge(
            "walstream_stream_kept_bytes",
            "Bytes of the messages a stream keeps (as of the last retention pass).",
            ["stream"],
            registry=self.registry,
        )
        self._lock = threading.Lock()

    def bind(self, monitor: Monitor) -> Metrics:
        self.registry.register(_Collector(monitor))
        return self

    def batch(self, source: str, started: float, seconds: float, newest_commit_us: int) -> None:
        """A batch of `source` finished: it started at `started` (epoch seconds)."""
        self.batch_duration.labels(source).observe(seconds)
        if newest_commit_us > 0:
            self.ingestion_latency.labels(source).observe(
                max(0.0, started - newest_commit_us / 1e6)
            )

    def delivered(self, sink: str, newest_commit_us: int) -> None:
        if newest_commit_us > 0:
            self.delivery_latency.labels(sink).observe(
                max(0.0, time.time() - newest_commit_us / 1e6)
            )

    def render(self) -> bytes:
        with self._lock:  # one scrape at a time: each reads the databases
            return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only (no database reads at registration)

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.snapshot()
        yield from self._sources(snap)
        yield from self._sinks(snap)

    def _sources(self, snap: Snapshot) -> Iterator[Metric]:
        rt = self.monitor.control
        restarts_of = {s.name: s.restarts for s in rt.sources()}

        ingested = CounterMetricFamily(
            "walstream_changes_ingested",
            "Changes read from the source into batches.",
            labels=["source"],
        )
        restarts = CounterMetricFamily(
            "walstream_query_restarts",
            "Failures of a source's streaming query (each is restarted).",
            labels=["source"],
        )
        lag = GaugeMetricFamily(
            "walstream_replication_lag_bytes",
            "WAL bytes between the server's current position and what the slot confirmed.",
            labels=["source"],
        )
        retained = GaugeMetricFamily(
            "walstream_slot_retained_wal_bytes",
            "WAL bytes the server keeps for the slot (from its restart_lsn).",
            labels=["source"],
        )
        safe = GaugeMetricFamily(
            "walstream_slot_safe_wal_bytes",
            "WAL bytes the slot may still hold back before PostgreSQL invalidates it "
            "(max_slot_wal_keep_size; absent when there is no limit).",
            labels=["source"],
        )
        up = GaugeMetricFamily(
            "walstream_source_status",
            "1 for the source's current status.",
            labels=["source", "status"],
        )
        for s in snap.sources:
            ingested.add_metric([s["name"]], s["ingested"])
            restarts.add_metric([s["name"]], restarts_of.get(s["name"], 0))
            if s["lag_bytes"] is not None:
                lag.add_metric([s["name"]], s["lag_bytes"])
            if s["retained_wal_bytes"] is not None:
                retained.add_metric([s["name"]], s["retained_wal_bytes"])
            if s.get("safe_wal_bytes") is not None:
                safe.add_metric([s["name"]], s["safe_wal_bytes"])
            for v in STATUS_VALUES:
                up.add_metric([s["name"], v], 1.0 if s["status"] == v else 0.0)
        yield from (ingested, restarts, lag, retained, safe, up)

    def _sinks(self, snap: Snapshot) -> Iterator[Metric]:
        rt = self.monitor.control
        delivered = CounterMetricFamily(
            "walstream_messages_delivered",
            "Messages the sink accepted (retried ones included).",
            labels=["sink"],
        )
        failures = CounterMetricFamily(
            "walstream_delivery_failures",
            "Messages a sink did not take: parked (for a retry), dead (refused for good), "
            "discarded (past max_parked with on_full: discard).",
            labels=["sink", "kind"],
        )
        parked = GaugeMetricFamily(
            "walstream_parked_messages", "Messages waiting for a retry.", labels=["sink"]
        )
        dead = GaugeMetricFamily(
            "walstream_dead_letters", "Dead letters kept for the operator.", labels=["sink"]
        )
        sink_up = GaugeMetricFamily(
            "walstream_sink_status", "1 for the sink's current status.", labels=["sink", "status"]
        )
        different = GaugeMetricFamily(
            "walstream_verify_rows_different",
            "Rows the sink's newest complete verification found missing, only in the sink or "
            "different from the source (0: equal; absent: never verified).",
            labels=["sink"],
        )
        verified = GaugeMetricFamily(
            "walstream_verify_last_success_timestamp",
            "When (Unix seconds) the sink's newest verification that compared every table "
            "ended, equal or not (absent: never verified).",
            labels=["sink"],
        )
        progress = rt.progress()
        for k in snap.sinks:
            p = progress.get(k["name"])
            delivered.add_metric([k["name"]], k["delivered"])
            for kind, n in (
                ("parked", p.parked if p else 0),
                ("dead", p.dead if p else 0),
                ("discarded", p.discarded if p else 0),
            ):
                failures.add_metric([k["name"], kind], n)
            parked.add_metric([k["name"]], k["parked"])
            dead.add_metric([k["name"]], k["dead_letters"])
            for v in STATUS_VALUES:
                sink_up.add_metric([k["name"], v], 1.0 if k["status"] == v else 0.0)
            if k.get("verified_at"):
                different.add_metric([k["name"]], k["rows_different"])
                verified.add_metric([k["name"]], _epoch(k["verified_at"]))
        yield from (delivered, failures, parked, dead, sink_up, different, verified)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()
