"""walstream run's server without Spark: what it reads from the runtime (`Control`), with
the test making the pipeline's writes to real stores itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from walstream.config import Plan
from walstream.streams.store import StreamStore


@dataclass
class StoreOnly:
    """What the server reads from walstream run, minus the Spark pipeline (see `Control`)."""

    config: Plan
    streams: StreamStore | None = None
    secrets: set[str] = field(default_factory=set)
    parking: Any = None
    backfills: Any = None
    outbox: Any = None
    rates: dict[str, float] = field(default_factory=dict)
    statuses: list[Any] = field(default_factory=list)  # the sources' SourceStatus

    def sources(self) -> list[Any]:
        return self.statuses

    def progress(self) -> dict[str, Any]:
        return {}
