"""`walstream run` on a Spark standalone cluster: a master and two 1-core workers on
loopback, started from PySpark's own bin/spark-class. 20,000 changes go to Kafka and
the file sink while one worker is killed with SIGKILL: nothing is lost and each key's
changes arrive in order. Spark's task accounting shows that the executors of both
workers decoded and delivered and the driver ran no task; the replication connection
belongs to the driver's process tree. The executors' Python has walstream's dependencies
but not walstream: they run the zip the driver ships (`addPyFile`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_run_crash import Run
from tests.kafka import consume_all
from walstream.postgres.embedded import free_port
from walstream.sinks.file import read_messages
from walstream.testing import SparkStandalone, wait_until

pytestmark = [pytest.mark.kafka]

TOTAL, KEYS = 20_000, 400


def write(dsn: str, first: int, last: int, per_txn: int = 50) -> None:
    """Changes first..last-1: upserts of key j % KEYS with v = j (per key, v increases)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(first, last, per_txn):
            with conn.transaction():
                for j in range(start, min(start + per_txn, last)):
                    conn.execute(
                        "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
                        (j % KEYS, j),
                    )


def in_order(pairs: list[tuple[str, dict[str, Any]]]) -> dict[int, list[int]]:
    """Each key's values, first copy of each change only; asserts they increase."""
    seen: set[str] = set()
    per_key: dict[int, list[int]] = defaultdict(list)
    for ikey, record in pairs:
        if ikey in seen:
            continue
        seen.add(ikey)
        per_key[record["k"]].append(record["v"])
    for k, vs in per_key.items():
        assert vs == sorted(vs), f"key {k} out of order: {vs[:20]}"
    return per_key


def owner_of_local_port(port: int) -> int | None:
    """The pid holding a TCP socket whose local port is `port` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                link = str(fd.readlink())
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def python_without_walstream(tmp_path: Path) -> str:
    """A Python whose path has this environment's packages (psycopg, pyarrow, PySpark, the
    sinks' clients) but not walstream: its site-packages listed as plain paths, so their
    .pth files — walstream's editable install among them — are not run."""
    env = tmp_path / "executor-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = (env / "lib").glob("python3*/site-packages")
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("\n".join(ours) + "\n")
    python = str(env / "bin" / "python")
    has = subprocess.run([python, "-c", "import psycopg, pyarrow, pyspark, confluent_kafka"])
    assert has.returncode == 0
    lacks = subprocess.run([python, "-c", "import walstream"], capture_output=True, cwd=env)
    assert lacks.returncode != 0 and b"No module named 'walstream'" in lacks.stderr
    return python


def test_walstream_run_on_a_standalone_cluster_survives_a_dead_worker(db, kafka, tmp_path):
    db.execute("CREATE TABLE kv (k int PRIMARY KEY, v int NOT NULL)")
    pub = db.create_publication("kv")
    slot = db.create_slot()
    topic, out, ui = unique("cluster"), tmp_path / "out", free_port()
    with SparkStandalone(workers=2, cores=1, memory="1g") as cluster:
        config = tmp_path / "walstream.yaml"
        config.write_text(yaml.safe_dump({
            "spark": {
                "master": cluster.master_url,
                "checkpoint_dir": str(tmp_path / "ckpt"),
                "conf": {
                    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.cores.max": "2", "spark.executor.cores": "1",
                    "spark.executor.memory": "512m",
                    "spark.pyspark.python": python_without_walstream(tmp_path),
                    # Spark's REST API shows which executor ran which task.
                    "spark.ui.enabled": "true", "spark.ui.port": str(ui),
                },
            },
            "server": {"port": 0},
            "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                         "max_changes_per_batch": 2000, "partition_bytes": 65536}],
            "sinks": [
                {"name": "kafka", "source": "app", "partitions": 2,
                 "destination": {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                                 "topic": topic, "create_topics": True}},
                {"name": "files", "source": "app", "partitions": 2,
                 "destination": {"type": "file", "path": str(out)}},
            ],
        }))  # fmt: skip
        run = Run(config, tmp_path)
        try:
            write(db.dsn, 0, 2000)
            wait_until(lambda: len(read_messages(out)) >= 1000, 240, interval=0.5,
                       message=lambda: run.output()[-3000:])  # fmt: skip
            writer = threading.Thread(target=write, args=(db.dsn, 2000, TOTAL))
            writer.start()
            wait_until(lambda: len(read_messages(out)) >= 6000, 240, interval=0.2,
                       message=lambda: run.output()[-3000:])  # fmt: skip
            cluster.kill_worker(0)  # a machine dies mid-stream
            writer.join(300)

            def files_complete() -> bool:
                keys = {json.loads(m)["metadata"]["idempotency_key"] for m in read_messages(out)}
                return len(keys) >= TOTAL

            wait_until(files_complete, 300, interval=1.0, message=lambda: run.output()[-3000:])
            got = consume_all(kafka.bootstrap_servers, topic, TOTAL, timeout=240)

            # Where the work ran: Spark's own accounting of tasks per executor.
            api = f"http://127.0.0.1:{ui}/api/v1/applications"
            app = httpx.get(api).json()[0]["id"]
            executors = {e["id"]: e for e in httpx.get(f"{api}/{app}/allexecutors").json()}
            # The capture: the slot's walsender serves a connection of the driver's tree.
            row = db.execute(
                "SELECT r.client_port FROM pg_replication_slots s JOIN pg_stat_replication r "
                "ON r.pid = s.active_pid WHERE s.slot_name = %s",
                (slot,),
            )
            capture_pid = owner_of_local_port(row[0][0]) if row else None
            chain = [capture_pid, *ancestors(capture_pid)] if capture_pid else []
            run.proc.send_signal(signal.SIGTERM)
            assert run.proc.wait(90) == 0, run.output()[-3000:]
            # The executors found the compiled decoder shipped beside the zip (else each
            # of their Python workers says so on its stderr).
            logs = [p.read_text(errors="replace") for p in cluster._dir.glob("work-*/*/*/stderr")]
            assert logs and not [t for t in logs if "without its compiled decoder" in t]
        finally:
            run.kill()

    # Files: every change once, in order per key.
    messages = [json.loads(m) for m in read_messages(out)]
    file_keys = [m["metadata"]["idempotency_key"] for m in messages]
    assert len(file_keys) == len(set(file_keys)) == TOTAL  # a replayed batch replaces its file
    per_key = in_order([(m["metadata"]["idempotency_key"], m["record"]) for m in messages])
    assert sum(len(v) for v in per_key.values()) == TOTAL
    assert all(vs[-1] == max(j for j in range(TOTAL) if j % KEYS == k) for k, vs in per_key.items())
    # Kafka: every change, in order per key; repeats only of what a killed task had sent.
    kafka_pairs = [
        (dict(m.headers())["idempotency-key"].decode(), json.loads(m.value())["record"])
        for m in got
    ]
    assert {k for k, _ in kafka_pairs} == set(file_keys)
    assert sum(len(v) for v in in_order(kafka_pairs).values()) == TOTAL
    print(f"kafka repeats after the worker died: {len(kafka_pairs) - TOTAL}")

    # Decoding and delivery ran on both workers' executors, none on the driver.
    assert executors["driver"]["totalTasks"] == 0
    workers = {i: e for i, e in executors.items() if i != "driver"}
    assert len(workers) >= 2, executors
    assert all(e["totalTasks"] > 0 for e in workers.values()), workers
    assert any(not e["isActive"] for e in workers.values())  # the dead worker's executor
    assert run.proc.pid in chain, (capture_pid, chain)
