"""The DBLog merge of a message sink's chunks, in Spark: a staged chunk's rows join the
batch at their high watermark's place, minus each row whose key the stream changed
inside the chunk's window (an update, a delete, an update that moved the key away),
and minus the whole chunk when the table was truncated there. Changes outside the
window drop nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from walstream.backfill.dblog import KEY_SQL, key_of
from walstream.backfill.merge import BackfillMerge, Staging, _Emit, _Target
from walstream.backfill.records import Mark

pytestmark = pytest.mark.spark

QUERY = "q"
BATCH = 5
WINDOW = "`schema` STRING, `table` STRING, pk ARRAY<STRING>, lsn BIGINT, seq INT, " \
    "action STRING, record STRING, old STRING"  # fmt: skip


def stage(merge: BackfillMerge, chunk: int, ids: range) -> None:
    path = Path(merge.staging.chunk(7, chunk, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "pk": pa.array([[str(i)] for i in ids], pa.list_(pa.string())),
        "record": [json.dumps({"id": i, "v": i * 10}) for i in ids],
        "ord": pa.array(range(len(ids)), pa.int32()),
        "backfill": pa.array([7] * len(ids), pa.int64()),
        "chunk": pa.array([chunk] * len(ids), pa.int32()),
    }), path)  # fmt: skip


def emit(chunk: int, low: int, high: int) -> _Emit:
    """Chunk `chunk` of backfill 7, its window (low, high) in LSNs, both marks in BATCH."""
    return _Emit(
        _Target("files", "public", "t", ("id",), 4242),
        Mark(7, chunk, 1, "low", low, 0, BATCH), Mark(7, chunk, 1, "high", high, 0, BATCH),
        committed_us=1_700_000_000_000_000,
    )  # fmt: skip


def change(lsn: int, action: str, key: int | None, old: int | None = None) -> tuple[Any, ...]:
    record = None if key is None else json.dumps({"id": key, "v": -1})
    return ("public", "t", None if key is None else [str(key)], lsn, 0, action, record,
            None if old is None else json.dumps({"id": old}))  # fmt: skip


def placed(spark: Any, tmp_path: Path, emits: list[_Emit], changes: list[tuple[Any, ...]],
           chunks: dict[int, range]) -> list[tuple[int, int, int, str]]:  # fmt: skip
    """(lsn, seq, id, action) of the read rows the batch delivers, in (lsn, seq) order."""
    merge = BackfillMerge(None, "app", Staging(str(tmp_path), "app"))  # type: ignore[arg-type]
    for n, ids in chunks.items():
        stage(merge, n, ids)
    keys = spark.createDataFrame(changes, WINDOW)
    inside, em = merge._inside(spark, keys, emits, QUERY, BATCH)
    placed = merge._rows(spark, inside, em, emits)
    assert placed is not None
    rows, _ = placed
    got = rows.selectExpr("lsn", "seq", "record", "action", "_sink", "table_oid").collect()
    assert {r._sink for r in got} <= {"files"}
    assert {r.table_oid for r in got} <= {4242}  # the backfilled table's OID
    return sorted((r.lsn, r.seq, json.loads(r.record)["id"], r.action) for r in got)


def test_a_quiet_window_places_every_row_after_its_high_watermark(spark, tmp_path):
    got = placed(spark, tmp_path, [emit(0, 100, 200)], [], {0: range(1, 4)})
    assert got == [(200, 1, 1, "read"), (200, 2, 2, "read"), (200, 3, 3, "read")]


def test_keys_changed_inside_the_window_are_dropped_and_changes_outside_drop_nothing(
    spark, tmp_path
):
    changes = [
        change(150, "update", 2),  # inside: 2 is dropped
        change(160, "delete", 4),  # inside: 4 is dropped
        change(170, "update", 30, old=3),  # inside, the key moved from 3: 3 is dropped
        change(90, "update", 1),  # before the low watermark: 1 stays
        change(250, "delete", 5),  # after the high watermark: 5 stays
    ]
    got = placed(spark, tmp_path, [emit(0, 100, 200)], changes, {0: range(1, 7)})
    assert [(i, seq) for _, seq, i, _ in got] == [(1, 1), (5, 5), (6, 6)]


def test_a_truncate_inside_one_window_drops_that_chunk_only(spark, tmp_path):
    emits = [emit(0, 100, 200), emit(1, 300, 400)]
    changes = [change(350, "truncate", None), change(150, "update", 2)]
    got = placed(spark, tmp_path, emits, changes, {0: range(1, 4), 1: range(4, 7)})
    assert got == [(200, 1, 1, "read"), (200, 3, 3, "read")]


def test_a_truncate_outside_the_window_drops_nothing(spark, tmp_path):
    changes = [change(50, "truncate", None), change(450, "truncate", None)]
    got = placed(spark, tmp_path, [emit(0, 100, 200)], changes, {0: range(1, 3)})
    assert got == [(200, 1, 1, "read"), (200, 2, 2, "read")]


def test_spark_sql_keys_a_row_as_python_and_arrow_do(spark):
    keys = [["a\x1fb", "c"], ["a", "b\x1fc"], ["1:a"], ["~"], [None], [""], ["", ""],
            ["é", "日本"], ["é日", "本"], ["it's", "\\"]]  # fmt: skip
    rows = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "i INT, pk ARRAY<STRING>")
    got = {r.i: r.k for r in rows.selectExpr("i", f"{KEY_SQL} AS k").collect()}
    assert [got[i] for i in range(len(keys))] == [key_of(k) for k in keys]
    assert len(set(got.values())) == len(keys)


def test_composite_text_keys_holding_the_separator_drop_only_their_own_row(spark, tmp_path):
    """("a\\x1fb", "c") and ("a", "b\\x1fc") are two keys: a change of one drops one row."""
    merge = BackfillMerge(None, "app", Staging(str(tmp_path), "app"))  # type: ignore[arg-type]
    path = Path(merge.staging.chunk(7, 0, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = [["a\x1fb", "c"], ["a", "b\x1fc"], ["é", "x"]]
    pq.write_table(pa.table({
        "pk": pa.array(keys, pa.list_(pa.string())),
        "record": [json.dumps({"k1": a, "k2": b}) for a, b in keys],
        "ord": pa.array(range(3), pa.int32()),
        "backfill": pa.array([7] * 3, pa.int64()),
        "chunk": pa.array([0] * 3, pa.int32()),
    }), path)  # fmt: skip
    target = _Emit(
        _Target("files", "public", "t", ("k1", "k2"), 4242),
        Mark(7, 0, 1, "low", 100, 0, BATCH), Mark(7, 0, 1, "high", 200, 0, BATCH),
        committed_us=1_700_000_000_000_000,
    )  # fmt: skip
    changes = [("public", "t", ["a", "b\x1fc"], 150, 0, "update",
                json.dumps({"k1": "a", "k2": "b\x1fc"}), None)]  # fmt: skip
    keys_df = spark.createDataFrame(changes, WINDOW)
    inside, em = merge._inside(spark, keys_df, [target], QUERY, BATCH)
    placed = merge._rows(spark, inside, em, [target])
    assert placed is not None
    got = sorted((r.seq, json.loads(r.record)["k1"]) for r in placed[0].collect())
    assert got == [(1, "a\x1fb"), (3, "é")]


def test_a_window_over_quiet_batches_reads_only_the_batches_with_changes(spark, tmp_path):
    """A batch of watermarks only stages its window as a marker (no Spark job); a chunk whose
    window's batches were all quiet, placed by a quiet batch, needs no job to find what its
    window holds (nothing), and a change staged by one batch of a longer window still drops
    its row."""
    merge = BackfillMerge(None, "app", Staging(str(tmp_path), "app"))  # type: ignore[arg-type]
    stage(merge, 0, range(1, 5))
    target = _Target("files", "public", "t", ("id",), 4242)
    low, high = Mark(7, 0, 1, "low", 100, 0, BATCH - 3), Mark(7, 0, 1, "high", 200, 0, BATCH)
    emits = [_Emit(target, low, high, committed_us=1_700_000_000_000_000)]
    for b in range(BATCH - 3, BATCH):
        merge.staging.mark_quiet(merge.staging.window(QUERY, b))
    merge.changes = 0  # this batch: watermarks only
    nothing = spark.createDataFrame([], WINDOW)

    def ids(inside: Any, em: Any) -> list[int]:
        placed = merge._rows(spark, inside, em, emits)
        assert placed is not None
        return sorted(json.loads(r.record)["id"] for r in placed[0].select("record").collect())

    inside, em = merge._inside(spark, nothing, emits, QUERY, BATCH)
    assert inside is None  # no batch of the window had a change
    assert ids(inside, em) == [1, 2, 3, 4]
    # one batch of the window had changes: its window file is Spark's, read with the rest
    busy = merge.staging.window(QUERY, BATCH - 2)
    shutil.rmtree(busy)
    spark.createDataFrame([change(150, "update", 2), change(90, "delete", 3)], WINDOW) \
        .write.parquet(busy)  # fmt: skip
    assert not merge.staging.quiet(busy) and merge.staging.quiet(
        merge.staging.window(QUERY, BATCH - 1)
    )
    inside, em = merge._inside(spark, nothing, emits, QUERY, BATCH)
    assert inside is not None
    assert ids(inside, em) == [1, 3, 4]  # 2 changed inside the window; 3 before it
