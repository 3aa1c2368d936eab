"""The table sinks' contract on the kind of table users have (`tests/lake.py`'s acct: a
composite key with a text part, TOASTed text, arrays with NULL elements, jsonb edge values, an
enum, NULLs): every mode of Delta and Iceberg, the mirrors and histories that write deletes
as deletes (`updates: merge_on_read`: Delta deletion vectors, Iceberg position deletes; the
mirrors on an S3 API, moto's server) and the Postgres mirror, in one run, backfilled while
a writer changes keys, leaves TOAST values unchanged and sets jsonb to strings, numbers and
the JSON null. The
lake tables are read back with DuckDB (the merge-on-read ones with delta-rs and pyiceberg
too), the mirror's with Postgres; every mirror (and every history's current rows) equals the
source row by row, every changelog holds each change once. At the sink itself,
test_table_batches.py checks each batch is one commit, a replay writes nothing, key changes
and truncates, in every mode; kill -9 (test_lake_crash.py, test_mirror_crash.py) and widening
(test_lake_schema.py) have runs of their own."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import unique
from tests.integration.test_backfill import config, request
from tests.integration.test_run import oracle
from tests.lake import (
    REAL_JSON,
    REAL_KEY,
    REAL_TABLE,
    Place,
    RealWriter,
    current_versions,
    delta_rows,
    differences,
    every_mode_rows,
    every_mode_sinks,
    fill_real,
    iceberg_rows,
    lake_sink,
    normalised,
    real_source,
)
from walstream.backfill.store import DONE, BackfillStore
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]

ROWS = 1_000


def lake(db: Any, tmp_path: Any, fmt: str, mode: str) -> list[dict[str, Any]]:
    return every_mode_rows(db.dsn, tmp_path, fmt, mode, "acct")


def not_paused(runtime: Runtime) -> bool:
    """True, after a poll; a paused sink fails the test at once (nothing in this workload is
    a reason to stop)."""
    runtime.poll()
    paused = runtime.parking.paused()
    assert not paused, paused
    return True


def test_every_table_sink_equals_a_real_table_backfilled_while_it_changes(
    spark, db, tmp_path, s3, monkeypatch
):
    db.execute(REAL_TABLE)
    keys = fill_real(db.dsn, ROWS)
    pub = db.create_publication("acct")
    oracle_slot, slot = db.create_slot(), db.create_slot()
    mirror_db = unique("mirror")
    db.execute(f"CREATE DATABASE {mirror_db}")
    mirror_dsn = db.server.dsn(mirror_db)
    on_s3 = Place(tmp_path, s3)  # the merge-on-read mirrors: backfill files moved onto S3
    sinks = [*every_mode_sinks(tmp_path), {"name": "pg-mirror", "source": "app",
             "destination": {"type": "postgres", "dsn": mirror_dsn}},
             {"name": "delta-mor", "source": "app", "destination": {
              **on_s3.delta_destination("d-mor"), "updates": "merge_on_read"}},
             {"name": "iceberg-mor", "source": "app", "destination": {
              **on_s3.iceberg_destination("mor"), "updates": "merge_on_read"}},
             {"name": "delta-mor-history", "source": "app", "destination": {"type": "delta",
              "mode": "history", "path": str(tmp_path / "d-morh" / "{table}"),
              "updates": "merge_on_read"}},
             {"name": "iceberg-mor-history", "source": "app", "destination": {
              "type": "iceberg", "mode": "history", "table": "morh.{table}",
              "catalog": {"warehouse": str(tmp_path / "w")}, "updates": "merge_on_read"}}]  # fmt: skip
    cfg = config(db, tmp_path, pub, slot, sinks, max_changes_per_batch=5000)
    writer = RealWriter(db.dsn, keys, seed=3)
    # Changes of rows the lake does not have yet, before any backfill was asked for: an
    # unchanged TOAST value the lake cannot fill from an earlier version.
    writer.write(150)
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    ids = [b.id for s in cfg.sinks for b in request(cfg, store, s.name, chunk_size=250,
                                                    target_seconds=0)]  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=writer.run, args=(stop, 0.01))
    # the merge-on-read tables' key indexes are kept between batches: each data file's
    # keys are read once (a sink made anew for each batch read every file every batch)
    from walstream.lake import key_index

    key_reads: dict[str, int] = {}
    read_keys = key_index.read_keys

    def counted(fs, file, *args):
        key_reads[file.path] = key_reads.get(file.path, 0) + 1
        return read_keys(fs, file, *args)

    monkeypatch.setattr(key_index, "read_keys", counted)
    runtime = Runtime(cfg, spark=spark).start()
    try:
        thread.start()
        wait_until(lambda: not_paused(runtime) and all(
            getattr(store.get(i), "status", None) == DONE for i in ids), 300, interval=0.5,
            message=lambda: f"{[store.get(i) for i in ids]}, {runtime.progress()}")  # fmt: skip
        stop.set()
        thread.join(30)
        writer.write(150)  # and after the backfills, with the lake full
        want = real_source(db.dsn)
        changes = oracle(db, oracle_slot, pub, "app")
        newest = changes[-1].committed_at_us

        def caught_up() -> bool:
            p = runtime.progress()
            return not_paused(runtime) and all(
                s.name in p and p[s.name].last_committed_us >= newest for s in cfg.sinks
            )

        wait_until(caught_up, 240, interval=0.5, message=lambda: f"{runtime.progress()}")
    finally:
        stop.set()
        runtime.stop()
    assert key_reads and max(key_reads.values()) == 1, sorted(key_reads.items())[:10]
    mirrored = real_source(mirror_dsn)  # the Postgres mirror's table, read as the source's
    db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")
    assert not differences(mirrored, want, REAL_KEY), (
        f"postgres mirror:\n{differences(mirrored, want, REAL_KEY)}"
    )
    # the Delta mirror that deletes by deletion vectors, read by DuckDB and by delta-rs
    from deltalake import DeltaTable

    on_read = DeltaTable(on_s3.delta("acct", "d-mor"), storage_options=s3.delta)
    for reader, rows in (
        ("duckdb", delta_rows(on_s3.delta("acct", "d-mor"), s3)),
        ("delta-rs", pa.table(on_read.scan()).to_pylist()),
    ):
        mor = normalised(rows, REAL_JSON)
        assert not differences(mor, want, REAL_KEY), (
            f"merge-on-read mirror read by {reader}:\n{differences(mor, want, REAL_KEY)}"
        )
    assert [k for k in on_s3.files("d-mor") if "/deletion_vector_" in k]
    # the Iceberg mirror that deletes by position delete files, read by DuckDB and pyiceberg
    by_pyiceberg = lake_sink(db, tmp_path, "iceberg", "mor", None, on_s3)._open("public", "acct")
    for reader, rows in (
        ("duckdb", iceberg_rows(db.dsn, "mor.acct", s3)),
        ("pyiceberg", by_pyiceberg.scan().to_arrow().to_pylist()),
    ):
        mor = normalised(rows, REAL_JSON)
        assert not differences(mor, want, REAL_KEY), (
            f"merge-on-read Iceberg mirror read by {reader}:\n{differences(mor, want, REAL_KEY)}"
        )
    assert [k for k in on_s3.files("w") if "/walstream-deletes-" in k]
    for fmt in ("delta", "iceberg"):
        mirror = normalised(lake(db, tmp_path, fmt, "mirror"), REAL_JSON)
        assert not differences(mirror, want, REAL_KEY), (
            f"{fmt} mirror:\n{differences(mirror, want, REAL_KEY)}"
        )
        history = normalised(current_versions(lake(db, tmp_path, fmt, "history")), REAL_JSON)
        assert not differences(history, want, REAL_KEY), (
            f"{fmt} history:\n{differences(history, want, REAL_KEY)}"
        )
    # the merge-on-read histories: the same current rows; a version only of a change the
    # slot sent, each once (which early changes have one depends on when each sink looked
    # up the source's TOAST values: a row gone from the source by then is left out); one
    # current version a key
    from deltalake import DeltaTable as Delta

    morh = {"delta": delta_rows(tmp_path / "d-morh" / "acct"),
            "iceberg": iceberg_rows(db.dsn, "morh.acct")}  # fmt: skip
    by_delta_rs = pa.table(Delta(str(tmp_path / "d-morh" / "acct")).scan()).to_pylist()
    assert normalised(by_delta_rs, REAL_JSON) == normalised(morh["delta"], REAL_JSON)
    sent = {(c.lsn, c.seq) for c in changes}
    for fmt, rows in morh.items():
        history = normalised(current_versions(rows), REAL_JSON)
        assert not differences(history, want, REAL_KEY), (
            f"{fmt} merge-on-read history:\n{differences(history, want, REAL_KEY)}"
        )
        current = Counter((r["region"], r["id"]) for r in rows if r["is_current"])
        assert max(current.values()) == 1, fmt
        versions = Counter((r["_lsn"], r["_seq"], r["_op"], r["region"], r["id"]) for r in rows
                           if r["_op"] != "read")  # fmt: skip
        assert max(versions.values()) == 1, fmt
        assert {(lsn, seq) for lsn, seq, *_ in versions} <= sent, fmt
    for op in ("update, TOAST unchanged", "key change", "key change (text part)", "delete",
               "insert", "jsonb and array update"):  # fmt: skip
        assert writer.ops.get(op, 0) >= 5, writer.ops
    for fmt in ("delta", "iceberg"):
        history = lake(db, tmp_path, fmt, "history")
        # a key's versions: at most one current, and none after a delete
        current = Counter((r["region"], r["id"]) for r in history if r["is_current"])
        assert max(current.values()) == 1, fmt
        changelog = lake(db, tmp_path, fmt, "changelog")
        # every change exactly once, in the WAL's order; each row read at most once
        streamed = sorted((r["_lsn"], r["_seq"], r["_op"]) for r in changelog if r["_op"] != "read")
        assert streamed == [(c.lsn, c.seq, c.action) for c in changes
                            if c.action != "watermark"], fmt  # fmt: skip
        read = Counter((r["region"], r["id"]) for r in changelog if r["_op"] == "read")
        assert read and max(read.values()) == 1, fmt
