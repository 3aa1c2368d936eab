"""One source's streaming query: its state in the runtime, starting it, reading its progress."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from walstream.config import Plan, SourceConfig
from walstream.pipeline.batches import Pipeline
from walstream.source.checkpoint import remove_partial_writes
from walstream.state.leadership import Leadership

log = logging.getLogger("walstream.runtime")  # the name operators know

#: Raw WAL bytes per Spark task where decoding is spread over several tasks.
SPREAD_TASK_BYTES = 4 << 20
#: So large that a batch (at most `max_buffer_bytes` of WAL) is one task.
WHOLE_BATCH_BYTES = 1 << 30


def task_bytes(configured: int | None, master: str, cores: int, tables_only: bool = False) -> int:
    """A source's `partition_bytes`: as configured, else one task per batch on a local
    master with at most 2 cores when a sink takes messages, else SPREAD_TASK_BYTES.

    With one task, the source's Python worker decodes while the delivery worker sends
    (Spark streams Arrow between them) and no shuffle is needed; spreading a batch over
    tasks pays a shuffle by group key and runs decoding and delivery one stage after the
    other, which only pays off with cores to spare (1M changes into Kafka on 2 cores:
    45k/s against 39k/s, see docs/performance-log.md). `tables_only`: every sink of the
    source is a table sink, whose batch is typed in the JVM and collected to the driver
    with no shuffle and no delivery worker: one task would leave all but one core idle.
    """
    if configured is not None:
        return configured
    if master.startswith("local") and cores <= 2 and not tables_only:
        return WHOLE_BATCH_BYTES
    return SPREAD_TASK_BYTES


def database_name(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(dsn).get("dbname") or "")


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
    caught_up: bool = False  # `--until-caught-up`: its query read the slot and ended


def start_query(
    spark: Any, config: Plan, sq: SourceQuery, checkpoint: str, available_now: bool = False
) -> None:
    """Start the source's streaming query (its pipeline as foreachBatch, from its checkpoint).
    `available_now`: Trigger.AvailableNow, the query reads what the slot has, then ends."""
    s = sq.source
    sq.started.clear()
    remove_partial_writes(checkpoint)  # no query of ours uses it now
    cores = spark.sparkContext.defaultParallelism
    tables_only = not sq.pipeline.message_sinks()
    per_task = task_bytes(s.partition_bytes, config.spark.master, cores, tables_only)
    reader = (
        spark.readStream.format("walstream")
        .option("dsn", s.dsn.get_secret_value())
        .option("slot", s.slot_name)
        .option("publication", s.publication_name)
        .option("name", s.name)
        .option("maxChangesPerBatch", str(s.max_changes_per_batch))
        .option("partitionBytes", str(per_task))
        .option("maxBufferBytes", str(s.max_buffer_bytes))
        .option("heartbeatInterval", str(s.heartbeat_interval))
    )
    if s.tables:
        reader = reader.option("tables", ",".join(s.tables))
    if s.handover is not None:
        reader = reader.option("handover", "{}:{}".format(*s.handover.positions()))
    if s.publish_via_partition_root:
        reader = reader.option("publishViaPartitionRoot", "true")
    if s.publish_generated_columns:
        reader = reader.option("publishGeneratedColumns", "true")
    if s.primary is not None:
        reader = reader.option("primaryDsn", s.primary)
    if s.streaming:
        reader = reader.option("streaming", "true")
        if s.spill_dir is not None:
            reader = reader.option("spillDir", s.spill_dir)
    if config.state_dsn in (s.dsn.get_secret_value(), s.writes_dsn):  # walstream's state is here
        reader = reader.option("internalSchema", config.state.schema_)
    interval = config.spark.trigger_interval
    writer = (
        sq.pipeline.stream(reader.load())  # the sinks' columns, planned with each batch
        .writeStream.queryName(f"walstream_{s.name.replace('-', '_')}")
        .foreachBatch(sq.pipeline)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{interval:g} seconds")
    sq.pipeline.delivered_batch = -1  # a stop waits for this query's batches, not an earlier one's
    sq.query = writer.start()
    sq.query_id = str(sq.query.id)
    sq.started.set()
    log.info("source %s: streaming (slot %s, query %s)", s.name, s.slot_name, sq.query_id)


def batch_committed(sq: SourceQuery) -> bool:
    """The last batch the pipeline delivered is in the checkpoint's commit log (or the
    query is gone). Spark writes that entry after the batch function returns and reports
    the batch's progress after it: stopping the query before then interrupts the write,
    and the next start delivers the batch again."""
    q, delivered = sq.query, sq.pipeline.delivered_batch
    try:
        if q is None or delivered < 0 or not q.isActive:
            return True
        last = q.lastProgress
    except Exception:  # the query is going away: nothing left to wait for
        return True
    return (-1 if last is None else report_batch(last)) >= delivered


def finish_batch(sq: SourceQuery, deadline: float, abandon: threading.Event) -> None:
    """Wait until the batch in flight is delivered and committed (`batch_committed`), until
    `deadline` (monotonic) or until `abandon` is set; then the query may be stopped."""
    if sq.query is None or (sq.pipeline.idle.is_set() and batch_committed(sq)):
        return
    log.info(
        "source %s: finishing the batch in flight (Ctrl-C again to abandon it)", sq.source.name
    )
    while not (sq.pipeline.idle.is_set() and batch_committed(sq)):
        if abandon.wait(0.1) or time.monotonic() > deadline:
            log.warning(
                "source %s: abandoning the batch in flight; the next start replays it",
                sq.source.name,
            )
            return


def stop_query(source: str, query: Any) -> None:
    """Stop a streaming query; a failure is logged in one line (stopping goes on)."""
    try:
        query.stop()
    except Exception as exc:
        lines = [line.strip(": ") for line in str(exc).splitlines() if line.strip()][:2]
        if "stopped SparkContext" in str(exc):  # a signal to the process group reached it first
            log.info("source %s: its query had stopped with Spark", source)
        else:
            log.warning("source %s: stopping its query: %s", source, " ".join(lines)[:300])
        log.debug("source %s: the full failure:\n%s", source, exc)


def report_batch(report: Any) -> int:
    """The batch id of one of a query's progress reports (a dict or PySpark's object)."""
    return int(report.get("batchId", -1)) if isinstance(report, dict) else int(report.batchId)


def collect_progress(sq: SourceQuery) -> None:
    """Count the changes of batches the query reported since the last look. The last
    report alone, when it is the only new one (a tick sees one batch or none); all the
    query keeps (its last 100, far more than a tick sees) only when batches were missed:
    each report crosses from the JVM as JSON, and a tick every second pulling 100 of
    them cost ~5% of a core on a busy 2-core machine."""
    q = sq.query
    if q is None:
        return
    try:
        last = q.lastProgress
        if last is None or report_batch(last) <= sq.seen_batch:
            return
        reports = [last] if report_batch(last) == sq.seen_batch + 1 else q.recentProgress
    except Exception:  # the query is going away: its next run reports again
        return
    for r in reports:
        batch = report_batch(r)
        if batch <= sq.seen_batch:
            continue
        rows = r.get("numInputRows", 0) if isinstance(r, dict) else r.numInputRows
        sq.seen_batch = batch
        sq.ingested += int(rows or 0)
        sq.batches += 1
        sq.last_batch_at = time.time()
