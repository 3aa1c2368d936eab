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
from tests.integration.transforms import poison_marker
from tests.kafka import consume
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


def test_max_parked_pauses_the_source_or_discards_with_a_count(spark, db, kafka, tmp_path):
    """max_parked bounds the parking lot. `on_full: pause` (source a): once a sink holds
    that many, the next batch waits, says why, and goes on when the retrier has
    delivered some, losing nothing. `on_full: discard` (source b): messages past the
    bound are dropped and counted; the rest of the stream never waits."""
    table = unique("acct")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)")
    pub = db.create_publication(table)
    slot_a, slot_b = db.create_slot(), db.create_slot()
    topic_a, topic_b = unique("bounded"), unique("lossy")
    switch = tmp_path / "failing"
    switch.touch()
    keys, bound = 5, 5

    def sink(name: str, source: str, key: str, topic: str, on_full: str) -> dict[str, Any]:
        return {
            "name": name, "source": source, "max_attempts": 1000, "max_parked": bound,
            "on_full": on_full, "backoff": {"initial": "0.2s", "max": "0.5s"},
            "destination": {
                "type": "faulty", "fail_keys": [key], "retryable": True,
                "while_exists": str(switch),
                "inner": {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                          "topic": topic, "create_topics": True},
            },
        }  # fmt: skip

    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "a", "dsn": db.dsn, "slot": slot_a, "publication": pub},
                    {"name": "b", "dsn": db.dsn, "slot": slot_b, "publication": pub}],
        "sinks": [sink("bounded", "a", "1", topic_a, "pause"),
                  sink("lossy", "b", "2", topic_b, "discard")],
    }))  # fmt: skip
    cfg = load_config(path)

    def write_round(r: int) -> None:
        with db.conn.transaction():
            for k in range(keys):
                if r == 0:
                    db.execute(f"INSERT INTO {table} VALUES (%s, 0)", (k,))
                else:
                    db.execute(f"UPDATE {table} SET n = %s WHERE id = %s", (r, k))

    def progress(sink: str) -> Any:
        return runtime.progress().get(sink)

    for r in range(3):
        write_round(r)
    runtime = Runtime(cfg, spark=spark).start()
    lot = ParkingLot(cfg.state_dsn)
    try:
        # Under the bound: key 1 (a) and key 2 (b) park three each, the others flow.
        wait_until(
            lambda: all(
                (p := progress(s)) is not None and p.parked == 3 and p.delivered == 3 * (keys - 1)
                for s in ("bounded", "lossy")
            ),
            120, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip
        for r in range(3, 10):
            write_round(r)
        # b: two more fit under the bound, five are discarded and counted; nothing waits.
        wait_until(
            lambda: progress("lossy").delivered == 10 * (keys - 1)
            and progress("lossy").parked == bound and progress("lossy").discarded == 5,
            60, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip
        # a: key 1's changes park until the lot holds max_parked (a batch is never split,
        # so it may hold more); then the next batch waits, says why and delivers nothing.
        write_round(10)
        queries = {sq.source.name: sq for sq in runtime.queries}
        wait_until(lambda: queries["a"].pipeline.holding, 60,
                   message=lambda: f"progress: {runtime.progress()}")  # fmt: skip
        held = progress("bounded")
        assert held.parked >= bound
        assert queries["a"].pipeline.holding["bounded"] == (
            f"sink bounded has {held.parked} parked messages (max_parked 5); new batches wait "
            "until the retrier delivers some"
        )
        assert len(lot.list(PARKED, "bounded", limit=100)) == held.parked
        # What went through is a WAL prefix: key 1's changes of rounds 0..parked-1 parked,
        # the other keys' delivered. A batch may end inside a round (a transaction whose
        # commit had not arrived when the batch was planned), so the round key 1 parked
        # last may be partly delivered, and the next one begun.
        rounds = held.parked
        assert (keys - 1) * rounds - (keys - 2) <= held.delivered <= (keys - 1) * rounds + 1
        assert len(lot.list(PARKED, "lossy", limit=100)) == bound
        wait_until(lambda: progress("lossy").delivered == 11 * (keys - 1), 60)
        assert progress("lossy").discarded == 6  # key 2 is still blocked and the lot full
        assert not queries["b"].pipeline.holding
        assert progress("bounded").delivered == held.delivered  # still waiting

        # Heal: the retrier empties both lots; a's held batch goes on once fewer than
        # max_parked are left (key 1's round 10 is delivered or parks behind the rest).
        switch.unlink()
        wait_until(
            lambda: progress("bounded").delivered + progress("bounded").retried == 11 * keys
            and progress("lossy").retried == bound,
            60, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip
        # the held batch looks again within a second of the lot emptying
        wait_until(lambda: not queries["a"].pipeline.holding, 30,
                   message=lambda: f"holding: {queries['a'].pipeline.holding}")  # fmt: skip
        assert lot.list(PARKED, "bounded") == [] and lot.list(PARKED, "lossy") == []
        write_round(11)
        wait_until(lambda: progress("lossy").delivered == 12 * (keys - 1) + 1, 60)

        def by_key(topic: str, n: int) -> dict[bytes, list[int]]:
            out: dict[bytes, list[int]] = defaultdict(list)
            for m in consume(kafka.bootstrap_servers, topic, n):
                out[m.key()].append(json.loads(m.value())["record"]["n"])
            return out

        # pause lost nothing: every key's 12 changes once, in order
        assert by_key(topic_a, keys * 12) == {str(k).encode(): list(range(12)) for k in range(keys)}
        # discard: key 2 kept the five that were parked, lost 5..10, and flows again after
        lossy = by_key(topic_b, (keys - 1) * 12 + bound + 1)
        assert lossy.pop(b"2") == [0, 1, 2, 3, 4, 11]
        assert lossy == {str(k).encode(): list(range(12)) for k in range(keys) if k != 2}
    finally:
        runtime.stop()
