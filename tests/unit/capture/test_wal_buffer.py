"""The WAL buffer: cursors, batch ends, slices, commits and confirmations (no connection)."""

from __future__ import annotations

import struct

from walstream.capture.wal_buffer import WalBuffer

INSERT = b"I" + struct.pack("!I", 16384) + b"N\x00\x00"  # a row change (contents unread)


def truncate(tables: int) -> bytes:
    return b"T" + struct.pack("!i", tables) + b"\x00"


def fill(buf: WalBuffer, lsn: int, msgs: list[bytes], end: int | None = None) -> None:
    txn = buf.begin(lsn, xid=lsn, commit_ts=0, relations={})
    assert txn is not None
    for i, m in enumerate(msgs):
        buf.add(txn, m, {}, lsn - 50 + i)  # each message's own WAL position, before the commit
    if end is not None:
        buf.complete(txn, end)


def test_a_batch_ends_within_its_row_budget_at_a_message_boundary() -> None:
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [INSERT, INSERT, truncate(3), INSERT], end=110)  # rows 0 1 2-4 5
    fill(buf, 200, [INSERT, INSERT], end=210)
    start = (0, -1)
    assert buf.latest(start) == (200, 1)  # everything
    assert buf.latest(start, max_rows=2) == (100, 1)
    assert buf.latest(start, max_rows=3) == (100, 1)  # the truncate's 3 rows do not fit
    assert buf.latest(start, max_rows=6) == (100, 5)  # the whole first transaction
    assert buf.latest((100, 1), max_rows=1) == (100, 4)  # at least one message
    assert buf.latest((100, 5), max_rows=1) == (200, 0)


def test_slices_hold_the_changes_after_start_up_to_end_with_their_first_seq() -> None:
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [INSERT, INSERT, INSERT], end=110)
    fill(buf, 200, [INSERT, INSERT], end=210)
    slices = buf.slices((100, 0), (200, 0))
    assert [(s.lsn, s.seq, len(s.msgs)) for s in slices] == [(100, 1, 2), (200, 0, 1)]
    assert [s.at for s in slices] == [[51, 52], [150]]  # each message's own WAL position
    assert buf.covers((200, 1)) and not buf.covers((300, 0))


def test_commit_trims_and_confirms_only_whole_transactions() -> None:
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [INSERT, INSERT], end=110)
    fill(buf, 200, [INSERT, INSERT], end=210)
    total = buf.buffered_bytes
    buf.commit((200, 0))  # half of the second transaction
    assert buf.confirm_lsn == 110  # only the first is confirmed to Postgres
    assert [t.lsn for t in buf.txns] == [200] and 0 < buf.buffered_bytes < total
    assert [(s.seq, s.at) for s in buf.slices((200, 0), (200, 1))] == [(1, [151])]  # trimmed
    buf.commit((200, 1))
    assert buf.confirm_lsn == 210 and buf.buffered_bytes == 0 and not buf.txns


def test_what_spark_committed_before_a_restart_is_not_buffered_again() -> None:
    buf = WalBuffer(floor=(100, 1))
    fill(buf, 100, [INSERT, INSERT, INSERT], end=110)
    assert [(s.seq, s.at) for s in buf.slices((100, 1), (100, 2))] == [(2, [52])]
    assert buf.latest((100, 1)) == (100, 2)


def test_a_reconnect_resends_whole_transactions_which_are_skipped_or_replaced() -> None:
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [INSERT], end=110)
    fill(buf, 200, [INSERT])  # cut off before its commit
    assert buf.begin(100, 100, 0, {}) is None  # held already
    buf.drop_partial()
    assert [t.lsn for t in buf.txns] == [100]
    fill(buf, 200, [INSERT, INSERT], end=210)  # resent whole
    assert buf.latest((100, 0)) == (200, 1)


def test_a_transaction_without_rows_moves_the_offset() -> None:
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [], end=110)  # a heartbeat's transaction
    assert buf.latest((0, -1)) == (100, -1)
    buf.commit((100, -1))
    assert buf.confirm_lsn == 110


def mark(kind: str) -> bytes:
    """A transactional pgoutput Message of a backfill watermark, as the chunk reader emits it."""
    from walstream.backfill.read import ChunkTask, watermark_content
    from walstream.decode.decoder import WATERMARK_PREFIX

    task = ChunkTask("dsn", "src", 7, 3, 0, "", (), (), (), (), "/tmp/x")
    body = watermark_content(task, kind, rows=5).encode()
    return (
        b"M\x01" + struct.pack("!Q", 1) + WATERMARK_PREFIX.encode() + b"\0"
        + struct.pack("!i", len(body)) + body
    )  # fmt: skip


def test_a_low_watermark_alone_waits_for_what_follows_it() -> None:
    """A backfill's low watermark with nothing after it is no batch of its own (deferred);
    its high watermark, a change or a heartbeat after it takes it along; without deferral
    (Trigger.AvailableNow) it is a batch as any message."""
    buf = WalBuffer(floor=(0, -1))
    fill(buf, 100, [INSERT], end=110)
    fill(buf, 200, [mark("low")], end=210)
    assert buf.latest((0, -1), defer_low_marks=True) == (100, 0)
    assert buf.latest((100, 0), defer_low_marks=True) == (100, 0)  # nothing to do yet
    assert buf.latest((100, 0)) == (200, 0)
    fill(buf, 300, [mark("low")], end=310)  # another chunk's
    assert buf.latest((100, 0), defer_low_marks=True) == (100, 0)
    fill(buf, 400, [mark("high")], end=410)
    assert buf.latest((100, 0), defer_low_marks=True) == (400, 0)
    assert [s.lsn for s in buf.slices((100, 0), (400, 0))] == [200, 300, 400]
    for after in ([INSERT], []):  # a change, a heartbeat
        b = WalBuffer(floor=(0, -1))
        fill(b, 200, [mark("low")], end=210)
        fill(b, 300, after, end=310)
        assert b.latest((0, -1), defer_low_marks=True) == (300, 0 if after else -1)
    # a transaction holding a low watermark and a change is no watermark alone
    b = WalBuffer(floor=(0, -1))
    fill(b, 200, [mark("low"), INSERT], end=210)
    assert b.latest((0, -1), defer_low_marks=True) == (200, 1)


def test_a_handover_marks_the_first_transaction_at_or_after_its_commit_end() -> None:
    """Another tool (Debezium) left the slot after the commit ending at 150 and in the middle
    of the next transaction, its changes through 205 delivered: that transaction carries
    the mark; the ones before are below the floor, the ones after carry none."""
    buf = WalBuffer(floor=(150, -1), handed_over=(150, 205))
    fill(buf, 100, [INSERT, INSERT], end=110)  # committed before: below the floor
    fill(buf, 250, [INSERT, INSERT, INSERT], end=260)  # changes at 200, 201, 202
    fill(buf, 300, [INSERT], end=310)
    assert buf.latest((150, -1)) == (300, 0)
    slices = buf.slices((150, -1), (300, 0))
    assert [(s.lsn, s.delivered_through) for s in slices] == [(250, 205), (300, None)]
