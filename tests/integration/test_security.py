"""Who may do what, against real servers: classic SQL injections posted as a backfill's
`where` to a live API are refused with 422 and change nothing; another role that can
connect cannot keep walstream from leading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.conftest import unique
from walstream.config import load_config
from walstream.errors import ConfigError
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.state.leadership import Leadership, lock_table
from walstream.testing import supervised

TOKEN = "security-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

INJECTIONS = [
    "true); DROP TABLE orders; --",
    "true; DROP TABLE orders",
    "id > 0; DELETE FROM orders",
    "1=1) OR (1=1",
    "id > 0 /* */); DROP TABLE orders; --",
    "pg_sleep(10) IS NULL",
    "(SELECT pg_sleep(10)) IS NULL",
    "true; COPY (SELECT 1) TO PROGRAM 'touch {pwned}'",
    "lo_export(1, '{pwned}') > 0",
    "pg_catalog.set_config('default_transaction_read_only', 'off', false) = 'off'",
    "id IN (SELECT id FROM canary)",
    "EXISTS (SELECT 1 FROM pg_authid)",
    "current_setting('data_directory') <> ''",
    "orders.id > 0",
]


@pytest.mark.spark
def test_where_injections_posted_to_the_api_are_refused_and_change_nothing(
    spark: Any, db: Any, tmp_path: Path
) -> None:
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE canary (id int PRIMARY KEY)")
    db.execute("INSERT INTO orders SELECT g, 'v' || g FROM generate_series(1, 50) g")
    db.execute("INSERT INTO canary VALUES (1)")
    pub, slot = db.create_publication("orders"), unique("slot")
    db.slots.append(slot)
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "token": TOKEN},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp_path / "files")}}],
    }))  # fmt: skip
    pwned = tmp_path / "pwned"
    before = db.execute("SELECT id, v FROM orders ORDER BY id")
    runtime = Runtime(load_config(path), spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    with supervised(runtime):
        for text in INJECTIONS:
            where = text.format(pwned=pwned)
            r = httpx.post(f"{url}/api/backfills", json={"sink": "files", "where": where},
                           headers=AUTH, timeout=30)  # fmt: skip
            assert r.status_code == 422, (where, r.text)
            detail = r.json()["detail"]
            assert "is refused" in detail["problem"] and "boolean expression" in detail["fix"]
        # An honest predicate goes through (and is stored as the parser prints it back).
        r = httpx.post(f"{url}/api/backfills", headers=AUTH,
                       json={"sink": "files", "where": "id > 40 and v like 'v%'"})  # fmt: skip
        assert r.status_code == 201, r.text
        (made,) = r.json()
        assert made["where"] == "id > 40 AND v LIKE 'v%'"
        listed = httpx.get(f"{url}/api/backfills", headers=AUTH).json()
        assert [b["id"] for b in listed] == [made["id"]]  # no refused one was queued
    assert db.execute("SELECT id, v FROM orders ORDER BY id") == before
    assert db.execute("SELECT id FROM canary") == [(1,)]
    assert not pwned.exists()
    assert db.execute("SHOW default_transaction_read_only") == [("off",)]


def test_a_role_that_can_connect_cannot_keep_walstream_from_leading(pg: Any, db: Any) -> None:
    """Leadership is a lock on a table of walstream's schema: another role can take the old
    advisory lock, but not that one; a leader table that is not walstream's own is refused."""
    ws, intruder = unique("walstream_role"), unique("intruder")
    schema = unique("state")
    db.execute(f"CREATE ROLE {ws} LOGIN")
    db.execute(f"CREATE ROLE {intruder} LOGIN")
    db.execute(f"GRANT CREATE ON DATABASE {db.name} TO {ws}")
    mine, theirs = pg.dsn(db.name, user=ws), pg.dsn(db.name, user=intruder)
    leaders: list[Leadership] = []
    try:
        first = Leadership(mine, schema, "app")
        leaders.append(first)
        assert first.try_acquire()
        table = f"{schema}.{lock_table('app')}"
        with connect(theirs, autocommit=True) as other:
            # What an advisory lock would have allowed: any key is anyone's to take.
            assert other.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege), other.transaction():
                other.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE NOWAIT")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                other.execute(f"CREATE TABLE {schema}.leader_x (id int)")
        second = Leadership(mine, schema, "app")  # a standby of walstream's own
        leaders.append(second)
        assert not second.try_acquire()
        first.release()
        assert second.try_acquire()
        second.release()

        # A leader table another role made (or may lock) is not walstream's: refused.
        db.execute(f"CREATE SCHEMA planted AUTHORIZATION {ws}")
        db.execute("CREATE TABLE planted.leader_app (id int PRIMARY KEY)")
        db.execute(f"ALTER TABLE planted.leader_app OWNER TO {intruder}")
        planted = Leadership(mine, "planted", "app")
        leaders.append(planted)
        with pytest.raises(ConfigError, match=f"belongs to role {intruder}"):
            planted.try_acquire()
        db.execute(f"ALTER TABLE planted.leader_app OWNER TO {ws}")
        db.execute(f"GRANT UPDATE ON planted.leader_app TO {intruder}")
        with pytest.raises(ConfigError, match="other roles may lock the leader table"):
            planted.try_acquire()
    finally:
        for leader in leaders:
            leader.release()
        for role in (ws, intruder):
            db.execute(f"DROP OWNED BY {role} CASCADE")
            db.execute(f"DROP ROLE {role}")
