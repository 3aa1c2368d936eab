"""High availability: two `walstream run` with one config. The second waits as a hot
standby (its /health says so); kill -9 of the leader mid-stream, the standby takes over
within seconds from the shared checkpoint, nothing is lost, and at no moment do both
report themselves leader."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import unique
from tests.integration.test_run_crash import Run
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

KEYS = 2000
_URL = re.compile(r"console at (http://\S+)")


def url_of(run: Run) -> str:
    found: list[str] = []

    def printed() -> bool:
        found[:] = _URL.findall(run.output())
        return bool(found)

    wait_until(printed, 180, message=lambda: f"the server address in:\n{run.output()[-3000:]}")
    return found[0]


def source_health(url: str, timeout: float = 5) -> dict[str, Any] | None:
    try:
        return httpx.get(f"{url}/health", timeout=timeout).json()["sources"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None  # not answering (starting, or killed)


def keys_delivered(out: Path) -> list[int]:
    import json

    return [json.loads(m)["record"]["k"] for m in read_messages(out)]


def test_standby_takes_over_after_kill_9_of_the_leader(db, tmp_path):
    table = unique("kv")
    db.execute(f"CREATE TABLE {table} (k int PRIMARY KEY, v int)")
    pub = db.create_publication(table)
    slot = unique("slot")
    db.slots.append(slot)
    out, config = tmp_path / "out", tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"port": 0},
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(out)}}],
    }))  # fmt: skip

    leader = Run(config, tmp_path)
    standby: Run | None = None
    overlaps: list[str] = []
    silent: list[str] = []  # a live process that did not answer: its role unknown then
    roles: dict[str, set[str]] = {"a": set(), "b": set()}
    watching, killed_a = threading.Event(), threading.Event()
    watcher: threading.Thread | None = None
    try:
        a = url_of(leader)
        wait_until(lambda: (source_health(a) or {}).get("streaming") is True, 180,
                   message=lambda: leader.output()[-3000:])  # fmt: skip
        # The leader reads the slot: the standby must wait, not fail on a slot in use.
        wait_until(lambda: db.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(True,)],
            60, message="the leader never read its slot")  # fmt: skip
        standby = Run(config, tmp_path)
        b = url_of(standby)
        wait_until(lambda: (source_health(b) or {}).get("role") == "standby", 120,
                   message=lambda: standby.output()[-3000:] if standby else "")  # fmt: skip
        hb = source_health(b)
        assert hb is not None and hb["status"] == "standby" and not hb["streaming"]
        assert any("standby" in r for r in hb["reasons"])

        def watch() -> None:  # both leaders at one moment would be a split brain
            while not watching.is_set():
                # generous: two Spark processes share 2 cores; a busy one is slow, not silent
                ha, hb = source_health(a, 20), source_health(b, 20)
                for name, h in (("a", ha), ("b", hb)):
                    if h is not None:
                        roles[name].add(h["role"])
                    elif name == "b" or not killed_a.is_set():  # alive, yet no answer
                        silent.append(f"{time.time()}: {name}")
                if ha and hb and ha["role"] == hb["role"] == "leader":
                    overlaps.append(f"{time.time()}: {ha} / {hb}")
                watching.wait(0.25)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def write(first: int, last: int) -> None:
            for start in range(first, last, 10):
                with db.conn.transaction():
                    for k in range(start, min(start + 10, last)):
                        db.execute(f"INSERT INTO {table} VALUES (%s, %s)", (k, k))

        write(0, KEYS // 2)
        wait_until(lambda: len(keys_delivered(out)) >= KEYS // 4, 120)
        writer = threading.Thread(target=write, args=(KEYS // 2, KEYS))
        writer.start()
        killed_a.set()
        leader.kill()  # mid-stream: batches in flight, more changes coming
        killed = time.monotonic()
        wait_until(lambda: (source_health(b) or {}).get("streaming") is True, 60,
                   message=lambda: standby.output()[-3000:] if standby else "")  # fmt: skip
        takeover = time.monotonic() - killed
        writer.join()
        wait_until(lambda: len(set(keys_delivered(out))) == KEYS, 180,
                   message=lambda: f"{len(set(keys_delivered(out)))} of {KEYS} keys")  # fmt: skip
        hb = source_health(b)
        assert hb is not None and hb["role"] == "leader" and hb["status"] == "ok", hb
    finally:
        watching.set()
        if watcher is not None:  # its last look ends before the processes do: a look cut
            watcher.join(60)  # short by the kills below is no silence
        leader.kill()
        if standby is not None:
            standby.kill()
    delivered = keys_delivered(out)
    assert sorted(delivered) == list(range(KEYS))  # nothing lost, nothing twice (files)
    assert overlaps == []
    assert silent == []  # every look saw each live process's role: no split brain unseen
    assert roles["b"] >= {"standby", "leader"}
    assert takeover < 30, f"the standby took {takeover:.1f}s to stream"
    print(f"takeover: {takeover:.1f}s after kill -9")
