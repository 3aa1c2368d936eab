"""`state: {dsn, schema}` and `spark.trigger_interval` in a real run: walstream's own
tables (ledger, parking) live in the state database and schema given, none in the
source's database; with changes coming every quarter second, micro-batches start at most
once per interval."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.servers import WebhookReceiver
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

pytestmark = pytest.mark.spark

N = 40  # changes, one every 0.25 s after the first: 10 s of them


def tables_in(db: Any, schema: str) -> set[str]:
    rows = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    return {r[0] for r in rows}


def test_state_lives_where_configured_and_batches_keep_the_trigger_interval(
    spark, db, other_db, tmp_path
):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    rx = WebhookReceiver().start()
    cfg = parse_config({
        "state": {"dsn": other_db.dsn, "schema": "ops"},
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt"), "trigger_interval": "5s"},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "hook", "source": "app",
                   "destination": {"type": "webhook", "url": rx.url()}}],
    })  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    try:
        with supervised(runtime):
            db.execute("INSERT INTO t VALUES (0, 'v')")  # the query runs: from here, time it
            wait_until(lambda: len(rx.requests) == 1, 120, message="the first change")
            began = time.monotonic()
            for i in range(1, N):  # the workload's pace, not a wait for a result
                db.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
                time.sleep(0.25)
            wait_until(lambda: len(rx.requests) == N, 60, message=lambda: f"{len(rx.requests)}")
            span = time.monotonic() - began
            progress = runtime.queries[0].query.recentProgress
    finally:
        rx.stop()
    assert [json.loads(r.body)["record"]["id"] for r in rx.requests] == list(range(N))
    assert {"delivery_ledger", "parked_messages", "sink_state"} <= tables_in(other_db, "ops")
    assert tables_in(db, "ops") == set() and tables_in(db, "walstream") == set()
    ledger = other_db.execute("SELECT count(*) FROM ops.delivery_ledger WHERE sink = 'hook'")
    assert ledger[0][0] >= 1  # the sink's deliveries are booked there
    batches = [p["timestamp"] for p in progress if p["numInputRows"] > 0][1:]  # after the first
    # One batch per 5 s at most, on Spark's grid (+1 for where the span cuts it). Without
    # the interval, a batch as soon as the last one ends: 7 or more here.
    print(f"batches: {len(batches)} in {span:.1f}s")
    assert 1 <= len(batches) <= span / 5 + 1, (span, batches)
