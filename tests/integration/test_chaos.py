"""Chaos: `walstream run` streams a 50k-change workload to files and Kafka while the test
kills it (kill -9), hangs the broker, restarts Postgres with an immediate shutdown, and
makes the Kafka sink fail for a while (the shipped fault-injecting destination).

Afterwards: every change is in the files exactly once; Kafka has every change except
those of the poison keys, which are dead letters with their reason; per-key order
holds in both; Kafka's duplicates stay within the ledger's window; and the table
rebuilt from each sink equals the source table.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import TEST_SETTINGS, TestDatabase, unique
from tests.integration.test_run_crash import Run, cursor, oracle
from tests.kafka import consume_all
from walstream.change import idempotency_key
from walstream.delivery.parking import DEAD, PARKED, ParkingLot
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.sinks.file import read_messages
from walstream.testing import TansuBroker, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

KEYS = 1000
POISON = {7, 77, 777}  # non-retryable for Kafka: dead letters on purpose
WINDOW = set(range(200, 300))  # fail retryably while the switch file exists: parked, retried
BATCH_SIZE, PARTITIONS = 200, 2


class Writer:
    """Inserts, updates and deletes on 1k keys; transactions of 1, 10, 100 and 3,000 changes."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.rng = random.Random(11)
        self.present: set[int] = set()
        self.done = 0

    def write(self, changes: int, seconds: float) -> None:
        target, start, t0 = self.done + changes, self.done, time.monotonic()
        rng = self.rng
        with connect(self.dsn, autocommit=True) as conn:
            while self.done < target:
                size = min(rng.choice((1, 10, 100, 100, 3000 if rng.random() < 0.05 else 10)),
                           target - self.done)  # fmt: skip
                present = set(self.present)
                with conn.transaction():
                    for _ in range(size):
                        k = rng.randrange(KEYS)
                        if k in present and rng.random() < 0.15:
                            conn.execute("DELETE FROM chaos WHERE k = %s", (k,))
                            present.discard(k)
                        else:
                            conn.execute(
                                "INSERT INTO chaos VALUES (%s, %s, %s) ON CONFLICT (k) DO UPDATE "
                                "SET v = EXCLUDED.v, pad = EXCLUDED.pad",
                                (k, self.done, "x" * rng.choice((0, 10, 500))),
                            )
                            present.add(k)
                self.present = present
                self.done += size
                ahead = (self.done - start) / changes * seconds - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)

    def background(self, changes: int, seconds: float) -> threading.Thread:
        t = threading.Thread(target=self.write, args=(changes, seconds))
        t.start()
        return t


def rebuild(messages: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The table as the messages describe it, applied in WAL order."""
    rows: dict[int, dict[str, Any]] = {}
    for m in sorted(
        messages, key=lambda m: (m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"])
    ):
        record = m["record"]
        if m["action"] == "delete":
            rows.pop(record["k"], None)
        else:
            rows[record["k"]] = record
    return rows


def test_chaos_kills_outages_and_failing_sinks_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(2026)
    pg = EmbeddedPostgres(settings=TEST_SETTINGS).start()
    broker = TansuBroker().start()
    run: Run | None = None
    counts: dict[str, Any] = {}
    try:
        name = unique("chaos")
        with connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        db = TestDatabase(pg, name, connect(pg.dsn(name), autocommit=True))
        db.execute("CREATE TABLE chaos (k int PRIMARY KEY, v int, pad text)")
        db.execute("ALTER TABLE chaos REPLICA IDENTITY FULL")
        pub = db.create_publication("chaos")
        oracle_slot = db.create_slot()
        slot = db.create_slot()
        topic, switch, out = unique("chaos"), tmp_path / "failing", tmp_path / "out"
        config = tmp_path / "walstream.yaml"
        config.write_text(yaml.safe_dump({
            "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
            "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                         "max_changes_per_batch": 5000, "partition_bytes": 262144}],
            "sinks": [
                {"name": "files", "source": "app", "partitions": PARTITIONS,
                 "destination": {"type": "file", "path": str(out)}},
                {"name": "kafka", "source": "app", "batch_size": BATCH_SIZE,
                 "partitions": PARTITIONS, "max_attempts": 1000,
                 "backoff": {"initial": "0.5s", "max": "2s"},
                 "destination": {
                     "type": "faulty", "fail_keys": [str(k) for k in sorted(POISON)],
                     "retryable": False,
                     "inner": {
                         "type": "faulty", "fail_keys": [str(k) for k in sorted(WINDOW)],
                         "while_exists": str(switch),
                         "inner": {"type": "kafka", "bootstrap_servers": broker.bootstrap_servers,
                                   "topic": topic, "create_topics": True},
                     },
                 }},
            ],
        }))  # fmt: skip
        writer = Writer(db.dsn)
        events: list[str] = []

        def start() -> Run:
            return Run(config, tmp_path)

        def progress(path: Path = out) -> int:
            return len(read_messages(path)) if path.exists() else 0

        run = start()
        # 1. kill -9 in the middle of a stream
        w = writer.background(12_000, 8.0)
        wait_until(lambda: progress() > 0, 180, message=lambda: run.output() if run else "")
        time.sleep(rng.uniform(1, 5))
        run.kill()
        events.append("kill -9 of walstream run while streaming")
        w.join(120)
        run = start()
        # 2. the broker hangs for 8 s while changes arrive
        w = writer.background(12_000, 8.0)
        time.sleep(rng.uniform(1, 4))
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)
        time.sleep(8)  # the hang's length
        broker.proc.send_signal(signal.SIGCONT)
        events.append("broker hung (SIGSTOP) for 8 s")
        w.join(120)
        # 3. the Kafka sink fails for 100 keys for a while: parked, then retried
        lot = ParkingLot(db.dsn)
        switch.touch()
        w = writer.background(12_000, 8.0)
        wait_until(lambda: lot.counts().get("kafka", {}).get(PARKED, 0) > 0, 120,
                   message=lambda: f"nothing parked; run output:\n{run.output()[-3000:] if run else ''}")  # fmt: skip
        time.sleep(2)  # the fault's window: keys keep failing (and parking) this long
        counts["parked_in_window"] = lot.counts()["kafka"][PARKED]
        switch.unlink()
        events.append("faulty window: 100 keys failing retryably until parked")
        w.join(120)
        # 4. Postgres immediate shutdown and restart, walstream running
        db.conn.close()
        pg._cmd(str(pg.bin / "pg_ctl"), "-D", str(pg.data), "-m", "immediate", "-w", "stop")
        time.sleep(2)  # Postgres stays down this long, walstream running
        pg.start()
        db.conn = connect(pg.dsn(name), autocommit=True)
        events.append("Postgres immediate shutdown and restart")
        # 5. kill -9 again under load, then the rest of the workload
        w = writer.background(12_000, 8.0)
        time.sleep(rng.uniform(2, 6))
        run.kill()
        events.append("kill -9 of walstream run while streaming")
        w.join(120)
        run = start()
        writer.write(3_000, 2.0)
        assert writer.done >= 50_000

        expected, _ = oracle(db, oracle_slot, pub)
        assert len(expected) == writer.done
        poison = {(c.lsn, c.seq) for c in expected if json.loads(c.record or c.old)["k"] in POISON}
        wait_until(lambda: progress() >= len(expected), 300,
                   message=lambda: f"files: {progress()} of {len(expected)}\n{run.output()[-3000:]}")  # fmt: skip
        got = consume_all(broker.bootstrap_servers, topic, len(expected) - len(poison), timeout=300)
        wait_until(lambda: not lot.list(PARKED, "kafka"), 120)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(90) == 0, run.output()[-3000:]
        dead = lot.list(DEAD, "kafka", limit=100_000)
        table = {r[0]: r for r in db.execute("SELECT k, v, pad FROM chaos")}
    finally:
        if run is not None:
            run.kill()
        broker.stop()
        pg.stop()

    # Files: exactly the change stream, once; per key in order; the table rebuilt.
    files = [json.loads(m) for m in read_messages(out)]
    file_cursors = [(m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"]) for m in files]
    assert sorted(file_cursors) == [(c.lsn, c.seq) for c in expected]
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for m, c in zip(files, file_cursors, strict=True):
        by_key[m["record"]["k"]].append(c)
    assert all(cs == sorted(cs) for cs in by_key.values())
    want = {k: {"k": k, "v": v, "pad": pad} for k, (_, v, pad) in table.items()}
    assert rebuild(files) == want

    # Kafka: everything but the poison keys, which are dead letters with their reason.
    keys = [dict(m.headers())["idempotency-key"].decode() for m in got]
    assert set(keys) == {
        idempotency_key(c.lsn, c.seq) for c in expected if (c.lsn, c.seq) not in poison
    }
    assert sorted((p.lsn, p.seq) for p in dead) == sorted(poison)
    # Each says why: its own failure, or the failure of the message its group waited behind.
    assert all("injected failure" in p.errors[-1]["error"] for p in dead), [
        p.errors for p in dead if not p.errors
    ]
    first: dict[str, bool] = {}
    kafka_msgs = []
    for m, k in zip(got, keys, strict=True):
        if k not in first:
            first[k] = True
            kafka_msgs.append(json.loads(m.value()))
    per_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for m in kafka_msgs:  # first deliveries in topic order, per key: WAL order
        per_key[m["record"]["k"]].append(cursor(json.dumps(m).encode()))
    assert all(cs == sorted(cs) for cs in per_key.values())
    duplicates = len(keys) - len(set(keys))
    window = 2 * PARTITIONS * BATCH_SIZE + BATCH_SIZE  # two kills, plus the retrier's chunk
    assert duplicates <= window
    rebuilt = rebuild(kafka_msgs)
    assert {k: r for k, r in rebuilt.items() if k not in POISON} == {
        k: r for k, r in want.items() if k not in POISON
    }
    counts.update(
        changes=len(expected), files=len(files), kafka=len(got), kafka_duplicates=duplicates,
        dead_letters=len(dead), keys=len(table),
    )  # fmt: skip
    print(f"chaos: {'; '.join(events)}")
    print("chaos counts: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
