"""Poison input in `walstream run`: a 50 MB TOASTed value.

Kafka refuses the message (larger than message.max.bytes): it becomes a dead letter
with that reason, and the rows around it are delivered. The file sink writes it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import unique
from tests.kafka import consume
from walstream.config import parse_config
from walstream.delivery.parking import DEAD, ParkingLot
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

BIG = 50 * 1024 * 1024


def test_a_50_mb_value_is_a_dead_letter_for_kafka_and_the_stream_goes_on(
    spark, db, kafka, tmp_path
):
    table = unique("big")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, body text)")
    pub = db.create_publication(table)
    slot = db.create_slot()
    topic = unique("big")
    db.execute(f"INSERT INTO {table} VALUES (1, 'small')")
    # md5 chunks: barely compressible, so the value is TOASTed out of line at full size
    db.execute(
        f"INSERT INTO {table} SELECT 2, string_agg(md5(g::text), '') "
        f"FROM generate_series(1, {BIG // 32}) g"
    )
    db.execute(f"INSERT INTO {table} VALUES (3, 'small too')")
    cfg = parse_config(
        {
            "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
            "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
            "sinks": [
                {"name": "kafka", "source": "app",
                 "destination": {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                                 "topic": topic, "create_topics": True}},
                {"name": "files", "source": "app",
                 "destination": {"type": "file", "path": str(tmp_path / "out")}},
            ],
        }
    )  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    try:
        wait_until(
            lambda: (p := runtime.progress()).get("kafka") is not None
            and p["kafka"].delivered + p["kafka"].dead == 3
            and p.get("files") is not None and p["files"].delivered == 3,
            180, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip
        assert runtime.progress()["kafka"].dead == 1
        dead = ParkingLot(cfg.state_dsn).list(DEAD, "kafka")
        assert [json.loads(p.message.value)["record"]["id"] for p in dead] == [2]
        assert "MSG_SIZE_TOO_LARGE" in dead[0].errors[0]["error"]
        got = consume(kafka.bootstrap_servers, topic, 2)
        assert [json.loads(m.value())["record"]["id"] for m in got] == [1, 3]
        # different keys, possibly different delivery partitions: order only per key
        files = sorted(
            (json.loads(m) for m in read_messages(tmp_path / "out")),
            key=lambda m: m["record"]["id"],
        )
        assert [m["record"]["id"] for m in files] == [1, 2, 3]
        assert len(files[1]["record"]["body"]) == BIG
    finally:
        runtime.stop()
