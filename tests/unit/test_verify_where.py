"""`walstream verify --where` on a lake table: DuckDB selects the rows of each Arrow batch the
backfill predicate selects at the source (string views included, as delta-rs 1.x reads text);
a predicate DuckDB cannot read is an error naming it, not an empty side."""

from __future__ import annotations

import pyarrow as pa
import pytest

from walstream.backfill.predicate import parse
from walstream.errors import WalstreamError
from walstream.verify.sides import _Selected

BATCH = pa.record_batch(
    {
        "region": pa.array(["eu", "us", "ap 1", "", None], pa.string_view()),
        "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "tags": pa.array([["a"], None, [], ["b", None], ["c"]], pa.list_(pa.string())),
    }
)


@pytest.mark.parametrize(
    ("where", "ids"),
    [
        ("region = 'eu' AND id > 0", [1]),
        ("region IN ('us', '') OR id BETWEEN 5 AND 9", [2, 4, 5]),
        ("region IS NULL", [5]),
        ("NOT (id < 3) AND region <> 'ap 1'", [4]),
    ],
)
def test_the_rows_the_predicate_selects(where: str, ids: list[int]) -> None:
    selected = _Selected(parse(where))
    try:
        assert selected(BATCH).column("id").to_pylist() == ids
        assert selected(BATCH).num_columns == 3  # every column, for the row hash
    finally:
        selected.close()


def test_a_predicate_duckdb_cannot_read_is_an_error_saying_so() -> None:
    selected = _Selected(parse("lower(region) = 'eu'"))  # Postgres' pg_catalog.lower
    with pytest.raises(WalstreamError, match="cannot be selected by --where") as err:
        selected(BATCH)
    assert "DuckDB" in err.value.problem and "both Postgres and DuckDB" in (err.value.fix or "")
