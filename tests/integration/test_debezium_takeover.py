"""Taking over from Debezium with no gap and no duplicate: Debezium 3.6 streams part of a
write load from its slot and stops in the middle of a transaction; `walstream import
debezium` turns its connector's config and offset file into walstream.yaml; `walstream
run` continues on Debezium's slot. A test_decoding slot made before any write is the
truth: what Debezium sent and what walstream sent together are every change exactly once
(by each change's own LSN, `source.lsn`), in the same records Debezium would have sent."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import yaml

from tests.conftest import fresh_database, unique
from tests.debezium_engine import connector_settings, run_until
from tests.kafka import consume
from walstream.change import parse_lsn
from walstream.config import parse_config
from walstream.importers.debezium import import_debezium
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def changes(db: Any, slot: str) -> list[int]:
    """Each change's LSN, as test_decoding reads the slot (inserts, updates, deletes)."""
    rows = db.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)",
                      (slot,))  # fmt: skip
    return [parse_lsn(lsn) for lsn, data in rows if data.startswith("table public.acct:")]


def test_walstream_continues_on_debeziums_slot_where_debezium_stopped(spark, pg, kafka, tmp_path):
    prefix = unique("takeover")
    with fresh_database(pg) as db:
        db.execute("CREATE TABLE acct (id int PRIMARY KEY, v text, n numeric(8,2))")
        pub = db.create_publication("acct")
        truth = db.create_slot("test_decoding")
        slot = db.create_slot()
        for i in range(10):  # ten transactions of one change ...
            db.execute("INSERT INTO acct VALUES (%s, 'a', %s)", (i, i / 4))
        with db.conn.transaction():  # ... and one of ten, which Debezium stops inside
            for i in range(10):
                db.execute("UPDATE acct SET v = v || 'b', n = n + 1 WHERE id = %s", (i,))
        settings = connector_settings(pg, db.name, slot, pub, {
            "topic.prefix": prefix, "max.batch.size": "3", "offset.flush.interval.ms": "0",
            "message.prefix.exclude.list": "walstream:.*",
        }, tmp_path)  # fmt: skip
        theirs = run_until(settings, 14, tmp_path)  # 10 inserts, 4+ of the 10 updates
        assert 14 <= len(theirs) < 20, len(theirs)  # it stopped inside the transaction
        # Writes while nothing reads the slot.
        for i in range(10, 15):
            db.execute("INSERT INTO acct VALUES (%s, 'c', 1.5)", (i,))
        db.execute("DELETE FROM acct WHERE id IN (0, 1)")
        db.execute("UPDATE acct SET v = 'd' WHERE id = 5")

        connector = tmp_path / "connector.json"
        connector.write_text(json.dumps({"name": "inventory", "config": settings}))
        imported = import_debezium(connector, tmp_path / f"offsets-{slot}.dat",
                                   kafka.bootstrap_servers)  # fmt: skip
        config = imported.config
        assert config["sources"][0]["slot"] == slot and "handover" in config["sources"][0]
        assert "processed" in config["sources"][0]["handover"]  # inside a transaction
        config["spark"] = {"checkpoint_dir": str(tmp_path / "ckpt")}
        path = tmp_path / "walstream.yaml"
        path.write_text(yaml.safe_dump(config))  # the file a user runs
        expected = changes(db, truth)
        runtime = Runtime(parse_config(yaml.safe_load(path.read_text())), spark=spark).start()
        try:
            mine_count = len(expected) - len([r for r in theirs if r["value"] is not None]) + 2

            def delivered() -> bool:
                runtime.poll()
                p = runtime.progress().get("debezium")
                return p is not None and p.delivered >= mine_count

            wait_until(delivered, 180, interval=0.5, message=lambda: f"{runtime.progress()}")
        finally:
            runtime.stop()
    mine = consume(kafka.bootstrap_servers, f"{prefix}.public.acct", mine_count)
    sent = [r["value"]["payload"] for r in theirs if r["value"] is not None]
    sent += [json.loads(m.value())["payload"] for m in mine if m.value() is not None]
    # every change exactly once, across the two
    assert Counter(p["source"]["lsn"] for p in sent) == Counter(expected)
    # walstream's records are Debezium's: the ops and keys it went on with
    ops = [json.loads(m.value())["payload"]["op"] for m in mine if m.value() is not None]
    tombstones = [json.loads(m.key())["payload"] for m in mine if m.value() is None]
    assert ops.count("d") == 2 and tombstones == [{"id": 0}, {"id": 1}]
    assert ops.count("c") == 5 and ops.count("u") == 10 - (len(theirs) - 10) + 1
