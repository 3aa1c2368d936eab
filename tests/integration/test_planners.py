"""Spark's Python processes for planning a source's read end once the queries run, and a
query started later plans (and reads) as the first did (walstream/engine/planners.py)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pytest

from tests.conftest import unique
from tests.processes import PLANNING, TASKS_DAEMON, running
from tests.streams import StreamRun
from walstream.config import parse_config
from walstream.engine.planners import release
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = pytest.mark.spark


def test_release_ends_the_planning_processes_and_a_new_query_plans_again(spark, db, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub, slot = db.create_publication("t"), unique("slot")
    db.slots.append(slot)
    me = os.getpid()
    options = {"dsn": db.dsn, "slot": slot, "publication": pub, "name": "app"}
    with StreamRun(spark, tmp_path / "ckpt", **options) as run:
        run.query.processAllAvailable()  # its slot exists
        db.execute("INSERT INTO t VALUES (1)")
        assert [r.pk for r in run.wait_for_rows(1)] == [["1"]]
        planners = running(me, PLANNING)
        assert any("plan_data_source_read" in line for line in planners.values()), planners
        tasks = set(running(me, TASKS_DAEMON))
        assert tasks  # the tasks' daemon: it must outlive the release

        stopped = release(spark)
        assert {"pyspark.sql.worker.create_data_source",
                "pyspark.sql.worker.plan_data_source_read"} <= set(stopped)  # fmt: skip
        wait_until(lambda: not running(me, PLANNING), 30, message=lambda: running(me, PLANNING))
        assert tasks <= set(running(me, TASKS_DAEMON))  # the same daemon: nothing else ended
        db.execute("INSERT INTO t VALUES (2)")
        assert [r.pk for r in run.wait_for_rows(2)] == [["1"], ["2"]]  # the query goes on
        run.wait_committed()  # else the next query delivers row 2 again (at-least-once)

    db.execute("INSERT INTO t VALUES (3)")
    with StreamRun(spark, tmp_path / "ckpt", **options) as run:  # planned again, from scratch
        assert [r.pk for r in run.wait_for_rows(1)] == [["3"]]
        assert any("plan_data_source_read" in line for line in running(me, PLANNING).values())


def test_the_runtime_ends_them_after_each_start_of_a_query(spark, db, tmp_path, caplog):
    """After the first batch, and again after a restart (a query that stopped): the
    changes of both runs arrive once, and the planning processes are gone each time."""
    caplog.set_level(logging.DEBUG, logger="walstream.engine.planners")
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub, slot = db.create_publication("t"), unique("slot")
    db.slots.append(slot)
    out = tmp_path / "out"
    cfg = parse_config({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(out)}}],
    })  # fmt: skip
    runtime = Runtime(cfg, spark=spark)
    runtime.end_planners = True  # as when it starts Spark itself (`walstream run`)
    runtime.start()
    me, sq = os.getpid(), runtime.queries[0]

    def ended(n: int) -> Any:
        def check() -> bool:
            runtime.supervise(until=time.monotonic() + 0.3, tick=0.1)  # restarts, the release
            released = [r for r in caplog.records if r.getMessage().startswith("ended Spark")]
            return len(released) >= n and not running(me, PLANNING)

        return check

    def delivered() -> list[int]:
        return sorted(m["record"]["id"] for m in map(json.loads, read_messages(out)))

    try:
        db.execute("INSERT INTO t VALUES (1)")
        wait_until(lambda: out.exists() and delivered() == [1], 120)
        wait_until(ended(1), 60, message=lambda: running(me, PLANNING))

        first = sq.query
        first.stop()  # the query stops: the runtime starts it again (planned again)

        def restarted() -> bool:
            runtime.poll()
            return sq.query is not None and sq.query is not first

        wait_until(restarted, 60)
        assert sq.restarts == 1
        db.execute("INSERT INTO t VALUES (2)")
        wait_until(lambda: delivered() == [1, 2], 120, message=lambda: delivered())
        wait_until(ended(2), 60, message=lambda: running(me, PLANNING))
    finally:
        runtime.stop()
