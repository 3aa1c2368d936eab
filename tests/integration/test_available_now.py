"""Trigger.AvailableNow: a query (or `walstream run --until-caught-up`) delivers every change
committed before it started, in batches of at most maxChangesPerBatch, then ends; what is
committed later arrives in the next run, nothing twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import unique
from tests.streams import StreamRun
from walstream.sinks.file import read_messages

pytestmark = pytest.mark.spark

NOW = {"availableNow": True}


def drained(spark, ckpt: Path, trigger: dict[str, bool] = NOW, **opts: str) -> list[list[int]]:
    """One AvailableNow (or `trigger`) run to its end: the ids of each non-empty batch."""
    with StreamRun(spark, ckpt, trigger=trigger, **opts) as run:
        assert run.query.awaitTermination(180), "the query did not end"
        assert run.query.exception() is None
        return [[int(r.pk[0]) for r in rows] for _, rows in run.collected.batches if rows]


def test_available_now_reads_what_was_committed_before_it_started_then_ends(spark, db, tmp_path):
    db.execute("CREATE TABLE an (id int PRIMARY KEY)")
    pub = db.create_publication("an")
    slot = unique("slot")
    db.slots.append(slot)
    opts = {"dsn": db.dsn, "slot": slot, "publication": pub, "maxChangesPerBatch": "1000"}
    ckpt = tmp_path / "ckpt"
    assert drained(spark, ckpt, **opts) == []  # creates the slot; nothing before it

    db.execute("INSERT INTO an SELECT g FROM generate_series(1, 2500) g")
    db.execute("INSERT INTO an SELECT g FROM generate_series(2501, 3000) g")
    batches = drained(spark, ckpt, **opts)
    assert [i for b in batches for i in b] == list(range(1, 3001))
    assert len(batches) >= 3 and all(len(b) <= 1000 for b in batches)

    assert drained(spark, ckpt, **opts) == []  # nothing new: ends at once, delivers nothing
    db.execute("INSERT INTO an VALUES (4000)")
    assert drained(spark, ckpt, **opts) == [[4000]]


def test_trigger_once_reads_what_was_committed_before_it_started_in_one_batch(spark, db, tmp_path):
    db.execute("CREATE TABLE onc (id int PRIMARY KEY)")
    pub = db.create_publication("onc")
    slot = unique("slot")
    db.slots.append(slot)
    opts = {"dsn": db.dsn, "slot": slot, "publication": pub, "maxChangesPerBatch": "1000"}
    ckpt = tmp_path / "ckpt"

    def once() -> list[list[int]]:
        return drained(spark, ckpt, trigger={"once": True}, **opts)

    assert once() == []  # creates the slot; nothing before it
    db.execute("INSERT INTO onc SELECT g FROM generate_series(1, 2500) g")
    db.execute("INSERT INTO onc SELECT g FROM generate_series(2501, 3000) g")
    # One batch with everything committed before the query started (Trigger.Once reads
    # all that is available, past maxChangesPerBatch); nothing of it again afterwards.
    assert once() == [list(range(1, 3001))]
    assert once() == []
    db.execute("INSERT INTO onc VALUES (4000)")
    assert once() == [[4000]]


def run_until_caught_up(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walstream.cli", "run", "-c", str(config), "--until-caught-up"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_walstream_run_until_caught_up_delivers_the_slot_and_exits(db, tmp_path):
    db.execute("CREATE TABLE uc (id int PRIMARY KEY, v text)")
    pub = db.create_publication("uc")
    slot = unique("slot")
    db.slots.append(slot)
    out = tmp_path / "out"
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(out)}}],
    }))  # fmt: skip
    first = run_until_caught_up(config)  # creates the slot, finds nothing, exits
    assert first.returncode == 0, first.stdout + first.stderr
    assert "caught up; delivered this run: {'files': 0}" in first.stdout

    db.execute("INSERT INTO uc SELECT g, 'v' || g FROM generate_series(1, 1500) g")
    db.execute("UPDATE uc SET v = 'changed' WHERE id <= 10")
    second = run_until_caught_up(config)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "delivering what the slots hold now, then stopping" in second.stdout
    # What it does and waits for while it starts, in that order.
    said = [f"source app: checking its slot {slot} and publication {pub}",
            "starting Spark (local[2]): its JVM and Python workers", "Spark is up (",
            f"source app: streaming from slot {slot}; the first batch waits"]  # fmt: skip
    at = [second.stdout.find(s) for s in said]
    assert -1 not in at and at == sorted(at), second.stdout
    assert "caught up; delivered this run: {'files': 1510}" in second.stdout
    got = sorted((json.loads(m) for m in read_messages(out)),
                 key=lambda m: (m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"]))  # fmt: skip
    assert [(m["action"], m["record"]["id"]) for m in got] == [
        ("insert", i) for i in range(1, 1501)
    ] + [("update", i) for i in range(1, 11)]
