"""kill -9 of `walstream run` writing every table sink at once (Delta and Iceberg changelogs
and mirrors, copy-on-write and merge-on-read, the Postgres mirror; the merge-on-read mirrors
on an S3 API, moto's server): each change lands exactly once in the changelog tables, and
every mirror equals the source table after the last run.
test_mirror_crash.py kills the Postgres mirror alone on a table of every type."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_crash import Workload, slot_inactive
from tests.integration.test_run_crash import Run, committed, oracle
from tests.lake import Place, delta_rows, iceberg_rows, normalised, source_rows
from walstream.testing import wait_until

pytestmark = pytest.mark.spark


def delta_log(table: Path) -> list[Path]:
    return sorted((table / "_delta_log").glob("*.json"))


def newest_batch(ckpt: Path) -> int:
    return max((int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit()), default=-1)


def test_kill_9_while_writing_lake_tables_writes_each_change_once(db, tmp_path, s3):
    db.execute("CREATE TABLE kv (k int PRIMARY KEY, v text)")
    pub = db.create_publication("kv")
    oracle_slot = db.create_slot()
    slot = unique("slot")
    db.slots.append(slot)
    ckpt, lake = tmp_path / "ckpt", tmp_path / "lake"
    mirror_db = unique("mirror")
    db.execute(f"CREATE DATABASE {mirror_db}")
    mirror_dsn = db.server.dsn(mirror_db)
    warehouse = {"warehouse": str(tmp_path / "warehouse")}
    on_s3 = Place(tmp_path, s3)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "spark": {"master": "local[2]", "checkpoint_dir": str(ckpt)},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "max_changes_per_batch": 400}],
        "sinks": [
            {"name": "delta-log", "source": "app", "destination": {
                "type": "delta", "mode": "changelog", "path": str(lake / "log" / "{table}")}},
            {"name": "delta-mirror", "source": "app", "destination": {
                "type": "delta", "path": str(lake / "mirror" / "{table}")}},
            {"name": "iceberg-log", "source": "app", "destination": {
                "type": "iceberg", "mode": "changelog", "table": "log.{table}",
                "catalog": warehouse}},
            {"name": "iceberg-mirror", "source": "app", "destination": {
                "type": "iceberg", "table": "mirror.{table}", "catalog": warehouse}},
            {"name": "pg-mirror", "source": "app", "destination": {
                "type": "postgres", "dsn": mirror_dsn}},
            {"name": "delta-mor", "source": "app", "destination": {
                **on_s3.delta_destination("mor"), "updates": "merge_on_read"}},
            {"name": "iceberg-mor", "source": "app", "destination": {
                **on_s3.iceberg_destination("mor"), "updates": "merge_on_read"}},
        ],
    }))  # fmt: skip
    runs, total = 4, 6_000
    workload = Workload(db.dsn, total)
    rng = random.Random(11)
    log_table = lake / "log" / "kv"
    between_lake_and_spark = 0
    run: Run | None = None
    try:
        for i in range(runs):
            run = Run(config, tmp_path)
            if i == 0:
                wait_until(
                    lambda: db.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    ),
                    120, message=lambda r=run: f"no slot; run output:\n{r.output()}",
                )  # fmt: skip
            writer = workload.write_in_background(total // runs, 5.0)
            if i % 2 == 1:
                # right after a Delta commit lands: likely before Spark records the batch
                seen = len(delta_log(log_table))
                wait_until(
                    lambda s=seen: len(delta_log(log_table)) > s, 180, interval=0.002,
                    message=lambda r=run: f"no new Delta commit; run output:\n{r.output()}",
                )  # fmt: skip
                run.kill()
                n = newest_batch(ckpt / "app")
                between_lake_and_spark += not committed(ckpt / "app", n) and any(
                    f':{n}"' in p.read_text() for p in delta_log(log_table)[-4:]
                )
            else:
                time.sleep(rng.uniform(3, 15))
                run.kill()
            writer.join(120)
            wait_until(lambda: slot_inactive(db, slot), 30)
        workload.write(total - workload.done, 1.0)
        expected, _ = oracle(db, oracle_slot, pub)
        assert len(expected) == total
        run = Run(config, tmp_path)

        source = normalised(source_rows(db.dsn, "kv"))

        def all_in() -> bool:
            try:
                return (
                    len(delta_rows(log_table)) >= total
                    and len(iceberg_rows(db.dsn, "log.kv")) >= total
                    and normalised(source_rows(mirror_dsn, "kv")) == source
                    and normalised(delta_rows(on_s3.delta("kv", "mor"), s3)) == source
                    and normalised(iceberg_rows(db.dsn, "mor.kv", s3)) == source
                )
            except Exception:
                return False

        wait_until(all_in, 300, interval=1, message=lambda r=run: f"output:\n{r.output()}")
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(60) == 0, run.output()
    finally:
        if run is not None:
            run.kill()

    want = [(c.lsn, c.seq, c.action) for c in expected]
    for name, rows in (
        ("delta", delta_rows(log_table)),
        ("iceberg", iceberg_rows(db.dsn, "log.kv")),
    ):
        got = sorted((r["_lsn"], r["_seq"], r["_op"]) for r in rows)
        assert got == want, f"{name}: {len(got)} rows for {len(want)} changes"
    assert normalised(delta_rows(lake / "mirror" / "kv")) == source
    assert normalised(iceberg_rows(db.dsn, "mirror.kv")) == source
    assert normalised(source_rows(mirror_dsn, "kv")) == source
    assert normalised(delta_rows(on_s3.delta("kv", "mor"), s3)) == source  # on S3
    assert normalised(iceberg_rows(db.dsn, "mor.kv", s3)) == source
    assert any(k.endswith(".bin") for k in on_s3.files("mor"))  # deletion vectors written
    assert any("walstream-deletes-" in k for k in on_s3.files("w"))  # position deletes
    db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")
    print(f"kills between the lake commit and Spark's: {between_lake_and_spark} of {runs // 2}")
    assert between_lake_and_spark >= 1, "no kill landed between the lake commit and Spark's"
