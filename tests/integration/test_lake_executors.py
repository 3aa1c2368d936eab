"""Merge-on-read tables' data files written by the executors (`lake/files.py`,
`stage_by_key`): a batch of several source partitions shuffled by key, each task keeping
each key's newest version (a mirror) or making every change a version (a history) and
writing them as one file, the driver deleting or closing the touched keys' rows and
committing the files; a batch of one partition through the driver.

On the kind of table users have (acct: a composite key with a text part, TOASTed text, an
int array, jsonb, an enum, typed by the JVM) and a table pyarrow types in the tasks, both in
one publication, into Delta and Iceberg mirrors and histories, batch by batch: inserts; a
transaction of updates that leave the TOASTed value out (only the table can fill it in:
those keys go to the driver) beside updates of it, jsonb updates, deletes, inserts, an
insert updated in the same batch and a delete followed by a new insert of its key; key
changes and a truncate (the batch goes the driver's way). After each, every table read
with DuckDB and with delta-rs / pyiceberg equals the source (a history: its current
versions), and the Delta log and Iceberg data files show which way each batch went."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from tests.integration.test_backfill import config
from tests.lake import (
    REAL_JSON,
    REAL_KEY,
    REAL_TABLE,
    Place,
    big_text,
    current_versions,
    delta_rows,
    differences,
    duck,
    fill_real,
    iceberg_metadata,
    normalised,
    real_row,
    real_source,
    rows_of,
)
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]

PLAIN = """
CREATE TABLE flat (
    region text NOT NULL, id int NOT NULL, big text, n bigint NOT NULL DEFAULT 0,
    at timestamptz, PRIMARY KEY (region, id)
);
ALTER TABLE flat ALTER COLUMN big SET STORAGE EXTERNAL;
"""
#: The merge-on-read tables: Delta and Iceberg, mirrors and histories ("-h").
KINDS = ("delta", "iceberg", "delta-h", "iceberg-h")


def lake_rows(db: Any, tmp_path: Path, kind: str, table: str) -> list[Any]:
    """The mirror's rows (a history's current versions) read by DuckDB; delta-rs /
    pyiceberg must read the same version."""
    json_columns = REAL_JSON if table == "acct" else ()
    history = kind.endswith("-h")

    def rows(got: list[dict[str, Any]]) -> list[Any]:
        return normalised(current_versions(got) if history else got, json_columns)

    if kind.startswith("delta"):
        from deltalake import DeltaTable

        path = tmp_path / ("dh" if history else "d") / table
        if not (path / "_delta_log").exists():
            return []  # before its first batch
        while True:
            version = DeltaTable(str(path)).version()
            by_duckdb = rows(delta_rows(path))
            pinned = DeltaTable(str(path), version=version)
            if DeltaTable(str(path)).version() == version:  # DuckDB read that version too
                break
        other = rows(pa.table(pinned.scan()).to_pylist())
    else:
        from pyiceberg.table import StaticTable

        try:
            location = iceberg_metadata(db.dsn, f"{'morh' if history else 'mor'}.{table}")
        except psycopg.errors.UndefinedTable:
            return []  # no Iceberg table in the catalog yet
        if location is None:
            return []
        con = duck()
        try:  # the catalog's metadata file now, read by both
            read = rows_of(con, "SELECT * FROM iceberg_scan(?)", location.removeprefix("file://"))
        finally:
            con.close()
        by_duckdb = rows(read)
        other = rows(StaticTable.from_metadata(location).scan().to_arrow().to_pylist())
    assert by_duckdb == other, f"{kind} {table}: DuckDB and the second reader differ"
    return by_duckdb


def source(db: Any, table: str) -> list[Any]:
    if table == "acct":
        return real_source(db.dsn)
    with psycopg.connect(db.dsn) as conn:
        cur = conn.execute("SELECT * FROM flat")
        names = [d.name for d in cur.description or ()]
        return normalised([dict(zip(names, r, strict=True)) for r in cur.fetchall()])


def before_commit(conn: Any) -> int:
    """Inside a transaction: a time (µs) before its commit, so a sink whose newest written
    commit is at or past it has written the transaction (or its first batch)."""
    row = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::int8").fetchone()
    return int(row[0])


def equal_everywhere(runtime: Runtime, db: Any, tmp_path: Path, since_us: int) -> None:
    """Wait until every sink has written the commit after `since_us` (cheap: no table
    read), then until every mirror equals its source table; the differences if they
    never do. Reading eight tables twice at each poll would take the cores the batches
    need."""

    def written() -> bool:
        runtime.poll()
        progress = runtime.progress()
        return all(getattr(progress.get(k), "last_committed_us", 0) >= since_us for k in KINDS)

    wait_until(written, 120, interval=0.2, message=lambda: f"progress: {runtime.progress()}")

    def diffs() -> str:
        out = []
        for kind in KINDS:
            for table in ("acct", "flat"):
                got = lake_rows(db, tmp_path, kind, table)
                d = differences(got, source(db, table), REAL_KEY)
                if d:
                    out.append(f"{kind} {table}:\n{d}")
        return "\n".join(out)

    def equal() -> bool:
        runtime.poll()
        assert not runtime.parking.paused(), runtime.parking.paused()
        return not diffs()

    wait_until(equal, 120, interval=1, message=diffs)


def delta_commits(tmp_path: Path, table: str, sub: str = "d") -> list[dict[str, Any]]:
    """Each version's data files added (by who wrote them) and deletion vectors written."""
    out = []
    for entry in sorted((tmp_path / sub / table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line]
        adds = [a["add"] for a in actions if "add" in a]
        out.append({
            "executors": [a["path"] for a in adds if a["path"].startswith("walstream-")],
            "driver": [a["path"] for a in adds if a["path"].startswith("part-")
                       and not a.get("deletionVector")],
            "vectors": sum(1 for a in adds if a.get("deletionVector")),
        })  # fmt: skip
    return out


def iceberg_files(tmp_path: Path, table: str) -> dict[str, int]:
    """The Iceberg mirror's data files by who wrote them."""
    names = [p.name for p in (tmp_path / "w").rglob("*.parquet") if f"/{table}/" in str(p)]
    return {
        "executors": sum(1 for n in names if n.startswith("walstream-") and "deletes" not in n),
        "deletes": sum(1 for n in names if n.startswith("walstream-deletes-")),
        "driver": sum(1 for n in names if not n.startswith("walstream-")),
    }


def test_the_executors_write_a_mirrors_files_and_the_driver_what_only_the_table_has(
    spark, db, tmp_path
):
    db.execute(REAL_TABLE)
    db.execute(PLAIN)
    pub = db.create_publication("acct", "flat")
    slot = db.create_slot()
    place = Place(tmp_path)
    sinks = [
        {"name": "delta", "source": "app", "destination": {
            **place.delta_destination(), "updates": "merge_on_read"}},
        {"name": "iceberg", "source": "app", "destination": {
            **place.iceberg_destination("mor"), "updates": "merge_on_read"}},
        {"name": "delta-h", "source": "app", "destination": {
            **place.delta_destination("dh"), "mode": "history", "updates": "merge_on_read"}},
        {"name": "iceberg-h", "source": "app", "destination": {
            **place.iceberg_destination("morh"), "mode": "history",
            "updates": "merge_on_read"}},
    ]  # fmt: skip
    # small source partitions: a batch of the larger transactions below spans several,
    # which the executors shuffle by key; a batch of one goes through the driver
    cfg = config(db, tmp_path, pub, slot, sinks, partition_bytes=64 << 10)
    runtime = Runtime(cfg, spark=spark).start()
    try:
        # 1. inserts only: every key new, the executors' files alone
        keys = fill_real(db.dsn, 300)
        with psycopg.connect(db.dsn) as conn, conn.transaction():
            for region, k in keys:
                conn.execute(
                    "INSERT INTO flat VALUES (%s, %s, %s, %s, now())",
                    (region, k, big_text(k, 0), k),
                )
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        for table in ("acct", "flat"):
            for sub in ("d", "dh"):  # the mirror's and the history's
                first = [
                    c for c in delta_commits(tmp_path, table, sub) if c["executors"] or c["driver"]
                ]
                assert first and all(c["executors"] and not c["driver"] for c in first), first
                assert not any(c["vectors"] for c in first), first
            assert iceberg_files(tmp_path, table)["driver"] == 0, iceberg_files(tmp_path, table)
        # 2. one transaction of each kind of change, the TOASTed value left out of most
        before = {t: len(delta_commits(tmp_path, t)) for t in ("acct", "flat")}
        where = "WHERE region = %s AND id = %s"
        with psycopg.connect(db.dsn) as conn, conn.transaction():
            for t in ("acct", "flat"):
                for region, k in keys[0:60]:  # TOAST unchanged: the table's value fills it in
                    conn.execute(f"UPDATE {t} SET n = n + 7 {where}", (region, k))
                for region, k in keys[60:100]:  # the TOASTed value itself
                    conn.execute(f"UPDATE {t} SET big = %s {where}", (big_text(k, 5), region, k))
                for region, k in keys[100:120]:
                    conn.execute(f"DELETE FROM {t} {where}", (region, k))
                for region, k in keys[120:130]:  # deleted, then a new row under its key
                    conn.execute(f"DELETE FROM {t} {where}", (region, k))
                for region, k in keys[0:5]:  # TOAST unchanged twice in the batch
                    conn.execute(f"UPDATE {t} SET n = n + 1 {where}", (region, k))
            for region, k in keys[120:130]:
                conn.execute("INSERT INTO acct VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                             real_row(region, k, 9))  # fmt: skip
                conn.execute("INSERT INTO flat VALUES (%s, %s, %s, 9, NULL)",
                             (region, k, big_text(k, 9)))  # fmt: skip
            for k in range(5000, 5010):  # new, then updated with its TOASTed value left out
                conn.execute("INSERT INTO acct VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                             real_row("eu", k, 1))  # fmt: skip
                conn.execute("UPDATE acct SET n = n + 1 WHERE region = 'eu' AND id = %s", (k,))
                conn.execute("INSERT INTO flat VALUES ('eu', %s, %s, 1, NULL)", (k, big_text(k, 1)))
                conn.execute("UPDATE flat SET n = n + 1 WHERE region = 'eu' AND id = %s", (k,))
            conn.execute("UPDATE acct SET doc = %s, arr = %s WHERE id > 200", ('"é"', [None, 2]))
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        for table in ("acct", "flat"):
            new = [c for c in delta_commits(tmp_path, table)[before[table] :] if c["vectors"]]
            # the executors' keys and, in the same commit, the driver's (TOAST filled in)
            assert any(c["executors"] and c["driver"] for c in new), new
            files = iceberg_files(tmp_path, table)
            assert files["driver"] >= 1 and files["deletes"] >= 1, files
        # 3. key changes (of the id and of the text part): the batch goes the driver's way
        with psycopg.connect(db.dsn) as conn, conn.transaction():
            for t in ("acct", "flat"):
                conn.execute(f"UPDATE {t} SET id = id + 100000 {where}", keys[200])
                conn.execute(f"UPDATE {t} SET region = 'moved', n = 3 {where}", keys[201])
                conn.execute(f"UPDATE {t} SET n = n + 1 {where}", keys[202])
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        # 4. a truncate, then rows again; 5. and updates of them through the executors
        with psycopg.connect(db.dsn) as conn, conn.transaction():
            conn.execute("TRUNCATE acct, flat")
            for region, k in keys[:50]:
                conn.execute("INSERT INTO acct VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                             real_row(region, k, 2))  # fmt: skip
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        before = len(delta_commits(tmp_path, "acct"))
        with psycopg.connect(db.dsn) as conn, conn.transaction():
            for region, k in keys[:50:2]:
                conn.execute(
                    f"UPDATE acct SET big = %s, n = 1 {where}", (big_text(k, 3), region, k)
                )
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        (last,) = [c for c in delta_commits(tmp_path, "acct")[before:] if c["vectors"]]
        assert last["executors"] and not last["driver"], last
        # 6. a small batch (one source partition): through the driver, the latency path
        before = len(delta_commits(tmp_path, "acct"))
        with psycopg.connect(db.dsn) as conn:
            conn.execute(f"UPDATE acct SET big = 'small', n = 1 {where}", keys[7])
            since = before_commit(conn)
        equal_everywhere(runtime, db, tmp_path, since)
        (small,) = [c for c in delta_commits(tmp_path, "acct")[before:] if c["vectors"]]
        assert small["driver"] and not small["executors"], small
    finally:
        runtime.stop()
