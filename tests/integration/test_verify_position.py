"""How `walstream verify` knows the sink caught up (`Position.reach`): a heartbeat it writes
into the WAL, confirmed by the sink's slot. Spark confirms a batch to the source only when
it plans the next one, so on a quiet source — walstream's own heartbeat ten minutes away —
the batch holding verify's heartbeat is confirmed only because verify writes more while it
waits."""

from __future__ import annotations

import pytest

from tests.conftest import unique
from tests.lake import run_config
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until
from walstream.verify.run import Position

pytestmark = pytest.mark.spark


def test_the_sink_is_seen_caught_up_on_a_quiet_source(spark, db, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = unique("slot")
    db.slots.append(slot)
    data = run_config(db, tmp_path, slot, pub, [
        {"name": "files", "source": "app", "destination": {"type": "file", "path": str(tmp_path / "out")}},
    ])  # fmt: skip
    data["sources"][0]["heartbeat_interval"] = 600  # nothing else writes to the WAL
    runtime = Runtime(parse_config(data), spark=spark).start()
    with supervised(runtime):
        db.execute("INSERT INTO t VALUES (1)")
        wait_until(
            lambda: (p := runtime.progress().get("files")) is not None and p.delivered >= 1, 120
        )
        for _ in range(3):  # each look on the quiet source: its heartbeat confirmed
            mark = Position(db.dsn, [slot], "app", 20).reach()
            confirmed = db.execute(
                "SELECT confirmed_flush_lsn - %s::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (f"{mark >> 32:X}/{mark & 0xFFFFFFFF:X}", slot),
            )[0][0]
            assert confirmed >= 0
