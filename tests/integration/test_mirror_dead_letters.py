"""A Postgres mirror's dead letter, retried through walstream run's retrier, is applied.

The target refuses one row (a CHECK constraint the source does not have); it becomes a
dead letter while later rows of the same table flow on and move the table's cursor
past it. The operator fixes the target and retries the dead letter: the target then
equals the source, and the dead letter is gone only because it was applied. A
mirror into a table its own source publishes is refused before anything starts.
"""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import unique
from tests.sinks.test_postgres import table_text
from walstream.config import load_config
from walstream.delivery.parking import DEAD, ParkingLot
from walstream.errors import ConfigError
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

pytestmark = pytest.mark.spark


def test_a_retried_dead_letter_of_the_mirror_is_applied(spark, db, target, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    with connect(target, autocommit=True) as conn:  # the target's table differs
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int CHECK (n < 100))")
    pub, slot = db.create_publication("t"), unique("slot")
    db.slots.append(slot)
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "copy", "source": "app", "max_attempts": 1,
                   "destination": {"type": "postgres", "dsn": target}}],
    }))  # fmt: skip
    cfg = load_config(path)
    lot = ParkingLot(cfg.state_dsn)
    runtime = Runtime(cfg, spark=spark).start()
    with supervised(runtime):
        db.execute("INSERT INTO t VALUES (1, 1), (2, 500)")  # 2 is refused by the target
        wait_until(lambda: len(lot.list(DEAD, "copy")) == 1, 60)
        for i in range(3, 30):  # later rows of the same table: its cursor moves past 2
            db.execute("INSERT INTO t VALUES (%s, %s)", (i, i))
        wait_until(lambda: len(table_text(target, "public.t", set())) == 28, 60)
        (dead,) = lot.list(DEAD, "copy")
        assert b'"id":2' in (dead.message.value or b"")

        with connect(target, autocommit=True) as conn:  # the operator fixes the target ...
            conn.execute("ALTER TABLE t DROP CONSTRAINT t_n_check")
        assert lot.retry_dead([dead.id]) == 1  # ... and retries (`walstream dead-letters retry`)
        wait_until(lambda: lot.get(dead.id) is None, 60, message="the retry did not finish")
        assert lot.list(DEAD, "copy") == []
    assert table_text(target, "public.t", set()) == table_text(db.dsn, "public.t", set())


def test_a_mirror_into_a_table_its_source_publishes_is_a_config_error(spark, db, tmp_path):
    """A feedback loop: the mirror's writes would be captured and mirrored again."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn}],  # FOR ALL TABLES: the copy too
        "sinks": [{"name": "copy", "source": "app",
                   "destination": {"type": "postgres", "dsn": db.dsn, "schema": "copy"}}],
    }))  # fmt: skip
    db.slots.append("walstream_app")
    with pytest.raises(ConfigError) as err:
        Runtime(load_config(path), spark=spark).start()
    assert "sink copy would write public.t into copy.t" in err.value.problem
    assert "feedback loop" in err.value.problem and "publication" in (err.value.fix or "")


def test_two_sinks_into_one_target_table_are_refused_before_anything_starts(db, other_db, target):
    """Checked from the publications and the target's identity (not its DSN's text):
    two sources' public.users into one database's public.users names both sinks."""
    from walstream.config import parse_config
    from walstream.sinks.registry import preflight

    for d in (db, other_db):
        d.execute("CREATE TABLE users (id int PRIMARY KEY)")
        d.execute("CREATE PUBLICATION walstream_pub FOR TABLE users")
    same_target = target.replace("127.0.0.1", "localhost")  # another spelling, one server

    def config(second_schema: str | None) -> object:
        dest = {"type": "postgres", "dsn": same_target}
        return parse_config({
            "sources": [{"name": "a", "dsn": db.dsn, "publication": "walstream_pub"},
                        {"name": "b", "dsn": other_db.dsn, "publication": "walstream_pub"}],
            "sinks": [
                {"name": "copy-a", "source": "a", "destination": {"type": "postgres", "dsn": target}},
                {"name": "copy-b", "source": "b",
                 "destination": {**dest, **({"schema": second_schema} if second_schema else {})}},
            ],
        })  # fmt: skip

    with pytest.raises(ConfigError) as err:
        preflight(config(None))
    assert "sinks copy-a and copy-b would both write into public.users" in err.value.problem
    assert "destination.schema" in (err.value.fix or "")
    preflight(config("from_b"))  # its own schema: fine
