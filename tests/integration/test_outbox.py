"""The event outbox against a real database, without Spark: one row per Idempotency-Key
however many requests repeat it at once, and retention that deletes old events (their
keys with them) and nothing else."""

from __future__ import annotations

from typing import Any

from tests.conftest import at_once
from walstream.state.outbox import Outbox


def outbox(db: Any) -> Outbox:
    box = Outbox(db.dsn, "walstream")
    box.ensure()
    return box


def test_concurrent_repeats_of_one_idempotency_key_make_one_event(db):
    box = outbox(db)
    answers = at_once(  # each request on a connection of its own (one per thread)
        12, lambda n: Outbox(db.dsn, "walstream").publish(
            "order.paid", {"order": 7, "try": n}, "order-7", "pay-7"
        )
    )  # fmt: skip
    assert len(answers) == 12
    assert len({a.id for a in answers}) == 1  # every request got the one event's id
    assert sorted(a.duplicate for a in answers) == [False] + [True] * 11
    rows = db.execute("SELECT id::text, ordering_key FROM walstream.events")
    assert rows == [(answers[0].id, "order-7")]
    assert box.publish("order.paid", {"order": 8}).duplicate is False  # no key: no dedupe
    assert box.publish("order.paid", {"order": 8}).duplicate is False


def test_retention_deletes_old_events_and_frees_their_keys(db):
    box = outbox(db)
    old = box.publish("audit", {"n": 1}, None, "k-old")
    new = box.publish("audit", {"n": 2}, None, "k-new")
    db.execute(
        "UPDATE walstream.events SET created_at = now() - interval '2 hours' WHERE id = %s",
        (old.id,),
    )
    assert box.expire(3600) == 1
    assert [r[0] for r in db.execute("SELECT id::text FROM walstream.events")] == [new.id]
    assert box.publish("audit", {"n": 3}, None, "k-new").id == new.id  # kept: still a repeat
    again = box.publish("audit", {"n": 4}, None, "k-old")  # gone with its event: new one
    assert not again.duplicate and again.id != old.id
    assert box.expire(3600) == 0
