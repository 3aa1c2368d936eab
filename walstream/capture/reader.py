"""Capture: one replication connection, and the WAL buffer it fills (`wal_buffer.py`).

The capture thread reads the slot into the buffer. The Spark source asks for the
changes in `(start, end]` (`slice`, which waits until they are here), and says when
Spark has committed a cursor (`commit`); only then is the commit LSN of the last
transaction entirely at or below that cursor confirmed to Postgres. When the buffer
is full the thread stops reading (the WAL stays in Postgres) but keeps sending status
updates so the walsender does not time out.

With `streaming`, Postgres sends a large transaction while it runs (protocol 2); the
capture keeps it in a spool (`spool.py`) and, at its Stream Commit, feeds it into the
buffer as if it had arrived whole: same positions, same bound on the buffer.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

import psycopg2

from walstream.backoff import RECONNECT
from walstream.capture.spool import Replay, Spools
from walstream.capture.stream import (
    read_burst,
    replication_connection,
    start_options,
    wait_for_messages,
)
from walstream.capture.wal_buffer import (
    Cursor,
    Txn,
    TxnSlice,
    WalBuffer,
    annotations_text,
)
from walstream.change import format_lsn
from walstream.decode import pgoutput as po
from walstream.decode.decoder import ANNOTATIONS_PREFIX, RelationInfo
from walstream.errors import ConnectionFailed, WalstreamError

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "walstream:heartbeat"
_OID = struct.Struct("!I")
#: Messages of a committed streamed transaction fed into the buffer per loop turn.
_REPLAY_STEP = 2000


class Capture:
    """Owns the replication connection of one slot and the buffer of what it read."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        publication: str,
        floor: Cursor,
        *,
        primary_keys: Mapping[tuple[str, str], Sequence[str]] | None = None,
        max_buffer_bytes: int = 32 << 20,
        status_interval: float = 5.0,
        connect_retries: int = 20,
        internal_schema: str | None = None,
        source: str | None = None,
        streaming: bool = False,
        spill_dir: str | None = None,
        handed_over: tuple[int, int] | None = None,
    ) -> None:
        """`handed_over`: (commit end, processed) where another tool left the slot in the
        middle of a transaction: of the first transaction committed at or after the
        commit end, the changes up to `processed` were delivered (`WalBuffer`)."""
        self.dsn = dsn
        self.source = source or slot  # for errors
        #: Tables of this schema but `events` are walstream's state: their changes are
        #: dropped as they arrive (they are not rows of any batch).
        self.internal_schema = internal_schema
        self._internal: set[int] = set()  # their relation oids
        self.slot = slot
        self.publication = publication
        self.primary_keys = dict(primary_keys or {})
        self.max_buffer_bytes = max_buffer_bytes
        self.status_interval = status_interval
        self.connect_retries = connect_retries
        self.buffer = WalBuffer(floor, primary_keys, handed_over)  # guarded by `cond`
        self.relations: dict[int, RelationInfo] = {}
        self.cond = threading.Condition()
        self._sent_lsn = 0
        self.error: BaseException | None = None
        self.last_message_at = time.monotonic()
        self.last_heartbeat_at = time.monotonic()
        #: When a change (not a heartbeat) last arrived: a heartbeat is needed only after a
        #: quiet `heartbeat_interval` (see `Heartbeat`'s `busy`).
        self.last_change_at = 0.0
        self._changed = False
        self.received_until = 0  # highest WAL position seen (for lag reporting)
        self._stop = threading.Event()
        #: Read past `max_buffer_bytes` (see `latest`); guarded by `cond`.
        self._overdraw = False
        self._overdrawn_once = False
        self._current: Txn | None = None
        self._skipping = False
        self._streaming = False
        self._parser = po.PgOutputParser()
        #: `streaming`: in-progress transactions (in memory up to a quarter of the buffer's
        #: bound together, then on disk under `spill_dir`), and the one being fed in.
        self.spools = Spools(max_buffer_bytes // 4, spill_dir) if streaming else None
        self._replay: Replay | None = None
        #: Messages of a burst read after a Stream Commit, ingested once it is fed in.
        self._pending: tuple[list[bytes], list[int]] = ([], [])  # the rest of a burst, at
        self.thread = threading.Thread(
            target=self._run, name=f"walstream-capture-{slot}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Capture:
        if self.spools is not None:
            self.spools.check()
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self.cond:
            self.cond.notify_all()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            if isinstance(self.error, WalstreamError):
                raise self.error
            raise WalstreamError(
                f"replication from slot {self.slot} failed: {self.error}",
                "check the server log; walstream resumes from the last confirmed position on restart",
            ) from self.error

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                self._stream()
                return
            except ConnectionFailed as exc:
                # Right after a stop the slot can still look active, and a server restart or a
                # network drop ends the stream: reconnect a while. A new connection resends
                # everything after the confirmed position; _ingest skips what we hold.
                attempt = 1 if self._streaming else attempt + 1
                self._streaming = False
                if attempt > self.connect_retries or self._stop.is_set():
                    self.error = exc
                    break
                log.info("replication connection failed (%s); retry %d", exc.problem, attempt)
                self._stop.wait(RECONNECT.delay(attempt))
            except BaseException as exc:
                if isinstance(exc, WalstreamError):  # says what and the fix: no traceback
                    log.error("capture of slot %s failed: %s", self.slot, exc)
                else:
                    log.exception("capture of slot %s failed", self.slot)
                self.error = exc
                break
        with self.cond:
            self.cond.notify_all()

    def _stream(self) -> None:
        if self.buffer.last_end is None:  # the first connection: where the stream starts
            from walstream.postgres.slots import confirmed_position

            start = confirmed_position(self.dsn, self.slot)
            with self.cond:
                if self.buffer.last_end is None:
                    self.buffer.last_end = start
        conn = replication_connection(self.dsn)
        try:
            cur = conn.cursor()
            try:
                cur.start_replication(
                    slot_name=self.slot,
                    decode=False,
                    options=start_options(
                        self.publication,
                        proto_version=2 if self.spools is not None else 1,
                        streaming=self.spools is not None,
                    ),
                )
            except Exception as exc:
                self._raise_if_lost()  # invalidated or dropped: retrying cannot help
                raise ConnectionFailed(
                    f"cannot start replication from slot {self.slot}: {str(exc).strip()}",
                    "another process may be using the slot; stop it or choose another slot name",
                ) from exc
            # A fresh connection re-sends everything after the confirmed position.
            with self.cond:
                self.buffer.drop_partial()
            self._current = None
            self._skipping = False
            self._pending = ([], [])
            self._end_replay()
            if self.spools is not None:
                self.spools.clear()
            self._parser = po.PgOutputParser()
            self._streaming = True
            self._sent_lsn = 0  # tell the new walsender where we are
            try:
                self._loop(cur)
            except psycopg2.Error as exc:
                raise ConnectionFailed(
                    f"replication from slot {self.slot} was interrupted: {str(exc).strip()}",
                    "walstream reconnects by itself; if this repeats, check the server log",
                ) from exc
        finally:
            conn.close()

    def _raise_if_lost(self) -> None:
        """SlotLost when the slot was invalidated or dropped (see `slots.py`); nothing when
        it is fine or cannot be looked at (then the connection error stands)."""
        from walstream.postgres.slots import check_slot_at

        check_slot_at(self.dsn, self.slot, self.source, self.buffer.floor[0])

    def _loop(self, cur: Any) -> None:
        last_status = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self.confirm_lsn > self._sent_lsn or now - last_status >= self.status_interval:
                lsn = self.confirm_lsn
                cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, apply_lsn=lsn, force=True)
                self._sent_lsn = lsn
                last_status = now
            if self.buffered_bytes >= self.max_buffer_bytes and not self._overdraw:
                with self.cond:  # full: wait for Spark to commit, keep the connection alive
                    self.cond.wait(0.2)
                continue
            if self._replay is not None:  # a streamed transaction committed: feed it in first
                self._feed_replay()
                continue
            (burst, at), self._pending = self._pending, ([], [])
            if not burst:
                burst, at, received = read_burst(cur)
                if not burst:
                    wait_for_messages(cur, 0.2)
                    continue
                self.received_until = max(self.received_until, received)
            self.last_message_at = time.monotonic()
            # The buffer is shared with Spark's thread: a burst is ingested under one hold
            # of the lock, with one wake-up, not a lock and a notify per message.
            with self.cond:
                for i, raw in enumerate(burst):
                    self._ingest(raw, at[i])
                    if self._replay is not None:  # fed in before the rest of the burst
                        self._pending = (burst[i + 1 :], at[i + 1 :])
                        break
                self.cond.notify_all()
            if self._changed:
                self.last_change_at, self._changed = self.last_message_at, False

    # -- ingest ----------------------------------------------------------------------------------
    def _ingest(self, raw: bytes, lsn: int) -> None:
        """Take one message (at WAL position `lsn`) into the buffer; the caller holds
        `cond` and notifies it."""
        kind = raw[:1]
        if self.spools is not None:  # in-progress transactions (protocol 2)
            if kind == b"c":
                self._replay = self.spools.commit(raw, lsn)  # fed in before the next message
                return
            if self.spools.receive(raw, lsn):
                return
        if kind == b"B":
            lsn, ts, xid = po.BEGIN_BODY.unpack_from(raw, 1)
            # None: a transaction we hold already, resent after a reconnect
            self._current = self.buffer.begin(lsn, xid, ts, self.relations)
            self._skipping = self._current is None
            return
        if kind == b"R":
            self._relation(raw)  # also inside skipped transactions: it is not sent again
        if self._skipping:
            if kind == b"C":
                self._skipping = False
            return
        txn = self._current
        if kind == b"C":
            if txn is not None:
                self.buffer.complete(txn, po.COMMIT_BODY.unpack_from(raw, 1)[2])
            self._current = None
            return
        if txn is None:
            return  # Origin, Type, or a message outside a transaction
        if self._internal and kind in b"IUD" and _OID.unpack_from(raw, 1)[0] in self._internal:
            return  # walstream's own state (ledger, parking, streams ...)
        if kind == b"M":
            msg = self._parser.parse(raw)
            assert isinstance(msg, po.Message)
            if msg.prefix == HEARTBEAT_PREFIX:
                self.last_heartbeat_at = time.monotonic()
                return
            if msg.prefix == ANNOTATIONS_PREFIX and not txn.msgs:
                txn.annotations = annotations_text(msg.content)  # context of the first piece
                return
        self._changed = True
        self.buffer.add(txn, raw, self.relations, lsn)

    def _feed_replay(self) -> None:
        """Feed the committed streamed transaction into the buffer, a step at a time, until
        it is in or the buffer is full (the loop waits for Spark then, as for any message)."""
        assert self._replay is not None
        self.last_message_at = time.monotonic()
        with self.cond:
            try:
                for raw, lsn in islice(self._replay, _REPLAY_STEP):
                    self._ingest(raw, lsn)
                    if self.buffered_bytes >= self.max_buffer_bytes and not self._overdraw:
                        return
            finally:
                self.cond.notify_all()
        if self._replay.done:
            self._end_replay()

    def _end_replay(self) -> None:
        if self._replay is not None:
            self._replay.close()
            self._replay = None

    def _relation(self, raw: bytes) -> None:
        rel = self._parser.parse(raw)
        assert isinstance(rel, po.Relation)
        info = RelationInfo.from_message(rel, self.primary_keys.get((rel.schema, rel.name)))
        self.relations = {**self.relations, rel.oid: info}  # copy on write: pieces keep theirs
        if rel.schema == self.internal_schema and rel.name != "events":
            self._internal.add(rel.oid)
        else:
            self._internal.discard(rel.oid)

    # -- what Spark calls (driver thread) ---------------------------------------------------------
    @property
    def buffered_bytes(self) -> int:
        return self.buffer.buffered_bytes

    @property
    def confirm_lsn(self) -> int:
        return self.buffer.confirm_lsn

    def latest(
        self, start: Cursor, max_rows: int | None = None, defer_low_marks: bool = False
    ) -> Cursor:
        """The offset a batch starting after `start` may end at (see WalBuffer.latest).
        Never blocks."""
        self.raise_if_failed()
        with self.cond:
            end = self.buffer.latest(start, max_rows, defer_low_marks)
            if end == start and self.buffered_bytes >= self.max_buffer_bytes:
                # Full of changes at or before `start` only: Spark commits them once it
                # plans the next batch, which needs a change after `start`. Read on past
                # the bound until that commit (waiting would stop the stream for good).
                self._overdraw = True
                self.cond.notify_all()
                if not self._overdrawn_once:
                    self._overdrawn_once = True
                    log.warning(
                        "slot %s: one batch's changes fill the read-ahead buffer (%d MiB), so "
                        "reading goes on past it until Spark commits that batch; give "
                        "max_buffer_bytes room for two batches, or lower max_changes_per_batch",
                        self.slot,
                        self.max_buffer_bytes >> 20,
                    )
            return end

    def wait_latest(
        self, start: Cursor, max_rows: int | None, timeout: float, defer_low_marks: bool = False
    ) -> Cursor:
        """`latest`, waiting up to `timeout` seconds for a change after `start` to arrive."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.latest(start, max_rows, defer_low_marks)
            left = deadline - time.monotonic()
            if end != start or left <= 0:
                return end
            with self.cond:  # woken by each change buffered (and by a failure)
                if self.buffer.latest(start, max_rows, defer_low_marks) == start:
                    self.cond.wait(min(left, 0.1))

    def covers(self, end: Cursor) -> bool:
        """Whether everything up to `end` has been received."""
        return self.buffer.covers(end)

    def slice(self, start: Cursor, end: Cursor, timeout: float) -> list[TxnSlice]:
        """The buffered messages of the changes in (start, end]; waits until they are here."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.buffer.covers(end):
                self.raise_if_failed()
                if time.monotonic() > deadline:
                    raise WalstreamError(
                        f"slot {self.slot} did not deliver the changes up to "
                        f"{format_lsn(end[0])} (change {end[1]}) within {timeout:g}s "
                        "(replayTimeout)",
                        "was the slot dropped, advanced or used by another consumer? "
                        "If it was reset on purpose, start over with a new checkpoint",
                    )
                self.cond.wait(0.5)
            return self.buffer.slices(start, end)

    def commit(self, end: Cursor) -> None:
        """Spark committed everything <= end: trim the buffer, confirm whole transactions."""
        with self.cond:
            self.buffer.commit(end)
            self._overdraw = False
            self.cond.notify_all()
