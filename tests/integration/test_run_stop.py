"""Ctrl-C of `walstream run` (SIGINT to its process group, as a terminal sends it) while a
batch hangs in the destination: the first lets the batch go on and starts no new one (it
used to cancel the batch and exit 130: PySpark's own SIGINT handler); the second abandons
it and the run ends; the slot was not confirmed past the batch, so the next start
delivers it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_crash import confirmed
from tests.integration.test_run_crash import Run
from tests.servers import WebhookReceiver
from walstream.change import parse_lsn
from walstream.sinks.file import read_messages
from walstream.testing import holds_for, wait_until

pytestmark = pytest.mark.spark


def slot_exists(db: Any, slot: str) -> bool:
    """walstream run made its slot: changes from now on reach it."""
    return bool(db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)))


@pytest.mark.parametrize(
    ("second", "sig"),
    [(True, signal.SIGINT), (False, signal.SIGINT), (False, signal.SIGTERM)],
    ids=["abandoned", "finished", "finished-sigterm"],
)
def test_ctrl_c_lets_the_batch_finish_and_a_second_abandons_it(
    db, tmp_path: Path, second: bool, sig: signal.Signals
):
    """`finished`: after the first Ctrl-C the destination answers: the batch is delivered
    and the run ends by itself. `abandoned`: a second Ctrl-C ends the run at once; the
    batch is delivered by the next start. `finished-sigterm`: SIGTERM to the whole process
    group, as systemd's stop sends it: Spark's JVM and Python workers get it too and must
    leave it to walstream, which finishes the batch and exits 0."""
    db.execute("CREATE TABLE kv (k int PRIMARY KEY)")
    pub, slot = db.create_publication("kv"), unique("slot")
    db.slots.append(slot)
    release, hanging = threading.Event(), threading.Event()

    def answer(path: str) -> int:
        hanging.set()
        release.wait(300)  # the destination hangs until the test lets it go
        return 200

    rx = WebhookReceiver()
    rx.answer = answer
    rx.start()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "hook", "source": "app", "destination": {
            "type": "webhook", "url": rx.url(), "timeout": "300s", "retry_timeout": "300s"}}],
    }))  # fmt: skip
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: slot_exists(db, slot), 120, message=lambda: run.output()[-2000:])
        (lsn,) = db.execute(
            "INSERT INTO kv VALUES (1) RETURNING pg_current_wal_insert_lsn()::text"
        )[0]
        wait_until(hanging.is_set, 120, message=lambda: run.output()[-2000:])
        os.killpg(run.proc.pid, sig)  # the first Ctrl-C (or systemd's stop)
        wait_until(lambda: "Ctrl-C again to abandon it" in run.output(), 60,
                   message=lambda: run.output()[-4000:])  # fmt: skip
        # What is observed: the run goes on waiting for its batch, sending nothing new.
        holds_for(lambda: run.proc.poll() is None and rx.requests == [], 2,
                  message=lambda: f"exit {run.proc.poll()}; {run.output()[-2000:]}")  # fmt: skip
        if not second:
            release.set()  # the destination answers: the batch finishes, the run ends
            assert run.proc.wait(60) == 0, run.output()[-3000:]
            assert "stopped; delivered this run: {'hook': 1}" in run.output()
            assert [b'"k":1' in r.body for r in rx.requests] == [True]
            return
        os.killpg(run.proc.pid, signal.SIGINT)  # the second
        code = run.proc.wait(60)
        out = run.output()
        assert "abandoning the batch in flight; the next start replays it" in out, out[-3000:]
        assert code == 0, out[-3000:]
        assert confirmed(db, slot) < parse_lsn(lsn)  # the batch was never confirmed
    finally:
        run.kill()
        if not second:
            rx.stop()
    rx.answer = lambda path: 200  # new requests are answered; the abandoned one stays open
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: rx.requests != [], 120, message=lambda: run.output()[-2000:])
    finally:
        run.kill()
        release.set()
        rx.stop()
    assert b'"k":1' in rx.requests[0].body


def test_a_stop_just_after_a_batch_waits_for_spark_to_commit_it(spark, db, tmp_path, monkeypatch):
    """Spark writes a batch's commit-log entry after the batch function returns. A stop in
    between (the demo stopping once everything was delivered) used to stop the query
    then, interrupting that write: the next start delivered the batch again."""
    from walstream.config import parse_config
    from walstream.pipeline.batches import Pipeline
    from walstream.runtime import Runtime

    db.execute("CREATE TABLE kv (k int PRIMARY KEY)")
    pub, slot = db.create_publication("kv"), db.create_slot()
    cfg = parse_config({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    })  # fmt: skip
    delivered, original = threading.Event(), Pipeline.__call__
    runtime = Runtime(cfg, spark=spark)

    def slow_to_commit(self: Any, df: Any, batch_id: int) -> None:
        original(self, df, batch_id)
        if self.progress["files"].delivered and not delivered.is_set():
            delivered.set()  # the batch with the change returned: now stop
            runtime.stopping.wait(60)
            time.sleep(0.5)  # widens the window: a stop not waiting has stopped the query

    monkeypatch.setattr(Pipeline, "__call__", slow_to_commit)
    runtime.start()
    try:
        db.execute("INSERT INTO kv VALUES (1)")
        assert delivered.wait(120), "the change was not delivered"
        batch = runtime.queries[0].pipeline.delivered_batch
    finally:
        runtime.stop()
    assert (tmp_path / "ckpt" / "app" / "commits" / str(batch)).exists()
    monkeypatch.setattr(Pipeline, "__call__", original)
    runtime = Runtime(cfg, spark=spark).start()  # the next start: that batch is done
    try:
        db.execute("INSERT INTO kv VALUES (2)")
        pipeline = runtime.queries[0].pipeline
        wait_until(  # the new change is written and its batch has returned
            lambda: len(read_messages(tmp_path / "out")) == 2
            and pipeline.idle.is_set() and "files" in runtime.progress(), 120,
            message=lambda: f"{read_messages(tmp_path / 'out')}",
        )  # fmt: skip
        assert runtime.progress()["files"].delivered == 1  # only the new change
    finally:
        runtime.stop()


def test_the_first_stop_waits_for_a_hanging_batch_only_the_grace_period(
    spark, db, tmp_path, caplog
):
    """The first Ctrl-C waits for the batch in flight for at most the grace period
    (`walstream run`: 30 s), then abandons it; the slot keeps the batch for the next start."""
    import inspect
    import logging

    from walstream.config import parse_config
    from walstream.runtime import Runtime

    db.execute("CREATE TABLE kv (k int PRIMARY KEY)")
    pub, slot = db.create_publication("kv"), db.create_slot()
    release, hanging = threading.Event(), threading.Event()

    def answer(path: str) -> int:
        hanging.set()
        release.wait(120)
        return 200

    rx = WebhookReceiver()
    rx.answer = answer
    rx.start()
    cfg = parse_config({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "hook", "source": "app", "destination": {
            "type": "webhook", "url": rx.url(), "timeout": "120s", "retry_timeout": "120s"}}],
    })  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    try:
        (lsn,) = db.execute(
            "INSERT INTO kv VALUES (1) RETURNING pg_current_wal_insert_lsn()::text"
        )[0]
        assert hanging.wait(120), "the batch did not reach the destination"
        began = time.monotonic()
        with caplog.at_level(logging.INFO, logger="walstream.runtime"):
            runtime.stop(grace=4)
        waited = time.monotonic() - began
    finally:
        release.set()
        runtime.stop()
        rx.stop()
    said = caplog.text
    assert "finishing the batch in flight" in said and "abandoning the batch in flight" in said
    assert 4 <= waited < 4 + 30, waited  # it waited for the batch, then no longer
    assert confirmed(db, slot) < parse_lsn(lsn)  # the abandoned batch stays in the slot
    assert runtime.progress().get("hook") is None or runtime.progress()["hook"].delivered == 0
    # `walstream run` stops with the default: the README's 30 s
    assert inspect.signature(Runtime.stop).parameters["grace"].default == 30
