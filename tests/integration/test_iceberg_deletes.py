"""Iceberg position deletes walstream writes (`lake/iceberg_deletes.py`) are not committed over
a snapshot another writer added after their positions were read: pyiceberg retries the
conflicting commit, and walstream's delete snapshot refuses the retry."""

from __future__ import annotations

import pyarrow as pa
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
