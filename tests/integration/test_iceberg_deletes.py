"""Iceberg position deletes walstream writes (`lake/iceberg_deletes.py`) are not committed over
a snapshot another writer added after their positions were read: pyiceberg retries the
conflicting commit, and walstream's delete snapshot refuses the retry."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.lake import iceberg_rows, lake_sink
from walstream.lake import iceberg_deletes

pytest.importorskip("pyiceberg")


def test_deletes_read_from_an_old_snapshot_are_refused_not_applied(db, tmp_path) -> None:
    from pyiceberg.exceptions import ValidationException

    sink = lake_sink(db, tmp_path, "iceberg", "c")
    catalog = sink._catalog()
    catalog.create_namespace_if_not_exists("c")
    table = catalog.create_table("c.t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    table.append(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    stale = catalog.load_table("c.t")
    (first,) = [f.path for f in iceberg_deletes.data_files(stale, ["id"])]
    catalog.load_table("c.t").append(pa.table({"id": [4], "v": ["d"]}))  # another writer
    refused = pytest.raises(ValidationException, match="changed while walstream wrote")
    with refused, stale.transaction() as tx:
        deletes = iceberg_deletes.write_deletes(stale, {"file://" + first: [0]})
        iceberg_deletes.add_deletes(tx, stale, [deletes], {"walstream.batch": "q:1"})
    assert sorted(r["id"] for r in iceberg_rows(db.dsn, "c.t")) == [1, 2, 3, 4]
    # the same deletes on the current snapshot are applied
    current = catalog.load_table("c.t")
    with current.transaction() as tx:
        deletes = iceberg_deletes.write_deletes(current, {"file://" + first: [0]})
        iceberg_deletes.add_deletes(tx, current, [deletes], {"walstream.batch": "q:1"})
    assert sorted(r["id"] for r in iceberg_rows(db.dsn, "c.t")) == [2, 3, 4]
    assert sorted(catalog.load_table("c.t").scan().to_arrow()["id"].to_pylist()) == [2, 3, 4]


def test_the_live_files_kept_between_batches_are_what_pyiceberg_plans(
    db, tmp_path, monkeypatch
) -> None:
    """`LiveFiles` (a merge-on-read sink's view of an Iceberg table between batches) gives
    the data files, key bounds and deleted positions pyiceberg's own planning gives, through
    appends, walstream's position deletes (one naming several files), a copy-on-write
    delete by pyiceberg and a rewrite of the whole table; a snapshot seen before reads no
    manifest, a new one only the manifests its commit added."""
    sink = lake_sink(db, tmp_path, "iceberg", "c")
    catalog = sink._catalog()
    catalog.create_namespace_if_not_exists("c")
    catalog.create_table("c.t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    live = iceberg_deletes.LiveFiles()
    read = []
    real = iceberg_deletes._read_manifest
    monkeypatch.setattr(
        iceberg_deletes, "_read_manifest", lambda io, m: read.append(m.manifest_path) or real(io, m)
    )

    def view(files):  # pyiceberg lists every later delete file of the partition, only
        return sorted((f.name, f.path, f.bounds, sorted(f.deleted())) for f in files)

    def same() -> list:
        table = catalog.load_table("c.t")
        read.clear()
        got = iceberg_deletes.data_files(table, ["id"], live)
        assert view(got) == view(iceberg_deletes.data_files(table, ["id"]))
        return got

    def delete(positions) -> None:
        table = catalog.load_table("c.t")
        with table.transaction() as tx:
            deletes = iceberg_deletes.write_deletes(table, positions)
            # kept as written: the next batch learns what it names without reading it back
            assert deletes.file_path in iceberg_deletes._DELETE_FILES
            iceberg_deletes.add_deletes(tx, table, [deletes], {"walstream.batch": "q:1"})

    def append(ids) -> None:
        catalog.load_table("c.t").append(
            pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids)})
        )

    append([1, 2, 3])
    append([4, 5, 6])
    first = same()
    assert len(read) == 2  # two manifests, one per append
    same()
    assert read == []  # the same snapshot: nothing read
    a, b = sorted(
        (f.name for f in first), key=lambda n: pq.read_table(n[len("file://") :])["id"][0].as_py()
    )
    delete({a: [0], b: [1, 2]})
    got = same()
    assert len(read) == 1  # the delete manifest only
    assert sorted(len(f.deleted()) for f in got) == [1, 2]
    append([7])
    delete({a: [2]})
    got = same()
    assert {f.name: sorted(f.deleted()) for f in got if f.name == a} == {a: [0, 2]}
    # a file's deletes are those that name it (pyiceberg lists the second one for id 7's)
    assert {f.name: len(f.deletes_id) for f in got}[a] == 2
    assert sorted(len(f.deletes_id) for f in got) == [0, 1, 2]
    catalog.load_table("c.t").delete("id = 4")  # pyiceberg: a copy-on-write rewrite
    same()
    table = catalog.load_table("c.t")
    with table.transaction() as tx:  # what optimize does: the whole table rewritten
        tx.overwrite(table.scan().to_arrow())
    got = same()
    assert all(not f.deletes_id for f in got)
    assert sorted(r["id"] for r in iceberg_rows(db.dsn, "c.t")) == [2, 7]
