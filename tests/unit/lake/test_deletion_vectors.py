"""Delta deletion vectors walstream writes (`lake/deletion_vectors.py`, `lake/delta_log.py`),
read by two readers it does not write with: DuckDB's delta extension (delta-kernel) and
delta-rs (its DataFusion scan and its own view of each file's vector)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.lake import duck
from walstream.lake import deletion_vectors as dv
from walstream.lake.delta_log import CommitConflict, delete_commit, snapshot, stats
from walstream.lake.storage import open_store

deltalake = pytest.importorskip("deltalake")


def test_z85_is_the_protocol_s_spelling_of_a_uuid() -> None:
    # PROTOCOL.md's example: "ab^-aqEH.-t@S}K{vb[*k^" is the prefix "ab" and this UUID
    assert uuid.UUID(bytes=dv.unz85("^-aqEH.-t@S}K{vb[*k^")) == uuid.UUID(
        "d2c639aa-8816-431a-aaf6-d3fe2512ff61"
    )
    assert dv.z85(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"
    with pytest.raises(ValueError, match="4-byte groups"):
        dv.z85(b"abc")


def test_a_vector_holds_64_bit_positions_behind_the_magic_number() -> None:
    rows = [0, 3, 65_536, 2**32 + 5, 2**40]
    data = dv.encode(rows)
    assert int.from_bytes(data[:4], "little") == dv.MAGIC
    assert list(dv.decode(data)) == rows
    with pytest.raises(ValueError, match="magic"):
        dv.decode(b"\x00" * 4 + data[4:])


def ids_by_duckdb(location: Path) -> list[int]:
    con = duck()
    try:
        return sorted(
            r[0] for r in con.execute("SELECT id FROM delta_scan(?)", [str(location)]).fetchall()
        )
    finally:
        con.close()


def ids_by_delta_rs(location: Path) -> list[int]:
    reader = deltalake.DeltaTable(str(location)).scan(columns=["id"])
    return sorted(pa.table(reader).column("id").to_pylist())


def masks(location: Path) -> dict[str, list[int]]:
    """delta-rs's view of each file's vector: file name -> deleted positions."""
    table = pa.table(deltalake.DeltaTable(str(location)).deletion_vectors())
    out = {}
    for path, keep in zip(
        table["filepath"].to_pylist(), table["selection_vector"].to_pylist(), strict=True
    ):
        out[path.rsplit("/", 1)[1]] = [i for i, k in enumerate(keep) if not k]
    return out


def three_files(location: Path) -> list[str]:
    """A table of ids 0..29 in three files (0-9, 10-19, 20-29) with deletion vectors on; the
    files' names in id order."""
    for first in (0, 10, 20):
        ids = list(range(first, first + 10))
        deltalake.write_deltalake(str(location), pa.table({"id": ids, "v": [f"v{i}" for i in ids]}),
                                  mode="append")  # fmt: skip
    table = deltalake.DeltaTable(str(location))
    table.alter.add_feature(
        deltalake.table.TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    adds = pa.table(deltalake.DeltaTable(str(location)).get_add_actions(flatten=True)).to_pylist()
    return [a["path"] for a in sorted(adds, key=lambda a: a["min.id"])]


def new_file(location: Path, ids: list[int]) -> dict[str, Any]:
    name = f"part-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"id": ids, "v": [f"new{i}" for i in ids]}), location / name)
    size = (location / name).stat().st_size
    return {"path": name, "partitionValues": {}, "size": size, "modificationTime": 0,
            "dataChange": True, "stats": stats(pq.read_metadata(location / name))}  # fmt: skip


def commit(
    location: Path, positions: dict[str, list[int]], adds=(), batch_id: int = 1, known=None
) -> int:
    current = snapshot(open_store(str(location)), deltalake.DeltaTable(str(location)).version())
    return delete_commit(open_store(str(location)), current, positions, adds, app_id="walstream/t/q",
                         batch_id=batch_id, known=known)  # fmt: skip


def test_a_commit_does_not_read_back_the_vectors_the_one_before_it_wrote(tmp_path: Path) -> None:
    """`known` (a key index's vectors): each committed vector is entered there, and the next
    commit extends it without reading the file (here: deleted from disk; the new vector
    holds both commits' rows, as both readers see)."""
    location = tmp_path / "t"
    a, b, _ = three_files(location)
    known: dict[str, Any] = {}
    commit(location, {a: [1], b: [2]}, known=known)
    assert {p: sorted(bits) for p, (_, bits) in known.items()} == {a: [1], b: [2]}
    for vector in location.glob("deletion_vector_*.bin"):
        vector.unlink()
    commit(location, {a: [3], b: [4]}, batch_id=2, known=known)
    assert {p: sorted(bits) for p, (_, bits) in known.items()} == {a: [1, 3], b: [2, 4]}
    want = sorted(set(range(30)) - {1, 3, 12, 14})
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == want


def test_deleted_rows_and_new_files_in_one_commit_read_alike_by_two_readers(tmp_path: Path) -> None:
    location = tmp_path / "t"
    a, b, c = three_files(location)
    before = deltalake.DeltaTable(str(location)).version()
    # rows 2 and 5 of the first file, 0 and 9 of the second; ids 2, 5, 10, 19 come again
    version = commit(location, {a: [2, 5], b: [0, 9]}, [new_file(location, [2, 5, 10, 19])])
    assert version == before + 1
    want = sorted([*range(30)])  # every id once: the old rows gone, the new ones in
    assert ids_by_duckdb(location) == want
    assert ids_by_delta_rs(location) == want
    assert masks(location) == {a: [2, 5], b: [0, 9]}
    rows = pa.table(deltalake.DeltaTable(str(location)).scan(columns=["id", "v"])).to_pylist()
    assert {r["id"]: r["v"] for r in rows if r["id"] in (2, 5, 10, 19, 3)} == {
        2: "new2",
        5: "new5",
        10: "new10",
        19: "new19",
        3: "v3",
    }
    assert deltalake.DeltaTable(str(location)).transaction_version("walstream/t/q") == 1
    # more rows of a file with a vector: the union; the old logical file is removed whole
    commit(location, {a: [7]}, batch_id=2)
    assert masks(location)[a] == [2, 5, 7]
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == [i for i in want if i != 7]
    assert c not in masks(location)


def test_a_file_re_added_with_its_vector_says_its_statistics_are_wide(tmp_path: Path) -> None:
    """The add action of a file whose vector changed: its min/max may count deleted rows, so
    `tightBounds` is false (the protocol's rule for such a file); numRecords stays the
    file's physical rows. The remove action names the file and its old vector, nothing a
    reader does not need; no field is written as null (a checkpoint's unset ones)."""
    import json

    location = tmp_path / "t"
    a, _, _ = three_files(location)
    commit(location, {a: [1]})
    deltalake.DeltaTable(str(location)).create_checkpoint()  # the next commit reads `a` there
    version = commit(location, {a: [2]}, batch_id=2)
    log = location / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    (added,) = [x["add"] for x in actions if "add" in x]
    (removed,) = [x["remove"] for x in actions if "remove" in x]
    assert None not in added.values()
    assert json.loads(added["stats"]) | {"minValues": None, "maxValues": None} == {
        "numRecords": 10, "tightBounds": False, "minValues": None, "maxValues": None,
        "nullCount": {"id": 0, "v": 0},
    }  # fmt: skip
    assert added["deletionVector"]["cardinality"] == 2
    assert set(removed) == {"path", "deletionTimestamp", "dataChange", "size", "deletionVector"}
    assert removed["deletionVector"]["cardinality"] == 1
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == [0, *range(3, 30)]
    deltalake.DeltaTable(str(location)).create_checkpoint()  # the short remove in one
    commit(location, {a: [3]}, batch_id=3)  # ... read back from it
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == [0, *range(4, 30)]


def test_the_live_files_are_read_from_a_checkpoint_and_compaction_folds_the_vectors(
    tmp_path: Path,
) -> None:
    location = tmp_path / "t"
    a, b, _ = three_files(location)
    commit(location, {a: [0, 1]})
    deltalake.DeltaTable(str(location)).create_checkpoint()
    commit(location, {a: [2], b: [3]}, batch_id=2)  # the old vector of `a` from the checkpoint
    gone = {0, 1, 2, 13}
    want = [i for i in range(30) if i not in gone]
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == want
    deltalake.DeltaTable(str(location)).optimize.compact()
    assert ids_by_duckdb(location) == ids_by_delta_rs(location) == want
    assert masks(location) == {}  # the rewritten files hold only live rows


def test_a_version_another_writer_took_is_a_conflict_and_changes_nothing(tmp_path: Path) -> None:
    location = tmp_path / "t"
    a, _, _ = three_files(location)
    stale = snapshot(open_store(str(location)), deltalake.DeltaTable(str(location)).version())
    commit(location, {a: [4]})
    with pytest.raises(CommitConflict) as caught:
        delete_commit(
            open_store(str(location)), stale, {a: [6]}, app_id="walstream/t/q", batch_id=2
        )
    assert caught.value.retryable
    assert ids_by_duckdb(location) == [i for i in range(30) if i != 4]
    assert not list((location / "_delta_log").glob(".*.tmp"))


def test_the_live_rows_of_some_keys_are_found_by_file_and_position(tmp_path: Path) -> None:
    from pyarrow import fs as pafs

    from walstream.lake.delta_log import data_files
    from walstream.lake.positions import locate

    location = tmp_path / "t"
    a, b, c = three_files(location)
    commit(location, {a: [4]})  # id 4 deleted already
    version = deltalake.DeltaTable(str(location)).version()
    store = open_store(str(location))
    files = data_files(store, snapshot(store, version), ["id"])
    keys = pa.table({"id": pa.array([3, 4, 15, 27, 99], pa.int64())})
    found = locate(pafs.LocalFileSystem(), files, keys, ["v"])
    assert found.positions == {a: [3], b: [5], c: [7]}
    assert sorted((r["id"], r["v"], r["_file"], r["_pos"]) for r in found.rows.to_pylist()) == [
        (3, "v3", a, 3), (15, "v15", b, 5), (27, "v27", c, 7)
    ]  # fmt: skip
    # a file whose statistics rule the keys out is not read (here: it could not be)
    gone = [f if f.name != c else type(f)("/nonexistent", c, f.bounds, f.deleted) for f in files]
    assert locate(pafs.LocalFileSystem(), gone, keys.slice(0, 3)).positions == {a: [3], b: [5]}


def test_composite_text_keys_are_found_in_plain_parquet_files(tmp_path: Path) -> None:
    from pyarrow import fs as pafs

    from walstream.lake.positions import DataFile, locate

    rows = pa.table({"region": ["eu", "eu", "us", "us\x1fx", "üß"], "id": [1, 2, 1, 1, 1],
                     "v": ["a", "b", "c", "d", "e"],
                     "arr": [[1], None, [None, 3], [], [5]]})  # fmt: skip
    pq.write_table(rows, tmp_path / "f.parquet")
    empty = dv.positions()
    file = DataFile(str(tmp_path / "f.parquet"), "f.parquet", {}, lambda: empty)
    keys = pa.table({"region": ["us", "eu", "üß", "us"], "id": [1, 2, 1, 2]})
    found = locate(pafs.LocalFileSystem(), [file], keys, ["v", "arr"])  # a list column too
    assert found.positions == {"f.parquet": [1, 2, 4]}
    assert sorted(zip(found.rows["v"].to_pylist(), found.rows["arr"].to_pylist(), strict=True)) == [
        ("b", None),
        ("c", [None, 3]),
        ("e", [5]),
    ]


def test_vacuum_keeps_live_vectors_and_walstream_drops_the_superseded_ones(
    tmp_path: Path,
) -> None:
    import time

    from walstream.lake.delta_log import drop_unused_vectors

    location = tmp_path / "t"
    a, _, _ = three_files(location)
    commit(location, {a: [1]})
    commit(location, {a: [2]}, batch_id=2)  # the first vector is superseded by the union
    table = deltalake.DeltaTable(str(location))
    table.optimize.compact(target_size=100)  # every file is larger: none is rewritten
    table = deltalake.DeltaTable(str(location))
    table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    assert len(list(location.glob("deletion_vector_*.bin"))) == 2  # delta-rs leaves both
    current = snapshot(open_store(str(location)), table.version())
    assert (
        drop_unused_vectors(open_store(str(location)), current, time.time() - 3600) == 0
    )  # too new
    assert drop_unused_vectors(open_store(str(location)), current, time.time() + 1) == 1
    assert len(list(location.glob("deletion_vector_*.bin"))) == 1  # the live one
    assert (
        ids_by_duckdb(location)
        == ids_by_delta_rs(location)
        == [i for i in range(30) if i not in (1, 2)]
    )


def test_the_key_index_reads_each_file_once_and_follows_the_tables_files(tmp_path: Path) -> None:
    """The merge-on-read index (lake/key_index.py): positions as `locate` finds them; a file
    indexed once is not read again (here: it is gone from the disk and still answers); a file
    the table no longer has is dropped, a new one read; changed deletes are read again."""
    from pyarrow import fs as pafs

    from walstream.lake.delta_log import data_files
    from walstream.lake.key_index import KeyIndex
    from walstream.lake.positions import locate

    location = tmp_path / "t"
    a, b, c = three_files(location)
    store = open_store(str(location))
    local = pafs.LocalFileSystem()

    def live() -> list[Any]:
        version = deltalake.DeltaTable(str(location)).version()
        return data_files(store, snapshot(store, version), ["id"])

    keys = pa.table({"id": pa.array([3, 4, 15, 27, 99], pa.int64())})
    index = KeyIndex(["id"])
    files = live()
    assert index.sync(local, files, keys.schema)
    assert index.positions(files, keys) == locate(local, files, keys).positions
    assert index.positions(files, keys) == {a: [3, 4], b: [5], c: [7]}

    commit(location, {a: [3]})  # id 3 deleted: its vector changes, the file does not
    files = live()
    index.sync(local, files, keys.schema)
    assert index.positions(files, keys) == {a: [4], b: [5], c: [7]}

    moved = {f.name: (location / f.name).read_bytes() for f in files}
    for name in moved:
        (location / name).unlink()  # indexed: not read again
    assert index.positions(files, keys) == {a: [4], b: [5], c: [7]}
    for name, data in moved.items():
        (location / name).write_bytes(data)

    new = new_file(location, [99])
    commit(location, {c: [7]}, [new], batch_id=2)  # 27 deleted, a file holding 99 added
    files = live()
    index.sync(local, files, keys.schema)
    assert set(index.files) == {a, b, c, new["path"]}
    assert index.positions(files, keys) == {a: [4], b: [5], new["path"]: [0]}

    deltalake.DeltaTable(str(location)).optimize.compact()  # every file replaced
    files = live()
    index.sync(local, files, keys.schema)
    assert set(index.files) == {f.name for f in files} and a not in index.files
    assert index.positions(files, keys) == locate(local, files, keys).positions
    assert sum(len(p) for p in index.positions(files, keys).values()) == 3  # 4, 15 and 99


def test_the_key_index_on_composite_text_keys_renumbers_the_files_it_keeps(
    tmp_path: Path, monkeypatch
) -> None:
    """Composite keys with a text part; files going and coming: the ids of the files gone
    are given up (here at once) and the files kept answer under their new ids."""
    from pyarrow import fs as pafs

    from walstream.lake import key_index
    from walstream.lake.positions import DataFile

    monkeypatch.setattr(key_index, "RENUMBER_SLACK", 0)
    empty = dv.positions()

    def file(name: str, regions: list[str], ids: list[int]) -> DataFile:
        pq.write_table(pa.table({"region": regions, "id": ids}), tmp_path / name)
        return DataFile(str(tmp_path / name), name, {}, lambda: empty, ("none",))

    f1 = file("1.parquet", ["eu", "us\x1fx"], [1, 1])
    f2 = file("2.parquet", ["eu", "üß"], [2, 1])
    f3 = file("3.parquet", ["us", "eu"], [1, 3])
    keys = pa.table({"region": ["us", "üß", "eu", "us\x1fx"], "id": [1, 1, 3, 1]})
    index = key_index.KeyIndex(["region", "id"])
    local = pafs.LocalFileSystem()
    index.sync(local, [f1, f2, f3], keys.schema)
    assert index.positions([f1, f2, f3], keys) == {
        "1.parquet": [1], "2.parquet": [1], "3.parquet": [0, 1]
    }  # fmt: skip
    f4 = file("4.parquet", ["us\x1fx"], [1])
    index.sync(local, [f3, f4], keys.schema)  # 1 and 2 gone: 3 of 4 ids given up
    assert index.names == ["3.parquet", "4.parquet"]
    assert index.positions([f3, f4], keys) == {"3.parquet": [0, 1], "4.parquet": [0]}


@pytest.mark.parametrize(
    "kind", ["bigint", "text", "composite", "numeric", "uuid"], ids=lambda k: k
)
def test_the_key_index_finds_what_locate_finds_as_files_come_and_go(
    tmp_path: Path, kind: str
) -> None:
    """The key index's sorted runs (merged as files come, rows of files gone dropped): after
    each of 40 batches (a new file of keys that may repeat earlier ones, some positions
    deleted, sometimes older files gone) its positions equal a read of every file's keys,
    for keys it holds as they are (bigint, text) and as length-prefixed text (composite,
    numeric, uuid)."""
    import decimal
    import random
    import uuid as uuid_

    from pyarrow import fs as pafs

    from walstream.lake.key_index import KeyIndex
    from walstream.lake.positions import DataFile, locate

    rnd = random.Random(7)
    columns = {
        "bigint": {"id": pa.int64()},
        "text": {"name": pa.string()},
        "composite": {"region": pa.string(), "id": pa.int64()},
        "numeric": {"amount": pa.decimal128(12, 2)},
        "uuid": {"u": pa.binary(16)},
    }[kind]
    schema = pa.schema(columns)

    def value(i: int) -> dict[str, Any]:
        return {
            "bigint": {"id": i - 500},
            "text": {"name": f"n\x1f{i}" if i % 3 else f"{i}:é"},
            "composite": {"region": ["eu", "us\x1f1", "1:x"][i % 3], "id": i // 3},
            "numeric": {"amount": decimal.Decimal(i) / 100},
            "uuid": {"u": uuid_.UUID(int=i * 7919).bytes},
        }[kind]

    deletions: dict[str, set[int]] = {}

    def file(n: int, ids: list[int]) -> DataFile:
        name = f"{n}.parquet"
        pq.write_table(pa.Table.from_pylist([value(i) for i in ids], schema), tmp_path / name)
        gone = set(rnd.sample(range(len(ids)), len(ids) // 4))
        deletions[name] = gone
        return DataFile(str(tmp_path / name), name, {}, lambda: dv.positions(gone), (n, "v1"))

    local = pafs.LocalFileSystem()
    index = KeyIndex(list(columns))
    live = [file(0, list(range(300)))]
    for n in range(1, 41):
        live.append(file(n, rnd.sample(range(400), rnd.randint(1, 40))))
        if n % 9 == 0:  # a compaction of sorts: older files gone
            live = live[len(live) // 2 :]
        index.sync(local, live, schema)
        asked = pa.Table.from_pylist([value(i) for i in rnd.sample(range(450), 60)], schema)
        assert index.positions(live, asked) == locate(local, live, asked).positions, n
    assert len(index._runs) < 10  # merged: fewer runs than files
    assert index.positions(live, None) == {
        f.name: sorted(set(range(pq.read_metadata(f.path).num_rows)) - deletions[f.name])
        for f in live
    }


def test_deletes_that_add_up_are_read_by_the_ones_new_since(tmp_path: Path) -> None:
    """A file's deletes that only ever add up (Iceberg's delete files): when the index knew
    the file under some of them, it reads only the new ones; when one went away, all."""
    from pyarrow import fs as pafs

    from walstream.lake.key_index import KeyIndex
    from walstream.lake.positions import DataFile

    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), tmp_path / "f.parquet")
    by_part = {"d1": [1], "d2": [2, 3], "d3": [7]}
    asked: list[Any] = []

    def file(parts: tuple[str, ...]) -> DataFile:
        def whole() -> Any:
            asked.append(("all", parts))
            return dv.positions(p for d in parts for p in by_part[d])

        def some(names: Any) -> Any:
            asked.append(("some", tuple(names)))
            return dv.positions(p for d in names for p in by_part[d])

        return DataFile(str(tmp_path / "f.parquet"), "f.parquet", {}, whole, parts, some)

    index = KeyIndex(["id"])
    keys = pa.table({"id": pa.array(range(10), pa.int64())})
    local = pafs.LocalFileSystem()
    for parts, live, read in [
        (("d1",), [0, 2, 3, 4, 5, 6, 7, 8, 9], ("all", ("d1",))),
        (("d1", "d2"), [0, 4, 5, 6, 7, 8, 9], ("some", ("d2",))),
        (("d1", "d2"), [0, 4, 5, 6, 7, 8, 9], None),  # known: nothing read
        (("d2", "d3"), [0, 1, 4, 5, 6, 8, 9], ("all", ("d2", "d3"))),  # d1 went away
    ]:
        asked.clear()
        files = [file(parts)]
        index.sync(local, files, keys.schema)
        assert index.positions(files, keys) == {"f.parquet": live}
        assert asked == ([read] if read else [])


def test_rows_at_positions_are_read_from_their_row_groups(tmp_path: Path) -> None:
    """A history batch reads back the versions it ends by position: in files of several
    row groups, a column the file predates read as NULL, keys in the table's types."""
    from pyarrow import fs as pafs

    from walstream.lake.positions import DataFile, rows_at

    rows = pa.table({"id": pa.array(range(10), pa.int32()), "v": [f"v{i}" for i in range(10)]})
    pq.write_table(rows, tmp_path / "f.parquet", row_group_size=3)  # groups 0-2, 3-5, 6-8, 9
    assert pq.ParquetFile(tmp_path / "f.parquet").metadata.num_row_groups == 4
    empty = dv.positions()
    file = DataFile(str(tmp_path / "f.parquet"), "f.parquet", {}, lambda: empty)
    key = pa.schema([("id", pa.int64())])
    got = rows_at(pafs.LocalFileSystem(), [file], {"f.parquet": [0, 4, 5, 9]}, key, ["v", "new"])
    assert got.schema.field("id").type == pa.int64()
    assert list(zip(got["id"].to_pylist(), got["v"].to_pylist(), got["new"].to_pylist(),
                    got["_pos"].to_pylist(), strict=True)) == [
        (0, "v0", None, 0), (4, "v4", None, 4), (5, "v5", None, 5), (9, "v9", None, 9)
    ]  # fmt: skip
