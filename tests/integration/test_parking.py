"""Parking, the retrier and dead letters in `walstream run`, with the fault-injecting sink.

Keys 1 and 2 fail (retryably) while a switch file exists: their changes are parked
in order behind the first failure while every other key flows; removing the file
lets the retrier deliver them. Key 3 fails for good: each of its changes becomes a
dead letter at once and the stream goes on. A Python transform that raises makes
its rows dead letters; once it is fixed, `dead-letters retry` delivers them.
Pause holds the source's batches; reset makes a sink skip what came before it.
The operator commands see all of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_run import consume
from tests.integration.transforms import poison_marker
from walstream.config import load_config
from walstream.delivery.parking import DEAD, PARKED, ParkingLot
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

KEYS, ROUNDS = 20, 30


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walstream.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_failing_groups_park_in_order_others_flow_and_dead_letters_are_operable(
    spark, db, kafka, tmp_path
):
    table = unique("acct")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)")
    pub = db.create_publication(table)
    slot = db.create_slot()
    retry_topic, dead_topic, shaped_topic = unique("parking"), unique("poison"), unique("shaped")
    switch = tmp_path / "failing"
    switch.touch()
    marker = poison_marker(table)
    marker.touch()

    def kafka_inner(topic: str) -> dict[str, Any]:
        return {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "topic": topic,
                "create_topics": True}  # fmt: skip

    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [
            {"name": "retry", "source": "app", "max_attempts": 1000,
             "backoff": {"initial": "0.2s", "max": "1s"},
             "destination": {"type": "faulty", "fail_keys": ["1", "2"], "retryable": True,
                             "while_exists": str(switch), "inner": kafka_inner(retry_topic)}},
            {"name": "poison", "source": "app",
             "destination": {"type": "faulty", "fail_keys": ["3"], "retryable": False,
                             "inner": kafka_inner(dead_topic)}},
            {"name": "shaped", "source": "app",
             "transform": "tests.integration.transforms:explode_on_7",
             "destination": kafka_inner(shaped_topic)},
        ],
    }))  # fmt: skip
    cfg = load_config(path)

    def write_round(r: int) -> None:  # every transaction touches every key
        with db.conn.transaction():
            for k in range(KEYS):
                if r == 0:
                    db.execute(f"INSERT INTO {table} VALUES (%s, 0)", (k,))
                else:
                    db.execute(f"UPDATE {table} SET n = %s WHERE id = %s", (r, k))

    for r in range(ROUNDS):
        write_round(r)

    runtime = Runtime(cfg, spark=spark).start()
    lot = ParkingLot(cfg.state_dsn)
    try:
        # Keys 1 and 2 are parked (in order, one head each with the error); the rest flows.
        def settled() -> bool:
            p = runtime.progress()
            return (
                "retry" in p and p["retry"].delivered == (KEYS - 2) * ROUNDS
                and p["retry"].parked == 2 * ROUNDS
                and "poison" in p and p["poison"].dead == ROUNDS
                and "shaped" in p and p["shaped"].dead == KEYS
                and p["shaped"].delivered == KEYS * (ROUNDS - 1)
            )  # fmt: skip

        wait_until(settled, 120, message=lambda: f"progress: {runtime.progress()}")
        parked = lot.list(PARKED, "retry", limit=1000)
        assert len(parked) == 2 * ROUNDS
        for key in ("1", "2"):
            mine = [p for p in parked if p.message.key == key.encode()]
            assert [json.loads(p.message.value)["record"]["n"] for p in mine] == list(range(ROUNDS))
            assert mine[0].errors and "injected failure" in mine[0].errors[0]["error"]
            assert all(not p.errors and p.next_attempt_at is None for p in mine[1:])
        out = cli("parked", "list", "-c", str(path), "--sink", "retry")
        assert out.returncode == 0, out.stderr
        assert f"{2 * ROUNDS} parked messages" in out.stdout

        # Dead letters: every change of key 3, at once, each with its reason.
        dead = lot.list(DEAD, "poison", limit=1000)
        assert [json.loads(p.message.value)["record"]["n"] for p in dead] == list(range(ROUNDS))
        out = cli("dead-letters", "list", "-c", str(path), "--sink", "poison")
        assert f"{ROUNDS} dead letters" in out.stdout, out.stdout + out.stderr
        shown = json.loads(cli("dead-letters", "show", str(dead[0].id), "-c", str(path)).stdout)
        assert shown["status"] == "dead" and shown["key"] == "3"
        assert "injected failure" in shown["errors"][0]["error"]
        assert shown["sink_config"]["destination"]["type"] == "faulty"

        # Heal: the retrier delivers keys 1 and 2 in order, without new changes.
        switch.unlink()
        wait_until(lambda: runtime.progress()["retry"].retried == 2 * ROUNDS, 60,
                   message=lambda: f"progress: {runtime.progress()}")  # fmt: skip
        assert lot.list(PARKED, "retry") == []
        got = consume(kafka.bootstrap_servers, retry_topic, KEYS * ROUNDS)
        by_key: dict[bytes, list[int]] = defaultdict(list)
        for m in got:
            by_key[m.key()].append(json.loads(m.value())["record"]["n"])
        assert len(got) == KEYS * ROUNDS  # every change once
        assert all(ns == list(range(ROUNDS)) for ns in by_key.values()), by_key
        assert len(by_key) == KEYS

        # The transform's poison rows: dead letters with its error; fixed, they are retried.
        shaped_dead = lot.list(DEAD, "shaped", limit=1000)
        assert len(shaped_dead) == KEYS
        assert all(
            "raised ValueError: cannot shape row" in p.errors[0]["error"] for p in shaped_dead
        )
        marker.unlink()  # the transform is fixed
        out = cli("dead-letters", "retry", "-c", str(path), "--sink", "shaped")
        assert f"{KEYS} dead letter(s) parked" in out.stdout, out.stdout + out.stderr
        wait_until(lambda: runtime.progress()["shaped"].retried == KEYS, 60)
        shaped: dict[int, list[int]] = defaultdict(list)
        for m in consume(kafka.bootstrap_servers, shaped_topic, KEYS * ROUNDS):
            v = json.loads(m.value())
            shaped[v["id"]].append(v["n"])
        # a retried dead letter arrives after what flowed while it was dead
        assert all(ns == [*range(7), *range(8, ROUNDS), 7] for ns in shaped.values()), shaped

        # Dead letters retried while the poison key still fails: they die again.
        out = cli("dead-letters", "retry", "-c", str(path), "--sink", "poison")
        assert f"{ROUNDS} dead letter(s) parked" in out.stdout, out.stdout + out.stderr
        wait_until(lambda: len(lot.list(DEAD, "poison", limit=1000)) == ROUNDS, 60)
        one = lot.list(DEAD, "poison", limit=1)[0]
        out = cli("dead-letters", "discard", str(one.id), "-c", str(path), "--yes")
        assert "1 dead letter(s) discarded" in out.stdout, out.stdout + out.stderr

        # Pause holds every batch of the source; reset makes "poison" skip what came
        # before it (and drops its dead letters); resume delivers the rest.
        before = {k: v.delivered for k, v in runtime.progress().items()}
        out = cli("pause", "poison", "-c", str(path), "--reason", "maintenance")
        assert out.returncode == 0, out.stderr
        write_round(ROUNDS)
        wait_until(lambda: any(sq.pipeline.holding for sq in runtime.queries), 60)
        holding = next(sq.pipeline.holding for sq in runtime.queries if sq.pipeline.holding)
        assert "sink poison is paused (maintenance)" in holding["poison"]
        assert {k: v.delivered for k, v in runtime.progress().items()} == before
        out = cli("reset", "poison", "--to", "now", "-c", str(path), "--yes")
        assert f"discarded 0 parked message(s) and {ROUNDS - 1} dead letter(s)" in out.stdout, (
            out.stdout + out.stderr
        )
        write_round(ROUNDS + 1)
        out = cli("resume", "poison", "-c", str(path))
        assert out.returncode == 0, out.stderr
        wait_until(
            lambda: runtime.progress()["retry"].delivered == before["retry"] + 2 * KEYS
            and runtime.progress()["poison"].delivered == before["poison"] + KEYS - 1,
            60, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip
        poison_ns: dict[bytes, list[int]] = defaultdict(list)
        for m in consume(kafka.bootstrap_servers, dead_topic, (KEYS - 1) * (ROUNDS + 1)):
            poison_ns[m.key()].append(json.loads(m.value())["record"]["n"])
        assert b"3" not in poison_ns
        # round ROUNDS came before the reset: skipped; round ROUNDS + 1 after it: delivered
        assert all(ns == [*range(ROUNDS), ROUNDS + 1] for ns in poison_ns.values()), poison_ns
        assert [json.loads(p.message.value)["record"]["n"] for p in lot.list(DEAD, "poison")] == [
            ROUNDS + 1
        ]
    finally:
        runtime.stop()
        marker.unlink(missing_ok=True)
