"""`walstream verify` on the kind of table users have (tests/lake.py's acct: a composite key
with a text part, TOASTed text, arrays with NULLs, jsonb edge values, key changes), against
a Postgres mirror, a Delta mirror (merge-on-read: deletion vectors) and an Iceberg mirror, while
a writer keeps changing the table: equal sinks are reported equal (no false difference from
the changes in flight); divergence made by hand behind walstream's back (rows deleted and
changed, a Delta data file dropped from the log, an Iceberg table emptied) is reported key for
key; `--repair` re-backfills it and a second verify is clean."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from tests.integration.test_backfill import mirror_database
from tests.lake import REAL_TABLE, RealWriter, fill_real
from walstream.backfill.store import DONE, BackfillStore
from walstream.cli import app
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import wait_until
from walstream.verify.run import Position, Verification
from walstream.verify.sinks import pair

pytestmark = pytest.mark.spark

ROWS = 2_000
#: Keys the writer never touches: the test changes them by hand in the sinks.
SPARED = 10


def verify(config: Path, sink: str, *args: str) -> tuple[int, dict[str, Any]]:
    """`walstream verify SINK --json ...`: its exit code and its report."""
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["verify", sink, "-c", str(config), "--json", *args])
    print(
        f"verify {sink} {' '.join(args)}: exit {result.exit_code} in {time.monotonic() - t0:.1f}s"
    )
    if result.exit_code not in (0, 1) or not isinstance(result.exception, (SystemExit, type(None))):
        raise AssertionError(f"verify {sink} exit {result.exit_code}: {result.output}")
    try:
        (table,) = json.loads(result.stdout)["tables"]
    except ValueError as exc:
        raise AssertionError(f"verify {sink}: {result.output!r} {result.exception!r}") from exc
    return result.exit_code, table


def keys(report: dict[str, Any], kind: str) -> set[tuple[str, int]]:
    return {(k[0], int(k[1])) for k in report[kind]}


def drop_a_file(path: Path, avoid: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """A data file of the Delta table removed from its log by hand (a commit of one `remove`
    action, as a careless job or a bad restore leaves it): the smallest one without a
    deletion vector and without the keys `avoid`. The keys of its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    vectors = pa.table(table.deletion_vectors())
    with_deletes = {
        name.rsplit("/", 1)[-1]
        for name, keep in zip(
            vectors["filepath"].to_pylist(), vectors["selection_vector"].to_pylist(), strict=True
        )
        if not all(keep)
    }
    for add in sorted(adds, key=lambda a: a["num_records"] or 0):
        if add["path"].rsplit("/", 1)[-1] in with_deletes:
            continue
        rows = pq.read_table(path / add["path"], columns=["region", "id"]).to_pylist()
        found = {(r["region"], r["id"]) for r in rows}
        if found and not found & avoid:
            break
    else:
        raise AssertionError(f"no file to drop among {adds}")
    now = int(time.time() * 1000)
    remove = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": add["size_bytes"],
    }
    commit = [{"commitInfo": {"timestamp": now, "operation": "DELETE"}}, {"remove": remove}]
    log = path / "_delta_log" / f"{table.version() + 1:020d}.json"
    with open(log, "x") as out:  # as a writer commits: only if that version is free
        out.write("".join(json.dumps(a) + "\n" for a in commit))
    return found


def test_verify_finds_exactly_the_divergence_made_by_hand_and_repair_fixes_it(spark, db, tmp_path):
    db.execute(REAL_TABLE)
    all_keys = fill_real(db.dsn, ROWS)
    spared, busy = all_keys[:SPARED], all_keys[SPARED:]
    pub = db.create_publication("acct")
    slot = db.create_slot()
    _, mirror = mirror_database(db)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "max_changes_per_batch": 2000}],
        "sinks": [
            {"name": "pg", "source": "app", "backfill": "on_create",
             "destination": {"type": "postgres", "dsn": mirror}},
            {"name": "delta", "source": "app", "backfill": "on_create",
             "destination": {"type": "delta", "path": str(tmp_path / "d" / "{table}"),
                             "updates": "merge_on_read"}},
            {"name": "iceberg", "source": "app", "backfill": "on_create",
             "destination": {"type": "iceberg", "table": "m.{table}",
                             "catalog": {"warehouse": str(tmp_path / "w")}}},
        ],
    }))  # fmt: skip
    plan = load_config(config)
    runtime = Runtime(plan, spark=spark).start()
    store = BackfillStore(plan.state_dsn)
    stop, stop_poll = threading.Event(), threading.Event()
    writer = RealWriter(db.dsn, busy, seed=3)
    writing = threading.Thread(target=writer.run, args=(stop, 0.02))
    # `walstream run`'s loop: a batch whose commit met a hand-made one fails and is replayed
    polling = threading.Thread(
        target=lambda: [runtime.poll() for _ in iter(lambda: stop_poll.wait(0.5), True)]
    )
    polling.start()
    try:
        wait_until(
            lambda: len(store.find()) == 3 and all(b.status == DONE for b in store.find()),
            240,
            interval=0.5,
            message=lambda: f"backfills: {store.find()}, {runtime.progress()}",
        )
        writing.start()
        wait_until(lambda: sum(writer.ops.values()) > 50, 60)
        # Equal while the writer runs: changes in flight are re-checked, not reported.
        for sink in ("pg", "delta"):
            code, report = verify(config, sink)
            assert code == 0, (sink, json.dumps(report)[:3000])
            assert report["equal"] and report["source_rows"] > ROWS // 2, report
        assert sum(writer.ops.values()) > 100, writer.ops  # the table changed meanwhile
        stop.set()
        writing.join(30)
        # the sinks have applied every write before the hand-made divergence
        Position(db.dsn, [slot], "app", 120).reach()
        code, report = verify(config, "iceberg")
        assert code == 0 and report["source_rows"] > ROWS // 2 and not report["buckets"], report

        # Divergence by hand, on keys the writer leaves alone.
        (r1, k1), (r2, k2) = spared[0], spared[1]
        with psycopg.connect(mirror, autocommit=True) as conn:
            conn.execute("DELETE FROM acct WHERE region = %s AND id = %s", (r1, k1))
            conn.execute("UPDATE acct SET doc = '{\"hand\": 1}' WHERE region = %s AND id = %s",
                         (r2, k2))  # fmt: skip
            conn.execute("INSERT INTO acct (region, id, n) VALUES ('zz', 424242, 1)")
        from deltalake import DeltaTable

        (r4, k4), (r5, k5) = spared[3], spared[4]
        delta = DeltaTable(str(tmp_path / "d" / "acct"))
        # delta-rs cannot write deletion vectors: it rewrites the file without the row
        delta.delete(f"region = '{r4}' AND id = {k4}")
        delta.update(updates={"n": "n + 1000"}, predicate=f"region = '{r5}' AND id = {k5}")
        dropped = drop_a_file(tmp_path / "d" / "acct", avoid={(r4, k4), (r5, k5)})
        from pyiceberg.expressions import AlwaysTrue

        from walstream.sinks.registry import sink_for

        iceberg = sink_for(plan.sink("iceberg").destination)._open("public", "acct")
        iceberg.delete(AlwaysTrue())  # emptied behind walstream's back

        code, pg = verify(config, "pg")
        assert code == 1
        assert (keys(pg, "missing"), keys(pg, "different"), keys(pg, "extra")) == (
            {(r1, k1)}, {(r2, k2)}, {("zz", 424242)}
        )  # fmt: skip
        # the same found through bucket sums, as a table too large to compare row by row is
        p = pair(plan, plan.sink("pg"), "public", "acct", chunk_size=500)
        position = Position(db.dsn, [slot], "app", 120)
        by_buckets = Verification(p.source, p.sink, position, direct_rows=0).run(
            p.table, p.target, ROWS
        )
        assert (by_buckets.missing, by_buckets.different, by_buckets.extra) == (
            [(r1, k1)], [(r2, k2)], [("zz", 424242)]
        )  # fmt: skip
        assert 1 <= by_buckets.buckets_different <= 3 and by_buckets.buckets == 64
        code, dl = verify(config, "delta")
        assert code == 1
        assert (keys(dl, "missing"), keys(dl, "different"), keys(dl, "extra")) == (
            {(r4, k4)} | dropped, {(r5, k5)}, set()
        )  # fmt: skip
        # --where: DuckDB selects the lake's rows as Postgres selects the source's
        assert r4 != r5
        code, dl = verify(config, "delta", "--where", f"region = '{r4}' AND id > 0")
        in_region = {k for k in dropped if k[0] == r4}
        assert code == 1 and dl["source_rows"] == dl["sink_rows"] + 1 + len(in_region)
        assert (keys(dl, "missing"), keys(dl, "different")) == ({(r4, k4)} | in_region, set())
        code, ice = verify(config, "iceberg")
        assert code == 1 and ice["sink_rows"] == 0 and not ice["extra"] and not ice["different"]
        assert len(ice["missing"]) == ice["source_rows"] > ROWS // 2

        # --repair: re-backfilled through the running pipeline, then checked again; the
        # mirror's row the source does not have is deleted (under a lock the sink waits for)
        code, pg = verify(config, "pg", "--repair")
        assert pg["repaired"] == 2 and pg["removed"] == 1, pg
        assert code == 0 and not pg["missing"] and not pg["different"] and not pg["extra"]
        code, dl = verify(config, "delta", "--repair")
        assert code == 0 and dl["repaired"] == 2 + len(dropped), dl
        code, ice = verify(config, "iceberg", "--repair")
        assert code == 0 and ice["repaired"] == ice["source_rows"], ice
        for sink in ("pg", "delta", "iceberg"):
            code, report = verify(config, sink, "--values")
            assert code == 0 and report["equal"] and "values" not in report, (sink, report)
    finally:
        stop.set()
        stop_poll.set()
        polling.join(30)
        runtime.stop()


def test_verify_says_why_it_cannot_compare(db, tmp_path):
    """Exit 2 with the reason and the fix: a sink whose kind keeps no copy of the rows, a
    table the sink does not take, and a source whose slot nothing consumes (no `walstream
    run`), with no wait longer than asked."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g")
    pub = db.create_publication("t")
    slot = db.create_slot()
    _, mirror = mirror_database(db)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [
            {"name": "pg", "source": "app", "destination": {"type": "postgres", "dsn": mirror}},
            {"name": "log", "source": "app", "destination": {
                "type": "delta", "mode": "changelog", "path": str(tmp_path / "d" / "{table}")}},
            {"name": "files", "source": "app",
             "destination": {"type": "file", "path": str(tmp_path / "out")}},
            {"name": "some", "source": "app", "filter": "action <> 'delete'",
             "destination": {"type": "postgres", "dsn": mirror, "schema": "s"}},
            {"name": "nodel", "source": "app", "actions": ["insert", "update", "read"],
             "destination": {"type": "postgres", "dsn": mirror, "schema": "n"}},
        ],
    }))  # fmt: skip

    def refused(*args: str) -> str:
        result = CliRunner().invoke(app, ["verify", *args, "-c", str(config)])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert "changelog table keeps every change" in refused("log")
    assert "a file sink sends messages" in refused("files")
    assert "its filter (action <> 'delete') keeps some changes out" in refused("some")
    assert "it does not take the delete changes" in refused("nodel")
    assert "public.t has no column nope" in refused("pg", "--where", "nope > 1")
    assert "does not take public.nope" in refused("pg", "-t", "public.nope")
    t0 = time.monotonic()
    out = refused("pg", "--wait", "2")
    assert f"slot {slot} is at" in out and "is `walstream run` running" in out, out
    assert time.monotonic() - t0 < 30
