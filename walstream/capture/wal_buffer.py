"""The WAL buffer: transactions read from a slot that Spark has not committed yet.

Raw pgoutput messages are kept grouped by transaction, each change known by its WAL
cursor `(commit lsn, seq)` without decoding a row: `seq` is a change's 0-based index
among the rows of its transaction (a Truncate of N tables is N rows); a transaction
without rows (a heartbeat) has the offset `(lsn, -1)`. Spark asks for the offset a
batch may end at (`latest`), for the changes in `(start, end]` (`slices`), and says
what it committed (`commit`): the buffer is trimmed and the end LSN of every whole
transaction at or below it may be confirmed to Postgres (`confirm_lsn`).

No I/O and no locking here: `reader.py` owns the connection and the lock.
"""

from __future__ import annotations

import bisect
import struct
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from walstream.decode import pgoutput as po
from walstream.decode.decoder import (
    ANNOTATIONS_PREFIX,
    WATERMARK_PREFIX,
    RelationInfo,
    annotations_json,
)

Cursor = tuple[int, int]
_MSG_OVERHEAD = 64  # bytes of Python object overhead counted per buffered message


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
    at: list[int] = field(default_factory=list)  # msgs[i]'s WAL position (its own LSN)
    row_end: list[int] = field(default_factory=list)  # rows through msgs[i] (absolute seq + 1)
    rows: int = 0  # rows seen so far, including trimmed ones
    end_lsn: int | None = None  # set by Commit
    nbytes: int = 0
    #: Whether every message so far is a backfill's low watermark (`is_low_mark`).
    low_marks_only: bool = True
    #: The end LSN of the commit before this transaction in the stream (None: not known).
    last_commit_lsn: int | None = None
    #: Its changes at or before this WAL position were delivered by the tool walstream
    #: took the slot over from (`WalBuffer`'s `handed_over`): decoded, never sent.
    delivered_through: int | None = None

    @property
    def complete(self) -> bool:
        return self.end_lsn is not None

    def last_cursor(self) -> Cursor:
        return (self.lsn, self.rows - 1)


@dataclass(frozen=True)
class TxnSlice:
    """Messages of one transaction within a slice, with the context to decode them."""

    lsn: int
    xid: int
    commit_ts: int
    seq: int  # seq of the first row in msgs
    annotations: str | None
    relations: tuple[RelationInfo, ...]
    msgs: list[bytes]
    nbytes: int
    at: list[int]  # each message's WAL position (a change's own LSN)
    last_commit_lsn: int | None = None  # the end of the commit before this transaction
    delivered_through: int | None = None  # its changes up to here were delivered (Txn)


_WATERMARK = WATERMARK_PREFIX.encode() + b"\0"
#: A low watermark's mark, as `backfill.read.watermark_content` writes it.
_LOW_MARK = b'"mark": "low"'


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


def is_low_mark(raw: bytes) -> bool:
    """Whether a raw message is a backfill chunk's low watermark: it opens the chunk's window
    and is needed only with what follows it (its high watermark, or a change inside)."""
    return raw[0] == 77 and bool(raw[1] & 1) and raw.startswith(_WATERMARK, 10) and _LOW_MARK in raw


class WalBuffer:
    """The transactions in the buffer, in WAL order (see the module docstring)."""

    def __init__(
        self,
        floor: Cursor,
        primary_keys: Mapping[tuple[str, str], Sequence[str]] | None = None,
        handed_over: tuple[int, int] | None = None,
    ) -> None:
        """`handed_over`: (commit end, processed): the first transaction committed at or
        after the commit end had its changes up to `processed` delivered by the tool
        walstream took the slot over from (the ones before it are below `floor`)."""
        self._handed_over = handed_over
        self.floor: Cursor = floor  # everything <= floor is committed by Spark: never buffered
        self.primary_keys = dict(primary_keys or {})
        self.txns: deque[Txn] = deque()
        self.ends: deque[tuple[int, int, int]] = deque()  # (lsn, end_lsn, rows) of complete txns
        self.buffered_bytes = 0
        self.confirm_lsn = 0  # what Postgres may be told is safe
        self.last_complete_lsn = 0
        #: The end LSN of the last commit received: the next transaction's
        #: `last_commit_lsn` (the reader starts it at the slot's confirmed position).
        self.last_end: int | None = None

    def begin(
        self, lsn: int, xid: int, commit_ts: int, relations: Mapping[int, RelationInfo]
    ) -> Txn | None:
        """A transaction starts; None when it is one we hold already (a reconnect resends
        whole transactions after the confirmed position)."""
        if lsn <= self.last_complete_lsn:
            return None
        txn = Txn(lsn, xid, commit_ts, relations, None, 0, last_commit_lsn=self.last_end)
        if self._handed_over is not None and lsn >= self._handed_over[0]:
            txn.delivered_through, self._handed_over = self._handed_over[1], None
        self.txns.append(txn)
        return txn

    def add(self, txn: Txn, raw: bytes, relations: Mapping[int, RelationInfo], lsn: int) -> int:
        """Keep a message of `txn` at WAL position `lsn` (unless Spark committed its rows
        already); its rows."""
        n = row_count(raw)
        txn.rows += n
        if txn.low_marks_only and not is_low_mark(raw):
            txn.low_marks_only = False
        if not txn.msgs:
            txn.relations = relations
            if n and (txn.lsn, txn.rows - 1) <= self.floor:
                txn.first_seq = txn.rows  # committed by Spark already: skip, keep context
                return 0
            txn.first_seq = txn.rows - n
        txn.msgs.append(raw)
        txn.at.append(lsn)
        txn.row_end.append(txn.rows)
        size = len(raw) + _MSG_OVERHEAD
        txn.nbytes += size
        self.buffered_bytes += size
        return n

    def complete(self, txn: Txn, end_lsn: int) -> None:
        """`txn`'s Commit arrived (its end LSN is what Postgres may be told once it is in)."""
        txn.end_lsn = end_lsn
        self.last_complete_lsn = txn.lsn
        self.last_end = end_lsn
        self.ends.append((txn.lsn, end_lsn, txn.rows))
        if txn.last_cursor() <= self.floor:
            self._drop(txn)

    def drop_partial(self) -> None:
        """After (re)connecting Postgres resends whole transactions: drop a partial one."""
        if self.txns and not self.txns[-1].complete:
            t = self.txns.pop()
            self.buffered_bytes -= t.nbytes

    def _drop(self, txn: Txn) -> None:
        try:
            self.txns.remove(txn)
        except ValueError:
            return
        self.buffered_bytes -= txn.nbytes

    def latest(
        self, start: Cursor, max_rows: int | None = None, defer_low_marks: bool = False
    ) -> Cursor:
        """The offset a batch starting after `start` may end at: at most `max_rows` rows
        (but at least one message), at a message boundary.

        `defer_low_marks`: transactions of backfill low watermarks only, with nothing after
        them, are left to the next batch: alone they cost a batch that does nothing (a
        backfill's chunk emits its high watermark a second later). Whatever comes next takes
        them along."""
        budget = max_rows if max_rows is not None else 1 << 62
        best = firm = start
        for txn in self.txns:
            if txn.lsn < start[0]:
                continue
            if not txn.row_end or txn.row_end[-1] == txn.first_seq:
                if txn.complete and txn.rows == 0 and (txn.lsn, -1) > best:
                    best = firm = (txn.lsn, -1)  # a transaction without rows (heartbeat)
                continue
            first = max(txn.first_seq, start[1] + 1) if txn.lsn == start[0] else txn.first_seq
            last = txn.row_end[-1]  # rows buffered, as absolute seq + 1
            if last <= first:
                continue
            if last - first <= budget:
                budget -= last - first
                best = (txn.lsn, last - 1)
                if not (defer_low_marks and txn.low_marks_only):
                    firm = best
                continue
            # cut inside this transaction at the last message boundary within budget
            j = bisect.bisect_right(txn.row_end, first + budget) - 1
            if j < 0 or txn.row_end[j] <= first:
                if best != start:
                    return best
                j = bisect.bisect_right(txn.row_end, first)  # at least one message
            return (txn.lsn, txn.row_end[j] - 1)
        return firm if defer_low_marks else best

    def covers(self, end: Cursor) -> bool:
        """Whether everything up to `end` has been received."""
        if self.last_complete_lsn >= end[0]:
            return True
        return any(t.lsn == end[0] and t.rows - 1 >= end[1] for t in self.txns)

    def slices(self, start: Cursor, end: Cursor) -> list[TxnSlice]:
        """The buffered messages of the changes in (start, end], per transaction, each with
        the context (relations, annotations) to decode them; `covers(end)` must hold."""
        out = []
        for txn in self.txns:
            if txn.lsn < start[0] or txn.lsn > end[0] or not txn.msgs:
                continue
            i0 = _first_after(txn, start[1]) if txn.lsn == start[0] else 0
            i1 = _first_after(txn, end[1]) if txn.lsn == end[0] else len(txn.msgs)
            if i0 >= i1:
                continue
            relations, annotations = _context(txn, i0, self.primary_keys)
            msgs = txn.msgs[i0:i1]
            out.append(
                TxnSlice(
                    txn.lsn,
                    txn.xid,
                    txn.commit_ts,
                    txn.row_end[i0 - 1] if i0 else txn.first_seq,
                    annotations,
                    tuple(relations.values()),
                    msgs,
                    sum(len(m) for m in msgs),
                    txn.at[i0:i1],
                    txn.last_commit_lsn,
                    txn.delivered_through,
                )
            )
        return out

    def commit(self, end: Cursor) -> None:
        """Spark committed everything <= end: trim the buffer, confirm whole transactions."""
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
                self._trim(txn, _first_after(txn, end[1]))
            break

    def _trim(self, txn: Txn, i: int) -> None:
        """Drop txn.msgs[:i] (committed by Spark), keeping the context the rest needs."""
        if i <= 0:
            return
        txn.relations, txn.annotations = _context(txn, i, self.primary_keys)
        dropped = sum(len(m) + _MSG_OVERHEAD for m in txn.msgs[:i])
        txn.first_seq = txn.row_end[i - 1]
        del txn.msgs[:i]
        del txn.at[:i]
        del txn.row_end[:i]
        txn.nbytes -= dropped
        self.buffered_bytes -= dropped


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
                annotations = annotations_text(msg.content)
    return (tuple(by_oid.values()) if changed else relations), annotations


def annotations_text(content: bytes) -> str:
    return annotations_json(content)
