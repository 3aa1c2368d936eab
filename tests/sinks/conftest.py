"""Harnesses for the sink contract suite: one per sink, each against its real server.

A harness makes a destination for a fresh route (topic, stream, subject, queue,
URL path, directory), reads back what arrived there in arrival order, and makes
destinations that fail: one that refuses messages for good, one that is down.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers import (
    Service,
    WebhookReceiver,
    nats_server,
    rabbitmq_server,
    redis_server,
)
from walstream.postgres.embedded import free_port
from walstream.sinks.base import SinkContext
from walstream.sinks.registry import sink_types
from walstream.testing import TansuBroker, wait_until


@dataclass(frozen=True)
class Got:
    """One delivered message as the destination holds it."""

    idempotency_key: str
    value: bytes


class Harness:
    name: str
    dedupes = False  # the destination drops a replayed message by its idempotency key
    state_only = False  # the destination keeps each row's latest state, not every message
    context: SinkContext | None = None  # what the config's plan resolves the sink with

    def unreachable_context(self) -> SinkContext | None:
        """The context of `unreachable()`'s destination."""
        return self.context

    def prepare(self, route: str, messages: list[Any]) -> list[Any]:
        """The messages as this sink takes them (the same, except for the mirror)."""
        return messages

    def destination(self, route: str) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, route: str, n: int) -> list[Got]:
        """What arrived at `route`, in order, once at least `n` did (then no more may come)."""
        got: list[Got] = []

        def enough() -> bool:
            got[:] = self._read(route)
            return len(got) >= n

        wait_until(enough, 30, interval=0.1, message=lambda: f"{self.name}: {len(got)}/{n}")
        return got

    def _read(self, route: str) -> list[Got]:
        raise NotImplementedError

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        """A destination and a message value it refuses for good."""
        raise NotImplementedError

    def unreachable(self) -> dict[str, Any]:
        raise NotImplementedError


class FileHarness(Harness):
    name, dedupes = "file", True

    def __init__(self, root: Path) -> None:
        self.root = root

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "file", "path": str(self.root / route), "format": "parquet"}

    def _read(self, route: str) -> list[Got]:
        import pyarrow.parquet as pq

        out = []
        for f in sorted((self.root / route).glob("batch-*-part-*.parquet")):
            for row in pq.read_table(f).to_pylist():
                out.append(Got(row["idempotency_key"], row["message"].encode()))
        return out


class KafkaHarness(Harness):
    name = "kafka"

    def __init__(self, broker: TansuBroker) -> None:
        self.broker = broker

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "kafka", "bootstrap_servers": self.broker.bootstrap_servers,
                "topic": route, "create_topics": True}  # fmt: skip

    def read(self, route: str, n: int) -> list[Got]:
        from tests.kafka import consume

        return [
            Got(dict(m.headers())["idempotency-key"].decode(), m.value())
            for m in consume(self.broker.bootstrap_servers, route, n)
        ]

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        dest = self.destination(route)
        dest["producer"] = {"message.max.bytes": 2000}
        return dest, b'"' + b"x" * 5000 + b'"'

    def unreachable(self) -> dict[str, Any]:
        return {"type": "kafka", "bootstrap_servers": f"127.0.0.1:{free_port()}", "topic": "t",
                "producer": {"message.timeout.ms": 2000}}  # fmt: skip


class WebhookHarness(Harness):
    name = "webhook"

    def __init__(self, rx: WebhookReceiver) -> None:
        self.rx = rx
        rx.answer = lambda path: 200  # an earlier test may have left another answer

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "webhook", "url": self.rx.url(f"/{route}"), "concurrency": 4}

    def _read(self, route: str) -> list[Got]:
        with self.rx.lock:
            return [
                Got(r.headers["webhook-id"], r.body)
                for r in self.rx.requests
                if r.path == f"/{route}"
            ]

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        answer = self.rx.answer
        self.rx.answer = lambda path: 422 if path == f"/{route}" else answer(path)
        return self.destination(route), b'{"bad": true}'

    def unreachable(self) -> dict[str, Any]:
        return {"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/hook", "timeout": 2}


class RedisHarness(Harness):
    name = "redis"

    def __init__(self, svc: Service) -> None:
        import redis

        self.url = f"redis://127.0.0.1:{svc.port}/0"
        self.client = redis.Redis.from_url(self.url)

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "redis_stream", "url": self.url, "stream": route}

    def _read(self, route: str) -> list[Got]:
        return [
            Got(f[b"idempotency_key"].decode(), f[b"message"]) for _, f in self.client.xrange(route)
        ]

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        self.client.set(route, "not a stream")  # XADD to it: WRONGTYPE
        return self.destination(route), b"{}"

    def unreachable(self) -> dict[str, Any]:
        return {"type": "redis_stream", "url": f"redis://127.0.0.1:{free_port()}/0",
                "stream": "s", "timeout": 2}  # fmt: skip


class NatsHarness(Harness):
    name, dedupes = "nats", True

    def __init__(self, svc: Service) -> None:
        self.servers = f"nats://127.0.0.1:{svc.port}"

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "nats", "servers": self.servers, "subject": f"{route}.changes",
                "stream": route, "create_stream": True}  # fmt: skip

    def _read(self, route: str) -> list[Got]:
        import nats
        import nats.js.errors

        async def fetch() -> list[Got]:
            nc = await nats.connect(self.servers)
            try:
                js = nc.jetstream()
                try:
                    info = await js.stream_info(route)
                except nats.js.errors.NotFoundError:
                    return []
                out = []
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    m = await js.get_msg(route, seq)
                    out.append(Got(m.headers["Nats-Msg-Id"], m.data))
                return out
            finally:
                await nc.close()

        return asyncio.run(fetch())

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        # no stream takes this subject: JetStream has no responder for it
        return {"type": "nats", "servers": self.servers, "subject": f"{route}.nowhere"}, b"{}"

    def unreachable(self) -> dict[str, Any]:
        return {"type": "nats", "servers": f"nats://127.0.0.1:{free_port()}", "subject": "s",
                "timeout": 2}  # fmt: skip


class RabbitMqHarness(Harness):
    name = "rabbitmq"

    def __init__(self, svc: Service) -> None:
        self.url = f"amqp://guest:guest@127.0.0.1:{svc.port}/%2F"
        self.got: dict[str, list[Got]] = {}

    def _channel(self) -> Any:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        return conn, conn.channel()

    def destination(self, route: str) -> dict[str, Any]:
        conn, ch = self._channel()
        ch.queue_declare(route, durable=True)
        conn.close()
        return {"type": "rabbitmq", "url": self.url, "routing_key": route}

    def _read(self, route: str) -> list[Got]:
        conn, ch = self._channel()
        try:
            got = self.got.setdefault(route, [])
            while True:
                method, props, body = ch.basic_get(route, auto_ack=True)
                if method is None:
                    return list(got)
                got.append(Got(props.message_id, body))
        finally:
            conn.close()

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        # the default exchange routes to the queue the key names, and there is none
        return {"type": "rabbitmq", "url": self.url, "routing_key": f"{route}.none"}, b"{}"

    def unreachable(self) -> dict[str, Any]:
        return {"type": "rabbitmq", "url": f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",
                "routing_key": "q", "timeout": 2}  # fmt: skip


class PostgresHarness(Harness):
    """The mirror keeps rows, not messages: each group is one row (id = group) that every
    message of the group updates; the target's cursor table says where it got to."""

    name, dedupes, state_only = "postgres", True, True

    def __init__(self, source: Any, target: str) -> None:
        self.source, self.target = source, target

    def _table(self, route: str) -> None:
        self.source.execute(
            f'CREATE TABLE IF NOT EXISTS {route} (id int PRIMARY KEY, "group" int, n int)'
        )

    def prepare(self, route: str, messages: list[Any]) -> list[Any]:
        self._table(route)
        seen: set[int] = set()
        out = []
        for m in messages:
            v = json.loads(m.value)
            action = "update" if v["group"] in seen else "insert"
            seen.add(v["group"])
            change = {"action": action, "schema": "public", "table": route,
                      "record": {"id": v["group"], **v}, "unchanged_toast": None}  # fmt: skip
            out.append(m._replace(value=json.dumps(change).encode(), table=f"public.{route}"))
        return out

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "postgres", "dsn": self.target, "source_dsn": self.source.dsn}

    def read(self, route: str, n: int) -> list[Got]:
        """The rows (one per group, its latest state), with the table's cursor as key."""
        from walstream.change import idempotency_key
        from walstream.postgres.replication import connect

        with connect(self.target, autocommit=True) as conn:
            rows = conn.execute(f'SELECT "group", n FROM {route} ORDER BY id').fetchall()
            lsn, seq = conn.execute(
                "SELECT lsn, seq FROM walstream.mirror_cursors WHERE source_table = %s",
                (f"public.{route}",),
            ).fetchone()
        key = idempotency_key(lsn, seq)
        return [Got(key, json.dumps({"group": g, "n": v}).encode()) for g, v in rows]

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        from walstream.postgres.replication import connect

        self._table(route)
        with connect(self.target, autocommit=True) as conn:  # the target differs: a CHECK
            conn.execute(
                f'CREATE TABLE {route} (id int PRIMARY KEY, "group" int, n int CHECK (n < 0))'
            )
        change = {"action": "insert", "schema": "public", "table": route,
                  "record": {"id": 1, "group": 1, "n": 5}, "unchanged_toast": None}  # fmt: skip
        return self.destination(route), json.dumps(change).encode()

    def unreachable(self) -> dict[str, Any]:
        return {"type": "postgres", "dsn": f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                "source_dsn": self.source.dsn}  # fmt: skip


@pytest.fixture(scope="session")
def redis_service() -> Iterator[Service]:
    svc = redis_server()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def nats_service() -> Iterator[Service]:
    svc = nats_server()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def rabbitmq_service() -> Iterator[Service]:
    svc = rabbitmq_server()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def receiver() -> Iterator[WebhookReceiver]:
    rx = WebhookReceiver().start()
    yield rx
    rx.stop()


class StreamHarness(Harness):
    """Pull subscriptions' sink: messages kept in the state database (`stream_messages`)."""

    name, dedupes = "stream", True  # a replayed batch writes nothing twice (ON CONFLICT)

    def __init__(self, db: Any) -> None:
        from walstream.state.streams import StreamTables

        self.db = db
        self.context = SinkContext("app", db.dsn, db.dsn, "walstream")
        StreamTables(db.dsn, "walstream").ensure()  # walstream run makes them at start

    def destination(self, route: str) -> dict[str, Any]:
        return {"type": "stream", "stream": route.replace("_", "-")}

    def _read(self, route: str) -> list[Got]:
        rows = (
            self.db.execute(
                "SELECT ikey, value FROM walstream.stream_messages WHERE stream = %s "
                "ORDER BY lsn, seq",
                (route.replace("_", "-"),),
            )
            if self.db.execute("SELECT to_regclass('walstream.stream_messages')")[0][0]
            else []
        )
        return [Got(k, v.encode()) for k, v in rows]

    def refusing(self, route: str) -> tuple[dict[str, Any], bytes]:
        return self.destination(route), b'"a NUL byte: \x00"'  # text cannot hold it

    def unreachable(self) -> dict[str, Any]:
        return self.destination("down")

    def unreachable_context(self) -> SinkContext:
        dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/x?connect_timeout=2"
        return SinkContext("app", dsn, dsn, "walstream")


#: How to make each sink's harness, by destination type. The contract suite runs for every
#: registered sink type (walstream.sinks.registry) but those below: a new sink fails here
#: until it has a harness.
HARNESSES: dict[str, Callable[[Any, Path], Harness]] = {
    "file": lambda request, tmp_path: FileHarness(tmp_path),
    "kafka": lambda request, tmp_path: KafkaHarness(request.getfixturevalue("kafka")),
    "webhook": lambda request, tmp_path: WebhookHarness(request.getfixturevalue("receiver")),
    "redis_stream": lambda request, tmp_path: RedisHarness(
        request.getfixturevalue("redis_service")
    ),
    "nats": lambda request, tmp_path: NatsHarness(request.getfixturevalue("nats_service")),
    "rabbitmq": lambda request, tmp_path: RabbitMqHarness(
        request.getfixturevalue("rabbitmq_service")
    ),
    "postgres": lambda request, tmp_path: PostgresHarness(
        request.getfixturevalue("db"), request.getfixturevalue("target")
    ),
    "stream": lambda request, tmp_path: StreamHarness(request.getfixturevalue("db")),
}
#: Not run through the contract suite: a wrapper of the others (tests/integration/test_chaos.py)
#: and the lake sinks, which write tables, not messages (tests/integration/test_lake*.py).
NOT_CONTRACTED = {"faulty", "delta", "iceberg"}
SINKS = sorted(set(sink_types()) - NOT_CONTRACTED)


@pytest.fixture(params=SINKS)
def harness(request: Any, tmp_path: Path) -> Harness:
    make = HARNESSES.get(request.param)
    if make is None:
        pytest.fail(f"sink {request.param!r} has no harness: add one to HARNESSES in {__file__}")
    return make(request, tmp_path)


def values(got: list[Got]) -> list[dict[str, Any]]:
    return [json.loads(g.value) for g in got]
