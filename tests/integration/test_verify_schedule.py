"""Verification as part of running walstream: a sink's `verify: {every: ...}` runs on its
own in `walstream run`, `/health`, `/metrics` and `/api/sinks` show the last result (degraded
while rows differ); `--where` keeps both sides to a predicate; a `walstream verify` killed
with -9 is resumed by the next one (the source pass not read again), and one can be
cancelled from another shell. The table is one users have: a composite text key, jsonb edge
values, arrays with NULLs, some TOASTed text; 60,000 rows (compared by bucket sums)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from tests.integration.test_backfill import mirror_database
from walstream.backfill.store import DONE, BackfillStore
from walstream.cli import app
from walstream.config import load_config
from walstream.delivery.parking import ParkingLot
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until
from walstream.verify.store import VerificationStore

pytestmark = pytest.mark.spark

ROWS = 60_000
TABLE = """CREATE TABLE orders (
    tenant text NOT NULL, id bigint NOT NULL, doc jsonb, tags text[], note text,
    PRIMARY KEY (tenant, id))"""
FILL = """INSERT INTO orders
    SELECT (ARRAY['a', 'b', 'ç d'])[mod(g, 3) + 1], g,
           (ARRAY['{"x": [1, null]}', 'null', '"1"', '{}', NULL])[mod(g, 5) + 1]::jsonb,
           CASE WHEN mod(g, 4) = 0 THEN NULL ELSE ARRAY['t' || g, NULL] END,
           CASE WHEN mod(g, 1000) = 0 THEN repeat(md5(g::text), 400) ELSE 'n' || g END
    FROM generate_series(1, %s) g"""


def verify(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["verify", "pg", "-c", str(config), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def verify_process(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`walstream verify pg` in a process of its own (killed with -9 by the test)."""
    return subprocess.Popen(
        [sys.executable, "-m", "walstream.cli", "verify", "pg", "-c", str(config), "--json",
         "--wait", "600"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def metric(url: str, name: str) -> float | None:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f'{name}{{sink="pg"}}'):
            return float(line.split()[-1])
    return None


def sink_of(url: str) -> dict[str, Any]:
    return next(s for s in httpx.get(f"{url}/health", timeout=10).json()["sinks"])


def test_scheduled_verification_health_where_kill_and_cancel(spark, db, tmp_path):
    db.execute(TABLE)
    db.execute(FILL, (ROWS,))
    db.execute("ANALYZE orders")  # the planner's estimate picks bucket sums
    pub = db.create_publication("orders")
    slot = db.create_slot()
    _, mirror = mirror_database(db)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"port": 0},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "pg", "source": "app", "backfill": "on_create",
                   "verify": {"every": "1d"},
                   "destination": {"type": "postgres", "dsn": mirror}}],
    }))  # fmt: skip
    plan = load_config(config)
    store = VerificationStore(plan.state_dsn, plan.state.schema_)
    started = datetime.now(UTC)
    runtime = Runtime(plan, spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    with supervised(runtime):
        backfills = BackfillStore(plan.state_dsn)
        wait_until(lambda: [b.status for b in backfills.find()] == [DONE], 240, interval=0.5)

        # The schedule verifies the sink on its own (after the backfill), and says so.
        def scheduled() -> Any:
            newest = store.latest().get("pg", (None, None))[0]
            return newest if newest is not None and newest.status == "done" else None

        first = wait_until(scheduled, 180, interval=0.5, message=lambda: f"{store.latest()}")
        assert first.trigger == "schedule" and first.rows_different == 0
        (result,) = first.results
        assert result["source_rows"] == result["sink_rows"] == ROWS and result["buckets"] == 64
        assert sink_of(url)["status"] == "ok"
        assert metric(url, "walstream_verify_rows_different") == 0
        assert metric(url, "walstream_verify_last_success_timestamp") >= started.timestamp()

        # A row lost in the mirror: found by a verification whose --where selects it, not by
        # one that leaves it out; /health is degraded until a verification finds none.
        with psycopg.connect(mirror, autocommit=True) as conn:
            conn.execute("DELETE FROM orders WHERE tenant = 'ç d' AND id = 1001")
        code, out = verify(config, "--where", "tenant = 'a'")
        (table,) = out["tables"]
        assert code == 0 and table["source_rows"] == table["sink_rows"] == ROWS // 3
        code, out = verify(config, "--where", "tenant <> 'a' AND id > 1000")
        (table,) = out["tables"]
        assert code == 1 and table["missing"] == [["ç d", 1001]] and not table["different"]
        (n,) = db.execute("SELECT count(*) FROM orders WHERE tenant <> 'a' AND id > 1000")[0]
        assert table["source_rows"] == table["sink_rows"] + 1 == n
        shown = sink_of(url)
        assert shown["status"] == "warning" and shown["rows_different"] == 1
        assert any("found 1 row(s) that differ" in r for r in shown["reasons"]), shown
        assert httpx.get(f"{url}/health", timeout=10).json()["health"] == "degraded"
        assert metric(url, "walstream_verify_rows_different") == 1

        # kill -9 while it waits for the (paused) sink, after its pass over the source.
        ParkingLot(plan.state_dsn).set_paused("pg", True, "test")
        killed = verify_process(config, tmp_path / "killed.log")

        def waiting() -> Any:
            running = store.running("pg")
            progress = running.progress if running is not None else None
            return running if progress and progress["phase"] == "sink" else None

        cut = wait_until(waiting, 120, interval=0.2, message=lambda: f"{store.running('pg')}")
        assert cut.owner.endswith(f":{killed.pid}") and cut.progress["source"]["rows"] == ROWS
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(30)
        assert store.dead(store.get(cut.id))
        # /health shows it (its snapshot is up to a second old: the kill can come sooner)
        wait_until(lambda: sink_of(url)["verification"]["id"] == cut.id, 10, interval=0.2)
        assert sink_of(url)["verification"]["status"] == "running"

        # Another one takes it over, and is cancelled from another shell.
        taker = verify_process(config, tmp_path / "taker.log")
        wait_until(
            lambda: (store.get(cut.id).owner or "").endswith(f":{taker.pid}"), 120, interval=0.2
        )
        cancel = CliRunner().invoke(app, ["verify", "pg", "-c", str(config), "--cancel"])
        assert cancel.exit_code == 0 and f"cancelled verification {cut.id}" in cancel.output
        assert taker.wait(60) == 2
        assert "was cancelled" in (tmp_path / "taker.log").read_text()
        assert store.get(cut.id).status == "cancelled"

        # Killed again: the next verification resumes it once the sink goes on, without
        # reading the source again (its sums do not have a row inserted after the kill,
        # which the sink has), and finds the lost row, not the new one.
        killed = verify_process(config, tmp_path / "killed2.log")
        cut = wait_until(waiting, 120, interval=0.2, message=lambda: f"{store.running('pg')}")
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(30)
        db.execute("INSERT INTO orders VALUES ('b', 999999, '{\"late\": true}', '{}', 'late')")
        ParkingLot(plan.state_dsn).set_paused("pg", False)
        t0 = time.monotonic()
        code, out = verify(config)
        (table,) = out["tables"]
        assert out["verification"] == cut.id and out["resumed"] is True
        assert code == 1 and table["missing"] == [["ç d", 1001]]
        assert not table["different"] and not table["extra"]
        assert (table["source_rows"], table["sink_rows"]) == (ROWS, ROWS)
        print(f"resumed verification: {time.monotonic() - t0:.1f}s")
        assert store.get(cut.id).status == "done"
