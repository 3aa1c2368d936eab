"""Spark's own start floor: how long a fresh process takes from its start to the first rows
of a streaming query in a Python `foreachBatch`, with walstream's Spark settings.

    .venv/bin/python -m bench.startfloor        # prints {"spark_up": s, "first_rows": s}

Spark's built-in `rate` source (no Postgres, no Python data source) into a foreachBatch
that collects its rows: what any PySpark streaming job pays before its first batch
(the JVM, the session, the query, the first two micro-batches). `walstream run`'s first
message after start is compared with it (bench.debezium), like latency with the no-op
foreachBatch floor (bench.kafka).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

T0 = time.monotonic()


def measure() -> dict[str, float]:
    """In a child process (its own JVM, as `walstream run` has): seconds to each step."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.startfloor"], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise SystemExit(f"bench.startfloor failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    from walstream.config import parse_config
    from walstream.engine.session import build_spark

    cfg = parse_config({
        "sources": [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:1/app"}],
        "sinks": [{"name": "out", "source": "app",
                   "destination": {"type": "file", "path": "/nonexistent"}}],
    })  # fmt: skip
    spark = build_spark(cfg)
    up = time.monotonic() - T0
    seen = threading.Event()

    def batch(df: object, _: int) -> None:
        if df.select("value").collect():  # type: ignore[attr-defined]
            seen.set()

    q = (
        spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
        .writeStream.foreachBatch(batch).trigger(processingTime="0 seconds").start()
    )  # fmt: skip
    if not seen.wait(120):
        raise SystemExit("no rows within 120 s")
    first = time.monotonic() - T0
    q.stop()
    spark.stop()
    print(json.dumps({"spark_up": round(up, 2), "first_rows": round(first, 2)}))


if __name__ == "__main__":
    main()
