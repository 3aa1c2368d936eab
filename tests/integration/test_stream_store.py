"""A stream's store against a real state database, without Spark: `max_bytes` retention
keeps the newest messages that fit and makes older positions a gap; a group's checkpoint
never goes back, whatever order (or how many at once) its consumers ack in."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import at_once
from walstream.streams.store import Expired, StreamStore


def store(db: Any) -> StreamStore:
    s = StreamStore(db.dsn, "walstream")
    s.ensure()
    return s


def fill(s: StreamStore, source: str, n: int, size: int = 100) -> None:
    """n messages of `size` bytes from `source`, then made visible."""
    rows = [("changes", source, 1000 + i, 0, "public.t", "insert", str(i), f"ik{i}",
             "x" * size, size) for i in range(n)]  # fmt: skip
    s.write(rows)
    s.make_visible("changes", source, (1000 + n - 1, 0))


def test_max_bytes_keeps_the_newest_messages_that_fit_and_older_positions_are_a_gap(db):
    s = store(db)
    fill(s, "east", 30)
    deleted = s.expire("changes", retention=3600, max_bytes=1000)  # room for 10 of 30
    assert deleted == 20
    count, size, _ = s.stats("changes")
    assert (count, size) == (10, 1000)
    page = s.read("changes", ["east"], {"east": (1019, 0)}, 100)
    assert [m.lsn for m in page.messages] == list(range(1020, 1030))  # nothing newer lost
    with pytest.raises(Expired) as gap:
        s.read("changes", ["east"], {"east": (1005, 0)}, 100)
    assert gap.value.expired == (1019, 0) and gap.value.at == (1005, 0)
    assert s.expire("changes", retention=3600, max_bytes=1000) == 0  # within bounds now


def test_acks_in_any_order_never_move_a_group_back(db):
    s = store(db)
    assert s.ack("changes", "workers", {"east": (1010, 0), "west": (2000, 3)}) == {
        "east": (1010, 0), "west": (2000, 3),
    }  # fmt: skip
    # A slower consumer acks an earlier page, and a marker that knows only one source.
    assert s.ack("changes", "workers", {"east": (1005, 0), "west": (2001, 0)}) == {
        "east": (1010, 0), "west": (2001, 0),
    }  # fmt: skip
    assert s.ack("changes", "workers", {"east": (1002, 0)}) == {
        "east": (1010, 0),
        "west": (2001, 0),
    }
    assert s.group("changes", "workers", {}) == {"east": (1010, 0), "west": (2001, 0)}


def test_concurrent_consumers_of_one_group_end_at_the_furthest_ack(db):
    s = store(db)
    acks = [{"east": (1000 + i, 0)} for i in range(40)]

    def consumer(k: int) -> None:  # each on a connection of its own (one per thread)
        mine = StreamStore(db.dsn, "walstream")
        for ack in acks[k::8]:
            mine.ack("changes", "workers", ack)

    at_once(8, consumer)  # an error in any consumer is raised here
    assert s.group("changes", "workers", {}) == {"east": (1039, 0)}


def test_the_retention_task_shows_what_a_stream_keeps_in_the_metrics(db):
    """`walstream_stream_kept_messages` and `..._kept_bytes`, as pull-subscriptions.md
    says: after the leader's retention step, what the stream keeps (here after max_bytes
    deleted the oldest); a standby's step deletes nothing and reports nothing."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from walstream.config import parse_config
    from walstream.runtime.retention import retention_tasks
    from walstream.server.metrics import Metrics

    s = store(db)
    fill(s, "east", 30)
    cfg = parse_config({
        "sources": [{"name": "east", "dsn": db.dsn}],
        "sinks": [{"name": "east-changes", "source": "east", "destination": {
            "type": "stream", "stream": "changes", "max_bytes": 1000}}],
    })  # fmt: skip

    def kept(leads: bool) -> dict[str, float]:
        metrics = Metrics()
        for task in retention_tasks(cfg, None, s, lambda source: leads, metrics):
            if task.name == "walstream-stream-retention-changes":
                task.run_once()
        text = generate_latest(metrics.registry).decode()
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("walstream_stream_kept") and sample.labels == {
                "stream": "changes"}
        }  # fmt: skip

    assert kept(leads=False) == {}  # a standby: nothing deleted, nothing reported
    assert s.stats("changes")[:2] == (30, 3000)
    assert kept(leads=True) == {
        "walstream_stream_kept_messages": 10.0, "walstream_stream_kept_bytes": 1000.0,
    }  # fmt: skip
