"""What a sink delivered, counted by the pipeline as batches finish (the runtime publishes it)."""

from __future__ import annotations

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
