"""Lake sinks end to end: Postgres → walstream run → Delta / Iceberg tables, read by DuckDB."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.test_run import oracle
from tests.lake import delta_rows, iceberg_rows, normalised, run_config, source_rows
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]

TYPES = """
CREATE TYPE mood AS ENUM ('ok', 'sad');
CREATE TABLE items (
    id int PRIMARY KEY, big bigint, price numeric(10,2), name text, flag bool, day date,
    at timestamptz, local timestamp, data bytea, doc jsonb, tags int[], uid uuid, mood mood,
    note text
);
ALTER TABLE items ALTER COLUMN note SET STORAGE EXTERNAL;
"""
JSON_COLUMNS = ("doc",)


def insert(db: Any, ids: range, note: bool = True) -> None:
    with db.conn.transaction():
        for i in ids:
            db.execute(
                "INSERT INTO items VALUES (%s, %s, %s, %s, %s, DATE '2024-01-01' + %s, "
                "TIMESTAMPTZ '2024-01-01 00:00:00+02' + %s * INTERVAL '1 minute', "
                "TIMESTAMP '2024-01-01 12:00' + %s * INTERVAL '1 second', %s, %s, %s, "
                "gen_random_uuid(), %s, %s)",
                (
                    i, i * 10_000_000_000, f"{i}.25", f"name {i}", i % 2 == 0, i, i, i,
                    bytes([i % 256, 0, 255]), f'{{"n": {i}, "tags": ["a", "b"]}}', [i, i + 1],
                    "ok" if i % 3 else "sad", ("n" * 50_000 + str(i)) if note else None,
                ),
            )  # fmt: skip


def workload(db: Any) -> None:
    insert(db, range(1, 121))
    with db.conn.transaction():
        db.execute("UPDATE items SET name = name || ' v2', price = price + 1 WHERE id % 4 = 0")
        db.execute("DELETE FROM items WHERE id % 10 = 0")
        # unchanged TOAST (note is stored out of line and not sent): filled from the lake
        db.execute("UPDATE items SET flag = NOT flag WHERE id % 7 = 0")
    db.execute("TRUNCATE items")
    insert(db, range(500, 540))
    with db.conn.transaction():
        db.execute("UPDATE items SET big = -big, tags = tags || 99 WHERE id % 3 = 0")
        db.execute("DELETE FROM items WHERE id = 501")
        db.execute("UPDATE items SET doc = NULL, note = 'short' WHERE id = 502")
    insert(db, range(900, 905), note=False)


def lake_sinks(tmp_path: Any, mode: str) -> list[dict[str, Any]]:
    return [
        {
            "name": f"delta-{mode}", "source": "app",
            "destination": {"type": "delta", "mode": mode,
                            "path": str(tmp_path / f"delta-{mode}" / "{schema}" / "{table}")},
        },
        {
            "name": f"iceberg-{mode}", "source": "app",
            "destination": {"type": "iceberg", "mode": mode, "table": f"{mode}.{{table}}",
                            "catalog": {"warehouse": str(tmp_path / "warehouse")}},
        },
    ]  # fmt: skip


def run_until_delivered(spark: Any, cfg: Any, changes: Callable[[], list[Any]]) -> list[Any]:
    """Run until every sink took all of `changes()` (called once the run is up), and
    return them."""
    runtime = Runtime(cfg, spark=spark).start()
    try:
        expected = changes()

        def done() -> bool:
            runtime.poll()
            p = runtime.progress()
            n = len(expected)
            return all(p.get(s.name) and p[s.name].delivered >= n for s in cfg.sinks)

        wait_until(done, 240, interval=0.5, message=lambda: f"{runtime.progress()}")
    finally:
        runtime.stop()
    return expected


def config(db: Any, tmp_path: Any, slot: str, pub: str, sinks: list[dict[str, Any]]) -> Any:
    return parse_config(run_config(db, tmp_path, slot, pub, sinks))


def test_mirror_tables_equal_the_source_after_updates_deletes_toast_and_truncate(
    spark, db, tmp_path
):
    db.execute(TYPES)
    pub = db.create_publication("items")
    oracle_slot, slot = db.create_slot(), db.create_slot()
    cfg = config(db, tmp_path, slot, pub, lake_sinks(tmp_path, "mirror"))

    def concurrently() -> list[Any]:  # written while the run is up
        workload(db)
        return oracle(db, oracle_slot, pub, "app")

    changes = run_until_delivered(spark, cfg, concurrently)
    assert any(c.unchanged_toast for c in changes), "the workload must leave TOAST values out"
    assert any(c.action == "truncate" for c in changes)

    want = normalised(source_rows(db.dsn, "items"), JSON_COLUMNS)
    assert len(want) == 44
    delta = tmp_path / "delta-mirror" / "public" / "items"
    assert normalised(delta_rows(delta), JSON_COLUMNS) == want
    assert normalised(iceberg_rows(db.dsn, "mirror.items"), JSON_COLUMNS) == want


def test_history_and_changelog_keep_every_version(spark, db, tmp_path):
    db.execute(TYPES)
    pub = db.create_publication("items")
    oracle_slot, slot = db.create_slot(), db.create_slot()
    workload(db)  # before the run: one batch holds it all (versions of a key in one batch)
    changes = oracle(db, oracle_slot, pub, "app")
    sinks = lake_sinks(tmp_path, "history") + lake_sinks(tmp_path, "changelog")
    run_until_delivered(spark, config(db, tmp_path, slot, pub, sinks), lambda: changes)

    for name, rows in (
        ("delta", delta_rows(tmp_path / "delta-changelog" / "public" / "items")),
        ("iceberg", iceberg_rows(db.dsn, "changelog.items")),
    ):
        got = sorted(rows, key=lambda r: (r["_lsn"], r["_seq"]))
        assert [(r["_lsn"], r["_seq"], r["_op"]) for r in got] == [
            (c.lsn, c.seq, c.action) for c in changes
        ], name
    # the changelog's data files are those the executors wrote, committed as they were;
    # nothing is left where they were staged
    for name, root in (("delta", tmp_path / "delta-changelog"),
                       ("iceberg", tmp_path / "warehouse" / "changelog")):  # fmt: skip
        written = [p.name for p in root.rglob("*.parquet")]
        assert written and all(n.startswith("walstream-") for n in written), (name, written)
    assert not list((tmp_path / "ckpt" / "_lake").rglob("*.parquet"))

    current = normalised(source_rows(db.dsn, "items"), JSON_COLUMNS)
    meta = ("_op", "_lsn", "_seq", "valid_from", "valid_to", "is_current")
    for name, rows in (
        ("delta", delta_rows(tmp_path / "delta-history" / "public" / "items")),
        ("iceberg", iceberg_rows(db.dsn, "history.items")),
    ):
        # every insert/update/delete is one version, in WAL order per key
        versions: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in sorted(rows, key=lambda r: (r["_lsn"], r["_seq"])):
            versions[r["id"]].append(r)
        assert sorted((r["_lsn"], r["_seq"]) for r in rows) == [
            (c.lsn, c.seq) for c in changes if c.action != "truncate"
        ], name
        for chain in versions.values():  # each version ends where the next begins
            for a, b in itertools.pairwise(chain):
                assert a["valid_to"] is not None and a["valid_to"] <= b["valid_from"], name
                assert not a["is_current"]
        # the current versions are the source table
        now = [{k: v for k, v in r.items() if k not in meta} for r in rows if r["is_current"]]
        assert normalised(now, JSON_COLUMNS) == current, name
