"""Columnar delivery (Arrow batches of SQL-formatted messages) writes what per-message
delivery writes, byte for byte, including batches with rows left to Python."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from walstream.change import ChangeRow, change_key
from walstream.config import parse_config
from walstream.delivery.columns import deliver_columns
from walstream.delivery.deliver import DeliveryPlan, deliver_partition
from walstream.delivery.route import Route
from walstream.formats import formatter
from walstream.pipeline.tasks import _rows

TS = 1_763_884_850_561_930


def batches(n: int, per_batch: int) -> list[pa.RecordBatch]:
    """Change rows as the pipeline hands them over, `_message` and `_ikey` made as SQL
    would (Python's formatter here), NULL where SQL leaves a row to Python."""
    fmt = formatter("sequin", sink="files", db="app")
    rows: list[dict[str, Any]] = []
    for i in range(n):
        update = i < 150 and i % 7 == 3  # sequin update with old values: Python formats it
        backfill = 4 if i % 2 else None
        row = dict(
            source="app", lsn=1000 + i // 3, seq=i % 3, xid=None if backfill else 9,
            committed_at=TS + i, action="update" if update else ("read" if backfill else "insert"),
            schema="public", table="t", pk=[str(i)], record=f'{{"id":{i},"v":"x{i}"}}',
            old=f'{{"id":{i},"v":"old"}}' if update else None, annotations=None,
            unchanged_toast=None, backfill=backfill, _group=f"g{i}", _key=str(i),
        )  # fmt: skip
        fields = {k: v for k, v in row.items() if k in ChangeRow._fields}
        change = ChangeRow(**fields, committed_at_us=TS + i)
        row["_message"] = None if update else fmt(change)
        row["_ikey"] = change_key(change)
        rows.append(row)
    schema = pa.schema([
        ("source", pa.string()), ("lsn", pa.int64()), ("seq", pa.int32()), ("xid", pa.int64()),
        ("committed_at", pa.timestamp("us", tz="UTC")), ("action", pa.string()),
        ("schema", pa.string()), ("table", pa.string()), ("pk", pa.list_(pa.string())),
        ("record", pa.string()), ("old", pa.string()), ("annotations", pa.string()),
        ("unchanged_toast", pa.list_(pa.string())), ("backfill", pa.int64()),
        ("_group", pa.string()), ("_key", pa.string()), ("_message", pa.string()),
        ("_ikey", pa.string()),
    ])  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=schema)
    return table.to_batches(max_chunksize=per_batch)


def plan_for(tmp: Path, fmt: str) -> DeliveryPlan:
    cfg = parse_config({
        "sources": [{"name": "app", "dsn": "postgresql:///app", "slot": "s", "publication": "p"}],
        "sinks": [{"name": "files", "source": "app",
                   "destination": {"type": "file", "path": str(tmp), "format": fmt}}],
    })  # fmt: skip
    sink = cfg.sinks[0]
    return DeliveryPlan(
        sink="files", destination=sink.destination, format="sequin", db="app",
        batch_size=50, retry_timeout=1.0, ledger=None, query_id="q", batch_id=7,  # type: ignore[arg-type]
        partitions=1,
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_columnar_equals_per_message(tmp_path: Path, fmt: str) -> None:
    data = batches(300, 64)
    nulls = [b.column("_message").null_count for b in data]
    assert 0 in nulls and sum(n > 0 for n in nulls) >= 3  # both kinds of batch

    rows_dir, cols_dir = tmp_path / "rows", tmp_path / "cols"
    by_row = deliver_partition(plan_for(rows_dir, fmt), 0, _rows(data, pa))
    plan = replace(plan_for(cols_dir, fmt), route=Route.COLUMNS)
    by_col = deliver_columns(plan, 0, iter(data), lambda b: _rows(b, pa))

    assert (by_col.delivered, by_col.last_lsn, by_col.last_seq, by_col.max_committed_us) == (
        by_row.delivered, by_row.last_lsn, by_row.last_seq, by_row.max_committed_us,
    )  # fmt: skip
    assert by_col.delivered == 300
    (a,) = rows_dir.iterdir()
    (b,) = cols_dir.iterdir()
    assert a.name == b.name
    if fmt == "jsonl":
        assert b.read_bytes() == a.read_bytes()
        assert b.read_bytes().count(b"\n") == 300
    else:
        assert pq.read_table(b).to_pylist() == pq.read_table(a).to_pylist()
