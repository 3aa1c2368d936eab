"""The Iceberg sink's key filter on a composite key: thousands of keys in one delete (a chain
of `Or`s nested deeper than Python's recursion limit) match exactly those rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from walstream.lake.iceberg import _delete, _keys_filter

pytest.importorskip("pyiceberg")


def test_a_delete_of_1500_composite_keys_removes_exactly_them(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    rows = pa.table({
        "region": pa.array([("eu", "us", "ap 1")[i % 3] for i in range(3000)], pa.string()),
        "id": pa.array(range(3000), pa.int32()),
        "v": pa.array([f"v{i}" for i in range(3000)], pa.string()),
    })  # fmt: skip
    table = catalog.create_table("ns.t", schema=rows.schema)
    table.append(rows)
    gone = [(("eu", "us", "ap 1")[i % 3], i) for i in range(0, 3000, 2)]
    gone.append(("eu", 1))  # a key the table does not have (1 is "us")
    with table.transaction() as tx:
        _delete(tx, _keys_filter(["region", "id"], gone), {})
    left = catalog.load_table("ns.t").scan().to_arrow()
    assert sorted(left["id"].to_pylist()) == list(range(1, 3000, 2))
    # and as a scan's filter
    some = [(("eu", "us", "ap 1")[i % 3], i) for i in range(1, 3000, 4)]
    found = catalog.load_table("ns.t").scan(row_filter=_keys_filter(["region", "id"], some))
    assert sorted(found.to_arrow()["id"].to_pylist()) == list(range(1, 3000, 4))
