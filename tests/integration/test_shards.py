"""A source split into shards: one slot, publication and query per table set; each sink
runs once per shard, and every change arrives once, through its table's shard. The API
and the metrics name each shard's sink (`files-1`, `files-2`), and pausing one holds that
shard alone."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import supervised, wait_until

pytestmark = [pytest.mark.spark]

TOKEN = "shards-api-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_sharded_source_streams_each_table_through_its_own_slot(spark, db, tmp_path):
    for t in ("orders", "items", "events"):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    out = tmp_path / "out"
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "token": TOKEN},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn,
                     "shards": [["public.orders", "public.items"], ["public.events"]]}],
        "sinks": [{"name": "files", "source": "app", "destination": {"type": "file",
                                                                    "path": str(out)}}],
    }))  # fmt: skip
    db.slots += ["walstream_app_1", "walstream_app_2"]
    runtime = Runtime(load_config(path), spark=spark).start()
    with supervised(runtime):
        slots = db.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'walstream_app_%' "
            "ORDER BY 1"
        )
        assert slots == [("walstream_app_1",), ("walstream_app_2",)]
        pubs = db.execute(
            "SELECT pubname, tablename FROM pg_publication_tables "
            "WHERE pubname LIKE 'walstream_app_%' ORDER BY 1, 2"
        )
        assert pubs == [("walstream_app_1", "items"), ("walstream_app_1", "orders"),
                        ("walstream_app_2", "events")]  # fmt: skip
        for i in range(50):  # each transaction writes tables of both shards
            with db.conn.transaction():
                for t in ("orders", "items", "events"):
                    db.execute(f"INSERT INTO {t} VALUES (%s, %s)", (i, f"{t}-{i}"))

        def tables(shard: int) -> list[str]:
            return [json.loads(m)["metadata"]["table_name"]
                    for m in read_messages(out / f"shard-{shard}")]  # fmt: skip

        wait_until(lambda: len(tables(1)) == 100 and len(tables(2)) == 50, 120,
                   message=lambda: f"shard 1: {len(tables(1))}/100, 2: {len(tables(2))}/50")  # fmt: skip
        # each shard's sink reports its progress once its batch is done, after the files
        wait_until(lambda: set(runtime.progress()) == {"files-1", "files-2"}, 30,
                   message=lambda: f"progress: {runtime.progress()}")  # fmt: skip

        # The API and the metrics name each shard's sink and source.
        assert runtime.server is not None
        url = runtime.server.url
        health = httpx.get(f"{url}/health").json()
        assert sorted(s["name"] for s in health["sinks"]) == ["files-1", "files-2"]
        assert sorted(s["name"] for s in health["sources"]) == ["app-1", "app-2"]
        metrics = httpx.get(f"{url}/metrics").text
        for shard in ("1", "2"):
            assert f'walstream_messages_delivered_total{{sink="files-{shard}"}}' in metrics
        # Pausing the second shard's sink holds that shard only.
        r = httpx.post(f"{url}/api/sinks/files-2/pause", headers=AUTH, json={"reason": "test"})
        assert r.status_code == 200, r.text
        for i in range(50, 60):
            with db.conn.transaction():
                for t in ("orders", "events"):
                    db.execute(f"INSERT INTO {t} VALUES (%s, %s)", (i, f"{t}-{i}"))
        wait_until(lambda: len(tables(1)) == 110, 60, message=lambda: f"shard 1: {len(tables(1))}")
        assert len(tables(2)) == 50  # held while paused (the first shard went on)
        assert httpx.post(f"{url}/api/sinks/files-2/resume", headers=AUTH).status_code == 200
        wait_until(lambda: len(tables(2)) == 60, 60, message=lambda: f"shard 2: {len(tables(2))}")
    assert sorted(set(tables(1))) == ["items", "orders"] and set(tables(2)) == {"events"}
    # Within a shard, changes keep their transaction order: orders i, items i, orders i+1 ...
    assert tables(1) == ["orders", "items"] * 50 + ["orders"] * 10
    ids = [json.loads(m)["record"]["id"] for m in read_messages(out / "shard-2")]
    assert ids == list(range(60))
