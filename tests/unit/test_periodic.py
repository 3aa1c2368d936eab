"""The periodic-task helper: steps repeat, failures are logged once per message, cleanup runs."""

from __future__ import annotations

import logging
import threading

import pytest

from walstream.periodic import Periodic
from walstream.testing import wait_until


def test_steps_repeat_until_stopped_and_cleanup_runs_on_the_thread() -> None:
    calls: list[int] = []
    cleaned = threading.Event()
    task = Periodic("t", lambda: calls.append(1) or 0.0, 60.0, first=0.0, cleanup=cleaned.set)
    task.start()
    wait_until(lambda: len(calls) >= 5, 10, message="steps")  # 0.0: back to back, not 60 s
    task.stop(5)
    assert not task.is_alive() and cleaned.is_set()
    n = len(calls)
    assert len(calls) == n  # no step after stop


def test_a_failing_step_is_logged_once_per_message_then_again_after_a_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([ValueError("db down"), ValueError("db down"), ValueError("other"), None])

    def step() -> float | None:
        answer = next(answers)
        if answer is not None:
            raise answer
        return None

    task = Periodic("t", step, 60.0, what="the task")
    with caplog.at_level(logging.WARNING, logger="walstream.periodic"):
        waits = [task.run_once() for _ in range(4)]
    assert [r.getMessage() for r in caplog.records] == ["the task: db down", "the task: other"]
    assert waits == [60.0, 60.0, 60.0, 60.0] and task.last_error is None


def test_the_wait_after_an_error_and_after_a_step_that_names_one() -> None:
    task = Periodic("t", lambda: 0.25, 10.0, on_error=3.0)
    assert task.run_once() == 0.25

    def boom() -> float | None:
        raise RuntimeError("x")

    task.step = boom
    assert task.run_once() == 3.0 and task.last_error == "x"
