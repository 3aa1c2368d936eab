"""`walstream backfill` as an operator runs it, against a real database, without Spark (the
commands only queue, show and cancel backfills in the state database; `walstream run`
carries them out): a table not in the publication is refused with the fix; `status`
shows what is queued; `status --watch` follows a backfill until a `cancel` ends it;
`cancel` says what it did and what it could not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def cli(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walstream.cli", "backfill", *args, "-c", str(config)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def config(db: Any, tmp_path: Path) -> Path:
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE hidden (id int PRIMARY KEY)")
    db.execute("INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 500) g")
    db.execute("ANALYZE orders")
    pub = db.create_publication("orders")
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"name": "app", "dsn": db.dsn, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp_path / "out")}}],
    }))  # fmt: skip
    return path


def test_backfill_commands_queue_show_follow_and_cancel(db, tmp_path):
    path = config(db, tmp_path)
    refused = cli(path, "start", "files", "--table", "public.hidden", "--no-follow")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "public.hidden is not in publication" in refused.stderr
    assert "ADD TABLE public.hidden" in refused.stderr

    started = cli(path, "start", "files", "--table", "public.orders", "--no-follow")
    assert started.returncode == 0, started.stderr
    assert "backfill 1: public.orders → sink files, about 500 rows" in started.stdout
    shown = cli(path, "status")
    assert shown.returncode == 0 and "backfill 1" in shown.stdout and "pending" in shown.stdout

    # --watch follows it until it ends: here, cancelled from another terminal.
    watch = subprocess.Popen(
        [sys.executable, "-m", "walstream.cli", "backfill", "status", "1", "--watch",
         "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline()  # its first look: the backfill is still pending
        assert "backfill 1" in first and "pending" in first, first
        assert watch.poll() is None  # ... so it keeps following
        cancelled = cli(path, "cancel", "1")
        assert cancelled.returncode == 0 and "backfill 1 cancelled" in cancelled.stdout
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "cancelled" in out

    again = cli(path, "cancel", "1", "7")
    assert "backfill 1 not cancelled: it is cancelled already" in again.stdout
    assert "backfill 7 not cancelled: no such backfill" in again.stdout
    nothing = cli(path, "cancel")
    assert nothing.returncode == 2 and "name backfill ids or --sink" in nothing.stdout
    assert "cancelled" in cli(path, "status", "1").stdout
