"""Capture: one replication connection, a byte-bounded buffer of raw pgoutput messages.

The capture thread reads the slot and keeps raw messages grouped by
transaction, knowing each change's WAL cursor `(commit lsn, seq)` without
decoding rows. The Spark source asks it for the changes in `(start, end]`
(`slice`), and tells it when Spark has committed a cursor (`commit`); only then
is the commit LSN of the last transaction entirely at or below that cursor
confirmed to Postgres. When the buffer is full the thread stops reading (the
WAL stays in Postgres) but keeps sending status updates so the walsender does
not time out.

Cursors: a change's `seq` is its 0-based index among the rows of its
transaction (a Truncate of N tables is N rows). The offset of a transaction
without rows (a heartbeat) is `(lsn, -1)`.
"""

from __future__ import annotations

import bisect
import logging
import select
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2

from walstream.errors import ConnectionFailed, WalstreamError
from walstream.postgres import pgoutput as po
from walstream.postgres.decoder import (
    ANNOTATIONS_PREFIX,
    WATERMARK_PREFIX,
    RelationInfo,
    annotations_json,
)
from walstream.postgres.replication import replication_connection, start_options

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "walstream:heartbeat"
_BEGIN = struct.Struct("!qqI")
_COMMIT = struct.Struct("!bqqq")
_MSG_OVERHEAD = 64  # bytes of Python object overhead counted per buffered message

Cursor = tuple[int, int]


@dataclass
class Txn:
    """A transaction's buffered messages (after Begin, before Commit), possibly trimmed at the front."""

    lsn: int
    xid: int
    commit_ts: int  # microseconds since 2000-01-01
    relations: Mapping[int, RelationInfo]  # as of msgs[0]
    annotations: str | None  # as of msgs[0]
    first_seq: int  # seq of the first row at or after msgs[0]
    msgs: list[bytes] = field(default_factory=list)
    row_end: list[int] = field(default_factory=list)  # rows through msgs[i] (absolute seq + 1)
    rows: int = 0  # rows seen so far, including trimmed ones
    end_lsn: int | None = None  # set by Commit
    nbytes: int = 0

    @property
    def complete(self) -> bool:
        return self.end_lsn is not None

    def last_cursor(self) -> Cursor:
        return (self.lsn, self.rows - 1)


@dataclass(frozen=True)
class Piece:
    """Messages of one transaction within a slice, with the context to decode them."""

    lsn: int
    xid: int
    commit_ts: int
    seq: int  # seq of the first row in msgs
    annotations: str | None
    relations: tuple[RelationInfo, ...]
    msgs: list[bytes]
    nbytes: int


_WATERMARK = WATERMARK_PREFIX.encode() + b"\0"


_OID = struct.Struct("!I")


def row_count(raw: bytes) -> int:
    """Rows a raw message yields: 1 for Insert/Update/Delete, N for a Truncate of N tables,
    1 for a transactional backfill watermark (a Message: kind, flags, LSN, prefix)."""
    kind = raw[0]
    if kind in (73, 85, 68):  # I U D
        return 1
    if kind == 84:  # T: Int32 number of relations follows
        return int(struct.unpack_from("!i", raw, 1)[0])
    if kind == 77 and raw[1] & 1 and raw.startswith(_WATERMARK, 10):  # M
        return 1
    return 0


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
        max_buffer_bytes: int = 128 << 20,
        status_interval: float = 5.0,
        connect_retries: int = 20,
        internal_schema: str | None = None,
    ) -> None:
        self.dsn = dsn
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
        self.floor: Cursor = floor  # everything <= floor is committed by Spark: never buffered
        self.txns: deque[Txn] = deque()
        self.ends: deque[tuple[int, int, int]] = deque()  # (lsn, end_lsn, rows) of complete txns
        self.relations: dict[int, RelationInfo] = {}
        self.buffered_bytes = 0
        self.cond = threading.Condition()
        self.confirm_lsn = 0  # what we want Postgres to know is safe
        self._sent_lsn = 0
        self.error: BaseException | None = None
        self.last_message_at = time.monotonic()
        self.last_heartbeat_at = time.monotonic()
        self.received_until = 0  # highest WAL position seen (for lag reporting)
        self._stop = threading.Event()
        self._current: Txn | None = None
        self._skipping = False
        self._streaming = False
        self.last_complete_lsn = 0
        self._parser = po.PgOutputParser()
        self.thread = threading.Thread(
            target=self._run, name=f"walstream-capture-{slot}", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Capture:
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
                self._stop.wait(min(0.25 * attempt, 2.0))
            except BaseException as exc:
                log.exception("capture of slot %s failed", self.slot)
                self.error = exc
                break
        with self.cond:
            self.cond.notify_all()

    def _stream(self) -> None:
        conn = replication_connection(self.dsn)
        try:
            cur = conn.cursor()
            try:
                cur.start_replication(
                    slot_name=self.slot, decode=False, options=start_options(self.publication)
                )
            except Exception as exc:
                raise ConnectionFailed(
                    f"cannot start replication from slot {self.slot}: {str(exc).strip()}",
                    "another process may be using the slot; stop it or choose another slot name",
                ) from exc
            # A fresh connection re-sends everything after the confirmed position.
            with self.cond:
                self._reset_partial()
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

    def _loop(self, cur: Any) -> None:
        last_status = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self.confirm_lsn > self._sent_lsn or now - last_status >= self.status_interval:
                lsn = self.confirm_lsn
                cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, apply_lsn=lsn, force=True)
                self._sent_lsn = lsn
                last_status = now
            if self.buffered_bytes >= self.max_buffer_bytes:
                with self.cond:  # full: wait for Spark to commit, keep the connection alive
                    self.cond.wait(0.2)
                continue
            msg = cur.read_message()
            if msg is None:
                select.select([cur], [], [], 0.2)
                continue
            self.last_message_at = time.monotonic()
            if msg.data_start > self.received_until:
                self.received_until = msg.data_start
            self._ingest(msg.payload)

    def _reset_partial(self) -> None:
        """After (re)connecting Postgres resends whole transactions: drop a partial one."""
        if self.txns and not self.txns[-1].complete:
            t = self.txns.pop()
            self.buffered_bytes -= t.nbytes
        self._current = None
        self._skipping = False
        self._parser = po.PgOutputParser()

    # -- ingest ----------------------------------------------------------------------------------
    def _ingest(self, raw: bytes) -> None:
        kind = raw[:1]
        if kind == b"B":
            lsn, ts, xid = _BEGIN.unpack_from(raw, 1)
            # After a reconnect Postgres resends whole transactions we may hold already.
            self._skipping = lsn <= self.last_complete_lsn
            self._current = None if self._skipping else Txn(lsn, xid, ts, self.relations, None, 0)
            if self._current is not None:
                with self.cond:
                    self.txns.append(self._current)
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
                self._commit_message(txn, _COMMIT.unpack_from(raw, 1)[2])
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
                txn.annotations = _annotations(msg.content)  # context of the first piece
                return
        n = row_count(raw)
        with self.cond:
            txn.rows += n
            if not txn.msgs:
                if n and (txn.lsn, txn.rows - 1) <= self.floor:
                    txn.first_seq = txn.rows  # committed by Spark already: skip, keep context
                    txn.relations = self.relations
                    return
                txn.relations = self.relations
                txn.first_seq = txn.rows - n
            txn.msgs.append(raw)
            txn.row_end.append(txn.rows)
            size = len(raw) + _MSG_OVERHEAD
            txn.nbytes += size
            self.buffered_bytes += size
            if n:
                self.cond.notify_all()

    def _commit_message(self, txn: Txn, end_lsn: int) -> None:
        with self.cond:
            txn.end_lsn = end_lsn
            self.last_complete_lsn = txn.lsn
            self.ends.append((txn.lsn, end_lsn, txn.rows))
            if txn.last_cursor() <= self.floor:
                self._drop_txn(txn)
            self.cond.notify_all()

    def _relation(self, raw: bytes) -> None:
        rel = self._parser.parse(raw)
        assert isinstance(rel, po.Relation)
        info = RelationInfo.from_message(rel, self.primary_keys.get((rel.schema, rel.name)))
        self.relations = {**self.relations, rel.oid: info}  # copy on write: pieces keep theirs
        if rel.schema == self.internal_schema and rel.name != "events":
            self._internal.add(rel.oid)
        else:
            self._internal.discard(rel.oid)

    def _drop_txn(self, txn: Txn) -> None:
        try:
            self.txns.remove(txn)
        except ValueError:
            return
        self.buffered_bytes -= txn.nbytes

    # -- what Spark calls (driver thread) ---------------------------------------------------------
    def latest(self, start: Cursor, max_rows: int | None = None) -> Cursor:
        """The offset a batch starting after `start` may end at: at most `max_rows` rows
        (but at least one message), at a message boundary. Never blocks."""
        self.raise_if_failed()
        budget = max_rows if max_rows is not None else 1 << 62
        best = start
        with self.cond:
            for txn in self.txns:
                if txn.lsn < start[0]:
                    continue
                if not txn.row_end or txn.row_end[-1] == txn.first_seq:
                    if txn.complete and txn.rows == 0 and (txn.lsn, -1) > best:
                        best = (txn.lsn, -1)  # a transaction without rows (heartbeat)
                    continue
                first = max(txn.first_seq, start[1] + 1) if txn.lsn == start[0] else txn.first_seq
                last = txn.row_end[-1]  # rows buffered, as absolute seq + 1
                if last <= first:
                    continue
                if last - first <= budget:
                    budget -= last - first
                    best = (txn.lsn, last - 1)
                    continue
                # cut inside this transaction at the last message boundary within budget
                j = bisect.bisect_right(txn.row_end, first + budget) - 1
                if j < 0 or txn.row_end[j] <= first:
                    if best != start:
                        return best
                    j = bisect.bisect_right(txn.row_end, first)  # at least one message
                return (txn.lsn, txn.row_end[j] - 1)
        return best

    def covers(self, end: Cursor) -> bool:
        """Whether everything up to `end` has been received."""
        if self.last_complete_lsn >= end[0]:
            return True
        return any(t.lsn == end[0] and t.rows - 1 >= end[1] for t in self.txns)

    def slice(self, start: Cursor, end: Cursor, timeout: float) -> list[Piece]:
        """The buffered messages of the changes in (start, end]; waits until they are here."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.covers(end):
                self.raise_if_failed()
                if time.monotonic() > deadline:
                    raise WalstreamError(
                        f"slot {self.slot} did not deliver the changes up to {end} within {timeout:.0f}s",
                        "was the slot dropped, advanced or used by another consumer? "
                        "If it was reset on purpose, start over with a new checkpoint",
                    )
                self.cond.wait(0.5)
            pieces = []
            for txn in self.txns:
                if txn.lsn < start[0] or txn.lsn > end[0] or not txn.msgs:
                    continue
                i0 = _first_after(txn, start[1]) if txn.lsn == start[0] else 0
                i1 = _first_after(txn, end[1]) if txn.lsn == end[0] else len(txn.msgs)
                if i0 >= i1:
                    continue
                relations, annotations = _context(txn, i0, self.primary_keys)
                msgs = txn.msgs[i0:i1]
                pieces.append(
                    Piece(
                        txn.lsn,
                        txn.xid,
                        txn.commit_ts,
                        txn.row_end[i0 - 1] if i0 else txn.first_seq,
                        annotations,
                        tuple(relations.values()),
                        msgs,
                        sum(len(m) for m in msgs),
                    )
                )
            return pieces

    def commit(self, end: Cursor) -> None:
        """Spark committed everything <= end: trim the buffer, confirm whole transactions."""
        with self.cond:
            self.floor = max(self.floor, end)
            while self.ends and (self.ends[0][0], self.ends[0][2] - 1) <= end:
                _, end_lsn, _ = self.ends.popleft()
                self.confirm_lsn = max(self.confirm_lsn, end_lsn)
            while self.txns:
                txn = self.txns[0]
                if txn.complete and txn.last_cursor() <= end:
                    self.txns.popleft()
                    self.buffered_bytes -= txn.nbytes
                    continue
                if txn.lsn == end[0] and txn.msgs:
                    _trim(txn, _first_after(txn, end[1]), self)
                break
            self.cond.notify_all()


def _first_after(txn: Txn, seq: int) -> int:
    """Index of the first message whose rows (or, for a non-row message, the next row) come
    after row `seq`: message i holds rows [lo_i, row_end[i]) with lo_0 = first_seq."""
    if txn.first_seq > seq:
        return 0
    return min(bisect.bisect_right(txn.row_end, seq) + 1, len(txn.msgs))


def _context(
    txn: Txn, i: int, primary_keys: Mapping[tuple[str, str], Sequence[str]]
) -> tuple[Mapping[int, RelationInfo], str | None]:
    """Relations and annotations in force before txn.msgs[i]."""
    rels, annotations = context_after(
        txn.msgs[:i], tuple(txn.relations.values()), txn.annotations, primary_keys
    )
    return {r.oid: r for r in rels}, annotations


def context_after(
    msgs: Sequence[bytes],
    relations: tuple[RelationInfo, ...],
    annotations: str | None,
    primary_keys: Mapping[tuple[str, str], Sequence[str]] | None = None,
) -> tuple[tuple[RelationInfo, ...], str | None]:
    """Relations and annotations in force after `msgs`, starting from the given ones."""
    by_oid = {r.oid: r for r in relations}
    changed = False
    parser = po.PgOutputParser()
    for raw in msgs:
        kind = raw[:1]
        if kind == b"R":
            rel = parser.parse(raw)
            assert isinstance(rel, po.Relation)
            if primary_keys is not None:
                key = primary_keys.get((rel.schema, rel.name))
            else:
                prev = by_oid.get(rel.oid)
                key = list(prev.key_columns) if prev and prev.table == rel.name else None
            by_oid[rel.oid] = RelationInfo.from_message(rel, key)
            changed = True
        elif kind == b"M":
            msg = parser.parse(raw)
            if (
                isinstance(msg, po.Message)
                and msg.prefix == ANNOTATIONS_PREFIX
                and msg.transactional
            ):
                annotations = _annotations(msg.content)
    return (tuple(by_oid.values()) if changed else relations), annotations


def _trim(txn: Txn, i: int, capture: Capture) -> None:
    """Drop txn.msgs[:i] (committed by Spark), keeping the context the rest needs."""
    if i <= 0:
        return
    txn.relations, txn.annotations = _context(txn, i, capture.primary_keys)
    dropped = sum(len(m) + _MSG_OVERHEAD for m in txn.msgs[:i])
    txn.first_seq = txn.row_end[i - 1]
    del txn.msgs[:i]
    del txn.row_end[:i]
    txn.nbytes -= dropped
    capture.buffered_bytes -= dropped


def _annotations(content: bytes) -> str:
    return annotations_json(content)
