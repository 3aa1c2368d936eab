"""The capture reads its replication connection in bursts (capture/stream.py: read_burst):
bounded, in order, nothing dropped, and the position it reports is the burst's highest."""

from __future__ import annotations

import time

from walstream.capture import stream
from walstream.capture.stream import (
    read_burst,
    replication_connection,
    start_options,
    wait_for_messages,
)
from walstream.testing import wait_until


def test_bursts_are_bounded_and_together_hold_every_message_in_order(db, monkeypatch):
    monkeypatch.setattr(stream, "BURST", 300)
    monkeypatch.setattr(stream, "BURST_BYTES", 20_000)
    db.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    db.execute("INSERT INTO t SELECT g, repeat('x', 10) FROM generate_series(1, 2500) g")
    small_end = db.execute("SELECT pg_current_wal_lsn()::text")[0][0]
    # 200 rows of 8 KB: the byte bound ends a burst before its message count does
    db.execute("INSERT INTO t SELECT g, repeat('y', 8192) FROM generate_series(2501, 2700) g")
    until = db.mark()
    expected = [m.payload for m in db.read(slot, pub)]  # the same stream, read message by message
    big = [m for m in expected if m[:1] == b"I" and len(m) > 8192]
    assert sum(m[:1] == b"I" for m in expected) == 2700 and len(big) == 200

    # db.read's walsender releases the slot as it exits, after its client has gone
    active = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
    wait_until(lambda: not db.execute(active, (slot,))[0][0], 30,
               message="the slot stayed active after reading it")  # fmt: skip
    conn = replication_connection(db.dsn)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, options=start_options(pub))
        # Read once the walsender has sent the small rows: they wait in the socket, and
        # the first bursts are full.
        sent = (
            "SELECT r.sent_lsn >= %s::pg_lsn FROM pg_stat_replication r JOIN "
            "pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s"
        )
        wait_until(lambda: (db.execute(sent, (small_end, slot)) or [(False,)])[0][0], 30,
                   message="the walsender did not send the small rows")  # fmt: skip
        got: list[bytes] = []
        sizes: list[tuple[int, int]] = []
        highest = 0
        deadline = time.monotonic() + 60
        while len(got) < len(expected):
            assert time.monotonic() < deadline, f"only {len(got)} of {len(expected)} arrived"
            burst, at, received = read_burst(cur)
            if not burst:
                wait_for_messages(cur, 0.5)
                continue
            assert received >= highest and received == max(at) and len(at) == len(burst)
            # each message's own WAL position, in order (a Relation message has none: 0)
            placed = [a for a, m in zip(at, burst, strict=True) if m[:1] != b"R"]
            assert placed == sorted(placed) and all(placed)
            highest = received
            sizes.append((len(burst), sum(map(len, burst))))
            got += burst
    finally:
        conn.close()
    assert got == expected
    assert sizes[0][0] == 300, sizes  # the small rows: the count ends the burst
    assert all(n <= 300 for n, _ in sizes), sizes
    # a burst ends with the message that takes it to BURST_BYTES or past (a big row: 3 of them)
    assert all(size - 8300 < 20_000 for _, size in sizes), sizes
    assert (3, 3 * len(big[0])) in sizes, sizes
    assert highest >= until  # the mark and its Commit are in: their WAL position
