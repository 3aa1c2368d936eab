"""`spark.readStream.format("walstream")`: a Structured Streaming source reading a replication slot.

Driver side (one long-lived Python process per query): validates the database,
owns the capture thread and the heartbeat, plans batches from the capture
buffer and confirms to Postgres on `commit`. Executor side: `read` decodes the
raw messages of its partition into Arrow record batches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from walstream.change import CHANGE_SCHEMA_DDL, parse_lsn
from walstream.errors import SetupError
from walstream.source.options import SourceOptions

if TYPE_CHECKING:
    from walstream.capture.heartbeat import Heartbeat
    from walstream.capture.reader import Capture, Cursor
    from walstream.decode.types import PgType

# Spark starts a fresh Python process for each planning step of a Python data source
# (creating it at load(), planning the read), and those need only the classes: what
# reading the slot and decoding need (psycopg, the capture, the decoder: ~0.25 s of such
# a process's start) is imported in the methods that read and decode.

log = logging.getLogger(__name__)
#: At most this many changes in the first batch with changes of a query (see latestOffset).
FIRST_BATCH_ROWS = 1000
#: A query that starts behind the server waits at most this long for its first change,
#: so that its first batch carries changes instead of running empty (see latestOffset).
#: The wait ends with the first change: only WAL of other tables waits it out, once.
FIRST_CHANGE_WAIT = 3.0

# One capture per (dsn, slot) in this process: a new query on the same slot replaces the old
# one (Spark never calls stop() on a finished query's reader).
_CAPTURES: dict[tuple[str, str], _Driver] = {}
_CAPTURES_LOCK = threading.Lock()


class WalstreamDataSource(DataSource):
    """Changes of a PostgreSQL database, read from a logical replication slot (pgoutput)."""

    @classmethod
    def name(cls) -> str:
        return "walstream"

    def schema(self) -> str:
        return CHANGE_SCHEMA_DDL

    def streamReader(self, schema: Any) -> WalstreamStreamReader:
        return WalstreamStreamReader(SourceOptions.parse(self.options))


def register(spark: Any) -> None:
    """Register the "walstream" data source with a SparkSession."""
    spark.dataSource.register(WalstreamDataSource)


@dataclass
class _Driver:
    capture: Capture
    heartbeat: Heartbeat | None
    types: list[PgType]
    primary_keys: dict[tuple[str, str], list[str]]

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.capture.stop()


def _as_cursor(offset: dict[str, Any]) -> Cursor:
    return (int(offset["lsn"]), int(offset["seq"]))


def _as_offset(cursor: Cursor) -> dict[str, int]:
    return {"lsn": cursor[0], "seq": cursor[1]}


class WalstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._driver: _Driver | None = None
        self._confirmed: int | None = None
        #: Trigger.AvailableNow: the LSN of the mark written when the query started, and
        #: the offset every change committed before it ends at (once received).
        self._mark: int | None = None
        self._until: Cursor | None = None
        #: Whether this query planned a batch with changes yet (the first one is small).
        self._planned_rows = False
        #: The server had written WAL past the slot when the capture started.
        self._behind = False

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: connections and threads stay on the driver.
        return {
            "options": self.options,
            "_driver": None,
            "_confirmed": None,
            "_mark": None,
            "_until": None,
            "_planned_rows": False,
            "_behind": False,
        }

    # -- Trigger.AvailableNow ------------------------------------------------------------
    def prepareForTriggerAvailableNow(self) -> None:
        """Write a mark into the WAL (a logical message, as heartbeats are): the query
        reads every change committed before it, then ends. Trigger.Once (which asks
        for all available) marks the same way at its one batch."""
        from walstream.capture.reader import HEARTBEAT_PREFIX
        from walstream.postgres.replication import connect

        with connect(self.options.writes_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_logical_emit_message(true, %s, 'available-now')::text",
                (HEARTBEAT_PREFIX,),
            ).fetchone()
        assert row is not None
        self._mark = parse_lsn(row[0])
        self._until = None
        log.info(
            "source %s: reading what was committed before %s, then stopping",
            self.options.name,
            row[0],
        )

    def _available_now(self, driver: _Driver, start: Cursor) -> Cursor:
        """The offset the changes committed before the mark end at: waits until the
        capture received the mark (every earlier commit is then in its buffer)."""
        if self._until is None and self._setup() >= (self._mark or 0):
            self._until = start  # the slot begins after the mark (it is new): nothing before
        if self._until is None:
            assert self._mark is not None
            cap = driver.capture
            deadline = time.monotonic() + self.options.replay_timeout
            while cap.received_until < self._mark:
                driver.capture.raise_if_failed()
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"slot {self.options.slot} did not send WAL up to {self._mark:X} within "
                        f"{self.options.replay_timeout:g}s (replayTimeout)",
                        "check the server (pg_stat_replication) and that nothing holds the "
                        "slot; run again",
                    )
                time.sleep(0.05)
            self._until = cap.latest(start, None)
        return self._until

    # -- setup ---------------------------------------------------------------------------
    def _setup(self, resume_from: int | None = None) -> int:
        """Validate the database, create slot/publication when missing; the slot's confirmed
        LSN. `resume_from`: the LSN a checkpoint resumes from, when this reader did not
        start the query fresh (`initialOffset`): then a missing slot is an error."""
        if self._confirmed is not None:
            return self._confirmed
        from walstream.postgres.prepare import prepare_capture

        o = self.options
        _release(o.dsn, o.slot)
        self._confirmed = prepare_capture(
            o.dsn,
            o.slot,
            o.publication,
            o.tables,
            o.name,
            resume_from=resume_from,
            primary=o.primary_dsn,
            options=o.publication_options,
        )
        return self._confirmed

    def _running(self, floor: Cursor) -> _Driver:
        driver = self._driver
        if driver is not None and driver.capture.thread.is_alive():
            return driver
        from walstream.capture.heartbeat import Heartbeat
        from walstream.capture.reader import Capture
        from walstream.decode.catalog import load_metadata
        from walstream.postgres.replication import connect, server_wal_lsn

        if driver is not None:
            driver.capture.raise_if_failed()
        self._setup(resume_from=floor[0])  # set already when this reader began the query
        o = self.options
        with connect(o.dsn, autocommit=True) as conn:
            meta = load_metadata(conn)
            wal = server_wal_lsn(conn)
        self._behind = wal is not None and parse_lsn(wal) > floor[0]
        partial = None  # a transaction the other tool delivered a part of (`handover`)
        if o.handover is not None and floor == (o.handover[0], -1) and o.handover[1] > floor[0]:
            partial = o.handover
        capture = Capture(
            o.dsn,
            o.slot,
            o.publication,
            floor,
            primary_keys=meta.primary_keys,
            max_buffer_bytes=o.max_buffer_bytes,
            internal_schema=o.internal_schema,
            source=o.name,
            streaming=o.streaming,
            spill_dir=o.spill_dir,
            handed_over=partial,
        ).start()
        heartbeat = (
            Heartbeat(
                o.writes_dsn,
                o.slot,
                o.heartbeat_interval,
                busy=lambda: time.monotonic() - capture.last_change_at < o.heartbeat_interval,
            ).start()
            if o.heartbeat_interval
            else None
        )
        driver = _Driver(capture, heartbeat, list(meta.types.catalog.values()), meta.primary_keys)
        with _CAPTURES_LOCK:
            _CAPTURES[(o.dsn, o.slot)] = driver
        self._driver = driver
        return driver

    def _check_alive(self, driver: _Driver) -> None:
        driver.capture.raise_if_failed()
        o = self.options
        if not o.heartbeat_interval:
            return
        cap = driver.capture
        quiet = time.monotonic() - max(cap.last_heartbeat_at, cap.last_message_at)
        if quiet > o.heartbeat_timeout and cap.buffered_bytes < cap.max_buffer_bytes:
            raise SetupError(
                f"no message from slot {o.slot} for {quiet:.0f}s although a heartbeat is sent "
                f"every {o.heartbeat_interval:g}s: the replication connection is stale",
                "check the server (pg_stat_replication) and the network; restart the query to reconnect",
            )

    # -- offsets -------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts: the slot's confirmed position, or where the tool it
        takes the slot over from left it (`handover`), whichever is later."""
        start = self._setup()
        if self.options.handover is not None:
            start = max(start, self.options.handover[0])
        return _as_offset((start, -1))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_changes_per_batch)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        cursor = _as_cursor(start)
        driver = self._running(cursor)
        self._check_alive(driver)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is not None and not self._planned_rows:
            # The query's first changes go out in a small batch: a cold batch of 200,000
            # takes seconds longer on a small machine before its first message is sent.
            max_rows = min(max_rows, FIRST_BATCH_ROWS)
        if isinstance(limit, ReadAllAvailable):
            max_rows = None
            if self._mark is None:  # Trigger.Once: all that was committed before it started
                self.prepareForTriggerAvailableNow()
        if self._mark is None:
            if self._behind and not self._planned_rows:
                # A backlog: the first batch waits (briefly) for its first changes rather
                # than run empty, which costs a whole cycle before anything is delivered.
                self._behind = False
                return _as_offset(
                    driver.capture.wait_latest(
                        cursor, max_rows, FIRST_CHANGE_WAIT, defer_low_marks=True
                    )
                )
            # a backfill's low watermark alone waits for what follows it (WalBuffer.latest)
            return _as_offset(driver.capture.latest(cursor, max_rows, defer_low_marks=True))
        # Trigger.AvailableNow: once the mark is received, up to it and no further
        until = self._available_now(driver, cursor)
        if cursor >= until:
            return _as_offset(cursor)  # no new data: Spark ends the query
        return _as_offset(min(driver.capture.latest(cursor, max_rows), until))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        from walstream.source.partition import ChangePartition, PackedSlice, group_slices

        s, e = _as_cursor(start), _as_cursor(end)
        if e <= s:
            return []
        driver = self._running(s)
        pieces = driver.capture.slice(s, e, timeout=self.options.replay_timeout)
        self._planned_rows = self._planned_rows or bool(pieces)
        groups = group_slices(pieces, self.options.partition_bytes)
        return [
            ChangePartition(
                self.options.name,
                [PackedSlice.pack(p) for p in group],
                driver.types,
                driver.primary_keys,
            )
            for group in groups
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from walstream.source.partition import ChangePartition, partition_batches

        assert isinstance(partition, ChangePartition)
        return partition_batches(partition)

    def commit(self, end: dict[str, Any]) -> None:
        cursor = _as_cursor(end)
        driver = self._running(cursor)
        driver.capture.commit(cursor)

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.stop()
            _release(self.options.dsn, self.options.slot)


def _release(dsn: str, slot: str) -> None:
    """Stop this process's previous capture of the slot, if any."""
    with _CAPTURES_LOCK:
        old = _CAPTURES.pop((dsn, slot), None)
    if old is not None:
        old.stop()


__all__ = ["WalstreamDataSource", "WalstreamStreamReader", "register"]
