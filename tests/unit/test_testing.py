"""walstream.testing's polling helpers: what they pass, what they fail, and when."""

from __future__ import annotations

import time

import pytest

from walstream.testing import holds_for, wait_until


def test_wait_until_returns_the_first_truthy_value():
    values = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(values), 5, interval=0.001) == 7


def test_wait_until_fails_at_the_deadline_with_the_message():
    with pytest.raises(TimeoutError, match=r"after 0\.1s: still 3"):
        wait_until(lambda: False, 0.1, interval=0.01, message=lambda: "still 3")


def test_holds_for_passes_a_condition_that_stays_true_and_polls_it_through_the_window():
    calls = []
    holds_for(lambda: calls.append(1) or True, 0.2, interval=0.01)
    assert len(calls) >= 3  # polled, not checked once


def test_holds_for_fails_when_the_condition_breaks_inside_the_window():
    began = time.monotonic()
    flips = iter([True, True, False, True, True])
    with pytest.raises(AssertionError, match=r"within 30\.0s: got 2"):
        holds_for(lambda: next(flips), 30, interval=0.001, message="got 2")
    assert time.monotonic() - began < 10  # at the break, not at the window's end
