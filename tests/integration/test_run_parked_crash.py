"""kill -9 of `walstream run` while messages are parked: the webhook refuses two keys
(503) while the others flow, so their changes park behind each other. After the kill the
destination takes everything, and a new `walstream run` delivers every change: the
parked ones by the retrier, in order per key, none lost, none parked twice, and repeats
only within the documented window."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_run_crash import Run
from tests.integration.test_run_stop import slot_exists
from tests.servers import WebhookReceiver
from walstream.testing import wait_until

pytestmark = pytest.mark.spark

KEYS, ROUNDS, REFUSED = 20, 10, {"3", "7"}


def parked(db: Any) -> int:
    rows = db.execute("SELECT count(*) FROM walstream.parked_messages WHERE status = 'parked'")
    return int(rows[0][0])


def test_kill_9_while_messages_are_parked_loses_and_reparks_nothing(db, tmp_path: Path):
    db.execute("CREATE TABLE kv (k int PRIMARY KEY, v int)")
    pub, slot = db.create_publication("kv"), unique("slot")
    db.slots.append(slot)
    refusing = threading.Event()
    refusing.set()
    rx = WebhookReceiver()
    rx.answer = lambda path: 503 if refusing.is_set() and path.rsplit("/", 1)[1] in REFUSED else 200
    rx.start()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "hook", "source": "app", "batch_size": 50,
                   "backoff": {"initial": "0.5s", "max": "1s"}, "max_attempts": 1000,
                   "destination": {"type": "webhook", "retry_timeout": "1s",
                                   "url": f"concat('{rx.url('/hook/')}', "
                                          "get_json_object(record, '$.k'))"}}],
    }))  # fmt: skip
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: slot_exists(db, slot), 120, message=lambda: run.output()[-2000:])
        for r in range(ROUNDS):
            with db.conn.transaction():
                for k in range(KEYS):
                    db.execute(
                        "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = %s",
                        (k, r, r),
                    )
        others = (KEYS - len(REFUSED)) * ROUNDS
        wait_until(
            lambda: len(rx.requests) >= others and parked(db) == len(REFUSED) * ROUNDS, 180,
            message=lambda: f"delivered {len(rx.requests)}/{others}, parked {parked(db)}: "
            f"{run.output()[-2000:]}",
        )  # fmt: skip
    finally:
        run.kill()  # kill -9 with every change of keys 3 and 7 parked
    refusing.clear()
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: parked(db) == 0 and len(rx.requests) >= KEYS * ROUNDS, 180,
                   message=lambda: f"parked {parked(db)}, got {len(rx.requests)}: "
                                   f"{run.output()[-2000:]}")  # fmt: skip
    finally:
        run.kill()
        rx.stop()
    first: dict[str, Any] = {}
    seen: dict[str, int] = defaultdict(int)
    for req in rx.requests:
        seen[req.headers["webhook-id"]] += 1
        first.setdefault(req.headers["webhook-id"], json.loads(req.body))
    assert len(first) == KEYS * ROUNDS  # every change, once at least
    per_key: dict[int, list[int]] = defaultdict(list)
    for body in first.values():  # in order of first arrival
        per_key[body["record"]["k"]].append(body["record"]["v"])
    assert per_key == {k: list(range(ROUNDS)) for k in range(KEYS)}
    # The refused keys' changes were parked once and delivered once by the retrier.
    refused = [i for i, b in first.items() if str(b["record"]["k"]) in REFUSED]
    assert all(seen[i] == 1 for i in refused)
    assert sum(n - 1 for n in seen.values()) <= 50  # the ledger's window: one chunk
    assert db.execute("SELECT count(*) FROM walstream.parked_messages") == [(0,)]
