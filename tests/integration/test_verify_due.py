"""When `walstream run` verifies a sink with `verify: {every}` (runtime/verifying.py), on the
state database the verifications left: never verified, due; verified within `every`, not;
one that could not compare, again after at most an hour; one cut short by the schedule,
resumed at once; one cut short by a command, left to its user until the schedule is due; one
running elsewhere, never; a backfill of the sink running, put off."""

from __future__ import annotations

import os

from tests.integration.test_backfill import mirror_database
from walstream.backfill.store import BackfillStore
from walstream.config import parse_config
from walstream.runtime.verifying import Schedule
from walstream.verify.store import DONE, FAILED, VerificationStore


def age(store: VerificationStore, id_: int, seconds: float) -> None:
    """The verification started `seconds` ago."""
    store._run(
        "UPDATE {t} SET started_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seconds, id_),
    )


def test_when_a_sink_is_due(db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    _, mirror = mirror_database(db)
    plan = parse_config({
        "sources": [{"name": "app", "dsn": db.dsn, "slot": "s", "publication": pub}],
        "sinks": [{"name": "m", "source": "app", "verify": {"every": "1d"},
                   "destination": {"type": "postgres", "dsn": mirror}}],
    })  # fmt: skip
    (sink,) = plan.sinks
    schedule = Schedule(plan, lambda source: True)
    store = schedule.store
    store.ensure()
    backfills = BackfillStore(plan.state_dsn)
    backfills.ensure()
    assert schedule.due(sink)  # never verified

    done = store.begin("m", [], None, "schedule")
    store.finish(done.id, DONE)
    assert not schedule.due(sink)
    age(store, done.id, 86_400 + 60)
    assert schedule.due(sink)

    failed = store.begin("m", [], None, "schedule")
    store.finish(failed.id, FAILED, "the sink was paused")
    assert not schedule.due(sink)
    age(store, failed.id, 3_700)  # could not compare: again within the hour, not the day
    assert schedule.due(sink)
    store.finish(store.begin("m", [], None, "schedule").id, DONE)  # verified just now

    cut = store.begin("m", [], None, "command")  # this process owns it: running here
    assert not schedule.due(sink)
    store.release(cut.id, None)  # let go of (Ctrl-C): a command's is left to its user
    assert store.dead(store.get(cut.id)) and not schedule.due(sink)
    store.cancel("m")

    ours = store.begin("m", [], None, "schedule")
    store._run("UPDATE {t} SET owner = %s WHERE id = %s", (f"elsewhere:{os.getpid()}", ours.id))
    assert not store.dead(store.get(ours.id)) and not schedule.due(sink)  # runs elsewhere
    store.release(ours.id, None)  # a schedule's, let go of: resumed at once
    assert schedule.due(sink)

    store.finish(ours.id, DONE)
    age(store, ours.id, 86_400 + 60)
    assert schedule.due(sink)
    backfills.create("m", "app", "public", "t", None, 1000, 1.0, 0)
    assert not schedule.due(sink)  # its backfill runs: put off
