"""walstream run's HTTP server against a live stream: /health, /metrics, the management
API (pause, resume, dead letters, backfills), `walstream status`, and schemathesis over
the OpenAPI spec."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import unique
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import supervised, wait_until
from walstream.version import __version__

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(m: dict[Any, float], name: str, **labels: str) -> float | None:
    return m.get((name, tuple(sorted(labels.items()))))


def health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=10).json()


def sink(h: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in h["sinks"] if s["name"] == name)


def write_config(
    tmp_path: Path, db: Any, kafka: Any, table: str, switch: Path, **extra: Any
) -> Path:
    pub = db.create_publication(table)
    slot = db.create_slot()
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "token": TOKEN, **extra},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [
            {"name": "files", "source": "app",
             "destination": {"type": "file", "path": str(tmp_path / "files")}},
            # Key 3 is refused for good while the switch file exists: a dead letter (kept
            # for a sink with a ledger; a file sink fails the batch instead).
            {"name": "picky", "source": "app",
             "destination": {"type": "faulty", "fail_keys": ["3"], "retryable": False,
                             "while_exists": str(switch),
                             "inner": {"type": "kafka", "topic": unique("picky"),
                                       "bootstrap_servers": kafka.bootstrap_servers,
                                       "create_topics": True}}},
        ],
    }))  # fmt: skip
    return path


def insert(db: Any, table: str, ids: range) -> None:
    with db.conn.transaction():
        for i in ids:
            db.execute(f"INSERT INTO {table} VALUES (%s, 'v')", (i,))


def test_health_metrics_and_management_api_follow_a_live_stream(spark, db, kafka, tmp_path):
    table = unique("orders")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    switch = tmp_path / "refusing"
    switch.touch()
    cfg = load_config(write_config(tmp_path, db, kafka, table, switch))
    started = datetime.now(UTC)
    runtime = Runtime(cfg, spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    with supervised(runtime):
        insert(db, table, range(0, 100))
        insert(db, table, range(100, 200))

        def arrived(n_files: int, n_picky: int) -> bool:
            h = health(url)
            return (
                sink(h, "files")["delivered"] == n_files
                and sink(h, "picky")["delivered"] == n_picky
                and sink(h, "picky")["dead_letters"] == 1
            )

        wait_until(lambda: arrived(200, 199), 120, message=lambda: f"health: {health(url)}")
        # A batch's progress report (its input rows) comes after its delivery.
        wait_until(lambda: health(url)["sources"][0]["ingested"] >= 200, 30)
        h = health(url)
        (source,) = h["sources"]
        assert source["status"] == "ok", source
        assert source["streaming"] and source["slot_active"] and source["role"] == "leader"
        # caught up: the slot lags by the few heartbeats since, and holds at least that
        assert 0 <= source["lag_bytes"] < 1 << 20, source
        assert source["lag_bytes"] <= source["retained_wal_bytes"] < 64 << 20, source
        assert source["ingested"] >= 200
        assert sink(h, "files")["status"] == "ok" and sink(h, "files")["reasons"] == []
        picky = sink(h, "picky")
        assert picky["status"] == "warning"
        assert picky["reasons"] == ["1 dead letter(s): retry or discard them"]
        assert h["status"] == "warning"
        assert h["health"] == "degraded"  # a dead letter needs a look; nothing is down
        assert h["version"] == __version__
        assert 0 < h["uptime_seconds"] < (datetime.now(UTC) - started).total_seconds() + 1
        # The commit time of the newest change delivered: one of the inserts above.
        newest = datetime.fromisoformat(source["last_event_at"])
        assert started - timedelta(seconds=1) <= newest <= datetime.now(UTC), source
        assert (
            0
            <= source["last_event_age_seconds"]
            <= (datetime.now(UTC) - newest).total_seconds() + 1
        )

        m = metrics(url)
        assert sample(m, "walstream_messages_delivered_total", sink="files") == 200
        assert sample(m, "walstream_messages_delivered_total", sink="picky") == 199
        assert sample(m, "walstream_delivery_failures_total", sink="picky", kind="dead") == 1
        assert sample(m, "walstream_delivery_failures_total", sink="files", kind="dead") == 0
        assert sample(m, "walstream_dead_letters", sink="picky") == 1
        assert sample(m, "walstream_parked_messages", sink="picky") == 0
        ingested = sample(m, "walstream_changes_ingested_total", source="app")
        assert ingested is not None and ingested >= 200
        lag = sample(m, "walstream_replication_lag_bytes", source="app")
        retained = sample(m, "walstream_slot_retained_wal_bytes", source="app")
        assert lag is not None and retained is not None
        assert 0 <= lag < 1 << 20 and lag <= retained < 64 << 20, (lag, retained)
        assert sample(m, "walstream_sink_status", sink="picky", status="warning") == 1
        assert sample(m, "walstream_sink_status", sink="files", status="ok") == 1
        batches = sample(m, "walstream_batch_duration_seconds_count", source="app")
        assert batches is not None and batches >= 1
        delivered_batches = sample(m, "walstream_delivery_latency_seconds_count", sink="files")
        assert delivered_batches is not None and delivered_batches >= 1
        assert (sample(m, "walstream_ingestion_latency_seconds_count", source="app") or 0) >= 1

        # The values move with the stream.
        insert(db, table, range(200, 250))
        wait_until(lambda: arrived(250, 249), 60, message=lambda: f"health: {health(url)}")
        wait_until(
            lambda: (sample(metrics(url), "walstream_changes_ingested_total", source="app") or 0)
            >= ingested + 50, 30,
        )  # fmt: skip
        m2 = metrics(url)
        assert sample(m2, "walstream_messages_delivered_total", sink="files") == 250
        assert (sample(m2, "walstream_batch_duration_seconds_count", source="app") or 0) > batches

        # Pause through the API: the source's batches wait, health says why; resume.
        r = httpx.post(f"{url}/api/sinks/files/pause", json={"reason": "maintenance"}, headers=AUTH)
        assert r.status_code == 200, r.text
        insert(db, table, range(250, 260))
        wait_until(
            lambda: sink(health(url), "files")["status"] == "paused", 30,
            message=lambda: f"health: {health(url)}",
        )  # fmt: skip
        assert sink(health(url), "files")["reasons"] == ["paused: maintenance; resume to go on"]
        assert httpx.post(f"{url}/api/sinks/files/resume", headers=AUTH).status_code == 200
        wait_until(lambda: arrived(260, 259), 60, message=lambda: f"health: {health(url)}")
        assert sink(health(url), "files")["status"] == "ok"

        # Dead letters through the API: list, show, retry (still refused: dead again), discard.
        dead = httpx.get(f"{url}/api/dead-letters", params={"sink": "picky"}, headers=AUTH).json()
        assert dead["total"] == 1
        (item,) = dead["items"]
        assert item["sink"] == "picky" and item["action"] == "insert"
        assert "injected failure" in item["last_error"]
        shown = httpx.get(f"{url}/api/dead-letters/{item['id']}", headers=AUTH).json()
        assert shown["key"] == "3" and '"id":3' in shown["message"]
        assert shown["sink_config"]["destination"]["type"] == "faulty"
        r = httpx.post(f"{url}/api/dead-letters/{item['id']}/retry", headers=AUTH)
        assert r.json() == {"id": item["id"], "retried": True}
        wait_until(
            lambda: httpx.get(f"{url}/api/dead-letters/{item['id']}", headers=AUTH).json()["attempts"] == 1
            and httpx.get(f"{url}/api/dead-letters/{item['id']}", headers=AUTH).json()["status"] == "dead",
            60, message="the retried dead letter to be refused again",
        )  # fmt: skip
        r = httpx.post(f"{url}/api/dead-letters/{item['id']}/discard", headers=AUTH)
        assert r.json() == {"id": item["id"], "discarded": True}
        assert httpx.get(f"{url}/api/dead-letters", headers=AUTH).json()["total"] == 0
        assert (
            httpx.post(f"{url}/api/dead-letters/{item['id']}/discard", headers=AUTH).status_code
            == 404
        )
        wait_until(lambda: sink(health(url), "picky")["status"] == "ok", 10)
        assert health(url)["health"] == "healthy"

        # A backfill through the API: started, followed to done, every row read once.
        r = httpx.post(f"{url}/api/backfills", json={"sink": "files"}, headers=AUTH)
        assert r.status_code == 201, r.text
        (b,) = r.json()
        assert b["table"] == f"public.{table}" and b["status"] == "pending"
        wait_until(
            lambda: httpx.get(f"{url}/api/backfills/{b['id']}", headers=AUTH).json()["status"] == "done", 120,
            message=lambda: httpx.get(f"{url}/api/backfills/{b['id']}", headers=AUTH).text,
        )  # fmt: skip
        assert httpx.get(f"{url}/api/backfills/{b['id']}", headers=AUTH).json()["rows_read"] == 260
        reads = [m for m in read_messages(tmp_path / "files") if b'"action":"read"' in m]
        assert len(reads) == 260
        r = httpx.post(f"{url}/api/backfills/{b['id']}/cancel", headers=AUTH)
        assert r.status_code == 409 and "done already" in r.json()["detail"]["problem"]
        r = httpx.post(f"{url}/api/backfills", json={"sink": "files", "where": "nonsense ((("},
                       headers=AUTH)  # fmt: skip
        assert r.status_code == 422 and r.json()["detail"]["fix"]

        # `walstream status` prints the same.
        out = subprocess.run(
            [sys.executable, "-m", "walstream.cli", "status", "--url", url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "files" in out.stdout and "picky" in out.stdout and "leader" in out.stdout
        assert f"walstream {__version__} at {url}: healthy" in out.stdout
        out = subprocess.run(
            [sys.executable, "-m", "walstream.cli", "status", "--url", url, "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        assert shown["health"] == "healthy" and [s["name"] for s in shown["sinks"]] == [
            "files", "picky",
        ]  # fmt: skip

        # schemathesis: generated calls over the OpenAPI spec find no server error.
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
             "--checks", "not_a_server_error", "--max-examples", "10", "--max-time", "45",
             "--header", f"Authorization: Bearer {TOKEN}", "--no-color"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]

        # The slot is dropped under the running source: changes are gone, and /health
        # says so with 503; `walstream status` exits 1.
        slot = cfg.sources[0].slot_name
        wait_until(lambda: drop_slot(db, slot), 60, message=f"slot {slot} stays in use")
        wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 503, 120,
                   message=lambda: f"health: {health(url)}")  # fmt: skip
        h = health(url)
        assert h["health"] == "unhealthy" and h["status"] == "error"
        assert h["sources"][0]["status"] == "error"
        out = subprocess.run(
            [sys.executable, "-m", "walstream.cli", "status", "--url", url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"at {url}: unhealthy" in out.stdout
    assert len(read_messages(tmp_path / "files")) >= 260
    # Nothing answers any more: exit 2, saying how to start it.
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "status", "--url", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "start `walstream run`" in out.stderr, out.stderr


def drop_slot(db: Any, slot: str) -> bool:
    """Stop the slot's walsender and drop the slot; False while it is in use again."""
    import psycopg

    db.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
        "WHERE slot_name = %s AND active",
        (slot,),
    )
    try:
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    except psycopg.errors.ObjectInUse:
        return False
    db.slots.remove(slot)
    return True
