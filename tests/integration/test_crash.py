"""kill -9 the Spark driver at random points: nothing lost, nothing duplicated per batch id,
WAL order kept, and the slot never confirmed past an undelivered change."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import unique
from walstream.decode import pgoutput as po
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder
from walstream.postgres.replication import connect
from walstream.testing import wait_until

pytestmark = pytest.mark.spark
DRIVER = Path(__file__).with_name("crash_driver.py")


class Driver:
    def __init__(
        self, db, slot, pub, ckpt: Path, out: Path, max_changes: str, kill_after: int | None = None
    ):
        env = {**os.environ}
        if kill_after is not None:
            env["WALSTREAM_TEST_KILL_AFTER_BATCH"] = str(kill_after)
        self.log = (out.parent / f"driver-{time.monotonic_ns()}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), db.dsn, slot, pub, str(ckpt), str(out), max_changes],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()


def deliveries(out: Path) -> dict[int, list[list[tuple]]]:
    by_batch: dict[int, list[list[tuple]]] = {}
    for f in sorted(out.glob("batch-*.jsonl")):
        batch_id = int(f.name.split("-")[1])
        rows = [
            tuple(json.loads(line)[:2]) + tuple(json.dumps(x) for x in json.loads(line)[2:])
            for line in f.read_text().splitlines()
        ]
        by_batch.setdefault(batch_id, []).append(rows)
    return by_batch


def oracle(db, slot, pub):
    """Every change in order, and each transaction's commit end LSN, read from a second slot."""
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("oracle", meta.types, meta.primary_keys)
    parser = po.PgOutputParser()
    changes, ends = [], {}
    for m in db.read(slot, pub, timeout=300):
        if m.payload[:1] == b"C":
            c = parser.parse(m.payload)
            assert isinstance(c, po.Commit)
            ends[c.commit_lsn] = c.end_lsn
        for r in decoder.decode(m.payload, m.data_start):
            changes.append(
                (r.lsn, r.seq, json.dumps(r.action), json.dumps(r.pk), json.dumps(r.record))
            )
    return changes, ends


def confirmed(db, slot) -> int:
    return int(
        db.execute(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )[0][0]
    )


def first_batch_committed(ckpt: Path) -> bool:
    """Spark cannot restart from a checkpoint killed while it wrote batch 0's offsets
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): kills wait for its first commit entry."""
    return any((ckpt / "commits").glob("[0-9]*"))


def slot_inactive(db, slot) -> bool:
    return not db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))[
        0
    ][0]


class Workload:
    """Upserts and deletes on 200 keys in 1–20-change transactions, written in chunks."""

    def __init__(self, dsn: str, total: int) -> None:
        self.dsn = dsn
        self.total = total
        self.done = 0
        self.rng = random.Random(7)
        self.present: set[int] = set()

    def write(self, changes: int, seconds: float) -> None:
        target = min(self.total, self.done + changes)
        start, t0 = self.done, time.monotonic()
        rng = self.rng
        with connect(self.dsn, autocommit=True) as conn:
            while self.done < target:
                with conn.transaction():
                    for _ in range(min(rng.randint(1, 20), target - self.done)):
                        key = rng.randrange(200)
                        if key in self.present and rng.random() < 0.3:
                            conn.execute("DELETE FROM kv WHERE k = %s", (key,))
                            self.present.discard(key)
                        else:
                            conn.execute(
                                "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
                                (key, f"v{self.done}"),
                            )
                            self.present.add(key)
                        self.done += 1
                ahead = (self.done - start) / max(1, target - start) * seconds - (
                    time.monotonic() - t0
                )
                if ahead > 0:
                    time.sleep(ahead)

    def write_in_background(self, changes: int, seconds: float) -> threading.Thread:
        t = threading.Thread(target=self.write, args=(changes, seconds))
        t.start()
        return t


def check_no_loss_no_dup(out: Path, expected: list[tuple]) -> None:
    by_batch = deliveries(out)
    for batch_id, copies in by_batch.items():
        assert all(c == copies[0] for c in copies), f"batch {batch_id} was replayed with other rows"
    delivered = [row for batch_id in sorted(by_batch) for row in by_batch[batch_id][0]]
    assert len(delivered) == len(set(delivered)), "a change arrived in two batch ids"
    assert delivered == expected  # every change, once, in WAL order


def check_confirmed(
    checks: list[tuple[int, set]], ends: dict[int, int], expected: list[tuple]
) -> None:
    for conf, delivered in checks:
        for change in expected:
            if ends[change[0]] <= conf:
                assert change in delivered, f"slot confirmed {conf:X} past undelivered {change[:2]}"


def test_kill_9_at_random_points_loses_and_duplicates_nothing(db, tmp_path):
    db.execute("CREATE TABLE kv (k int PRIMARY KEY, v text)")
    pub = db.create_publication("kv")
    oracle_slot = db.create_slot()
    slot = unique("slot")
    db.slots.append(slot)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    runs, total = 6, 12_000
    workload = Workload(db.dsn, total)
    rng = random.Random(11)
    checks: list[tuple[int, set]] = []
    between_write_and_commit = 0
    driver: Driver | None = None
    try:
        for run in range(runs):
            kill_after = max(deliveries(out), default=-1) + 1 if run % 2 == 1 else None
            driver = Driver(db, slot, pub, ckpt, out, "500", kill_after)
            if run == 0:  # the slot exists once the first driver started
                wait_until(
                    lambda: db.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    ),
                    90,
                )
            writer = workload.write_in_background(total // runs, 4.0)
            if kill_after is not None:
                wait_until(
                    lambda p=driver.proc: p.poll() is not None,
                    120,
                    message="the sink did not kill itself after a batch",
                )
                between_write_and_commit += 1
            else:
                time.sleep(
                    rng.uniform(3, 12)
                )  # a random point: starting, planning, writing, committing
            driver.kill()
            writer.join(120)
            wait_until(lambda: slot_inactive(db, slot), 30)
            delivered = {r for copies in deliveries(out).values() for r in copies[0]}
            checks.append((confirmed(db, slot), delivered))
        workload.write(total - workload.done, 1.0)
        driver = Driver(db, slot, pub, ckpt, out, "500")
        wait_until(
            lambda: sum(len(c[0]) for c in deliveries(out).values()) >= total, 180,
            message=lambda: f"delivered {sum(len(c[0]) for c in deliveries(out).values())} of {total}",
        )  # fmt: skip
    finally:
        if driver is not None:
            driver.kill()
    expected, ends = oracle(db, oracle_slot, pub)
    assert len(expected) == total
    assert len(checks) == runs and between_write_and_commit == runs // 2
    check_no_loss_no_dup(out, expected)
    check_confirmed(checks, ends, expected)
    replayed = [b for b, copies in deliveries(out).items() if len(copies) > 1]
    assert len(replayed) >= runs // 2 - 1, f"replayed batches: {replayed}"


def test_crash_in_the_middle_of_a_200k_row_transaction(db, tmp_path):
    db.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    pub = db.create_publication("big")
    oracle_slot = db.create_slot()
    slot = unique("slot")
    db.slots.append(slot)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    driver = Driver(db, slot, pub, ckpt, out, "20000")
    try:
        wait_until(
            lambda: db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)),
            90,
        )
        driver.kill()
        db.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 200000) g")
        # crash after the third batch of the transaction is written, before it is committed
        driver = Driver(db, slot, pub, ckpt, out, "20000", kill_after=0)
        first = driver.proc
        wait_until(
            lambda: len(deliveries(out)) >= 1 and first.poll() is not None, 180, message="no crash"
        )
        driver.kill()
        wait_until(lambda: slot_inactive(db, slot), 30)
        after_crash = confirmed(db, slot)  # compared with the transaction's end below
        driver = Driver(db, slot, pub, ckpt, out, "20000")
        wait_until(
            lambda: sum(len(c[0]) for c in deliveries(out).values()) >= 200_000, 300,
            message=lambda: f"delivered {sum(len(c[0]) for c in deliveries(out).values())}",
        )  # fmt: skip
    finally:
        driver.kill()
    expected, ends = oracle(db, oracle_slot, pub)
    (big,) = {lsn for lsn, *_ in expected}
    assert len(expected) == 200_000
    # Part of the transaction was delivered before the crash, not all: the slot must not
    # have been told it may forget it (its Commit's end).
    assert after_crash < ends[big], f"confirmed {after_crash:X} past the commit end {ends[big]:X}"
    check_no_loss_no_dup(out, expected)
    by_batch = deliveries(out)
    assert len(by_batch) >= 10 and all(len(c[0]) <= 20000 for c in by_batch.values())
    assert any(len(c) > 1 for c in by_batch.values())  # the crashed batch was replayed
