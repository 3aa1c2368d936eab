"""Schema changes mid-stream reach the message sinks as they happen: a column added or
dropped, a type changed, the table renamed — each change's message has the table's
shape at that change, in files, Kafka and webhooks alike."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TestDatabase, unique
from tests.integration.test_backfill import messages
from tests.kafka import consume
from tests.servers import WebhookReceiver
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.testing import TansuBroker, supervised, wait_until

pytestmark = pytest.mark.spark

#: (DDL before the insert, the insert, the message's table and record after it)
STEPS: list[tuple[str | None, str, str, dict[str, Any]]] = [
    (None, "INSERT INTO t VALUES (1, 10, 'x')", "t", {"id": 1, "a": 10, "b": "x"}),
    ("ALTER TABLE t ADD COLUMN c text", "INSERT INTO t VALUES (2, 20, 'y', 'new')", "t",
     {"id": 2, "a": 20, "b": "y", "c": "new"}),
    ("ALTER TABLE t DROP COLUMN b", "INSERT INTO t VALUES (3, 30, 'z')", "t",
     {"id": 3, "a": 30, "c": "z"}),
    ("ALTER TABLE t ALTER COLUMN a TYPE bigint", "INSERT INTO t VALUES (4, 5000000000, 'big')",
     "t", {"id": 4, "a": 5000000000, "c": "big"}),
    ("ALTER TABLE t ALTER COLUMN a TYPE text", "INSERT INTO t VALUES (5, 'five', 'text')", "t",
     {"id": 5, "a": "five", "c": "text"}),
    ("ALTER TABLE t RENAME TO u", "INSERT INTO u VALUES (6, 'six', 'renamed')", "u",
     {"id": 6, "a": "six", "c": "renamed"}),
]  # fmt: skip


def test_every_message_sink_gets_each_change_in_the_shape_of_its_moment(
    spark: Any, db: TestDatabase, kafka: TansuBroker, tmp_path: Path
) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
    rx = WebhookReceiver().start()
    topic = f"schema-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    cfg = parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": unique("slot"),
                     "publication": unique("pub"), "tables": ["public.t"]}],
        "sinks": [
            {"name": "files", "source": "app", "destination": {"type": "file", "path": str(out)}},
            {"name": "kafka", "source": "app",
             "destination": {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                             "topic": topic, "create_topics": True}},
            {"name": "hooks", "source": "app", "destination": {"type": "webhook",
                                                              "url": rx.url("/")}},
        ],
    })  # fmt: skip
    db.slots.append(cfg.sources[0].slot_name)
    try:
        with supervised(Runtime(cfg, spark=spark).start()) as rt:
            for i, (ddl, insert, _, _) in enumerate(STEPS, 1):  # batches see each shape
                if ddl:
                    db.execute(ddl)
                db.execute(insert)
                wait_until(lambda i=i: [p.delivered for p in rt.progress().values()] == [i] * 3,
                           90, message=lambda: f"{rt.progress()}")  # fmt: skip
    finally:
        rx.stop()
    from_kafka = [
        json.loads(m.value()) for m in consume(kafka.bootstrap_servers, topic, len(STEPS))
    ]
    hooks = sorted((r.json() for r in rx.requests), key=lambda m: m["metadata"]["commit_lsn"])
    expected = [(table, record) for _, _, table, record in STEPS]
    for name, got in (("files", messages(out)), ("kafka", from_kafka), ("webhooks", hooks)):
        shapes = [(m["metadata"]["table_name"], m["record"]) for m in got]
        assert shapes == expected, name
        # the record's columns in the table's order at that moment
        assert [list(r) for _, r in shapes] == [list(r) for _, r in expected], name
