"""One backoff for every retry: inline deliveries, parked messages, query restarts, reconnects."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delay before attempt n+1 after n failures: initial * 2^(n-1), at most `maximum`,
    spread by ±`jitter` (a fraction) so that many waiting parts do not retry at once."""

    initial: float = 1.0
    maximum: float = 600.0
    jitter: float = 0.2

    def delay(self, failures: int, hint: float | None = None) -> float:
        """`hint`: the destination said when (Retry-After): at least that, up to `maximum`."""
        base = min(self.initial * 2 ** max(failures - 1, 0), self.maximum)
        if hint is not None:
            base = max(base, min(hint, self.maximum))
        return base * random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else base


#: Inline retries of a chunk inside a task (0.25 s doubling to 5 s).
INLINE = Backoff(0.25, 5.0)
#: Restarts of a failed streaming query (2 s doubling to 30 s).
QUERY_RESTART = Backoff(2.0, 30.0, jitter=0.0)
#: Reconnects of a replication connection (0.25 s doubling to 2 s).
RECONNECT = Backoff(0.25, 2.0, jitter=0.0)
