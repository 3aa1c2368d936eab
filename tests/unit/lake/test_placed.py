"""A lake sink's staged backfill chunk placed in a batch (DBLog in Arrow): the rows whose
key changed in the window are dropped, the rest keep their read order at the high
watermark's place, and staged columns follow the table's columns now."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from walstream.backfill.typed import TypedChunk
from walstream.decode.table_shape import Column, TableShape
from walstream.errors import SinkError
from walstream.lake.typed import Placed

SHAPE = TableShape("public", "t", (Column("id", "BIGINT"), Column("v", "INT")), ("id",))


def chunk(tmp_path: Path, n: int, data: pa.Table) -> TypedChunk:
    path = tmp_path / f"chunk-{n}-1.parquet"
    pq.write_table(data, path)
    return TypedChunk(7, n, 1, "public", "t", str(path), lsn=900, seq=3, committed_us=1_000)


def staged(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([i * 10 for i in ids],
                                                                   pa.int32())})  # fmt: skip


def test_rows_whose_key_changed_in_the_window_are_dropped_the_rest_keep_their_places(tmp_path):
    first, second = chunk(tmp_path, 0, staged(range(1, 6))), chunk(tmp_path, 1, staged(range(6, 9)))
    changed = {(7, 0): pa.table({"id": pa.array([4, 2, 2], pa.int64())})}
    rows = Placed(SHAPE, [first, second], set(), changed).rows()
    assert rows.column_names == ["_op", "_lsn", "_seq", "_committed_at", "_toast", "id", "v",
                                 "_before"]  # fmt: skip
    got = [(r["_op"], r["_lsn"], r["_seq"], r["id"], r["v"]) for r in rows.to_pylist()]
    # seq = the high watermark's seq + 1 + the row's rank in its chunk (2 and 4 are gone)
    assert got == [
        ("read", 900, 4, 1, 10), ("read", 900, 6, 3, 30), ("read", 900, 8, 5, 50),
        ("read", 900, 4, 6, 60), ("read", 900, 5, 7, 70), ("read", 900, 6, 8, 80),
    ]  # fmt: skip
    assert rows["_toast"].null_count == rows["_before"].null_count == 6


def test_a_truncate_in_the_window_drops_the_whole_chunk(tmp_path):
    only = chunk(tmp_path, 0, staged(range(1, 4)))
    assert Placed(SHAPE, [only], {(7, 0)}, {}).rows() is None
    assert not Placed(SHAPE, [only], {(7, 0)}, {}).whole
    assert Placed(SHAPE, [only], set(), {}).whole


def test_staged_columns_follow_the_table_an_added_one_is_null_a_widened_one_cast(tmp_path):
    only = chunk(tmp_path, 0, staged(range(1, 3)))
    now = TableShape("public", "t", (Column("id", "BIGINT"), Column("v", "BIGINT"),
                                     Column("added", "STRING")), ("id",))  # fmt: skip
    rows = Placed(now, [only], set(), {}).rows()
    assert rows.schema.field("v").type == pa.int64()
    assert [(r["id"], r["v"], r["added"]) for r in rows.to_pylist()] == [(1, 10, None),
                                                                         (2, 20, None)]  # fmt: skip


def test_a_type_the_staged_values_do_not_fit_fails_naming_the_way_out(tmp_path):
    data = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["x"], pa.string())})
    only = chunk(tmp_path, 0, data)
    with pytest.raises(SinkError, match=r"read column v as string, and it is int32 now") as err:
        Placed(SHAPE, [only], set(), {}).rows()
    assert "walstream backfill cancel 7" in str(err.value.fix)


def test_a_chunk_with_a_list_column_drops_its_changed_keys(tmp_path):
    """Arrow joins no list columns: the anti-join is on the key alone."""
    shape = TableShape("public", "t", (Column("id", "BIGINT"), Column("arr", "ARRAY<INT>")),
                       ("id",))  # fmt: skip
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                     "arr": pa.array([[1, None], None, []], pa.list_(pa.int32()))})  # fmt: skip
    changed = {(7, 0): pa.table({"id": pa.array([2], pa.int64())})}
    rows = Placed(shape, [chunk(tmp_path, 0, data)], set(), changed).rows()
    assert [(r["id"], r["arr"], r["_seq"]) for r in rows.to_pylist()] == [
        (1, [1, None], 4), (3, [], 6)]  # fmt: skip
