"""What becomes of the messages of a chunk that did not all go through (no I/O here).

Each message is delivered, parked (to be retried later; its group is blocked behind
it, so the group's order holds) or a dead letter (refused for good). The rules:

- a message whose transform failed (`poison`) is a dead letter at once;
- a message of a group that was blocked before the chunk is parked behind its head;
- a message the sink failed with a retryable error is parked: the first of its group
  with the error and a first retry time, later ones of that group behind it;
- a message the sink refused for good is a dead letter; later ones of its group in the
  chunk too, naming the one that was refused (sinks stop a group at its first refusal).
"""

from __future__ import annotations

from walstream.backoff import Backoff
from walstream.delivery.parking import DEAD, PARKED
from walstream.errors import SinkError
from walstream.sinks.base import Message

#: (message, status, error, attempts, seconds until the next attempt) for ParkingLot.park.
ParkEntry = tuple[Message, str, str | None, int, float | None]


def outcomes(
    chunk: list[Message],
    blocked: set[str],
    poison: set[int],
    failed: set[int],
    exc: SinkError | None,
    backoff: Backoff,
) -> list[ParkEntry]:
    """The chunk's messages that are parked or dead, in cursor order (see the module
    docstring). `poison` and `failed` hold `id()`s of messages; `blocked` holds the groups
    blocked before the chunk and gains those a retryable failure blocks now."""
    was_blocked = set(blocked)
    out: list[ParkEntry] = []
    refused: dict[str, Message] = {}  # per group, the message refused for good in this chunk
    for m in chunk:
        if id(m) in poison:
            out.append((m, DEAD, m.error, 0, None))
        elif m.group in was_blocked:
            out.append((m, PARKED, None, 0, None))  # behind the group's parked head
        elif id(m) in failed:
            assert exc is not None
            if exc.retryable and m.group in blocked:  # its head failed earlier in the chunk
                out.append((m, PARKED, None, 0, None))
            elif exc.retryable:
                blocked.add(m.group)
                out.append((m, PARKED, exc.problem, 1, backoff.delay(1, exc.retry_after)))
            elif m.group in refused:
                head = refused[m.group]
                out.append(
                    (
                        m,
                        DEAD,
                        f"behind {head.lsn}:{head.seq} of its group, which was "
                        f"refused for good: {exc.problem}",
                        0,
                        None,
                    )
                )
            else:
                refused[m.group] = m
                out.append((m, DEAD, exc.problem, 1, None))
    return out


def within_room(entries: list[ParkEntry], room: int, on_full: str) -> tuple[list[ParkEntry], int]:
    """What may be parked when `room` places are left: with `on_full: discard` the rest
    is dropped (how many is returned); with `pause` everything is kept (the sink pauses)."""
    if on_full != "discard" or len(entries) <= room:
        return entries, 0
    keep = max(room, 0)
    return entries[:keep], len(entries) - keep
