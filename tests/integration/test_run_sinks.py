"""`walstream run` into webhooks, Redis Streams, NATS JetStream, RabbitMQ and a Postgres
mirror at once.

Each sink routes by a Spark SQL expression (per table or action), so the test
checks the wiring of routes and keys as well as delivery: every change arrives at
the right place, once, in order per row. Then the webhook receiver answers 410
Gone: walstream pauses that sink, says why, and delivers the rest after
`walstream resume`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import unique
from tests.servers import Service, WebhookReceiver, nats_server, rabbitmq_server, redis_server
from walstream.config import load_config
from walstream.delivery.parking import ParkingLot
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]

KEYS, ROUNDS = 10, 6


@pytest.fixture(scope="module")
def services() -> Iterator[dict[str, Service]]:
    svcs = {"redis": redis_server(), "nats": nats_server(), "rabbitmq": rabbitmq_server()}
    yield svcs
    for s in svcs.values():
        s.stop()


def rows_by_key(values: list[dict[str, Any]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for v in values:
        out[v["record"]["id"]].append(v["record"]["n"])
    return dict(out)


def test_run_routes_to_webhooks_redis_nats_and_rabbitmq(spark, db, tmp_path, services) -> None:
    import nats
    import pika
    import redis

    items, notes = unique("items"), unique("notes")
    for t in (items, notes):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, n int)")
    pub, slot = db.create_publication(items, notes), db.create_slot()
    rx = WebhookReceiver().start()
    prefix = unique("cdc")
    redis_url = f"redis://127.0.0.1:{services['redis'].port}/0"
    nats_url = f"nats://127.0.0.1:{services['nats'].port}"
    amqp_url = f"amqp://guest:guest@127.0.0.1:{services['rabbitmq'].port}/%2F"

    async def add_stream() -> None:
        nc = await nats.connect(nats_url)
        await nc.jetstream().add_stream(name=prefix, subjects=[f"{prefix}.>"])
        await nc.close()

    asyncio.run(add_stream())
    amqp = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = amqp.channel()
    ch.exchange_declare(prefix, "topic", durable=True)
    for action in ("insert", "update", "delete"):  # one queue per action, of both tables
        ch.queue_declare(f"{prefix}.{action}", durable=True)
        ch.queue_bind(f"{prefix}.{action}", prefix, f"{action}.#")

    mirror_db = unique("mirror")
    db.execute(f"CREATE DATABASE {mirror_db}")
    mirror_dsn = db.server.dsn(mirror_db)

    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [
            {"name": "hooks", "source": "app", "max_attempts": 3,
             "destination": {"type": "webhook", "concurrency": 4,
                             "url": f"concat('{rx.url('/')}', `table`)"}},
            {"name": "streams", "source": "app",
             "destination": {"type": "redis_stream", "url": redis_url,
                             "stream": f"concat('{prefix}:', `table`)"}},
            {"name": "subjects", "source": "app",
             "destination": {"type": "nats", "servers": nats_url,
                             "subject": f"concat('{prefix}.', `table`)", "stream": prefix}},
            {"name": "mirror", "source": "app",
             "destination": {"type": "postgres", "dsn": mirror_dsn}},
            {"name": "queues", "source": "app",
             "destination": {"type": "rabbitmq", "url": amqp_url, "exchange": prefix,
                             "routing_key": "concat(action, '.', `table`)"}},
        ],
    }))  # fmt: skip
    cfg = load_config(path)

    def write_round(r: int) -> None:
        with db.conn.transaction():
            for t in (items, notes):
                for k in range(KEYS):
                    if r == 0:
                        db.execute(f"INSERT INTO {t} VALUES (%s, 0)", (k,))
                    else:
                        db.execute(f"UPDATE {t} SET n = %s WHERE id = %s", (r, k))

    for r in range(ROUNDS):
        write_round(r)
    db.execute(f"DELETE FROM {items} WHERE id = 0")
    total = 2 * KEYS * ROUNDS + 1
    expected = {k: list(range(ROUNDS)) for k in range(KEYS)}
    runtime = Runtime(cfg, spark=spark).start()
    supervising = threading.Event()  # `walstream run` restarts a failed query: so does this
    threading.Thread(
        target=runtime.supervise, kwargs={"stop": supervising, "tick": 0.2}, daemon=True
    ).start()
    try:
        wait_until(
            lambda: all(
                (p := runtime.progress().get(s)) is not None and p.delivered == total
                for s in ("hooks", "streams", "subjects", "queues", "mirror")
            ),
            120, message=lambda: f"progress: {runtime.progress()}",
        )  # fmt: skip

        # webhooks: one path per table
        for t in (items, notes):
            got = [json.loads(r.body) for r in rx.requests if r.path == f"/{t}"]
            assert {v["metadata"]["table_name"] for v in got} == {t}
            assert rows_by_key([v for v in got if v["action"] != "delete"]) == expected
        assert len(rx.requests) == total

        # Redis: one stream per table, fields message + idempotency_key + key
        client = redis.Redis.from_url(redis_url)
        for t in (items, notes):
            entries = client.xrange(f"{prefix}:{t}")
            got = [json.loads(f[b"message"]) for _, f in entries]
            assert rows_by_key([v for v in got if v["action"] != "delete"]) == expected
            assert all(f[b"idempotency_key"] == v["metadata"]["idempotency_key"].encode()
                       and f[b"key"] == str(v["record"]["id"]).encode()
                       for (_, f), v in zip(entries, got, strict=True))  # fmt: skip
        assert client.xlen(f"{prefix}:{items}") == KEYS * ROUNDS + 1

        # NATS: subjects per table in one stream, Nats-Msg-Id = idempotency key
        async def fetch() -> list[tuple[str, dict[str, str], Any]]:
            nc = await nats.connect(nats_url)
            js = nc.jetstream()
            info = await js.stream_info(prefix)
            out = []
            for seq in range(1, info.state.last_seq + 1):
                m = await js.get_msg(prefix, seq)
                out.append((m.subject, m.headers, json.loads(m.data)))
            await nc.close()
            return out

        msgs = asyncio.run(fetch())
        assert len(msgs) == total
        for subject, headers, v in msgs:
            assert subject == f"{prefix}.{v['metadata']['table_name']}"
            assert headers["Nats-Msg-Id"] == v["metadata"]["idempotency_key"]
        assert rows_by_key([v for s, _, v in msgs if s.endswith(notes)]) == expected

        # RabbitMQ: a topic exchange, routed by action; persistent, message_id set
        got_by_action: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for action in ("insert", "update", "delete"):
            while True:
                method, props, body = ch.basic_get(f"{prefix}.{action}", auto_ack=True)
                if method is None:
                    break
                v = json.loads(body)
                assert (
                    props.delivery_mode == 2
                    and props.message_id == v["metadata"]["idempotency_key"]
                )
                assert method.routing_key == f"{action}.{v['metadata']['table_name']}"
                got_by_action[action].append(v)
        assert {a: len(v) for a, v in got_by_action.items()} == {
            "insert": 2 * KEYS, "update": 2 * KEYS * (ROUNDS - 1), "delete": 1
        }  # fmt: skip

        # the Postgres mirror: both tables, created there, equal the source
        for t in (items, notes):
            query = f"SELECT id, n FROM {t} ORDER BY id"
            with connect(mirror_dsn, autocommit=True) as conn:
                assert conn.execute(query).fetchall() == db.execute(query)

        # 410 Gone: the webhook sink pauses itself and says why; resume delivers the rest
        rx.answer = lambda p: 410
        write_round(ROUNDS)
        lot = ParkingLot(cfg.state_dsn)
        wait_until(lambda: "hooks" in lot.paused(), 60, message="the sink was not paused")
        assert "answered 410 Gone" in (lot.paused()["hooks"] or "")
        wait_until(lambda: any(sq.pipeline.holding for sq in runtime.queries), 60)
        holding = next(sq.pipeline.holding for sq in runtime.queries if sq.pipeline.holding)
        assert "sink hooks is paused" in holding["hooks"]
        # the other sinks of the source wait with it, and their status says so
        sinks = {x["name"]: x for x in runtime.monitor.snapshot(fresh=True).sinks}
        assert sinks["hooks"]["status"] == "paused"
        others = [n for n in sinks if n != "hooks"]
        assert others and all(
            sinks[n]["status"] == "warning"
            and any(r.text.startswith("waits for hooks") for r in sinks[n]["reasons"])
            for n in others
        ), {n: (sinks[n]["status"], sinks[n]["reasons"]) for n in others}
        before = len(rx.requests)
        rx.answer = lambda p: 200
        out = subprocess.run(
            [sys.executable, "-m", "walstream.cli", "resume", "hooks", "-c", str(path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        # the round updates every row but the deleted one, and each arrives once
        wait_until(lambda: len(rx.requests) - before >= 2 * KEYS - 1, 60,
                   message=lambda: f"{len(rx.requests) - before} after resume")  # fmt: skip
        wait_until(lambda: not any(sq.pipeline.holding for sq in runtime.queries), 30)
        last = [json.loads(r.body) for r in rx.requests[before:]]
        assert sorted((v["metadata"]["table_name"], v["record"]["id"]) for v in last) == sorted(
            (t, k) for t in (items, notes) for k in range(KEYS) if (t, k) != (items, 0)
        )
        assert all(v["record"]["n"] == ROUNDS for v in last)
    finally:
        supervising.set()
        runtime.stop()
        rx.stop()
        amqp.close()
        db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")
