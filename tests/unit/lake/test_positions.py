"""Rows found by position in data files other writers wrote (`lake/positions.py`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from walstream.lake.positions import DataFile, live_range, rows_at


def view_file(tmp_path) -> DataFile:
    path = tmp_path / "part-0.parquet"
    pq.write_table(
        pa.table({
            "region": pa.array(["eu", "us", "ap"], pa.string_view()),
            "id": pa.array([1, 2, 3], pa.int32()),
            "big": pa.array(["a" * 5000, None, "c"], pa.string_view()),
        }),
        path,
    )  # fmt: skip
    return DataFile(str(path), "part-0.parquet", {}, lambda: [])


def test_rows_at_reads_a_file_whose_text_columns_are_views(tmp_path):
    """delta-rs 1.x writes text as string_view: a merge-on-read batch that fills an unchanged
    TOAST value from such a file (one delta-rs rewrote) took rows from it and failed."""
    file = view_file(tmp_path)
    keys = pa.schema([("region", pa.string()), ("id", pa.int32())])
    found = rows_at(fs.LocalFileSystem(), [file], {"part-0.parquet": [2, 0]}, keys, ["big"])
    assert found.select(["region", "id", "big", "_pos", "_file"]).to_pylist() == [
        {"region": "ap", "id": 3, "big": "c", "_pos": 2, "_file": "part-0.parquet"},
        {"region": "eu", "id": 1, "big": "a" * 5000, "_pos": 0, "_file": "part-0.parquet"},
    ]


def test_live_range_reads_a_file_whose_key_columns_are_views(tmp_path):
    """The key check of a backfill's adoption, on a file delta-rs rewrote, compared string
    views with a string bound and failed every replay of the batch."""
    file = view_file(tmp_path)
    found = live_range(fs.LocalFileSystem(), [file], ["region", "id"], "region", "ap", "eu")
    assert sorted(found.to_pylist(), key=repr) == [
        {"region": "ap", "id": 3},
        {"region": "eu", "id": 1},
    ]
