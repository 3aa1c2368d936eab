"""Run a walstream streaming query into a foreachBatch sink and collect what arrived."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walstream.testing import wait_until


@dataclass
class Collected:
    batches: list[tuple[int, list[Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rows(self) -> list[Any]:
        with self.lock:
            return [r for _, rows in self.batches for r in rows]


class StreamRun:
    def __init__(
        self, spark: Any, checkpoint: Path, trigger: dict[str, Any] | None = None, **options: str
    ) -> None:
        self.collected = Collected()
        self.checkpoint = checkpoint
        reader = spark.readStream.format("walstream")
        for k, v in options.items():
            reader = reader.option(k, v)
        df = reader.load()

        def sink(batch: Any, batch_id: int) -> None:
            rows = batch.orderBy("lsn", "seq").collect()
            with self.collected.lock:
                self.collected.batches.append((batch_id, rows))

        self.query = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**(trigger or {"processingTime": "0 seconds"}))
            .start()
        )

    def wait_for(
        self, condition: Callable[[list[Any]], bool], timeout: float = 90, what: str = ""
    ) -> list[Any]:
        def ready() -> bool:
            exc = self.query.exception()
            if exc is not None:
                raise AssertionError(f"query failed: {exc}")
            return condition(self.collected.rows())

        wait_until(
            ready,
            timeout,
            interval=0.2,
            message=lambda: f"{what}: got {len(self.collected.rows())} rows",
        )
        return self.collected.rows()

    def wait_for_rows(self, n: int, timeout: float = 90) -> list[Any]:
        return self.wait_for(lambda rows: len(rows) >= n, timeout, f"waiting for {n} rows")

    def wait_committed(self, timeout: float = 60) -> None:
        """Wait until Spark has committed the last batch collected: foreachBatch is
        at-least-once, so a query stopped between a batch's delivery and its commit
        delivers that batch again when it starts."""
        with self.collected.lock:
            last = self.collected.batches[-1][0]
        done = self.checkpoint / "commits" / str(last)
        wait_until(done.exists, timeout, interval=0.1, message=f"batch {last} not committed")

    def stop(self) -> None:
        self.query.stop()

    def __enter__(self) -> StreamRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
