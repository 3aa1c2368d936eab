"""`walstream verify` of a Kafka sink: what a consumer of its compacted topic ends up with (each
key's latest message; a delete or a tombstone removes the key) against the source table — the
acct table of tests/lake.py (composite text key, TOASTed text, arrays with NULLs, jsonb edge
values, key changes) on a two-partition topic of the tansu broker. While a writer runs, the
only difference is the one format sequin has: a key change leaves the old key's last message
in the topic (a key whose latest update left its unchanged TOASTed value out is compared on
the rest); messages produced by hand behind walstream's back are reported key for key;
`--repair` re-sends the rows; a topic that is not compacted, or a sink whose messages are not
the rows, is refused with the reason. A format debezium sink's topic (Debezium's name, its
records' key and `after`) is equal to the table while the writer runs: a key change deletes
the old key there, and an unchanged TOASTed value is the placeholder; records produced by
hand (a tombstone, a changed `after`, a key the source lacks) are reported key for key and
`--repair` re-sends the rows."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import unique
from tests.lake import REAL_TABLE, RealWriter, fill_real
from walstream.backfill.store import DONE, BackfillStore
from walstream.cli import app
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until
from walstream.verify.topic import Latest, key_json

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROWS = 300
SPARED = 8  # keys the writer leaves alone: the test changes them by hand


def verify(config: Path, sink: str, *args: str) -> tuple[int, dict[str, Any]]:
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["verify", sink, "-c", str(config), "--json", *args])
    print(
        f"verify {sink} {' '.join(args)}: exit {result.exit_code} in {time.monotonic() - t0:.1f}s"
    )
    assert result.exit_code in (0, 1), result.output
    (table,) = json.loads(result.stdout)["tables"]
    return result.exit_code, table


def keys(report: dict[str, Any], kind: str) -> set[str]:
    return {k[0] for k in report[kind]}


def records(kafka: Any, topic: str) -> dict[str, tuple[bytes, bytes]]:
    """A Debezium topic's latest record per key (its payload's `key_json`): key and value
    as the sink wrote them."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "t",
                         "enable.partition.eof": True})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    out, left, deadline = {}, {0, 1}, time.monotonic() + 60
    while left and time.monotonic() < deadline:
        for msg in consumer.consume(1_000, timeout=1.0):
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                left.discard(msg.partition())
            elif msg.value() is not None:
                out[key_json(json.loads(msg.key())["payload"])] = (msg.key(), msg.value())
    consumer.close()
    assert not left, f"partitions {left} of {topic} not read to their end in 60s"
    return out


def edited(message: bytes, **values: Any) -> bytes:
    """A Kafka Connect JSON message (schemas on) with some fields of its payload — or of
    its `after`, for a record — set to `values`."""
    whole = json.loads(message)
    payload = whole["payload"]
    (payload.get("after") or payload).update(values)
    return json.dumps(whole).encode()


def create_topics(kafka: Any, compacted: str, plain: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    made = admin.create_topics([
        NewTopic(compacted, 2, 1, config={"cleanup.policy": "compact"}),
        NewTopic(plain, 1, 1),
    ])  # fmt: skip
    for future in made.values():
        future.result(30)


def test_verify_a_compacted_topic(spark, db, kafka, tmp_path):
    from confluent_kafka import Producer

    db.execute(REAL_TABLE)
    all_keys = fill_real(db.dsn, ROWS)
    spared, busy = all_keys[:SPARED], all_keys[SPARED:]
    pub = db.create_publication("acct")
    slot = db.create_slot()
    topic, plain, prefix = unique("compacted"), unique("plain"), unique("dbz")
    create_topics(kafka, topic, plain)
    create_topics(kafka, f"{prefix}.public.acct", unique("unused"))  # Debezium's name
    kafka_dest = {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers}
    run = {
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "topic", "source": "app", "backfill": "on_create",
                   "destination": {**kafka_dest, "topic": topic}},
                  {"name": "dbz", "source": "app", "backfill": "on_create", "format": "debezium",
                   "debezium": {"topic.prefix": prefix}, "destination": kafka_dest}],
    }  # fmt: skip
    config, others = tmp_path / "walstream.yaml", tmp_path / "others.yaml"
    config.write_text(yaml.safe_dump(run))
    others.write_text(yaml.safe_dump(run | {"sinks": [
        {"name": "plain", "source": "app", "destination": {**kafka_dest, "topic": plain}},
        {"name": "rows", "source": "app", "format": "record",
         "destination": {**kafka_dest, "topic": plain}},
        {"name": "keyed", "source": "app",
         "destination": {**kafka_dest, "topic": plain, "key": "upper(`table`)"}},
    ]}))  # fmt: skip

    def refused(sink: str) -> str:
        result = CliRunner().invoke(app, ["verify", sink, "-c", str(others)])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert f"its topic {plain} is not compacted (cleanup.policy=delete)" in refused("plain")
    assert "format record does not say which messages are deletes" in refused("rows")
    assert "keyed by expressions of its own" in refused("keyed")

    plan = load_config(config)
    runtime = Runtime(plan, spark=spark).start()
    stop = threading.Event()
    writer = RealWriter(db.dsn, busy, seed=5)
    writing = threading.Thread(target=writer.run, args=(stop, 0.02))
    with supervised(runtime):
        store = BackfillStore(plan.state_dsn)
        wait_until(lambda: [b.status for b in store.find()] == [DONE] * 2, 240, interval=0.5)
        writing.start()
        wait_until(lambda: len(writer.replaced) >= 3, 60)
        before = {f"{r},{k}" for r, k in writer.replaced}
        code, report = verify(config, "topic", "--values")  # while the writer runs
        after = {f"{r},{k}" for r, k in writer.replaced}
        # A primary-key change is an update of the new key in format sequin: the old key's
        # last message stays in the compacted topic, and a consumer of it keeps that row.
        assert before <= keys(report, "extra") <= after, json.dumps(report)[:3000]
        wrong = keys(report, "missing") | keys(report, "different")
        assert code == 1 and not wrong, {k: report["values"].get(json.dumps([k])) for k in wrong}
        assert report["source_rows"] > ROWS // 2
        # Debezium's records: a key change is a delete of the old key (and its tombstone),
        # an unchanged TOASTed value the placeholder: what a consumer has is the table
        code, report = verify(config, "dbz", "--values")
        wrong = keys(report, "missing") | keys(report, "different") | keys(report, "extra")
        assert code == 0 and not wrong, {k: report["values"].get(json.dumps([k])) for k in wrong}
        # the rows each side had when read (the writer deletes more than it inserts)
        assert report["source_rows"] > 0 and report["sink_rows"] > 0
        stop.set()
        writing.join(30)
        old_keys = {f"{r},{k}" for r, k in writer.replaced}
        # an update that leaves the TOASTed value as it was: its message leaves it out
        (r0, k0) = spared[0]
        db.execute("UPDATE acct SET n = n + 1 WHERE region = %s AND id = %s", (r0, k0))

        # Behind walstream's back: a delete, a tombstone, a changed row, a key the source
        # does not have.
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
        (r1, k1), (r2, k2), (r3, k3) = spared[1], spared[2], spared[3]
        meta = '"metadata":{"table_schema":"public","table_name":"acct"}'
        row = {"region": r3, "id": k3, "n": -1}
        for key, value in (
            (f"{r1},{k1}", f'{{"record":{{"region":"{r1}","id":{k1}}},"action":"delete",{meta}}}'),
            (f"{r2},{k2}", None),
            (f"{r3},{k3}", f'{{"record":{json.dumps(row)},"action":"update",{meta}}}'),
            ("zz,1", f'{{"record":{{"region":"zz","id":1}},"action":"insert",{meta}}}'),
        ):
            producer.produce(
                topic, key=key.encode(), value=None if value is None else value.encode()
            )
        assert producer.flush(30) == 0

        code, report = verify(config, "topic")
        assert code == 1
        assert keys(report, "missing") == {f"{r1},{k1}", f"{r2},{k2}"}
        assert keys(report, "different") == {f"{r3},{k3}"}
        assert keys(report, "extra") == {"zz,1"} | old_keys
        assert f"{r0},{k0}" in keys(report, "incomplete"), report

        # --repair re-sends the rows (a backfill of those keys); the extra key stays
        code, report = verify(config, "topic", "--repair")
        assert report["repaired"] == 3 and not report["missing"] and not report["different"]
        assert code == 1 and keys(report, "extra") == {"zz,1"} | old_keys
        for key in {"zz,1"} | old_keys:  # what the topic's owner does about them
            producer.produce(topic, key=key.encode(), value=None)
        assert producer.flush(30) == 0
        code, report = verify(config, "topic")
        assert code == 0 and report["source_rows"] == report["sink_rows"], report

        # The same behind the Debezium sink's back, its records taken from its topic: a
        # tombstone, a changed `after`, a key the source does not have
        dbz_topic = f"{prefix}.public.acct"
        sent = records(kafka, dbz_topic)
        (r4, k4), (r5, k5), (r6, k6) = spared[4], spared[5], spared[6]
        gone, changed = key_json({"region": r4, "id": k4}), key_json({"region": r5, "id": k5})
        extra = key_json({"id": 1, "region": "zz"})
        key5, value5 = sent[changed]
        key6, value6 = sent[key_json({"region": r6, "id": k6})]
        producer.produce(dbz_topic, key=sent[gone][0], value=None)
        producer.produce(dbz_topic, key=key5, value=edited(value5, n=-1))
        producer.produce(dbz_topic, key=edited(key6, region="zz", id=1),
                         value=edited(value6, region="zz", id=1))  # fmt: skip
        assert producer.flush(30) == 0
        code, report = verify(config, "dbz")
        assert code == 1 and keys(report, "missing") == {gone}, report
        assert keys(report, "different") == {changed} and keys(report, "extra") == {extra}
        # spared[0]'s update left its TOASTed value out: the placeholder, equal on the rest
        assert key_json({"region": r0, "id": k0}) in keys(report, "incomplete"), report
        code, report = verify(config, "dbz", "--repair")
        assert report["repaired"] == 2 and not report["missing"] and not report["different"]
        assert code == 1 and keys(report, "extra") == {extra}, report
        producer.produce(dbz_topic, key=edited(key6, region="zz", id=1), value=None)
        assert producer.flush(30) == 0
        code, report = verify(config, "dbz")
        assert code == 0 and report["source_rows"] == report["sink_rows"], report

        del producer  # before the broker stops: no reconnecting in the background


def test_a_topic_read_has_every_acknowledged_message_while_writes_go_on(kafka):
    """`Latest.catch_up` reads each partition to the end it had when asked — while another
    producer keeps writing — and has every message the broker acknowledged before it: the
    latest of each key, read again and again from where it left off."""
    from confluent_kafka import Producer

    topic = unique("moving")
    create_topics(kafka, topic, unique("unused"))
    settings = {"bootstrap.servers": kafka.bootstrap_servers}
    stop = threading.Event()

    def write_on() -> None:
        producer, i = Producer(settings), 0
        while not stop.is_set():
            producer.produce(topic, key=f"bg{i % 40}".encode(), value=b"{}")
            producer.poll(0)
            i += 1
            stop.wait(0.003)  # pacing, ended at once by stop
        producer.flush(30)

    latest = Latest(settings, topic, "record", ("public", "t"))
    producer = Producer(settings)
    background = threading.Thread(target=write_on)
    background.start()
    try:
        for n in range(6):
            for i in range(3_000):  # more than one consume() call's worth before the probes
                producer.produce(topic, key=f"burst{i}".encode(), value=b"{}")
                producer.poll(0)
            for k in range(5):  # the probe keys' values: this round's
                producer.produce(topic, key=f"probe{k}".encode(), value=f'{{"n":{n}}}'.encode())
            assert producer.flush(30) == 0
            latest.catch_up()
            rows = latest.of("public", "t")
            assert [rows[f"probe{k}"] for k in range(5)] == [f'{{"n":{n}}}'] * 5, n
    finally:
        stop.set()
        background.join(30)


def test_a_topic_read_has_the_last_batch_when_writes_stop(kafka):
    """Messages produced together, last, with nothing after them — as a topic is when its
    writers pause — are read, by a read going on from the last and by one from the start
    (a read stopped at the end offsets tansu lists lacks them: those point into the last
    batch)."""
    from confluent_kafka import Producer

    topic = unique("paused")
    create_topics(kafka, topic, unique("unused"))
    settings = {"bootstrap.servers": kafka.bootstrap_servers}
    latest = Latest(settings, topic, "record", ("public", "t"))
    producer = Producer(settings | {"linger.ms": 50})
    for n in range(4):
        for i in range(100):
            producer.produce(topic, key=f"k{i}".encode(), value=f'{{"n":{n}}}'.encode())
        assert producer.flush(30) == 0
        for k in range(3):  # one batch per partition, the last of each
            producer.produce(topic, key=f"last{k}".encode(), value=f'{{"n":{n}}}'.encode())
        assert producer.flush(30) == 0
        latest.catch_up()
        rows = latest.of("public", "t")
        assert [rows.get(f"last{k}") for k in range(3)] == [f'{{"n":{n}}}'] * 3, n
        assert {rows[f"k{i}"] for i in range(100)} == {f'{{"n":{n}}}'}, n
        fresh = Latest(settings, topic, "record", ("public", "t"))  # read from the start
        fresh.catch_up()
        assert fresh.of("public", "t") == rows, n
