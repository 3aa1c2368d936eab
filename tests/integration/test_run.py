"""`walstream run` end to end: Postgres → Spark → Kafka (tansu) and the file sink."""

from __future__ import annotations

import base64
import json
import os
import random
from collections import defaultdict
from typing import Any

import pytest

from tests.conftest import unique
from tests.kafka import consume
from walstream.config import parse_config
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder
from walstream.errors import ConfigError
from walstream.formats import formatter
from walstream.formats.debezium_message import TableMessages
from walstream.formats.debezium_types import load_columns
from walstream.pipeline.batches import validate
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def oracle(db: Any, slot: str, pub: str, source: str) -> list[Any]:
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder(source, meta.types, meta.primary_keys)
    return [r for m in db.read(slot, pub) for r in decoder.decode(m.payload, m.data_start)]


def workload(db: Any, keys: int, statements: int, seed: int = 7) -> None:
    """Inserts, updates and deletes repeatedly hitting the same keys, in mixed transactions."""
    rnd = random.Random(seed)
    present: set[int] = set()
    done = 0
    while done < statements:
        size = rnd.choice((1, 5, 50))
        with db.conn.transaction():
            for _ in range(size):
                k = rnd.randrange(keys)
                if k not in present:
                    db.execute("INSERT INTO orders VALUES (%s, 'new', 0)", (k,))
                    present.add(k)
                elif rnd.random() < 0.15:
                    db.execute("DELETE FROM orders WHERE id = %s", (k,))
                    present.discard(k)
                else:
                    db.execute(
                        "UPDATE orders SET n = n + 1, status = %s WHERE id = %s",
                        (rnd.choice(("new", "paid", "sent")), k),
                    )
                done += 1


def test_run_delivers_every_change_once_in_order_to_kafka_and_files(spark, db, kafka, tmp_path):
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, n int)")
    db.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
    pub = db.create_publication("orders")
    oracle_slot = db.create_slot()
    slot = unique("slot")
    db.slots.append(slot)
    topic, dbz_prefix = unique("cdc"), unique("dbz")
    kdest = {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "create_topics": True}
    cfg = parse_config(
        {
            "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
            "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
            "sinks": [
                {"name": "seq", "source": "app", "destination": {**kdest, "topic": topic}},
                {
                    "name": "dbz",
                    "source": "app",
                    "format": "debezium",
                    "debezium": {"topic.prefix": dbz_prefix},
                    "destination": kdest,  # no topic: Debezium's, <prefix>.<schema>.<table>
                },
                {
                    "name": "files",
                    "source": "app",
                    "destination": {"type": "file", "path": str(tmp_path / "out")},
                },
            ],
        }
    )
    runtime = Runtime(cfg, spark=spark).start()
    try:
        workload(db, keys=300, statements=10_000)
        expected = oracle(db, oracle_slot, pub, "app")
        assert len(expected) >= 10_000  # the last transaction completes past the count

        def delivered() -> bool:
            runtime.poll()
            p = runtime.progress()
            return all(
                p.get(s) and p[s].delivered >= len(expected) for s in ("seq", "dbz", "files")
            )

        wait_until(delivered, 180, interval=0.5, message=lambda: f"progress {runtime.progress()}")
    finally:
        runtime.stop()

    # File sink: exactly the oracle's changes, in WAL order, byte for byte.
    sequin_files = formatter("sequin", sink="files", db=db.name)
    lines = read_messages(tmp_path / "out")
    by_cursor = sorted(
        lines,
        key=lambda b: (
            json.loads(b)["metadata"]["commit_lsn"],
            json.loads(b)["metadata"]["commit_idx"],
        ),
    )
    assert [b.decode() for b in by_cursor] == [sequin_files(c) for c in expected]

    # Kafka, sequin format: every change once, per-key WAL order, headers, exact bytes.
    sequin = formatter("sequin", sink="seq", db=db.name)
    msgs = consume(kafka.bootstrap_servers, topic, len(expected))
    cursors = []
    per_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for m in msgs:
        headers = dict(m.headers())
        lsn, seq = map(int, base64.b64decode(headers["idempotency-key"]).decode().split(":"))
        cursors.append((lsn, seq))
        per_key[m.key()].append((lsn, seq))
        assert headers["walstream-table"] == b"public.orders"
    assert sorted(cursors) == [(c.lsn, c.seq) for c in expected]  # each change exactly once
    want_per_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for c in expected:
        want_per_key[",".join(c.pk).encode()].append((c.lsn, c.seq))
    assert per_key == want_per_key  # per-key WAL order
    want_bytes = {(c.lsn, c.seq): sequin(c).encode() for c in expected}
    assert all(m.value() == want_bytes[cur] for m, cur in zip(msgs, cursors, strict=True))

    # Kafka, debezium format in Debezium's topic of the table: each change's records
    # (a delete and its tombstone) under Debezium's key, in per-key WAL order, exact but
    # for the processing time (ts_ms, ts_us, ts_ns); each record its own idempotency key.
    oid = db.execute("SELECT 'orders'::regclass::oid")[0][0]
    maker = TableMessages(
        dbz_prefix, db.name, "public", "orders", load_columns(db.conn, oid), ["id"]
    )
    want = [(c, m) for c in expected for m in maker.messages(c, 0)]
    assert len(want) == len(expected) + sum(c.action == "delete" for c in expected)
    dbz = consume(kafka.bootstrap_servers, f"{dbz_prefix}.public.orders", len(want))
    ikeys = [dict(m.headers())["idempotency-key"] for m in dbz]
    assert len(set(ikeys)) == len(dbz)  # a tombstone has its own
    got_per_key: dict[bytes, list[Any]] = defaultdict(list)
    for m in dbz:
        got_per_key[m.key()].append(without_times(m.value()))
    want_per_key: dict[bytes, list[Any]] = defaultdict(list)
    for _, m in want:
        assert m.key is not None
        want_per_key[m.key].append(without_times(m.value))
    assert got_per_key == want_per_key


def without_times(value: bytes | None) -> Any:
    """A Debezium record's value without its processing time (none for a tombstone) and
    with only the change's own LSN of `source.sequence` (the commit before the first
    transaction is where each slot began: test_debezium_run.py compares it)."""
    if value is None:
        return None
    body = json.loads(value)
    for field in ("ts_ms", "ts_us", "ts_ns"):
        body["payload"].pop(field)
    source = body["payload"]["source"]
    source["sequence"] = json.loads(source["sequence"])[1]
    return body


def test_invalid_expression_is_a_config_error_naming_it(spark):
    base = {
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "sinks": [
            {
                "name": "s",
                "source": "app",
                "filter": "get_json_objekt(record, '$.x') = 1",
                "destination": {"type": "file", "path": "/tmp/x"},
            }
        ],
    }
    with pytest.raises(ConfigError) as info:
        validate(spark, parse_config(base).sinks[0])
    assert "sink s: an expression is invalid" in str(info.value)
    assert "get_json_objekt" in str(info.value)
    base["sinks"][0]["filter"] = "action = 'insert'"
    base["sinks"][0]["group_by"] = ["record.customer_id", "no_such_column"]
    with pytest.raises(ConfigError, match="no_such_column"):
        validate(spark, parse_config(base).sinks[0])


def test_a_config_error_raised_inside_a_batch_stops_the_run(spark, db, tmp_path):
    """A transform that cannot be imported fails inside Spark's task; its kind crosses
    Spark's text as the error's marker, and the runtime stops instead of restarting."""
    db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    pub = db.create_publication("orders")
    slot = unique("slot")
    db.slots.append(slot)
    cfg = parse_config({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "shaped", "source": "app", "transform": "walstream_no_such_mod:shape",
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    })  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    try:
        db.execute("INSERT INTO orders VALUES (1)")

        def stopped() -> bool:
            runtime.poll()
            return runtime.fatal is not None

        wait_until(stopped, 120, interval=0.2, message="the run did not stop")
        assert isinstance(runtime.fatal, ConfigError)
        assert (
            "source app: transform function 'walstream_no_such_mod:shape' cannot be loaded"
            in str(runtime.fatal)
        )
        assert runtime.stopping.is_set()
        assert not list((tmp_path / "out").glob("*.jsonl"))  # nothing was delivered
        assert [s.restarts for s in runtime.sources()] == [0]  # stopped, never restarted
    finally:
        runtime.stop()


def test_check_config_reports_every_problem_with_its_fix(db, tmp_path):
    """`walstream check -c`: the database, an unreachable broker, a bad expression — all named."""
    import subprocess
    import sys

    import yaml

    from walstream.postgres.embedded import free_port

    db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    cfg = {
        "sources": [{"name": "app", "dsn": db.dsn, "tables": ["public.orders"]}],
        "sinks": [
            {
                "name": "bad-filter",
                "source": "app",
                "filter": "actoin = 'insert'",
                "destination": {"type": "file", "path": str(tmp_path / "out")},
            },
            {
                "name": "no-broker",
                "source": "app",
                "destination": {
                    "type": "kafka",
                    "bootstrap_servers": f"127.0.0.1:{free_port()}",
                    "topic": "orders",
                },
            },
        ],
    }
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "check", "-c", str(path)],
        capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "sink bad-filter" in text and "actoin" in text  # the expression and Spark's reason
    assert "sink no-broker" in text and "cannot reach" in text
    assert "source app: publication" in text  # not created yet: a warning that run creates it
    assert "not ready: 2 error(s)" in text
    # Spark starts only for the sinks with expressions, and says so while it waits.
    assert "starting Spark (local[1], ~10 s) to check the SQL expressions of bad-filter" in text
    assert "no SQL expressions to check" in text

    path.write_text(yaml.safe_dump({**cfg, "sinks": [cfg["sinks"][1]]}))
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "check", "-c", str(path)],
        capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "cannot reach" in text, text
    assert "starting Spark" not in text and "Using incubator modules" not in text  # no JVM

    path.write_text(
        yaml.safe_dump({**cfg, "sinks": [{**cfg["sinks"][0], "filter": "nope("}], "bogus": 1})
    )
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "check", "-c", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "bogus: unknown key" in out.stderr


@pytest.mark.kafka
def test_a_sink_that_cannot_work_stops_the_run_with_an_error_before_anything_starts(
    db, kafka, tmp_path
):
    """A missing topic (and no create_topics) is not a passing outage: an error, exit 2,
    and the word that nothing was started (no slot, no Spark)."""
    import subprocess
    import sys

    import yaml

    db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "sources": [{"name": "app", "dsn": db.dsn, "tables": ["public.orders"]}],
        "sinks": [{"name": "orders", "source": "app", "destination": {
            "type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
            "topic": "no_such_topic_here"}}],
    }))  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "run", "-c", str(path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: sink orders: Kafka: topic 'no_such_topic_here' does not exist" in out.stderr
    assert "nothing was started" in out.stderr and "warning" not in out.stderr
    slots = db.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
    )
    assert slots == [(0,)]
