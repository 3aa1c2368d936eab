"""Heartbeats are written only while the slot is quiet: other logical decoders on the
database (Debezium shows each as an `op: m` event) see them only when nothing else moves
the slot. Their prefix is the documented `walstream:heartbeat`."""

from __future__ import annotations

import threading

from walstream.capture.heartbeat import Heartbeat
from walstream.decode import pgoutput as po
from walstream.testing import wait_until


def heartbeats(db, slot: str, pub: str) -> list[bytes]:
    parser = po.PgOutputParser()
    out = []
    for m in db.read(slot, pub):
        msg = parser.parse(m.payload)
        if isinstance(msg, po.Message) and msg.prefix == "walstream:heartbeat":
            out.append(msg.content)
    return out


def test_a_heartbeat_is_written_only_when_no_change_arrived_for_an_interval(db):
    db.execute("CREATE TABLE t (id int)")
    pub, slot = db.create_publication("t"), db.create_slot()
    busy = threading.Event()
    busy.set()  # changes arrive: no heartbeat is needed
    beat = Heartbeat(db.dsn, slot, 0.2, busy=busy.is_set).start()
    try:
        wait_until(lambda: beat.skipped >= 5, 30)
        assert beat.sent == 0
        assert heartbeats(db, slot, pub) == []
        busy.clear()  # quiet: heartbeats keep the slot moving
        wait_until(lambda: beat.sent >= 2, 30)
    finally:
        beat.stop()
    found = heartbeats(db, slot, pub)
    assert len(found) >= 2 and all(b'"slot": "' + slot.encode() + b'"' in c for c in found)
