"""A sink's selection and shaping in `walstream run`: tables, actions, SQL filter, SQL and
Python transforms, group_by override, and routing to several Kafka topics by expression."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique
from tests.integration.test_run import oracle
from tests.kafka import consume
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def workload(db: Any, seed: int = 3) -> None:
    """Orders of 12 customers changing status; items inserted and deleted."""
    rnd = random.Random(seed)
    orders: set[int] = set()
    items: set[int] = set()
    for t in range(400):
        with db.conn.transaction():
            for _ in range(rnd.choice((1, 3, 8))):
                o = rnd.randrange(150)
                if o not in orders:
                    db.execute(
                        "INSERT INTO orders VALUES (%s, %s, 'new', %s)",
                        (o, f"c{rnd.randrange(12)}", rnd.randrange(1000)),
                    )
                    orders.add(o)
                elif rnd.random() < 0.1:
                    db.execute("DELETE FROM orders WHERE id = %s", (o,))
                    orders.discard(o)
                else:
                    db.execute(
                        "UPDATE orders SET status = %s, total = total + 1 WHERE id = %s",
                        (rnd.choice(("new", "paid", "sent")), o),
                    )
                i = t * 10 + rnd.randrange(10)
                if rnd.random() < 0.3 and items:
                    gone = rnd.choice(sorted(items))
                    db.execute("DELETE FROM items WHERE id = %s", (gone,))
                    items.discard(gone)
                elif i not in items:
                    db.execute("INSERT INTO items VALUES (%s, %s)", (i, o))
                    items.add(i)


def lines(path: Path) -> list[Any]:
    return [json.loads(m) for m in read_messages(path)]


def test_filter_transforms_group_by_and_routing(spark, db, kafka, tmp_path):
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text, status text, total int)")
    db.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, order_id int)")
    pub = db.create_publication("orders", "items")
    oracle_slot = db.create_slot()
    slot = db.create_slot()  # before the workload: the first batch holds all of it
    prefix = unique("by_action")
    compacted = unique("compacted")

    def file_sink(name: str, **kw: Any) -> dict[str, Any]:
        return {
            "name": name, "source": "app",
            "destination": {"type": "file", "path": str(tmp_path / name)}, **kw,
        }  # fmt: skip

    cfg = parse_config(
        {
            "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
            "sources": [
                # small partitions: the backlog spans several, so batches are spread by group
                {"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                 "partition_bytes": 65536}
            ],
            "sinks": [
                file_sink(
                    "paid", tables=["public.orders"], format="record",
                    filter="action != 'delete' AND get_json_object(record, '$.status') = 'paid'",
                ),
                file_sink(
                    "shaped", tables=["public.ord*"], actions=["insert", "update"],
                    transform={
                        "id": "CAST(get_json_object(record, '$.id') AS INT)",
                        "kind": "action",
                        "status": "get_json_object(record, '$.status')",
                    },
                ),
                file_sink("py", tables=["public.items"], transform="tests.integration.transforms:shape"),
                file_sink("by-customer", tables=["public.orders"], group_by=["record.customer"],
                          partitions=4),
                {
                    # batch_size 1: every change is its own ledger chunk, yet a delete and
                    # its tombstone stay together
                    "name": "compacted", "source": "app", "tables": ["public.orders"],
                    "tombstones": True, "batch_size": 1,
                    "destination": {
                        "type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                        "create_topics": True, "topic": compacted,
                    },
                },
                {
                    "name": "routed", "source": "app", "tables": ["public.orders"],
                    "destination": {
                        "type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                        "create_topics": True, "topic": f"concat('{prefix}.', action)",
                        "key": "get_json_object(record, '$.customer')",
                    },
                },
            ],
        }
    )  # fmt: skip
    workload(db)
    runtime = Runtime(cfg, spark=spark).start()
    try:
        changes = oracle(db, oracle_slot, pub, "app")
        orders = [c for c in changes if c.table == "orders"]
        items = [c for c in changes if c.table == "items"]
        rec = {id(c): json.loads(c.record) for c in changes}
        want = {
            "paid": [c for c in orders if c.action != "delete" and rec[id(c)]["status"] == "paid"],
            "shaped": [c for c in orders if c.action in ("insert", "update")],
            "py": items,
            "by-customer": orders,
            "routed": orders,
            "compacted": orders + [c for c in orders if c.action == "delete"],  # + tombstones
        }
        assert all(want.values()) and any(c.action == "delete" for c in orders)

        def done() -> bool:
            runtime.poll()
            p = runtime.progress()
            return all(p.get(s) and p[s].delivered >= len(cs) for s, cs in want.items())

        wait_until(done, 180, interval=0.5, message=lambda: f"{runtime.progress()}")
    finally:
        runtime.stop()

    def by_cursor(cs: list[Any]) -> list[Any]:
        return sorted(cs, key=lambda c: (c.lsn, c.seq))

    # Filter + format record: the rows of paid orders, nothing else.
    got = lines(tmp_path / "paid")
    assert sorted(got, key=lambda r: json.dumps(r, sort_keys=True)) == sorted(
        (rec[id(c)] for c in want["paid"]), key=lambda r: json.dumps(r, sort_keys=True)
    )
    # SQL transform: each message is exactly the declared fields.
    got = lines(tmp_path / "shaped")
    shaped = [
        {"id": rec[id(c)]["id"], "kind": c.action, "status": rec[id(c)]["status"]}
        for c in by_cursor(want["shaped"])
    ]
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(got, key=key) == sorted(shaped, key=key)
    # Python transform, applied on the executors.
    got = lines(tmp_path / "py")
    assert sorted(got, key=key) == sorted(
        ({"item": rec[id(c)]["id"], "op": c.action, "table": "items"} for c in items), key=key
    )
    # group_by record.customer: per batch, all of a customer's changes in one partition file,
    # in WAL order; and the batch really was spread over several partitions.
    parts: dict[tuple[int, str], set[int]] = defaultdict(set)
    per_customer: dict[str, list[tuple[int, int]]] = defaultdict(list)
    spread = False
    out = tmp_path / "by-customer"
    batches: dict[int, set[int]] = defaultdict(set)
    for f in sorted(out.glob("batch-*-part-*.jsonl")):
        batch, part = int(f.name.split("-")[1]), int(f.name.split("-")[3].split(".")[0])
        batches[batch].add(part)
        for line in f.read_text().splitlines():
            m = json.loads(line)
            parts[(batch, m["record"]["customer"])].add(part)
            per_customer[m["record"]["customer"]].append(
                (m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"])
            )
    spread = any(len(p) > 1 for p in batches.values())
    assert spread, "every batch landed in one partition: the group check would be vacuous"
    assert all(len(p) == 1 for p in parts.values())
    assert all(cs == sorted(cs) for cs in per_customer.values())
    assert sum(len(cs) for cs in per_customer.values()) == len(orders)
    # Routing by expression: one topic per action, keyed by customer, exact changes each.
    for action in ("insert", "update", "delete"):
        expected = [c for c in orders if c.action == action]
        msgs = consume(kafka.bootstrap_servers, f"{prefix}.{action}", len(expected))
        assert sorted(
            (
                json.loads(m.value())["metadata"]["commit_lsn"],
                json.loads(m.value())["metadata"]["commit_idx"],
            )
            for m in msgs
        ) == [(c.lsn, c.seq) for c in by_cursor(expected)]
        assert all(m.key().decode() == json.loads(m.value())["record"]["customer"] for m in msgs)
    # Tombstones: after each delete, a null value with the same key and cursor.
    deletes = [c for c in orders if c.action == "delete"]
    msgs = consume(kafka.bootstrap_servers, compacted, len(orders) + len(deletes))
    per_key: dict[bytes, list[tuple[str, bytes]]] = defaultdict(list)
    for m in msgs:
        kind = "tombstone" if m.value() is None else json.loads(m.value())["action"][0]
        per_key[m.key()].append((kind, dict(m.headers())["idempotency-key"]))
    for key, seq in per_key.items():
        for i, (kind, idem) in enumerate(seq):
            if kind == "d":
                assert seq[i + 1] == ("tombstone", idem), (key, seq)
            if kind == "tombstone":
                assert i > 0 and seq[i - 1] == ("d", idem), (key, seq)
    assert sum(kind == "tombstone" for s in per_key.values() for kind, _ in s) == len(deletes)
