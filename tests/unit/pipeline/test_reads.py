"""A staged chunk delivered straight from its file (pipeline/reads.py): the rows DBLog drops
and those tied to the batch's changes are left out, the rest arrive in read order, each
message what the format function makes of the read row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.unit.delivery.test_deliver_columns import plan_for
from walstream.backfill.dblog import key_of
from walstream.backfill.typed import TypedChunk
from walstream.change import ChangeRow
from walstream.formats import formatter
from walstream.formats.template import ReadTemplate
from walstream.pipeline.reads import Direct, deliver_chunk
from walstream.sinks.file import read_messages

US = 1_700_000_000_000_001


def chunk(tmp_path: Path, n: int, ids: range) -> TypedChunk:
    path = tmp_path / "staged" / f"chunk-{n}-1.parquet"
    path.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({
        "pk": pa.array([[str(i)] for i in ids], pa.list_(pa.string())),
        "record": [json.dumps({"id": i}) for i in ids],
        "ord": pa.array(range(len(ids)), pa.int32()),
        "backfill": pa.array([7] * len(ids), pa.int64()),
        "chunk": pa.array([n] * len(ids), pa.int32()),
    }), path, row_group_size=3)  # fmt: skip
    return TypedChunk(7, n, 1, "public", "t", str(path), lsn=900, seq=2, committed_us=US)


def template() -> ReadTemplate:
    out = ReadTemplate.of("sequin", sink="files", db="app", source="app", schema="public",
                          table="t", backfill=7, lsn=900, committed_us=US)  # fmt: skip
    assert out is not None
    return out


def delivered(tmp_path: Path, direct: Direct, c: TypedChunk) -> list[bytes]:
    out = tmp_path / "out"
    stats = deliver_chunk(direct, c, template(), plan_for(out, "jsonl"), partition=3)
    got = read_messages(out)
    assert stats.delivered == len(got)
    if got:
        assert sorted(p.name for p in out.iterdir()) == ["batch-000000000007-part-0003.jsonl"]
    return got


def test_rows_changed_in_the_window_or_tied_to_the_batch_are_left_out(tmp_path):
    c = chunk(tmp_path, 0, range(1, 9))
    direct = Direct((), changed={(7, 0): frozenset({key_of(["2"]), key_of(["5"])}),
                             (7, 1): frozenset({key_of(["3"])})},
                    truncated=frozenset(), tied=frozenset({"public\x1ft\x1f7", "other\x1ft\x1f4"}))  # fmt: skip
    got = delivered(tmp_path, direct, c)
    fmt = formatter("sequin", sink="files", db="app")
    # 2 and 5 changed in the window; 7 changes in the batch (Spark orders it); 4's group
    # is another table's. seq = the watermark's seq + 1 + the row's ordinal.
    want = [
        fmt(ChangeRow("app", 900, 3 + i - 1, None, US, "read", "public", "t", [str(i)],
                      json.dumps({"id": i}), None, None, None, backfill=7)).encode()
        for i in (1, 3, 4, 6, 8)
    ]  # fmt: skip
    assert got == want


def test_a_truncate_in_the_window_delivers_nothing_of_the_chunk(tmp_path):
    c = chunk(tmp_path, 0, range(1, 4))
    direct = Direct((), changed={}, truncated=frozenset({(7, 0)}), tied=frozenset())
    assert delivered(tmp_path, direct, c) == []
