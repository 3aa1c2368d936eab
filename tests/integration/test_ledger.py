"""The ledger at a batch's start, and what a delivery task asks of it.

A batch the ledger holds nothing of is fresh: its tasks' first attempts deliver
without asking the ledger. A replayed batch, and any retried task attempt, skip
what the ledger says was delivered.
"""

from __future__ import annotations

from typing import Any

from tests.conftest import TestDatabase, unique
from tests.kafka import consume
from walstream.change import ChangeRow
from walstream.config import parse_config
from walstream.delivery.deliver import DeliveryPlan, Row, deliver_partition
from walstream.delivery.ledger import Ledger
from walstream.pipeline.steps import BatchPart

TS = 1_763_884_850_561_930


def test_start_batch_says_whether_the_batch_is_a_replay(db: TestDatabase) -> None:
    ledger = Ledger(db.dsn, unique("state"))
    ledger.ensure()
    assert ledger.start_batch("k", "q1", 5) is True
    ledger.record("k", "q1", 5, 0, 1, (100, 0), 10)
    assert ledger.start_batch("k", "q1", 5) is False  # batch 5 again: a replay
    assert ledger.delivered_through("k", "q1", 5, 0, 1) == (100, 0)

    assert ledger.start_batch("k", "q2", 5) is True  # another query: the old rows are gone
    assert ledger.delivered_through("k", "q1", 5, 0, 1) is None

    ledger.record("k", "q2", 5, 0, 1, (100, 0), 10)
    ledger.record("other", "q2", 5, 0, 1, (100, 0), 10)
    assert ledger.start_batch("k", "q2", 6) is True  # batch 6: batch 5 is never replayed
    assert ledger.delivered_through("k", "q2", 5, 0, 1) is None
    assert ledger.delivered_through("other", "q2", 5, 0, 1) == (100, 0)  # its own sink's


def test_a_retried_attempt_asks_the_ledger_even_in_a_fresh_batch() -> None:
    part = BatchPart("q", 7, 2, fresh=True, unblocked=True)
    plan = _plan("unused:9092", "t", ledger=None)
    first = part.apply(plan, first_attempt=True)
    again = part.apply(plan, first_attempt=False)
    assert (first.query_id, first.batch_id, first.partitions) == ("q", 7, 2)
    assert (first.fresh, first.unblocked) == (True, True)
    assert (again.fresh, again.unblocked) == (False, False)
    assert BatchPart.parse(part.text()) == part


def test_a_replay_skips_what_the_ledger_recorded(db: TestDatabase, kafka: Any) -> None:
    ledger = Ledger(db.dsn, unique("state"))
    ledger.ensure()
    topic = unique("ledger")
    plan = _plan(kafka.bootstrap_servers, topic, ledger)
    ledger.start_batch("k", "q", 7)
    ledger.record("k", "q", 7, 0, 1, (1003, 0), 4)  # an earlier run delivered through 1003

    # The retried attempt of a batch that started fresh asks the ledger: 1004..1009 only.
    retried = BatchPart("q", 7, 1, fresh=True, unblocked=True).apply(plan, first_attempt=False)
    stats = deliver_partition(retried, 0, _rows(range(1000, 1010)))
    assert (stats.delivered, stats.skipped) == (6, 4)
    got = consume(kafka.bootstrap_servers, topic, 6)
    assert [m.key().decode() for m in got] == [str(i) for i in range(1004, 1010)]
    assert ledger.delivered_through("k", "q", 7, 0, 1) == (1009, 0)

    # A fresh first attempt delivers without asking (the batch start said nothing was).
    fresh = BatchPart("q", 8, 1, fresh=True, unblocked=True).apply(plan, first_attempt=True)
    stats = deliver_partition(fresh, 0, _rows(range(1010, 1013)))
    assert (stats.delivered, stats.skipped) == (3, 0)
    assert ledger.delivered_through("k", "q", 8, 0, 1) == (1012, 0)


def test_a_replay_split_another_way_skips_nothing(db: TestDatabase, kafka: Any) -> None:
    """The batch was delivered in 1 partition through 1005 before a crash; the restart
    splits it into 2 (`partitions` changed). A ledger row says nothing of another split's
    partitions, so each is delivered again in full: duplicates, never a skipped change."""
    ledger = Ledger(db.dsn, unique("state"))
    ledger.ensure()
    topic = unique("ledger")
    plan = _plan(kafka.bootstrap_servers, topic, ledger)
    ledger.start_batch("k", "q", 7)
    ledger.record("k", "q", 7, 0, 1, (1005, 0), 6)
    assert ledger.start_batch("k", "q", 7) is False  # the restart: a replay
    replay = BatchPart("q", 7, 2, fresh=False, unblocked=True)
    for partition, lsns in ((0, range(1000, 1010, 2)), (1, range(1001, 1010, 2))):
        stats = deliver_partition(replay.apply(plan, first_attempt=True), partition, _rows(lsns))
        assert (stats.delivered, stats.skipped) == (5, 0)
        assert ledger.delivered_through("k", "q", 7, partition, 2) == (lsns[-1], 0)
    got = consume(kafka.bootstrap_servers, topic, 10)
    assert sorted(int(m.key()) for m in got) == list(range(1000, 1010))


def _plan(bootstrap: str, topic: str, ledger: Ledger | None) -> DeliveryPlan:
    cfg = parse_config({
        "sources": [{"name": "app", "dsn": "postgresql:///app", "slot": "s", "publication": "p"}],
        "sinks": [{"name": "k", "source": "app",
                   "destination": {"type": "kafka", "bootstrap_servers": bootstrap,
                                   "topic": topic, "create_topics": True}}],
    })  # fmt: skip
    return DeliveryPlan(
        sink="k", destination=cfg.sinks[0].destination, format="sequin", db="app",
        batch_size=100, retry_timeout=5.0, ledger=ledger, query_id="", batch_id=-1,  # type: ignore[arg-type]
        partitions=1,
    )  # fmt: skip


def _rows(lsns: range) -> list[Row]:
    out: list[Row] = []
    for lsn in lsns:
        change = ChangeRow(
            source="app", lsn=lsn, seq=0, xid=9, committed_at_us=TS, action="insert",
            schema="public", table="t", pk=[str(lsn)], record=f'{{"id":{lsn}}}', old=None,
            annotations=None, unchanged_toast=None,
        )  # fmt: skip
        out.append((change, f"g{lsn}", str(lsn), None, None, None))
    return out
