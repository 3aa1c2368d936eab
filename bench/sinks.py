"""Messages/s of each sink on its own, and of the webhook sink at several concurrencies.

    .venv/bin/python -m bench.sinks [--messages 200000] [--chunk 500]

1. Every sink (file jsonl and parquet, Kafka into tansu, Redis Streams, NATS
   JetStream, RabbitMQ, webhook) delivers MESSAGES sequin-sized messages (~400
   bytes, 1,000 groups) as one Spark task would: begin, deliver in chunks of
   CHUNK, finish. The servers are the ones on the standard loopback ports, or
   started as the tests start them.
2. Webhooks at concurrency 1, 8 and 32 (one message per request, signed) against a
   local receiver (uvicorn, a minimal ASGI app, in its own process), next to the
   receiver's ceiling measured in the same run: a bare httpx client with the same
   number of threads, keep-alive, unsigned, posting the same bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from bench.results import figure
from walstream.change import idempotency_key
from walstream.config import Destination
from walstream.postgres.embedded import free_port
from walstream.sinks.base import BatchInfo, Message
from walstream.sinks.registry import sink_for
from walstream.testing import TansuBroker, _port_open, wait_until

RECEIVER = """
import sys
count = 0
async def app(scope, receive, send):
    global count
    if scope["type"] != "http":
        return
    while True:
        event = await receive()
        if not event.get("more_body"):
            break
    count += 1
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
import uvicorn
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False)
"""


def messages(n: int) -> list[Message]:
    out = []
    for i in range(n):
        record = {"id": i % 1000, "aid": i, "bid": i % 10, "tid": i % 100, "delta": i % 9999,
                  "mtime": "2026-11-23T10:00:00.000000Z", "filler": "f" * 22, "note": f"n{i}"}  # fmt: skip
        value = json.dumps({
            "record": record, "changes": None, "action": "insert",
            "metadata": {"table_schema": "public", "table_name": "accounts_history",
                         "commit_timestamp": "2026-11-23T10:00:00.000000Z",
                         "commit_lsn": 0x1000000 + i, "commit_idx": 0,
                         "idempotency_key": idempotency_key(0x1000000 + i, 0)},
        }).encode()  # fmt: skip
        out.append(
            Message(0x1000000 + i, 0, value, str(i % 1000).encode(), None,
                    "public.accounts_history", "insert", group=str(i % 1000))
        )  # fmt: skip
    return out


def deliver(dest: dict[str, Any], msgs: list[Message], chunk: int) -> float:
    """Seconds to deliver `msgs` through one sink instance, as one task does."""
    sink = sink_for(TypeAdapter(Destination).validate_python(dest))
    sink.test_connection()  # connect (and warm up) before the clock starts
    sink.prepare_batch("bench", 1, 1)
    sink.begin(BatchInfo("bench", 1, 0, 1))
    t0 = time.perf_counter()
    try:
        for i in range(0, len(msgs), chunk):
            sink.deliver(msgs[i : i + chunk])
        sink.finish()
    finally:
        sink.close()
    return time.perf_counter() - t0


def ceiling(url: str, bodies: list[bytes], threads: int) -> float:
    """Seconds for a bare keep-alive httpx client with `threads` threads to post `bodies`."""
    import httpx

    client = httpx.Client(limits=httpx.Limits(max_connections=threads))
    client.post(url, content=b"{}")
    parts = [bodies[k::threads] for k in range(threads)]

    def post(part: list[bytes]) -> None:
        for b in part:
            client.post(url, content=b, headers={"content-type": "application/json"})

    t0 = time.perf_counter()
    workers = [threading.Thread(target=post, args=(p,)) for p in parts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - t0
    client.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--chunk", type=int, default=500, help="the sink's batch_size")
    ap.add_argument("--webhook-messages", type=int, default=20_000,
                    help="messages per webhook run (one request each)")  # fmt: skip
    args = ap.parse_args()
    from tests.servers import nats_server, rabbitmq_server, redis_server

    msgs = messages(args.messages)
    size = sum(len(m.value or b"") for m in msgs) / len(msgs)
    print(f"{args.messages:,} messages of {size:.0f} bytes, 1,000 groups, chunks of {args.chunk}")
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-sinks-"))
    redis, nats, rabbit = redis_server(), nats_server(), rabbitmq_server()
    results: list[tuple[str, float, str]] = []
    tag = str(int(time.time()))
    try:
        with TansuBroker() as broker:
            import pika

            amqp = f"amqp://guest:guest@127.0.0.1:{rabbit.port}/%2F"
            conn = pika.BlockingConnection(pika.URLParameters(amqp))
            conn.channel().queue_declare(f"bench{tag}", durable=True)
            runs = {
                "file (jsonl)": {"type": "file", "path": str(work / "jsonl")},
                "file (parquet)": {"type": "file", "path": str(work / "pq"), "format": "parquet"},
                "kafka (tansu, acks=all, idempotent)": {
                    "type": "kafka", "bootstrap_servers": broker.bootstrap_servers,
                    "topic": f"bench{tag}", "create_topics": True,
                    "producer": {"linger.ms": 5, "batch.size": 1_000_000}},
                "redis_stream": {"type": "redis_stream",
                                 "url": f"redis://127.0.0.1:{redis.port}/0",
                                 "stream": f"bench{tag}"},
                "nats (JetStream, acks)": {"type": "nats",
                                           "servers": f"nats://127.0.0.1:{nats.port}",
                                           "subject": f"bench{tag}.x", "stream": f"bench{tag}",
                                           "create_stream": True},
                "rabbitmq (confirms, persistent)": {"type": "rabbitmq", "url": amqp,
                                                    "routing_key": f"bench{tag}"},
            }  # fmt: skip
            for name, dest in runs.items():
                took = deliver(dest, msgs, args.chunk)
                results.append((name, args.messages / took, ""))
                figure("sinks", f"{name} (messages/s)", args.messages / took, "/s")
                print(f"  {name:<40}{args.messages / took:>10,.0f}/s", flush=True)
            ch = conn.channel()
            ch.queue_delete(f"bench{tag}")
            conn.close()
            asyncio.run(_drop_stream(f"nats://127.0.0.1:{nats.port}", f"bench{tag}"))
            import redis as redis_client

            redis_client.Redis.from_url(f"redis://127.0.0.1:{redis.port}/0").delete(f"bench{tag}")

        port = free_port()
        rx = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
        try:
            wait_until(lambda: _port_open(port), 30, message="the receiver did not start")
            url = f"http://127.0.0.1:{port}/hook"
            few = msgs[: args.webhook_messages]
            bodies = [m.value or b"" for m in few]
            secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            for c in (1, 8, 32):
                ref = len(few) / ceiling(url, bodies, c)
                dest = {"type": "webhook", "url": url, "concurrency": c, "secrets": [secret]}
                got = len(few) / deliver(dest, few, args.chunk)
                results.append(
                    (f"webhook, concurrency {c}", got, f"{got / ref:.2f}x of {ref:,.0f}/s")
                )
                figure("sinks", f"webhook, concurrency {c} (messages/s)", got, "/s",
                       reference=f"local receiver ceiling, {c} clients", reference_value=ref)  # fmt: skip
                print(
                    f"  webhook concurrency {c:<3} {got:>10,.0f}/s  ceiling {ref:,.0f}/s",
                    flush=True,
                )
        finally:
            rx.terminate()
            rx.wait(10)
    finally:
        for s in (redis, nats, rabbit):
            s.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'sink':<42}{'messages/s':>12}  {'vs the receiver ceiling (same run)'}")
    for name, rate, note in results:
        print(f"{name:<42}{rate:>12,.0f}  {note}")


async def _drop_stream(servers: str, name: str) -> None:
    import nats

    nc = await nats.connect(servers)
    await nc.jetstream().delete_stream(name)
    await nc.close()


if __name__ == "__main__":
    main()
