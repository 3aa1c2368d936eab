"""What a sink delivered, counted by the pipeline as batches finish (the runtime publishes it)."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class SinkProgress:
    delivered: int = 0
    skipped: int = 0
    parked: int = 0  # parked by batches (the retrier's deliveries are counted in `retried`)
    dead: int = 0
    discarded: int = 0
    retried: int = 0  # parked messages the retrier delivered
    batches: int = 0
    last_committed_us: int = 0
    last_batch_at: float = 0.0
    #: Commit → delivered (s) of the newest change of the last batch that delivered any.
    latency: float | None = None

    def add_batch(
        self,
        delivered: int,
        newest_us: int,
        *,
        skipped: int = 0,
        parked: int = 0,
        dead: int = 0,
        discarded: int = 0,
        latest_us: int = 0,
    ) -> None:
        """Count one finished batch. `newest_us`: the commit time (µs) of the newest change
        it delivered (0: none); `latest_us`: the newest it saw at all."""
        self.delivered += delivered
        self.skipped += skipped
        self.parked += parked
        self.dead += dead
        self.discarded += discarded
        self.batches += 1
        self.last_committed_us = max(self.last_committed_us, newest_us, latest_us)
        self.last_batch_at = time.time()
        if newest_us:
            self.latency = max(0.0, time.time() - newest_us / 1e6)
