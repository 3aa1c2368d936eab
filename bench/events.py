"""`POST /v1/events` latency and throughput, next to a bare INSERT of the same row.

    .venv/bin/python -m bench.events [--requests 5000] [--threads 8]

Starts an embedded Postgres and walstream's HTTP server (uvicorn, as `walstream run`
serves it; no Spark: ingestion does not touch it), then:

1. the reference: `INSERT INTO walstream.events ...` over one psycopg connection;
2. one client, one request at a time (keep-alive): latency p50 / p95 / p99;
3. `--threads` clients at once: requests per second and latency.

Prints each figure and the ratio of the API's p50 to the bare INSERT's.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

import httpx

from bench.results import figure
from walstream.config import parse_config
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.server import Server
from walstream.state.outbox import Outbox, ensure_outbox

TOKEN = "bench-token"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def event(i: int) -> dict[str, object]:
    return {"event_type": "order.created", "ordering_key": f"order-{i % 100}",
            "payload": {"id": i, "amount": "12.50", "items": [1, 2, 3]}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    with EmbeddedPostgres(settings={"synchronous_commit": "on"}) as pg:
        dsn = pg.dsn()
        with connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION bench")
        ensure_outbox(dsn, "walstream", "bench")
        cfg = parse_config({
            "server": {"port": 0},
            "events": {"source": "app", "token": TOKEN},
            "sources": [{"name": "app", "dsn": dsn, "slot": "bench", "publication": "bench"}],
            "sinks": [{"name": "hooks", "source": "app", "event_types": ["order.created"],
                       "destination": {"type": "file", "path": "/tmp/walstream-bench-events"}}],
        })  # fmt: skip
        runtime = Runtime(cfg)  # not started: the server and the outbox are all this needs
        runtime.outbox = Outbox(dsn, "walstream")
        server = Server(runtime, runtime.monitor, runtime.metrics).start()
        url = f"{server.url}/v1/events"
        try:
            with connect(dsn, autocommit=True) as conn:
                bare = []
                for _ in range(min(args.requests, 2000)):
                    t0 = time.perf_counter()
                    conn.execute(
                        "INSERT INTO walstream.events (event_type, payload, ordering_key) "
                        "VALUES (%s, %s::jsonb, %s)",
                        ("order.created", '{"id":1,"amount":"12.50","items":[1,2,3]}', "o"),
                    )
                    bare.append(time.perf_counter() - t0)
            print(f"bare INSERT (psycopg, autocommit): p50 {pct(bare, 50):.2f} ms, "
                  f"p99 {pct(bare, 99):.2f} ms")  # fmt: skip

            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(headers=headers) as c:
                for i in range(200):  # warm up
                    c.post(url, json=event(i))
                one = []
                for i in range(args.requests):
                    t0 = time.perf_counter()
                    r = c.post(url, json=event(i), headers={"Idempotency-Key": str(uuid.uuid4())})
                    one.append(time.perf_counter() - t0)
                    assert r.status_code == 202, r.text
            print(f"POST /v1/events, one client: p50 {pct(one, 50):.2f} ms, p95 "
                  f"{pct(one, 95):.2f} ms, p99 {pct(one, 99):.2f} ms, "
                  f"{len(one) / sum(one):,.0f} requests/s")  # fmt: skip

            lat: list[float] = []
            lock = threading.Lock()
            per = args.requests // args.threads

            def client() -> None:
                mine = []
                with httpx.Client(headers=headers) as c:
                    for i in range(per):
                        t0 = time.perf_counter()
                        r = c.post(url, json=event(i))
                        mine.append(time.perf_counter() - t0)
                        assert r.status_code == 202
                with lock:
                    lat.extend(mine)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(args.threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            print(f"POST /v1/events, {args.threads} clients: {len(lat) / elapsed:,.0f} requests/s, "
                  f"p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms")  # fmt: skip
            figure("events", "POST /v1/events p50, one client", statistics.median(one) * 1000,
                   "ms", reference="bare INSERT p50", reference_value=statistics.median(bare) * 1000,
                   target="< 50 ms")  # fmt: skip
            figure("events", f"POST /v1/events, {args.threads} clients (requests/s)",
                   len(lat) / elapsed, "/s")  # fmt: skip
            print(f"ratio: API p50 / bare INSERT p50 = "
                  f"{statistics.median(one) / statistics.median(bare):.1f}x")  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
