"""Delta commits walstream writes itself on an S3 API (moto's server, a real HTTP server of
the S3 protocol): a version is created only if absent (`If-None-Match: *`), so of writers
racing for it exactly one wins and the others get a retryable conflict; deletion vectors on
S3 read back alike by DuckDB and delta-rs. The table sinks on S3: test_table_batches.py,
test_lake_adopt.py, test_lake_crash.py, test_table_sinks.py."""

from __future__ import annotations

import uuid
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from tests.lake import duck, race_to_create
from walstream.lake.delta_log import CommitConflict, delete_commit, snapshot
from walstream.lake.storage import open_store


def test_of_writers_racing_on_s3_to_create_one_file_exactly_one_wins(s3) -> None:
    store = open_store(f"s3://{s3.bucket}/race-{uuid.uuid4().hex}", s3.delta)
    race_to_create(store, "_delta_log/00000000000000000001.json", 6)


def ids(location: str, s3: Any) -> tuple[list[int], list[int]]:
    """The table's ids as DuckDB and as delta-rs read them."""
    con = duck(s3)
    try:
        by_duckdb = [r[0] for r in con.execute("SELECT id FROM delta_scan(?) ORDER BY id",
                                               [location]).fetchall()]  # fmt: skip
    finally:
        con.close()
    table = deltalake.DeltaTable(location, storage_options=s3.delta)
    return by_duckdb, sorted(pa.table(table.scan())["id"].to_pylist())


def test_deletion_vectors_on_s3_read_alike_and_a_stale_version_is_a_conflict(s3) -> None:
    location = f"s3://{s3.bucket}/dv-{uuid.uuid4().hex}"
    for first in (0, 10):
        rows = pa.table({"id": list(range(first, first + 10))})
        deltalake.write_deltalake(location, rows, mode="append", storage_options=s3.delta)
    table = deltalake.DeltaTable(location, storage_options=s3.delta)
    table.alter.add_feature(
        deltalake.table.TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    store = open_store(location, s3.delta)
    version = deltalake.DeltaTable(location, storage_options=s3.delta).version()
    current = snapshot(store, version)
    adds = pa.table(deltalake.DeltaTable(location, storage_options=s3.delta)
                    .get_add_actions(flatten=True)).to_pylist()  # fmt: skip
    low, high = [a["path"] for a in sorted(adds, key=lambda a: a["min.id"])]
    assert set(current.files) == {low, high}  # the log as walstream replays it from S3

    delete_commit(store, current, {low: [2, 3], high: [0]}, app_id="w/q", batch_id=1)
    want = [i for i in range(20) if i not in (2, 3, 10)]
    assert ids(location, s3) == (want, want)
    assert any(k.endswith(".bin") for k in s3.keys(location.split("/", 3)[3]))

    with pytest.raises(CommitConflict) as caught:  # the version after `current` is taken
        delete_commit(store, current, {low: [5]}, app_id="w/q", batch_id=2)
    assert caught.value.retryable
    assert ids(location, s3) == (want, want)  # nothing of the loser's


def test_a_store_that_ignores_conditional_writes_is_refused_before_any_commit(
    s3, monkeypatch
) -> None:
    """Some S3-compatible stores ignore `If-None-Match`; walstream finds out with a probe
    before its first commit there and refuses, instead of letting two writers take one
    version. (Such a store is played here by dropping the condition on the way out.)"""
    import obstore

    from walstream.errors import SinkError
    from walstream.lake import storage

    bucket = f"plain-{uuid.uuid4().hex[:8]}"  # a store of its own: probed afresh
    s3.client().create_bucket(Bucket=bucket)
    put = obstore.put
    monkeypatch.setattr(obstore, "put", lambda store, key, data, mode=None: put(store, key, data))
    store = open_store(f"s3://{bucket}/t", s3.delta)
    with pytest.raises(SinkError) as caught:
        store.create("_delta_log/00000000000000000001.json", b"{}")
    assert "wrote over an existing file despite `If-None-Match: *`" in caught.value.problem
    assert "copy_on_write" in caught.value.fix and not caught.value.retryable
    assert s3.keys_in(bucket) == []  # neither the version nor the probe left behind
    monkeypatch.undo()
    assert (s3.delta["AWS_ENDPOINT_URL"], bucket) not in storage._CONDITIONAL
    assert open_store(f"s3://{bucket}/t", s3.delta).create("_delta_log/0.json", b"{}")
