"""Parked or dead: the delivery layer's decisions for a chunk that did not all go through."""

from __future__ import annotations

from walstream.backoff import Backoff
from walstream.delivery.decide import outcomes, within_room
from walstream.delivery.parking import DEAD, PARKED
from walstream.errors import SinkError
from walstream.sinks.base import Message

NO_JITTER = Backoff(1.0, 600.0, jitter=0.0)


def msg(lsn: int, group: str, error: str | None = None) -> Message:
    return Message(lsn, 0, b"v", group=group, error=error)


def shape(entries):
    return [(m.lsn, status, error, attempts, wait) for m, status, error, attempts, wait in entries]


def test_a_retryable_failure_parks_its_head_and_blocks_the_rest_of_its_group() -> None:
    chunk = [msg(1, "a"), msg(2, "b"), msg(3, "a"), msg(4, "c")]
    blocked: set[str] = {"c"}
    failed = {id(chunk[0]), id(chunk[2])}
    exc = SinkError("broker said no", retryable=True, retry_after=5.0)
    out = outcomes(chunk, blocked, set(), failed, exc, NO_JITTER)
    assert shape(out) == [
        (1, PARKED, "broker said no", 1, 5.0),  # the head: the destination's Retry-After
        (3, PARKED, None, 0, None),  # behind it
        (4, PARKED, None, 0, None),  # its group was blocked before the chunk
    ]
    assert blocked == {"a", "c"}  # b went through


def test_a_refusal_for_good_is_a_dead_letter_and_names_it_for_the_rest_of_its_group() -> None:
    chunk = [msg(1, "a"), msg(2, "a"), msg(3, "b")]
    exc = SinkError("value too long", retryable=False)
    out = outcomes(chunk, set(), set(), {id(chunk[0]), id(chunk[1])}, exc, NO_JITTER)
    assert shape(out) == [
        (1, DEAD, "value too long", 1, None),
        (2, DEAD, "behind 1:0 of its group, which was refused for good: value too long", 0,
         None),
    ]  # fmt: skip


def test_a_transform_failure_is_a_dead_letter_whatever_the_sink_did() -> None:
    chunk = [msg(1, "a", error="transform raised KeyError"), msg(2, "a")]
    out = outcomes(chunk, set(), {id(chunk[0])}, set(), None, NO_JITTER)
    assert shape(out) == [(1, DEAD, "transform raised KeyError", 0, None)]


def test_past_max_parked_discard_drops_the_rest_and_pause_keeps_all() -> None:
    entries = [(msg(i, "a"), PARKED, None, 0, None) for i in range(5)]
    kept, dropped = within_room(entries, 2, "discard")
    assert [m.lsn for m, *_ in kept] == [0, 1] and dropped == 3
    assert within_room(entries, -1, "discard") == ([], 5)
    assert within_room(entries, 2, "pause") == (entries, 0)
    assert within_room(entries, 9, "discard") == (entries, 0)
