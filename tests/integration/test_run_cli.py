"""`walstream run --seconds N --port P` as a command: it serves /health on P while it
runs, delivers the changes made meanwhile, and stops by itself after N seconds, exit 0.
Once its query runs, Spark's planning processes are gone (walstream/engine/planners.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import yaml

from tests.processes import PLANNING, TASKS_DAEMON, running
from walstream.postgres.embedded import free_port
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = pytest.mark.spark


def test_run_for_some_seconds_on_a_given_port(db, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pub = db.create_publication("t")
    slot = db.create_slot()
    out, port = tmp_path / "out", free_port()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"port": 8376},  # --port replaces it
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(out)}}],
    }))  # fmt: skip
    seconds = 25
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "walstream.cli", "run", "-c", str(config),
         "--seconds", str(seconds), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:

        def serving() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                assert proc.poll() is None, "walstream run ended before it served /health"
                return False

        wait_until(serving, seconds, interval=0.5, message="nothing answered on --port")
        db.execute("INSERT INTO t SELECT g FROM generate_series(1, 50) g")
        wait_until(lambda: out.exists() and len(read_messages(out)) == 50, seconds,
                   message="the changes were not delivered while it ran")  # fmt: skip
        wait_until(lambda: running(proc.pid, TASKS_DAEMON) and not running(proc.pid, PLANNING),
                   seconds, message=lambda: f"under the run: {running(proc.pid, 'pyspark')}")  # fmt: skip
        output, _ = proc.communicate(timeout=seconds + 120)
    finally:
        proc.kill()
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, output[-3000:]
    assert elapsed >= seconds, elapsed  # it ran its time ...
    assert f"at http://127.0.0.1:{port}" in output and "stopped; delivered this run" in output
    assert len(read_messages(out)) == 50  # ... and wrote nothing twice while stopping
