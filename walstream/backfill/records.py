"""What the backfill tables hold: a backfill, a chunk of it, a watermark the stream saw."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

PENDING, RUNNING, DONE, CANCELLED, FAILED = "pending", "running", "done", "cancelled", "failed"
ACTIVE = (PENDING, RUNNING)


@dataclass(frozen=True)
class Backfill:
    id: int
    sink: str
    source: str
    schema: str
    table: str
    where: str | None
    chunk_size: int
    target_seconds: float
    status: str
    error: str | None
    rows_estimated: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    planned_all: bool
    # from the chunks
    chunks: int = 0
    chunks_emitted: int = 0
    rows_read: int = 0

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def rate(self) -> float | None:
        """Rows read per second since it started (None before any)."""
        if self.started_at is None or not self.rows_read:
            return None
        end = self.finished_at or datetime.now(self.started_at.tzinfo)
        seconds = (end - self.started_at).total_seconds()
        return self.rows_read / seconds if seconds > 0 else None

    @property
    def eta(self) -> float | None:
        """Seconds left at the current rate, from the estimate (None when unknown)."""
        rate = self.rate
        if self.status != RUNNING or rate is None or self.rows_estimated is None:
            return None
        return max(0.0, (self.rows_estimated - self.rows_read) / rate)


@dataclass(frozen=True)
class Chunk:
    backfill: int
    n: int
    after: tuple[str, ...] | None
    upto: tuple[str, ...] | None
    attempt: int
    status: str
    rows: int | None


@dataclass(frozen=True)
class Mark:
    """A watermark as the pipeline saw it in the stream."""

    backfill: int
    chunk: int
    attempt: int
    mark: str  # "low" | "high"
    lsn: int
    seq: int
    batch: int

    @property
    def cursor(self) -> tuple[int, int]:
        return (self.lsn, self.seq)
