"""The Kafka broker is down when `walstream run` starts, and hangs mid-stream: the run keeps
retrying with a message that names the broker and the fix, loses nothing, and resumes
on its own when the broker is back."""

from __future__ import annotations

import base64
import signal
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.conftest import unique
from tests.integration.test_run import oracle
from tests.kafka import consume, consume_all
from walstream.config import parse_config
from walstream.postgres.embedded import free_port
from walstream.runtime import Runtime
from walstream.testing import TansuBroker, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def write(db: Any, start: int, n: int) -> None:
    """n changes on 50 keys: inserts first, then updates, in 10-row transactions."""
    for i in range(start, start + n, 10):
        with db.conn.transaction():
            for j in range(i, min(i + 10, start + n)):
                db.execute(
                    "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
                    (j % 50, f"v{j}"),
                )


def cursors_of(msgs: list[Any]) -> list[tuple[bytes, tuple[int, int]]]:
    out = []
    for m in msgs:
        key = base64.b64decode(dict(m.headers())["idempotency-key"]).decode()
        lsn, seq = map(int, key.split(":"))
        out.append((m.key(), (lsn, seq)))
    return out


def test_broker_down_at_start_and_hung_mid_stream(spark, db, tmp_path):
    db.execute("CREATE TABLE kv (k int PRIMARY KEY, v text)")
    pub = db.create_publication("kv")
    oracle_slot = db.create_slot()
    slot = unique("slot")
    db.slots.append(slot)
    broker = TansuBroker(port=free_port())  # not started yet: the broker is down
    topic = unique("cdc")
    cfg = parse_config(
        {
            "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
            "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
            "sinks": [
                {
                    "name": "k",
                    "source": "app",
                    "destination": {
                        "type": "kafka",
                        "bootstrap_servers": broker.bootstrap_servers,
                        "topic": topic,
                        "create_topics": True,
                        "retry_timeout": "3s",
                        "producer": {"message.timeout.ms": 3000},
                    },
                }
            ],
        }
    )
    runtime = Runtime(cfg, spark=spark).start()
    sq = runtime.queries[0]

    def failed_and_retrying() -> bool:
        runtime.poll()
        return sq.failures >= 1 and sq.last_error is not None

    def delivered(n: int) -> Any:
        def check() -> bool:
            runtime.poll()
            p = runtime.progress().get("k")
            # skipped: delivered by an attempt that failed later, then skipped by its replay
            return p is not None and p.delivered + p.skipped >= n

        return check

    try:
        write(db, 0, 500)
        wait_until(failed_and_retrying, 120, message="the run did not report the broker down")
        # One line that names the sink, the broker and what to do.
        assert "SinkError" in sq.last_error and "Kafka" in sq.last_error, sq.last_error
        assert broker.bootstrap_servers in sq.last_error, sq.last_error
        assert "check that the brokers" in sq.last_error, sq.last_error
        assert runtime.progress().get("k") is None or runtime.progress()["k"].delivered == 0
        assert restarts(runtime) == sq.restarts >= 1  # counted in /metrics as they happen

        broker.start()  # the broker comes up: the run resumes by itself
        wait_until(delivered(500), 180, interval=0.5, message=lambda: f"{runtime.progress()}")
        first = cursors_of(consume(broker.bootstrap_servers, topic, 500))

        # Mid-stream the broker hangs (SIGSTOP: connections stay open, nothing answers).
        assert broker.proc is not None
        failures_before = sq.failures
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            write(db, 500, 500)
            wait_until(
                lambda: failed_and_retrying() and sq.failures > failures_before, 120,
                message="the run did not report the hung broker",
            )  # fmt: skip
            assert "Kafka" in sq.last_error, sq.last_error
            assert restarts(runtime) == sq.restarts > failures_before
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        wait_until(delivered(1000), 180, interval=0.5, message=lambda: f"{runtime.progress()}")
        expected = oracle(db, oracle_slot, pub, "app")
        assert len(expected) == 1000
        got = cursors_of(consume_all(broker.bootstrap_servers, topic, 1000))
    finally:
        runtime.stop()
        broker.stop()

    # Down at start: nothing had been acknowledged, so exactly once.
    assert sorted(c for _, c in first) == [(c.lsn, c.seq) for c in expected[:500]]
    # Hung mid-stream: every change arrived; a copy only where the broker stored a message
    # whose acknowledgement never came (the ledger's documented window).
    assert {c for _, c in got} == {(c.lsn, c.seq) for c in expected}
    duplicates = len(got) - len({c for _, c in got})
    print(f"duplicates after the hang: {duplicates}")
    # Only changes in flight while the broker hung (the second 500) may come twice: none
    # of the first 500, acknowledged before it, is sent again.
    counts = Counter(c for _, c in got)
    twice = {c for c, n in counts.items() if n > 1}
    assert twice <= {(c.lsn, c.seq) for c in expected[500:]}, sorted(twice)[:5]
    # Per key, the first copy of each change arrives in WAL order.
    per_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for key, c in got:
        if c not in per_key[key]:
            per_key[key].append(c)
    want: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for c in expected:
        want[",".join(c.pk).encode()].append((c.lsn, c.seq))
    assert per_key == want


def restarts(runtime: Any) -> float:
    """`walstream_query_restarts_total` of source app, as /metrics renders it."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(runtime.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == "walstream_query_restarts_total" and sample.labels == {
                "source": "app"
            }:
                return sample.value
    raise AssertionError("walstream_query_restarts_total{source=app} is not in /metrics")
