"""What the management API shows, on a real server over a real state database, without
Spark (the test parks messages as a batch would): `/api/parked` and `/api/dead-letters`
list them with their errors, `/api/sinks/{name}` counts them and says why it is not ok;
`/api/sources` shows each source's pipeline (as the runtime reports it) and its real slot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serving import StoreOnly
from walstream.config import parse_config
from walstream.delivery.parking import DEAD, PARKED, ParkingLot
from walstream.server import Server
from walstream.server.metrics import Metrics
from walstream.server.monitor import Monitor
from walstream.server.status import SourceStatus
from walstream.sinks.base import Message

TOKEN = "api-token-8"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(db: Any) -> Iterator[tuple[str, ParkingLot]]:
    cfg = parse_config({
        "server": {"port": 0, "token": TOKEN},
        "sources": [{"name": "app", "dsn": db.dsn}],
        "sinks": [{"name": "hook", "source": "app",
                   "destination": {"type": "webhook", "url": "http://127.0.0.1:9/h"}}],
    })  # fmt: skip
    lot = ParkingLot(db.dsn, "walstream")
    lot.ensure()
    control = StoreOnly(cfg, parking=lot)
    server = Server(control, Monitor(control, ttl=0), Metrics()).start()  # type: ignore[arg-type]
    try:
        yield server.url, lot
    finally:
        server.stop()


def message(n: int, key: str) -> Message:
    return Message(0x9000 + n * 64, n, json.dumps({"id": key, "n": n}).encode(), key.encode(),
                   None, "public.orders", "update", group=f"public\x1forders\x1f{key}")  # fmt: skip


def test_parked_messages_and_dead_letters_as_the_api_lists_and_counts_them(api):
    url, lot = api
    lot.park("hook", [
        (message(1, "7"), PARKED, "webhook answered 503", 1, 30.0),
        (message(2, "7"), PARKED, None, 0, None),
        (message(3, "9"), DEAD, "webhook answered 400", 1, None),
    ])  # fmt: skip
    parked = httpx.get(f"{url}/api/parked", params={"sink": "hook"}, headers=AUTH).json()
    assert parked["total"] == 2
    first, second = parked["items"]
    assert (first["sink"], first["status"], first["group"]) == (
        "hook",
        "parked",
        "public\x1forders\x1f7",
    )
    assert (first["lsn"], first["seq"], first["table"], first["action"]) == (
        0x9000 + 64, 1, "public.orders", "update",
    )  # fmt: skip
    assert first["attempts"] == 1 and first["last_error"] == "webhook answered 503"
    assert first["next_attempt_at"] is not None
    assert (second["seq"], second["attempts"], second["last_error"]) == (2, 0, None)
    assert "message" not in first  # the list holds no row values
    dead = httpx.get(f"{url}/api/dead-letters", headers=AUTH).json()
    assert [(d["seq"], d["status"], d["last_error"]) for d in dead["items"]] == [
        (3, "dead", "webhook answered 400"),
    ]
    shown = httpx.get(f"{url}/api/dead-letters/{dead['items'][0]['id']}", headers=AUTH).json()
    assert json.loads(shown["message"]) == {"id": "9", "n": 3} and shown["key"] == "9"
    sink = httpx.get(f"{url}/api/sinks/hook", headers=AUTH).json()
    assert (sink["name"], sink["source"], sink["type"]) == ("hook", "app", "webhook")
    assert (sink["status"], sink["parked"], sink["dead_letters"]) == ("warning", 2, 1)
    assert sink["reasons"] == [
        "2 parked message(s) waiting for a retry",
        "1 dead letter(s): retry or discard them",
    ]
    assert httpx.get(f"{url}/api/sinks/nope", headers=AUTH).status_code == 404
    assert httpx.get(f"{url}/api/parked").status_code == 401  # row data: a token's


def test_sources_show_their_pipeline_and_their_slot(db):
    """Three sources on one database: one streaming whose slot nobody reads (WAL piles up
    behind it) and that restarted once; one whose query stopped on an error and whose slot
    is gone; one another walstream leads."""
    slot = db.create_slot()
    db.execute("CREATE TABLE t (id int)")
    db.execute("INSERT INTO t SELECT generate_series(1, 20000)")  # WAL behind the slot

    def lag() -> int:
        return int(db.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0])  # fmt: skip

    (confirmed,) = db.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )[0]
    cfg = parse_config({
        "server": {"port": 0, "token": TOKEN},
        "sources": [{"name": n, "dsn": db.dsn, "slot": s}
                    for n, s in (("app", slot), ("broken", "gone_slot"), ("other", "other_slot"))],
        "sinks": [{"name": "hook", "source": "app",
                   "destination": {"type": "webhook", "url": "http://127.0.0.1:9/h"}}],
    })  # fmt: skip
    statuses = [
        SourceStatus("app", slot, db.dsn, streaming=True, failures=1, restarts=1,
                     last_error="SinkError: the webhook answered 503 for id 42",
                     last_error_kind="SinkError", ingested=1234, batches=7),
        SourceStatus("broken", "gone_slot", db.dsn, streaming=False, failed=True,
                     last_error="SetupError: slot gone_slot was dropped", last_error_kind="SetupError"),
        SourceStatus("other", "other_slot", db.dsn, leader=False),
    ]  # fmt: skip
    control = StoreOnly(cfg, statuses=statuses)
    server = Server(control, Monitor(control, ttl=0), Metrics()).start()  # type: ignore[arg-type]
    try:
        low = lag()
        got = {s["name"]: s for s in httpx.get(f"{server.url}/api/sources", headers=AUTH).json()}
        high = lag()
        assert httpx.get(f"{server.url}/api/sources").status_code == 401  # error texts: a token's
    finally:
        server.stop()
    app, broken, other = got["app"], got["broken"], got["other"]
    assert (app["status"], app["role"], app["streaming"], app["slot"]) == (
        "warning",
        "leader",
        True,
        slot,
    )
    assert app["reasons"] == [
        f"replication slot {slot} has no connection",
        "restarted after 1 failure(s); last: SinkError: the webhook answered 503 for id 42",
    ]
    assert app["slot_active"] is False and app["confirmed_lsn"] == confirmed
    assert low <= app["lag_bytes"] <= high and low > 1_000_000  # the 20,000 rows' WAL, at least
    assert app["retained_wal_bytes"] >= app["lag_bytes"]
    assert (app["ingested"], app["batches"], app["failures"]) == (1234, 7, 1)
    assert app["last_error"] == "SinkError: the webhook answered 503 for id 42"
    assert (broken["status"], broken["streaming"]) == ("error", False)
    assert broken["reasons"] == [
        "not streaming: SetupError: slot gone_slot was dropped",
        "replication slot gone_slot does not exist",
    ]
    assert broken["lag_bytes"] is None and broken["confirmed_lsn"] is None
    assert (other["status"], other["role"]) == ("standby", "standby")
    assert other["reasons"] == [
        "standby: another walstream holds this source; taking over when it stops"
    ]


def test_a_slot_far_behind_and_a_silent_replication_connection_are_warnings(db, monkeypatch):
    """A source whose slot is more than LAG_WARNING_BYTES behind, read by a replication
    connection that sent its last status report more than STALE_REPLY_SECONDS ago, is a
    warning with both reasons. The thresholds (1 GiB, 30 s) are lowered to what the test
    makes: the lag and the silence are real."""
    import psycopg2
    import psycopg2.extras

    from walstream.server import monitor
    from walstream.testing import wait_until

    db.execute("CREATE TABLE t (id int)")
    pub, slot = db.create_publication("t"), db.create_slot()
    db.execute("INSERT INTO t SELECT generate_series(1, 50000)")  # ~3 MiB of WAL behind it
    monkeypatch.setattr(monitor, "LAG_WARNING_BYTES", 1 << 20)
    monkeypatch.setattr(monitor, "STALE_REPLY_SECONDS", 1.0)
    cfg = parse_config({
        "server": {"port": 0, "token": TOKEN},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot}],
        "sinks": [{"name": "hook", "source": "app",
                   "destination": {"type": "webhook", "url": "http://127.0.0.1:9/h"}}],
    })  # fmt: skip
    control = StoreOnly(cfg, statuses=[SourceStatus("app", slot, db.dsn, streaming=True)])
    server = Server(control, Monitor(control, ttl=0), Metrics()).start()  # type: ignore[arg-type]
    reader = psycopg2.connect(
        db.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    try:
        cur = reader.cursor()
        cur.start_replication(slot_name=slot, decode=False, status_interval=3600,
                              options={"proto_version": "1", "publication_names": pub})  # fmt: skip
        cur.send_feedback(force=True)  # one status report, then silence (nothing is read)

        def reasons() -> list[str]:
            (app,) = httpx.get(f"{server.url}/api/sources", headers=AUTH).json()
            return app["reasons"] if app["status"] == "warning" else []

        said = wait_until(
            lambda: (r := reasons()) and any(x.startswith("no status report") for x in r) and r,
            30, message=lambda: f"{reasons()}",
        )  # fmt: skip
    finally:
        reader.close()
        server.stop()
    assert len(said) == 2, said
    assert said[0].startswith("no status report from the replication connection for ")
    assert said[1].endswith(" MiB behind") and said[1].startswith("the slot is ")
