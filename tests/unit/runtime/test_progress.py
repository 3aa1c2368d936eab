"""collect_progress: each batch's changes counted once, from the last report alone when a
tick saw one batch, from every report the query keeps when it missed some."""

from __future__ import annotations

from typing import Any

from walstream.config import SourceConfig
from walstream.runtime.query import SourceQuery, collect_progress


class Reports:
    """What a streaming query says of its progress (PySpark's `lastProgress` and
    `recentProgress`, as dicts), and how often each was asked for."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.recent_asked = 0

    def ran(self, rows: int) -> None:
        self.reports.append({"batchId": len(self.reports), "numInputRows": rows})

    @property
    def lastProgress(self) -> dict[str, Any] | None:  # PySpark's name
        return self.reports[-1] if self.reports else None

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        self.recent_asked += 1
        return self.reports[-100:]


def test_each_batch_counted_once_and_the_full_list_only_when_batches_were_missed() -> None:
    q = Reports()
    sq = SourceQuery(SourceConfig(name="s", dsn="postgresql://x/y", slot="s"), None, q)  # type: ignore[arg-type]
    collect_progress(sq)  # no batch yet
    assert (sq.ingested, sq.batches, q.recent_asked) == (0, 0, 0)
    q.ran(5)
    collect_progress(sq)
    collect_progress(sq)  # nothing new: counted once
    assert (sq.ingested, sq.batches, sq.seen_batch, q.recent_asked) == (5, 1, 0, 0)
    q.ran(7)
    q.ran(11)
    q.ran(13)  # three batches between two ticks
    collect_progress(sq)
    assert (sq.ingested, sq.batches, sq.seen_batch, q.recent_asked) == (36, 4, 3, 1)
    q.ran(2)
    collect_progress(sq)
    assert (sq.ingested, sq.batches, q.recent_asked) == (38, 5, 1)
