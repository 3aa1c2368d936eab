"""Staged backfill files committed as the lake table's own data files (`adopt_files`): once,
after a crash between moving them and the commit, and never over keys the table has; on
local disk, and moved across filesystems into tables on an S3 API (moto's server)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyiceberg.table import Transaction

from tests.lake import Place, delta_rows, iceberg_rows, lake_sink
from walstream.decode.table_shape import TableShape, load_shape
from walstream.lake.contract import FilesBatch

KINDS = ("delta", "iceberg")


def sink_of(db: Any, place: Place, kind: str) -> Any:
    return lake_sink(db, place.tmp_path, kind, "adopt", None, place)


def rows(first: int, last: int) -> list[dict[str, Any]]:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return [
        {"id": i, "name": f"n{i}", "amount": Decimal(i) / 4, "at": at} for i in range(first, last)
    ]


def stage(tmp_path: Path, shape: TableShape, data: list[dict[str, Any]], name: str) -> str:
    path = tmp_path / "staged" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(data, schema=shape.arrow_schema()), path)
    return str(path)


def table_rows(db: Any, place: Place, kind: str) -> list[dict[str, Any]]:
    found = (
        delta_rows(place.delta("t"), place.s3)
        if kind == "delta"
        else iceberg_rows(db.dsn, "adopt.t", place.s3)
    )
    return sorted(found, key=lambda r: r["id"])


def data_files(place: Place, kind: str) -> list[str]:
    names = place.files("d" if kind == "delta" else "w")
    return sorted(n.rsplit("/", 1)[-1] for n in names if n.endswith(".parquet"))


def expected(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as DuckDB reads them back."""
    return [{**r, "amount": r["amount"].quantize(Decimal("0.01"))} for r in data]


@pytest.fixture
def shape(db: Any) -> TableShape:
    db.execute("CREATE TABLE t (id bigint PRIMARY KEY, name text, amount numeric(10,2), "
               "at timestamptz)")  # fmt: skip
    return load_shape(db.conn, "public", "t")


@pytest.mark.parametrize("kind", KINDS)
def test_staged_files_become_data_files_once_even_after_a_crash_before_the_commit(
    db, tmp_path, place, shape, kind, monkeypatch
):
    sink = sink_of(db, place, kind)
    files = (
        (stage(tmp_path, shape, rows(1, 101), "chunk-0-0.parquet"), "walstream-backfill-1-0-0.parquet"),
        (stage(tmp_path, shape, rows(101, 151), "chunk-1-0.parquet"), "walstream-backfill-1-1-0.parquet"),
    )  # fmt: skip
    batch = FilesBatch("lake", "q1", 7, shape, files)

    # the first try moves the files under the table, then dies before its commit
    commit = DeltaTable.create_write_transaction if kind == "delta" else Transaction.add_files

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(DeltaTable if kind == "delta" else Transaction, commit.__name__, crash)
    with pytest.raises(RuntimeError, match="killed"):
        sink.adopt_files(batch)
    assert not any(Path(staged).exists() for staged, _ in files)
    monkeypatch.undo()

    # the replay finds them moved and commits them
    written = sink.adopt_files(batch)
    assert written is not None and (written.rows, written.replayed) == (150, False)
    assert table_rows(db, place, kind) == expected(rows(1, 151))
    assert data_files(place, kind) == [name for _, name in files]

    # a replay after the commit writes nothing
    again = sink.adopt_files(batch)
    assert again is not None and again.replayed
    assert len(table_rows(db, place, kind)) == 150


@pytest.mark.parametrize("kind", KINDS)
def test_files_are_not_adopted_over_keys_the_table_has_or_in_other_columns(
    db, tmp_path, place, shape, kind
):
    sink = sink_of(db, place, kind)
    first = stage(tmp_path, shape, rows(1, 51), "a.parquet")
    assert sink.adopt_files(FilesBatch("lake", "q", 1, shape, ((first, "w-a.parquet"),)))
    # keys 40..59: 40..50 are in the table, so the rows must be merged, not appended
    overlap = stage(tmp_path, shape, rows(40, 60), "b.parquet")
    assert sink.adopt_files(FilesBatch("lake", "q", 2, shape, ((overlap, "w-b.parquet"),))) is None
    assert Path(overlap).exists()
    # a column added at the source since the file was staged: not the table's columns now
    db.execute("ALTER TABLE t ADD COLUMN extra int")
    wider = load_shape(db.conn, "public", "t")
    later = stage(tmp_path, shape, rows(100, 110), "c.parquet")
    assert sink.adopt_files(FilesBatch("lake", "q", 3, wider, ((later, "w-c.parquet"),))) is None
    assert table_rows(db, place, kind) == expected(rows(1, 51))
