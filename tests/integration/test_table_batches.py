"""The TableSink contract at the sink itself, for every table sink and mode: typed batches of a
table of the kind users have (a composite key with a text part, an int array with NULL
elements, jsonb holding a string, a number and the JSON null, a numeric, NULLs) are written
one commit each — inserts, an update, a key change, a delete, then a truncate — a replayed
batch writes nothing, and the result read back with DuckDB (which walstream does not write
with) is the source as it should be. No Spark: the batches are built as the writer builds
them (`TableBatch`: `_op`, `_lsn`, `_seq`, `_committed_at`, `_toast`, the columns, `_before`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.lake import Place, delta_rows, iceberg_rows, lake_sink
from walstream.decode.table_shape import TableShape, load_shape
from walstream.lake.contract import TableBatch

KINDS = ("delta", "iceberg")
MODES = ("mirror", "history", "changelog")
#: Every kind in every mode, and the mirrors and histories that write deletes as deletes
#: (Delta deletion vectors, Iceberg position deletes).
CASES = [(k, m) for k in KINDS for m in MODES] + [
    (f"{k}-mor", m) for k in KINDS for m in ("mirror", "history")
]
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KEY = ("region", "id")


def sink_of(db: Any, place: Place, kind: str, mode: str) -> Any:
    if kind.endswith("-mor"):
        return lake_sink(db, place.tmp_path, kind[:-4], "c", mode, place, updates="merge_on_read")
    return lake_sink(db, place.tmp_path, kind, "c", mode, place)


def read(db: Any, place: Place, kind: str) -> list[dict[str, Any]]:
    """The table's rows, in an order of their own (a reader's order is not the table's). A
    table with deletion vectors is read by delta-rs too, which must agree with DuckDB."""
    if kind.startswith("iceberg"):
        rows = sorted(iceberg_rows(db.dsn, "c.acct", place.s3), key=repr)
        if kind == "iceberg-mor":
            by_pyiceberg = lake_sink(db, place.tmp_path, "iceberg", "c", None, place)
            scanned = by_pyiceberg._open("public", "acct").scan().to_arrow().to_pylist()
            assert plain(scanned) == plain(rows), "pyiceberg and DuckDB read different rows"
        return rows
    rows = sorted(delta_rows(place.delta("acct"), place.s3), key=repr)
    if kind == "delta-mor":
        by_delta_rs = pa.table(delta_table(place).scan()).to_pylist()
        assert plain(by_delta_rs) == plain(rows), "delta-rs and DuckDB read different rows"
    return rows


def delta_table(place: Place) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(place.delta("acct"), storage_options=place.storage_options())


def versions(place: Place, kind: str) -> int:
    """How many commits the table has (Delta log entries, Iceberg metadata files)."""
    if kind.startswith("delta"):
        log = place.files("d/acct/_delta_log")
        return len([name for name in log if name.endswith(".json")])
    return len([name for name in place.files("w") if name.endswith(".metadata.json")])


@pytest.fixture
def shape(db: Any) -> TableShape:
    db.execute("CREATE TABLE acct (region text, id int, arr int[], doc jsonb, "
               "price numeric(12,2), note text, PRIMARY KEY (region, id))")  # fmt: skip
    return load_shape(db.conn, "public", "acct")


def row(region: str, k: int, arr: Any, doc: str | None, price: str | None, note: Any) -> dict:
    return {"region": region, "id": k, "arr": arr, "doc": doc,
            "price": None if price is None else Decimal(price), "note": note}  # fmt: skip


def batch(shape: TableShape, batch_id: int, changes: list[tuple[str, dict, dict | None]]) -> Any:
    """A TableBatch of (op, row, row before) in WAL order (lsn = batch id × 100 + i)."""
    columns = list(shape.arrow_schema())
    schema = pa.schema([
        ("_op", pa.string()), ("_lsn", pa.int64()), ("_seq", pa.int32()),
        ("_committed_at", pa.timestamp("us", tz="UTC")), ("_toast", pa.list_(pa.string())),
        *columns, ("_before", pa.struct(columns)),
    ])  # fmt: skip
    empty = {f.name: None for f in columns}
    rows = [{"_op": op, "_lsn": batch_id * 100 + i, "_seq": 0, "_committed_at": AT, "_toast": None,
             **(after or empty), "_before": before}
            for i, (op, after, before) in enumerate(changes)]  # fmt: skip
    return TableBatch("lake", "q", batch_id, shape, pa.Table.from_pylist(rows, schema=schema))


def plain(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The source columns of rows as comparable tuples (jsonb parsed), sorted by key."""
    out = []
    for r in rows:
        doc = None if r["doc"] is None else json.dumps(json.loads(r["doc"]))
        out.append((r["region"], r["id"], r["arr"], doc, r["price"], r["note"]))
    return sorted(out, key=repr)


A = row("eu", 1, [1, None, 3], '"text"', "1.50", None)
B = row("us east", 2, [], "null", None, "b")
C = row("", 3, None, "-0.5", "3.00", "c")
A2 = {**A, "arr": [None], "doc": '{"a": null}', "note": "changed"}
B_MOVED = {**B, "region": "ap 1", "id": 20}
D = row("eu", 9, [7], "123", "9.99", "after the truncate")


@pytest.mark.parametrize(("kind", "mode"), CASES)
def test_each_batch_is_one_commit_a_replay_writes_nothing_and_duckdb_reads_the_source(
    db, place, shape, kind, mode
):
    sink = sink_of(db, place, kind, mode)
    first = batch(shape, 1, [("insert", A, None), ("insert", B, None), ("insert", C, None)])
    second = batch(shape, 2, [
        ("update", A2, None),  # jsonb to an object holding null, an array of one NULL
        ("update", B_MOVED, {**B}),  # the key moved, the text part too
        ("delete", C, None),
    ])  # fmt: skip
    third = batch(shape, 3, [("truncate", None, None), ("insert", D, None)])

    assert sink.write_batch(first).rows == 3
    after_first = versions(place, kind)
    snapshots = len(sink._open("public", "acct").snapshots()) if kind == "iceberg-mor" else 0
    written = sink.write_batch(second)
    assert not written.replayed
    after_second = versions(place, kind)
    assert after_second == after_first + 1  # one commit per batch
    if kind == "iceberg-mor":  # and one snapshot: its deletes and new rows together
        assert len(sink._open("public", "acct").snapshots()) == snapshots + 1
    got_second = read(db, place, kind)

    replay = sink.write_batch(second)  # the same query and batch again
    assert replay.replayed and replay.rows == 0
    assert versions(place, kind) == after_second
    assert read(db, place, kind) == got_second
    assert sink.write_batch(first).replayed  # an older batch of the query too

    if kind == "delta-mor":  # the three old rows deleted in place, the first file not rewritten
        vectors = pa.table(delta_table(place).deletion_vectors())
        assert [m.count(False) for m in vectors["selection_vector"].to_pylist()] == [3]
    if kind == "iceberg-mor":  # one position delete file of the three old rows
        (deletes,) = [f for f in place.files("w") if "/walstream-deletes-" in f]
        data = pq.read_table(pa.BufferReader(place.read("w", deletes)))
        assert data["pos"].to_pylist() == [0, 1, 2]
    if mode == "mirror":
        assert plain(got_second) == plain([A2, B_MOVED])
    elif mode == "history":
        current = [r for r in got_second if r["is_current"]]
        assert plain(current) == plain([A2, B_MOVED])
        assert sorted((r["region"], r["id"], r["_op"], r["is_current"]) for r in got_second) == [
            ("", 3, "delete", False), ("", 3, "insert", False), ("ap 1", 20, "update", True),
            ("eu", 1, "insert", False), ("eu", 1, "update", True),
            ("us east", 2, "delete", False), ("us east", 2, "insert", False),  # moved away
        ]  # fmt: skip
    else:
        ops = sorted((r["_lsn"], r["_op"], r["region"], r["id"]) for r in got_second)
        assert ops == [
            (100, "insert", "eu", 1), (101, "insert", "us east", 2), (102, "insert", "", 3),
            (200, "update", "eu", 1), (201, "update", "ap 1", 20), (202, "delete", "", 3),
        ]  # fmt: skip
        assert plain([r for r in got_second if r["_lsn"] == 200]) == plain([A2])

    sink.write_batch(third)
    got = read(db, place, kind)
    if mode == "mirror":
        assert plain(got) == plain([D])
    elif mode == "history":
        assert plain([r for r in got if r["is_current"]]) == plain([D])
    else:
        assert sorted((r["_lsn"], r["_op"]) for r in got if r["_lsn"] >= 300) == [
            (300, "truncate"), (301, "insert"),
        ]  # fmt: skip


def test_a_merge_on_read_delta_mirror_checkpoints_its_log(db, tmp_path, shape):
    """walstream's own commits checkpoint the log every 100 versions (delta-rs checkpoints
    after its own only), and the batches after a checkpoint read the live files from it."""
    sink = sink_of(db, Place(tmp_path), "delta-mor", "mirror")
    rows = [row("eu", k, [k], str(k), "1.00", f"v{k}") for k in range(5)]
    sink.write_batch(batch(shape, 1, [("insert", r, None) for r in rows]))
    log = tmp_path / "d" / "acct" / "_delta_log"
    n = 1
    while not list(log.glob("*.checkpoint.parquet")):
        n += 1
        assert n < 120, "no checkpoint after 120 batches"
        k = n % 5
        rows[k] = {**rows[k], "note": f"v{k} at {n}"}
        sink.write_batch(batch(shape, n, [("update", rows[k], None)]))
    (checkpoint,) = log.glob("*.checkpoint.parquet")
    assert checkpoint.name == "00000000000000000100.checkpoint.parquet"
    for extra in range(3):  # after the checkpoint: the earlier vectors come from it
        n += 1
        rows[extra] = {**rows[extra], "note": f"after the checkpoint {extra}"}
        sink.write_batch(batch(shape, n, [("update", rows[extra], None)]))
    assert plain(read(db, Place(tmp_path), "delta-mor")) == plain(rows)


def live_deletes(db: Any, place: Place, kind: str) -> int:
    """How many deletes readers of the table's current version must apply: Delta files
    with a deletion vector, Iceberg delete files the scan's files carry."""
    if kind == "delta-mor":
        vectors = pa.table(delta_table(place).deletion_vectors())
        return sum(1 for m in vectors["selection_vector"].to_pylist() if m and not all(m))
    table = lake_sink(db, place.tmp_path, "iceberg", "c", None, place)._open("public", "acct")
    return len({d.file_path for task in table.scan().plan_files() for d in task.delete_files})


@pytest.mark.parametrize("kind", ["delta-mor", "iceberg-mor"])
def test_optimize_folds_a_merge_on_read_mirrors_deletes_and_batches_go_on(db, place, shape, kind):
    """Compaction (`walstream lake optimize`, `optimize.every`) rewrites the files with their
    deletes applied, so readers never face a growing pile of deletes; the batches after it
    find the rows in the compacted files (the key index follows the table's files)."""
    fmt = kind.removesuffix("-mor")
    sink = lake_sink(db, place.tmp_path, fmt, "c", "mirror", place, updates="merge_on_read",
                     optimize={"retain": 0})  # fmt: skip
    rows = [row("eu", k, [k], str(k), "1.00", f"v{k}") for k in range(6)]
    sink.write_batch(batch(shape, 1, [("insert", r, None) for r in rows]))
    for n in range(2, 6):  # updates: each batch deletes an old version
        rows[n] = {**rows[n], "note": f"changed in batch {n}"}
        sink.write_batch(batch(shape, n, [("update", rows[n], None)]))
    assert live_deletes(db, place, kind) >= 1
    assert plain(read(db, place, kind)) == plain(rows)

    result = sink.optimize("public", "acct")
    assert live_deletes(db, place, kind) == 0, result
    assert plain(read(db, place, kind)) == plain(rows)

    rows[0] = {**rows[0], "note": "after the compaction"}
    sink.write_batch(batch(shape, 6, [("update", rows[0], None), ("delete", rows[1], None)]))
    assert plain(read(db, place, kind)) == plain([rows[0], *rows[2:]])


@pytest.mark.parametrize("kind", ["delta", "delta-mor"])
def test_a_delta_sink_keeps_its_table_between_batches_and_sees_what_changed_it(
    db, place, shape, kind
):
    """A Delta sink keeps each table open from batch to batch (opening it replays the log)
    and brings it up to date first: a batch another writer committed meanwhile is a replay
    here, and a table removed between batches is made anew, not written as a stale log."""
    sink = sink_of(db, place, kind, "mirror")
    other = sink_of(db, place, kind, "mirror")
    sink.write_batch(batch(shape, 1, [("insert", A, None), ("insert", B, None)]))
    second = batch(shape, 2, [("update", A2, None), ("delete", B, None)])
    assert not other.write_batch(second).replayed
    assert sink.write_batch(second).replayed  # seen in the log, though the sink held version 1
    assert plain(read(db, place, kind)) == plain([A2])

    from walstream.lake.storage import open_store

    store = open_store(place.delta("acct"), place.storage_options() or {})
    store.filesystem.delete_dir(store.root)
    assert not sink.write_batch(batch(shape, 3, [("insert", C, None)])).replayed
    assert plain(read(db, place, kind)) == plain([C])
    assert versions(place, kind) == 2  # created, then the one batch
