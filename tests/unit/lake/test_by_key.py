"""What one executor task of a merge-on-read table writes (`lake/files.py`): the keys whose
values the batch gives, planned and written as one file; the keys only the table can fill
in, held for the driver; what the driver must delete (a mirror) or close (a history).
Outside Spark: a task's rows as the typed batch it gets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from walstream.decode.table_shape import Column, TableShape
from walstream.lake.contract import ENDS, StagedRows
from walstream.lake.files import _from_ipc, _write_history, _write_mirror

SHAPE = TableShape(
    "public", "t", (Column("id", "BIGINT"), Column("v", "STRING"), Column("w", "STRING")), ("id",)
)
ROWS = pa.schema([
    ("_op", pa.string()), ("_lsn", pa.int64()), ("_seq", pa.int32()),
    ("_committed_at", pa.timestamp("us", tz="UTC")), ("_toast", pa.list_(pa.string())),
    ("id", pa.int64()), ("v", pa.string()), ("w", pa.string()),
    ("_before", pa.struct([("id", pa.int64()), ("v", pa.string()), ("w", pa.string())])),
])  # fmt: skip


def at(s: int) -> datetime:
    return datetime(2024, 1, 1, 0, 0, s, tzinfo=UTC)


def rows(*changes: tuple[Any, ...]) -> pa.Table:
    """(op, lsn, id, v, w, toast) each."""
    out = [{"_op": op, "_lsn": lsn, "_seq": 0, "_committed_at": at(lsn), "_toast": toast,
            "id": i, "v": v, "w": w, "_before": None}
           for op, lsn, i, v, w, toast in changes]  # fmt: skip
    return pa.Table.from_pylist(out, schema=ROWS)


BATCH = rows(
    ("update", 1, 1, "a", None, ["w"]),  # only the table has 1's w: held
    ("insert", 2, 2, "b", "big2", None),
    ("update", 3, 2, "b2", None, ["w"]),  # filled from the insert before it
    ("update", 4, 3, "c", "big3", None),
    ("delete", 5, 4, None, None, None),
    ("update", 6, 1, "a2", None, ["w"]),  # held with 1's first change
)


def test_a_mirror_task_writes_what_it_knows_and_holds_what_only_the_table_has(tmp_path):
    out = _write_mirror(BATCH, SHAPE, str(tmp_path), complete=True)
    held = _from_ipc(out["held"])
    assert [(r["_lsn"], r["id"]) for r in held.to_pylist()] == [(1, 1), (6, 1)]
    written = pq.read_table(out["path"]).to_pylist()
    assert written == [{"id": 2, "v": "b2", "w": "big2"}, {"id": 3, "v": "c", "w": "big3"}]
    assert out["rows"] == 2
    # 2 is new (inserted here first, every change here); 3 and 4 may be in the table
    touched = _from_ipc(out["touched"]).to_pylist()
    assert touched == [{"id": 2}, {"id": 3}, {"id": 4}]


def test_a_mirror_task_of_new_keys_only_touches_nothing(tmp_path):
    out = _write_mirror(rows(("insert", 1, 5, "e", "x", None)), SHAPE, str(tmp_path), True)
    assert "touched" not in out and out["rows"] == 1
    assert StagedRows((), None).ends(["id"]) == {}


def test_a_history_task_writes_every_version_and_says_when_the_tables_end(tmp_path):
    out = _write_history(BATCH, SHAPE, str(tmp_path))
    assert _from_ipc(out["held"]).num_rows == 2
    versions = [
        (r["_op"], r["id"], r["is_current"], r["valid_to"])
        for r in pq.read_table(out["path"]).to_pylist()
    ]
    assert versions == [
        ("insert", 2, False, at(3)),  # ended by the update in the same batch
        ("update", 2, True, None),
        ("update", 3, True, None),
        ("delete", 4, False, at(5)),
    ]
    touched = _from_ipc(out["touched"])
    assert touched.column_names == ["id", ENDS]
    staged = StagedRows((("x", "y"),), touched)
    # the table's current versions end at each key's first change here
    assert staged.ends(["id"]) == {(2,): at(2), (3,): at(4), (4,): at(5)}
