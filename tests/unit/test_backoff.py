"""The one backoff: doubling, a cap, jitter, and a destination's Retry-After."""

from __future__ import annotations

from walstream.backoff import INLINE, QUERY_RESTART, Backoff


def test_doubles_up_to_the_cap_without_jitter() -> None:
    assert [QUERY_RESTART.delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]


def test_jitter_stays_within_its_fraction() -> None:
    delays = [Backoff(1.0, 600.0).delay(3) for _ in range(500)]
    assert all(3.2 <= d <= 4.8 for d in delays)
    assert max(delays) - min(delays) > 0.5  # it does spread


def test_a_retry_after_hint_is_a_floor_up_to_the_cap() -> None:
    b = Backoff(1.0, 60.0, jitter=0.0)
    assert b.delay(1, hint=10.0) == 10.0
    assert b.delay(1, hint=1e6) == 60.0
    assert b.delay(5, hint=0.1) == 16.0


def test_inline_retries_start_small() -> None:
    assert 0.2 <= INLINE.delay(1) <= 0.3
    assert INLINE.delay(100) <= 5.0 * 1.2
