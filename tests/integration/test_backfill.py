"""Backfills through the runtime: a table's rows arrive as action `read`, placed by watermarks
in the stream, equal to what the stream would send, and never older than a change the
stream delivered (DBLog)."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from tests.conftest import unique
from tests.integration.test_crash import slot_inactive
from tests.integration.test_decoder_types import CASES, USER_TYPES
from tests.integration.test_run_crash import Run
from tests.sinks.test_postgres import table_text
from walstream.backfill.coordinator import Coordinator
from walstream.backfill.merge import BackfillMerge, Staging
from walstream.backfill.read import ChunkResult, read_chunk, watermark
from walstream.backfill.records import Mark
from walstream.backfill.requests import request
from walstream.backfill.store import DONE, BackfillStore
from walstream.change import read_idempotency_key
from walstream.cli import backfill as commands
from walstream.cli.backfill import status_table, summary
from walstream.config import Plan, parse_config
from walstream.delivery.parking import ParkingLot
from walstream.errors import ConfigError
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.sinks.file import read_messages
from walstream.testing import wait_until

pytestmark = pytest.mark.spark


def config(
    db: Any, tmp_path: Path, pub: str, slot: str, sinks: list[dict[str, Any]], **source: Any
) -> Plan:
    """Source `app` on `db` (with `source`'s further settings) into `sinks`."""
    return parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub,
                     "max_changes_per_batch": 5000, **source}],
        "sinks": sinks,
    })  # fmt: skip


def files(name: str, path: Path) -> dict[str, Any]:
    return {"name": name, "source": "app", "batch_size": 400,
            "destination": {"type": "file", "path": str(path)}}  # fmt: skip


def messages(path: Path) -> list[dict[str, Any]]:
    """The file sink's messages in WAL-cursor order."""
    out = [json.loads(m) for m in read_messages(path)]
    return sorted(out, key=lambda m: (m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"]))


def raw_records(path: Path) -> dict[tuple[str, int], bytes]:
    """(action, id) -> the raw JSON text of the message's `record`, as the sink wrote it."""
    out = {}
    for line in read_messages(path):
        m = json.loads(line)
        out[(m["action"], m["record"]["id"])] = line[
            len(b'{"record":') : line.index(b',"changes":')
        ]
    return out


def mirror_database(db: Any) -> tuple[str, str]:
    """A fresh database on the test server for a Postgres mirror: its name and DSN."""
    name = unique("mirror")
    db.execute(f"CREATE DATABASE {name}")
    return name, db.server.dsn(name)


def run_until_done(runtime: Runtime, store: BackfillStore, ids: list[int], timeout: float = 240):
    def done() -> bool:
        runtime.poll()
        found = [store.get(i) for i in ids]
        failed = [b for b in found if b is not None and b.status == "failed"]
        assert not failed, failed
        return all(b is not None and b.status == DONE for b in found)

    wait_until(done, timeout, interval=0.5,
               message=lambda: f"backfills {[store.get(i) for i in ids]}, {runtime.progress()}")  # fmt: skip


def test_all_types_backfill_to_files_and_the_mirror_equals_the_source(spark, db, tmp_path):
    """The decoder's all-types table: read rows are byte for byte the stream's inserts of
    the same values, each row once with its backfill idempotency key, and the mirror built
    from them equals the source."""
    db.execute(USER_TYPES)
    cols = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(CASES))
    literals = ", ".join(lit for _, lit, _ in CASES)
    for t in ("old_rows", "new_rows"):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, {cols})")
    db.execute(f"INSERT INTO old_rows VALUES (1, {literals})")
    names = ", ".join(f"o.c{i}" for i in range(len(CASES)))
    db.execute(
        f"INSERT INTO old_rows SELECT g, {names} FROM old_rows o, generate_series(2, 1500) g"
    )
    db.execute("UPDATE old_rows SET c3 = id * 7, c1 = (id % 2 = 0)")  # values vary by row
    pub = db.create_publication("old_rows", "new_rows")
    slot = db.create_slot()
    mirror_db, mirror = mirror_database(db)
    cfg = config(db, tmp_path, pub, slot, [
        files("files", tmp_path / "out"),
        {"name": "mirror", "source": "app", "tables": ["public.old_rows"],
         "backfill": "on_create", "destination": {"type": "postgres", "dsn": mirror}},
    ])  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    try:
        # The same values, inserted while streaming: what the stream sends for them.
        db.execute("INSERT INTO new_rows SELECT * FROM old_rows")
        ids = [b.id for b in request(cfg, store, "files", ["public.old_rows"], chunk_size=400,
                                     target_seconds=0)]  # fmt: skip
        (on_create,) = store.find(sink="mirror")  # backfill: on_create, at the first start
        assert on_create.qualified == "public.old_rows"
        ids.append(on_create.id)
        run_until_done(runtime, store, ids)
        wait_until(lambda: len([m for m in messages(tmp_path / "out")
                                if m["metadata"]["table_name"] == "new_rows"]) == 1500, 60)  # fmt: skip
    finally:
        runtime.stop()
    got = messages(tmp_path / "out")
    reads = [m for m in got if m["action"] == "read"]
    inserts = {m["record"]["id"]: m for m in got if m["metadata"]["table_name"] == "new_rows"}
    assert sorted(m["record"]["id"] for m in reads) == list(range(1, 1501))  # each row once
    for m in reads:
        twin = inserts[m["record"]["id"]]
        assert m["record"] == twin["record"]
        assert list(m["record"]) == list(twin["record"])  # same columns, same order
        assert m["metadata"]["idempotency_key"] == read_idempotency_key(
            ids[0], [str(m["record"]["id"])]
        )

    # byte for byte: the raw JSON text of a read's record is the insert's
    raw = raw_records(tmp_path / "out")
    assert all(raw[("read", i)] == raw[("insert", i)] for i in range(1, 1501))
    b = store.get(ids[0])
    assert b is not None and b.rows_read == 1500 and b.chunks == 4 and b.chunks_emitted == 4
    Runtime(cfg, spark=spark)._backfills_on_create(store)  # a later start: no second one
    assert len(store.find(sink="mirror")) == 1
    json_cols = {f"c{i}" for i, (t, _, _) in enumerate(CASES) if t == "json"}
    lossy = {f"c{i}" for i, (_, lit, _) in enumerate(CASES) if lit in ("'null'", "'[0:1]={5,6}'")}
    try:
        assert table_text(mirror, "public.old_rows", json_cols, lossy) == table_text(
            db.dsn, "public.old_rows", json_cols, lossy
        )
    finally:
        db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")


def replay(msgs: list[dict[str, Any]], table: str) -> dict[int, dict[str, Any]]:
    """The table as the messages build it, in cursor order; and the DBLog check: a read
    row is never older than what the stream delivered before it for the same key."""
    state: dict[int, dict[str, Any]] = {}
    streamed: dict[int, dict[str, Any] | None] = {}  # last stream version per key (None: deleted)
    for m in msgs:
        if m["metadata"]["table_name"] != table:
            continue
        action, record = m["action"], m["record"]
        key = record["id"]
        if action == "read":
            if key in streamed:
                assert streamed[key] is not None, f"a read resurrected deleted key {key}: {m}"
                assert record == streamed[key], (
                    f"stale read of {key}: {record} after {streamed[key]}"
                )
            state[key] = record
        elif action == "delete":
            state.pop(key, None)
            streamed[key] = None
        else:
            state[key] = streamed[key] = record
    return state


def churn(dsn: str, table: str, keys: int, stop: threading.Event, seed: int) -> int:
    """Updates, deletes and inserts on random keys until `stop`; how many transactions."""
    rng = random.Random(seed)
    n = 0
    with connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            k = rng.randrange(1, keys + keys // 10)
            op = rng.random()
            if op < 0.6:
                conn.execute(f"UPDATE {table} SET v = v + 1, note = %s WHERE id = %s", (f"u{n}", k))
            elif op < 0.8:
                conn.execute(f"DELETE FROM {table} WHERE id = %s", (k,))
            else:
                conn.execute(
                    f"INSERT INTO {table} VALUES (%s, 0, %s) ON CONFLICT (id) DO UPDATE "
                    "SET v = excluded.v, note = excluded.note", (k, f"i{n}"),
                )  # fmt: skip
            n += 1
            time.sleep(0.002)  # pacing: a steady write load, not a flood the test must drain
    return n


def write_inside_windows(dsn: str, table: str, stop: threading.Event) -> int:
    """Until `stop`: hold an ACCESS EXCLUSIVE lock on `table` until a read waits on it,
    update every 200th key, commit. A chunk read waits after its low watermark committed,
    so each one meets changes to its own keys between its watermarks, whatever the timing
    (the planner's reads wait too, harmlessly). How many reads it held."""
    held = 0
    with connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                while not stop.is_set():
                    # pg_stat_activity is read once per transaction unless cleared
                    conn.execute("SELECT pg_stat_clear_snapshot()")
                    waiting = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
                        r" AND query !~* '^\s*(update|delete|insert)'"  # not the churn's
                    ).fetchone()[0]  # fmt: skip
                    if waiting:
                        conn.execute(
                            f"UPDATE {table} SET v = v + 1, note = 'held' WHERE id % 200 = 7"
                        )
                        held += 1
                        break
                    time.sleep(0.01)  # polling for a waiter (bounded by `stop`)
            time.sleep(0.05)  # pacing: let the churn and the stream run between holds
    return held


def test_concurrent_writes_during_the_backfill_never_lose_to_a_stale_read(spark, db, tmp_path):
    """Updates, deletes and inserts hit the rows of the chunks being read: every read is
    the latest version the stream had delivered for its key (or the key was not in the
    stream yet), no deleted row comes back, and the final state equals the source."""
    keys = 20_000
    db.execute("CREATE TABLE hot (id int PRIMARY KEY, v int NOT NULL, note text)")
    db.execute(f"INSERT INTO hot SELECT g, 0, 'start' FROM generate_series(1, {keys}) g")
    pub = db.create_publication("hot")
    slot = db.create_slot()
    mirror_db, mirror = mirror_database(db)
    cfg = config(db, tmp_path, pub, slot, [
        files("files", tmp_path / "out"),
        {"name": "mirror", "source": "app", "destination": {"type": "postgres", "dsn": mirror}},
    ])  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    stop = threading.Event()
    counts: list[int] = []
    writer = threading.Thread(target=lambda: counts.append(churn(db.dsn, "hot", keys, stop, 11)))
    holds: list[int] = []
    locker = threading.Thread(
        target=lambda: holds.append(write_inside_windows(db.dsn, "hot", stop))
    )
    try:
        writer.start()
        locker.start()
        ids = [b.id for b in request(cfg, store, "files", chunk_size=1000, target_seconds=0)]
        ids += [b.id for b in request(cfg, store, "mirror", chunk_size=1500, target_seconds=0)]
        run_until_done(runtime, store, ids)
        stop.set()
        writer.join(30)
        locker.join(30)
        final = {r[0]: r for r in db.execute("SELECT id, v, note FROM hot")}

        def diff() -> str:
            state = replay(messages(tmp_path / "out"), "hot")
            got = {k: (k, r["v"], r["note"]) for k, r in state.items()}
            wrong = sorted(k for k in set(got) | set(final) if got.get(k) != final.get(k))
            return f"{len(wrong)} keys differ, e.g. {[(k, got.get(k), final.get(k)) for k in wrong[:5]]}"

        def caught_up() -> bool:
            runtime.poll()
            state = replay(messages(tmp_path / "out"), "hot")
            return {k: (k, r["v"], r["note"]) for k, r in state.items()} == final

        wait_until(caught_up, 120, interval=1, message=lambda: f"{runtime.progress()}: {diff()}")
        wait_until(lambda: table_text(mirror, "public.hot", set()) == table_text(db.dsn, "public.hot", set()),
                   60, interval=1)  # fmt: skip
    finally:
        stop.set()
        runtime.stop()
        db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")
    got = messages(tmp_path / "out")
    replay(got, "hot")  # the DBLog checks, on everything delivered
    reads = [m for m in got if m["action"] == "read"]
    assert counts and counts[0] > 100, "the writer barely ran during the backfill"
    assert holds and holds[0] > 0, "no chunk read waited on the held lock"
    superseded = keys - len({m["record"]["id"] for m in reads})
    print(f"{counts[0]} write transactions and {holds[0]} held reads during the backfill; "
          f"{len(reads)} rows read and "
          f"delivered, {superseded} superseded by the stream or deleted")  # fmt: skip
    assert len(reads) == len({m["record"]["id"] for m in reads})  # each key read at most once
    b = store.get(ids[0])
    assert b is not None
    dropped = b.rows_read - len(reads)
    print(f"{dropped} rows read but dropped: their key changed between the chunk's watermarks")
    assert dropped > 0  # writes hit rows of chunks inside their windows (each held read has ~5)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walstream.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_kill_9_during_a_backfill_resumes_and_completes(db, tmp_path):
    """`walstream backfill` (the command) queues it, `walstream run` reads it; kill -9 in
    the middle; the next run resumes from the chunks not delivered: every row arrives,
    duplicates only of the chunks that were in flight."""
    rows, size = 60_000, 2000
    db.execute("CREATE TABLE big (id int PRIMARY KEY, v int, pad text)")
    db.execute(
        f"INSERT INTO big SELECT g, g % 97, repeat('x', 100) FROM generate_series(1, {rows}) g"
    )
    pub = db.create_publication("big")
    slot = db.create_slot()
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [files("files", tmp_path / "out")],
    }))  # fmt: skip
    queued = cli("backfill", "files", "--chunk-size", str(size), "--target-seconds", "0",
                 "--no-follow", "-c", str(path))  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert re.search(r"backfill (\d+): public\.big → sink files, about [\d,]+ rows", queued.stdout)
    store = BackfillStore(db.dsn)
    (b,) = store.find(sink="files")
    assert b.status == "pending"
    run = Run(path, tmp_path)
    try:
        # kill -9 while chunks are being read: 6 to 20 of the 30 read (a round reads 2)
        wait_until(lambda: (x := store.get(b.id)) is not None and 6 * size <= x.rows_read <= 20 * size,
                   240, interval=0.02, message=lambda: f"{store.get(b.id)}\n{run.output()[-3000:]}")  # fmt: skip
        run.kill()
        at_kill = store.get(b.id)
        assert at_kill is not None and at_kill.status == "running"
        assert at_kill.rows_read < rows
        wait_until(lambda: slot_inactive(db, slot), 30)
        run = Run(path, tmp_path)
        wait_until(lambda: (x := store.get(b.id)) is not None and x.status == DONE, 300,
                   message=lambda: f"{store.get(b.id)}\n{run.output()[-3000:]}")  # fmt: skip
    finally:
        run.kill()
    reads = [m["record"]["id"] for m in messages(tmp_path / "out") if m["action"] == "read"]
    assert set(reads) == set(range(1, rows + 1))
    duplicates = len(reads) - rows
    again = [c for c in store.chunks(b.id) if c.attempt > 1]
    print(f"killed with {at_kill.rows_read // size} of {rows // size} chunks read and "
          f"{at_kill.chunks_emitted} delivered; "
          f"{len(again)} chunk(s) read again; {duplicates} duplicate row(s)")  # fmt: skip
    assert 0 <= duplicates <= 2 * size  # at most the chunks in flight (2 tasks at once)
    shown = cli("backfill", "status", "-c", str(path))
    assert shown.returncode == 0, shown.stderr
    assert f"backfill {b.id} public.big → files: done, 60,000 of ~" in shown.stdout, shown.stdout
    assert "chunks 30/30 delivered" in shown.stdout


def test_composite_and_text_keys_a_where_predicate_and_cancel(spark, db, tmp_path):
    """Composite (int, text) and text keys are read in key ranges, each row once; `--where`
    reads only its rows; a cancelled backfill reads no further chunk; bad requests fail
    with the fix."""
    db.execute("CREATE TABLE pairs (a int, b text, n int, PRIMARY KEY (a, b))")
    db.execute(
        "INSERT INTO pairs SELECT g % 7, 'k' || g || ' é''\"', g FROM generate_series(1, 3000) g"
    )
    db.execute('CREATE TABLE words (w text COLLATE "C" PRIMARY KEY, n int)')
    db.execute("INSERT INTO words SELECT md5(g::text), g FROM generate_series(1, 2000) g")
    db.execute("INSERT INTO words VALUES ('ünïcödé', -1), ('', -2), ('a''b,c)', -3)")
    db.execute("CREATE TABLE slow (id int PRIMARY KEY, status text)")
    db.execute("INSERT INTO slow SELECT g, CASE WHEN g % 4 = 0 THEN 'open%' ELSE 'done' END "
               "FROM generate_series(1, 40000) g")  # fmt: skip
    db.execute("CREATE TABLE nokey (v int)")
    db.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")  # streams, but has no key to chunk by
    pub = db.create_publication("pairs", "words", "slow", "nokey")
    slot = db.create_slot()
    cfg = config(db, tmp_path, pub, slot, [
        files("files", tmp_path / "out"),
        {**files("bulk", tmp_path / "bulk"), "tables": ["public.slow"]},
        {**files("noreads", tmp_path / "x"), "actions": ["insert", "update", "delete"]},
    ])  # fmt: skip
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    with pytest.raises(ConfigError, match="nokey has no primary key") as e:
        request(cfg, store, "files", ["public.nokey"])
    assert "ADD PRIMARY KEY" in e.value.fix
    with pytest.raises(ConfigError, match="does not take action 'read'"):
        request(cfg, store, "noreads", ["public.pairs"])
    with pytest.raises(ConfigError, match=r"does not select public\.pairs"):
        request(cfg, store, "bulk", ["public.pairs"])
    with pytest.raises(ConfigError, match=r"refused: public\.pairs has no column nope"):
        request(cfg, store, "files", ["public.pairs"], where="nope > 1")
    with pytest.raises(ConfigError, match=r"public\.missing does not exist"):
        request(cfg, store, "files", ["public.missing"])
    runtime = Runtime(cfg, spark=spark).start()
    try:
        ids = [b.id for b in request(cfg, store, "files", ["public.pairs", "words"],
                                     chunk_size=250, target_seconds=0)]  # fmt: skip
        ids += [b.id for b in request(cfg, store, "files", ["public.slow"],
                                      where="status LIKE 'open%'", chunk_size=900)]  # fmt: skip
        with pytest.raises(ConfigError, match="is not finished"):
            request(cfg, store, "files", ["public.words"])
        # Cancel while chunks are read but none delivered: the source is paused meanwhile.
        lot = ParkingLot(cfg.state_dsn)
        lot.set_paused("bulk", True, "test")
        (bulk,) = request(cfg, store, "bulk", chunk_size=500, target_seconds=0)
        wait_until(lambda: (x := store.get(bulk.id)) is not None and x.rows_read >= 1000, 120)
        assert store.cancel([bulk.id]) == [bulk.id]
        at_cancel = store.get(bulk.id)
        assert at_cancel is not None and at_cancel.status == "cancelled"
        lot.set_paused("bulk", False)
        run_until_done(runtime, store, ids)
    finally:
        runtime.stop()
    got = messages(tmp_path / "out")
    reads = defaultdict(list)
    for m in got:
        if m["action"] == "read":
            reads[m["metadata"]["table_name"]].append(m["record"])
    assert sorted((r["a"], r["b"]) for r in reads["pairs"]) == sorted(
        db.execute("SELECT a, b FROM pairs")
    )
    assert sorted(r["w"] for r in reads["words"]) == sorted(
        r[0] for r in db.execute("SELECT w FROM words")
    )
    assert sorted(r["id"] for r in reads["slow"]) == list(range(4, 40001, 4))
    assert {r["status"] for r in reads["slow"]} == {"open%"}
    assert len(store.chunks(ids[0])) == 12  # 3000 rows in chunks of 250
    # cancelled: no chunk delivered, and at most the reads in flight at the cancel finished
    after = store.get(bulk.id)
    assert after is not None and after.chunks_emitted == 0
    assert after.chunks <= at_cancel.chunks + 2 < 80
    assert [m for m in messages(tmp_path / "bulk") if m["action"] == "read"] == []


def test_a_read_cut_short_by_a_crash_is_read_again_and_delivered_once(spark, db, tmp_path):
    """Two reads interrupted by a crash: chunk 0's high watermark reached the WAL but the
    coordinator never recorded it; chunk 1 stopped after its low watermark. The next start
    reads both again (attempt 2); the stream reaches chunk 0's first high watermark first,
    so attempt 1 is delivered and attempt 2 ignored; chunk 1 is delivered from attempt 2."""
    db.execute("CREATE TABLE cut (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO cut SELECT g, 'v' || g FROM generate_series(1, 2500) g")
    pub = db.create_publication("cut")
    slot = db.create_slot()
    cfg = config(db, tmp_path, pub, slot, [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    (b,) = request(cfg, store, "files", chunk_size=1000, target_seconds=0)
    store.start(b.id, None, ["id"])
    before = Coordinator(cfg, spark, store)  # a run that dies mid-way (its thread never runs)
    first, second = before._next_tasks(store.get(b.id), 2)
    assert (first.n, first.attempt, second.n, second.attempt) == (0, 1, 1, 1)
    read_chunk(first)  # low watermark, rows staged, high watermark: then the crash
    with connect(db.dsn, autocommit=True) as conn:
        watermark(conn, second, "low")  # the crash comes during this read
        conn.execute("UPDATE cut SET v = 'changed' WHERE id = 1500")
    runtime = Runtime(cfg, spark=spark).start()
    try:
        run_until_done(runtime, store, [b.id])
    finally:
        runtime.stop()
    reads = [m["record"] for m in messages(tmp_path / "out") if m["action"] == "read"]
    assert sorted(r["id"] for r in reads) == list(range(1, 2501))  # each row once
    assert next(r["v"] for r in reads if r["id"] == 1500) == "changed"
    chunks = db.execute(
        f"SELECT n, attempt, emitted_attempt FROM walstream.backfill_chunks WHERE backfill = {b.id} "
        "ORDER BY n"
    )
    assert chunks == [(0, 2, 1), (1, 2, 2), (2, 1, 1)]


def test_a_backfill_reads_the_publications_columns_and_rows_only(db, tmp_path):
    """The publication sends some columns (a column list) of some rows (a row filter):
    a backfill reads exactly those, as the stream would send them, and an operator's
    `--where` narrows the rows further."""
    import pyarrow.parquet as pq

    db.execute("CREATE TABLE listed (id int PRIMARY KEY, a int, secret text, b int)")
    db.execute("INSERT INTO listed SELECT g, g % 7, 'hidden', g * 2 FROM generate_series(1, 300) g")
    pub = unique("pub")
    db.execute(f"CREATE PUBLICATION {pub} FOR TABLE listed (id, a, b) WHERE (a > 4)")
    cfg = config(db, tmp_path, pub, db.create_slot(), [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    coordinator = Coordinator(cfg, None, store, parallelism=4)
    got: dict[str | None, list[dict[str, Any]]] = {}
    for where in (None, "b < 200"):
        (b,) = request(cfg, store, "files", ["public.listed"], where=where, chunk_size=120)
        store.start(b.id, None, ["id"])
        rows = []
        while tasks := coordinator._next_tasks(store.get(b.id), 4):  # type: ignore[arg-type]
            for task in tasks:
                read_chunk(task)
                store.staged(b.id, task.n, task.attempt, 0, 0.0)
                rows += [json.loads(r) for r in pq.read_table(task.path)["record"].to_pylist()]
        got[where] = sorted(rows, key=lambda r: r["id"])
        store.cancel([b.id])
    wanted = [{"id": g, "a": g % 7, "b": g * 2} for g in range(1, 301) if g % 7 > 4]
    assert got[None] == wanted  # no `secret`, no row with a <= 4
    assert got["b < 200"] == [r for r in wanted if r["b"] < 200]


def started(db: Any, tmp_path: Path, table: str, rows: int) -> tuple[Plan, BackfillStore, Any]:
    """Table `table` with ids 1..`rows`, and a running backfill of it into a file sink in
    chunks of 10 (the size kept), whose chunks a test reads itself."""
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    db.execute(f"INSERT INTO {table} SELECT generate_series(1, {rows})")
    pub = db.create_publication(table)
    cfg = config(db, tmp_path, pub, db.create_slot(), [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    (b,) = request(cfg, store, "files", [f"public.{table}"], chunk_size=10, target_seconds=0)
    store.start(b.id, None, ["id"])
    return cfg, store, b


def test_staged_files_go_once_their_batch_is_committed_or_their_backfill_is_cancelled(db, tmp_path):
    """A chunk's staged file stays while a replay of the batch that emitted it may need it,
    and goes at the start of the next batch; a cancelled backfill's unemitted chunks go
    too. Window files go once no chunk still to emit opened its window in their batch,
    and those of another query (an older checkpoint) at once."""
    cfg, store, b = started(db, tmp_path, "staged", 30)
    tasks = Coordinator(cfg, None, store, parallelism=3)._next_tasks(store.get(b.id), 3)  # type: ignore[arg-type]
    assert [t.n for t in tasks] == [0, 1, 2]
    for t in tasks:
        read_chunk(t)
        store.staged(b.id, t.n, t.attempt, 10, 0.0)
    staging = Staging(cfg.spark.checkpoint_dir, "app")
    merge = BackfillMerge(store, "app", staging)
    old_window, window = staging.window("older-query", 1), staging.window("q", 2)
    for path in (old_window, window):
        Path(path).mkdir(parents=True)
    store.record_marks([Mark(b.id, 2, 1, "low", 100, 0, 2)], "q")  # chunk 2's window opens in 2

    def there() -> list[bool]:
        return [Path(t.path).exists() for t in tasks]

    assert store.emit(b.id, 0, 1, 3, "q") and store.emit(b.id, 1, 1, 3, "q")
    merge.batch_started("q", 3)  # batch 3 may be replayed: its chunks' files stay
    assert there() == [True, True, True]
    assert not Path(old_window).exists() and Path(window).exists()
    merge.batch_started("q", 4)  # batch 3 is committed
    assert there() == [False, False, True]
    assert Path(window).exists()  # chunk 2 is still to emit, its window opened in batch 2
    store.cancel([b.id])
    merge.batch_started("q", 5)
    assert there() == [False, False, False] and not Path(window).exists()
    assert store._run("SELECT n FROM {chunks} WHERE backfill = %s AND cleaned ORDER BY n",
                      (b.id,)) == [(0,), (1,), (2,)]  # fmt: skip


@pytest.mark.spark
def test_a_read_that_may_succeed_later_is_tried_five_times_then_the_backfill_fails(
    spark, db, tmp_path
):
    """A chunk read that fails for a reason that may pass (the database refuses the
    connection) is read again; the fifth failure in a row fails the backfill with the
    error, as backfills.md says. Each failed read puts the chunk back to be read."""
    import dataclasses

    from walstream.backfill.coordinator import MAX_FAILURES
    from walstream.postgres.embedded import free_port

    cfg, store, b = started(db, tmp_path, "flaky", 20)
    coordinator = Coordinator(cfg, spark, store, parallelism=1)
    away = f"postgresql://walstream@127.0.0.1:{free_port()}/app?connect_timeout=2"
    assert MAX_FAILURES == 5
    for attempt in range(1, MAX_FAILURES + 1):
        (task,) = coordinator._next_tasks(store.get(b.id), 1)  # type: ignore[arg-type]
        assert task.n == 0 and task.attempt == attempt  # read again, as a new attempt
        coordinator._read([dataclasses.replace(task, dsn=away)])  # nothing listens there
        failed = store.get(b.id)
        assert failed is not None
        if attempt < MAX_FAILURES:
            assert failed.status == "running", (attempt, failed.error)
    assert failed.status == "failed"
    assert failed.error is not None and "127.0.0.1" in failed.error, failed.error


def test_a_standby_neither_starts_nor_reads_nor_takes_over_a_backfill(db, tmp_path):
    """High availability: only the process that leads the source reads its backfills. A
    standby's step starts nothing; at its start it leaves the leader's in-flight reads
    alone; the process that becomes leader reads those again."""
    db.execute("CREATE TABLE led (id int PRIMARY KEY)")
    db.execute("CREATE TABLE led2 (id int PRIMARY KEY)")
    pub = db.create_publication("led", "led2")
    cfg = config(db, tmp_path, pub, db.create_slot(), [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    pending, running = (
        request(cfg, store, "files", [t], chunk_size=10)[0] for t in ("public.led", "public.led2")
    )
    store.start(running.id, 40, ["id"])
    store.add_chunk(running.id, 0, None, ("40",))
    store.reading(running.id, [0])  # the leader is reading chunk 0

    def chunk_status() -> str:
        return store._run("SELECT status FROM {chunks} WHERE backfill = %s", (running.id,))[0][0]

    standby = Coordinator(cfg, None, store, parallelism=2, leads=lambda source: False)
    standby.take_over()
    assert standby.step() is False  # nothing started, nothing read
    assert store.get(pending.id).status == "pending"  # type: ignore[union-attr]
    assert chunk_status() == "reading"
    leader = Coordinator(cfg, None, store, parallelism=2, leads=lambda source: source == "app")
    leader.take_over("app")  # it just became the leader: the cut-short read is read again
    assert chunk_status() == "planned"


def test_the_chunk_size_moves_toward_the_target_time_and_status_shows_progress(
    db, tmp_path, monkeypatch
):
    """Fast chunks grow (at most doubling), slow ones shrink (at most halving), within
    500..200,000 rows; target 0 keeps the size. The status table and the progress bar
    show rows, estimate, rate and ETA."""
    db.execute("CREATE TABLE sized (id int PRIMARY KEY)")
    db.execute("INSERT INTO sized SELECT generate_series(1, 100)")
    db.execute("ANALYZE sized")
    pub = db.create_publication("sized")
    cfg = config(db, tmp_path, pub, db.create_slot(), [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    (b,) = request(cfg, store, "files", chunk_size=1000, target_seconds=2)
    coordinator = Coordinator(cfg, None, store, parallelism=2)

    def after(rows: int, seconds: float) -> int:
        coordinator._adapt([ChunkResult(b.id, 0, 1, rows, seconds)])
        now = store.get(b.id)
        assert now is not None
        return now.chunk_size

    assert after(1000, 0.1) == 2000  # 20x too fast: doubles
    assert after(2000, 0.5) == 4000
    assert after(4000, 2.0) == 4000  # on target
    assert after(4000, 16.0) == 2000  # 8x too slow: halves
    assert after(2000, 1.6) == 2500  # close: straight to the ideal
    for _ in range(12):
        after(100_000, 0.01)
    assert store.get(b.id).chunk_size == 200_000  # type: ignore[union-attr]
    for _ in range(12):
        after(10, 100.0)
    assert store.get(b.id).chunk_size == 500  # type: ignore[union-attr]
    store.cancel([b.id])
    (fixed,) = request(cfg, store, "files", chunk_size=700, target_seconds=0)
    coordinator._adapt([ChunkResult(fixed.id, 0, 1, 700, 30.0)])
    assert store.get(fixed.id).chunk_size == 700  # type: ignore[union-attr]

    # status: a running backfill with rows read shows its estimate, rate and ETA
    store.start(fixed.id, 100, ["id"])
    store.add_chunk(fixed.id, 0, None, ("40",))
    store.reading(fixed.id, [0])
    store.staged(fixed.id, 0, 1, 40, 0.5)
    shown = store.get(fixed.id)
    assert shown is not None and shown.rows_read == 40 and shown.rows_estimated == 100
    assert shown.rate is not None and shown.eta is not None
    out = io.StringIO()
    # A live terminal whatever TERM says (TERM=dumb gets log lines, not a live bar).
    wide = Console(file=out, force_terminal=True, force_interactive=True, width=200, height=50)
    wide.print(status_table([shown]))
    text = out.getvalue()
    assert re.search(
        rf"{fixed.id}\s*│ files\s*│ public\.sized\s*│ .*running.*│\s*40 │\s*100 │", text
    ), text
    line = summary(shown)
    assert line.startswith(
        f"backfill {fixed.id} public.sized → files: running, 40 of ~100 rows read (40%), "
    )
    assert "rows/s, ETA " in line and line.endswith("chunks 0/1+ delivered")
    # on a terminal, `walstream backfill` follows it with a progress bar until it ends
    store.cancel([fixed.id])
    monkeypatch.setattr(commands, "console", wide)
    final = commands.follow(store, [fixed.id], interval=0.01)
    assert [x.status for x in final] == ["cancelled"]
    text = out.getvalue()
    assert f"{fixed.id} public.sized" in text and "40/100" in text


def test_read_records_are_the_streams_byte_for_byte_nulls_included(spark, db, tmp_path):
    """Every non-array type of the decoder's table (text with quotes, escapes, unicode and
    control characters, char(n) padding, BC dates, infinities, NaN, bytea, json, enums,
    domains, composites ...), a row of NULLs and a row of defaults: each read `record` is
    the bytes the stream sends for the same values."""
    db.execute(USER_TYPES)
    cases = [(t, lit) for t, lit, _ in CASES if not t.endswith("[]") and t != "timetz"]
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(cases))
    literals = ", ".join(lit for _, lit in cases)
    nulls = ", ".join("NULL" for _ in cases)
    for t in ("old_rows", "new_rows"):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, {cols})")
    db.execute(f"INSERT INTO old_rows VALUES (1, {literals}), (2, {nulls})")
    db.execute("INSERT INTO old_rows (id, c0) VALUES (3, true)")
    pub = db.create_publication("old_rows", "new_rows")
    slot = db.create_slot()
    cfg = config(db, tmp_path, pub, slot, [files("files", tmp_path / "out")])
    runtime = Runtime(cfg, spark=spark).start()
    store = BackfillStore(cfg.state_dsn)
    try:
        db.execute("INSERT INTO new_rows SELECT * FROM old_rows")
        ids = [b.id for b in request(cfg, store, "files", ["public.old_rows"])]
        run_until_done(runtime, store, ids)
        wait_until(lambda: len([m for m in messages(tmp_path / "out")
                                if m["metadata"]["table_name"] == "new_rows"]) == 3, 60)  # fmt: skip
    finally:
        runtime.stop()
    raw = raw_records(tmp_path / "out")
    assert {k for k in raw if k[0] == "read"} == {("read", 1), ("read", 2), ("read", 3)}
    for i in (1, 2, 3):
        a, b = raw[("read", i)], raw[("insert", i)]
        at = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        lo = max(0, at - 60)
        assert a == b, (
            f"row {i} differs at {at}: read {a[lo : at + 40]!r} stream {b[lo : at + 40]!r}"
        )


def test_an_idle_coordinator_starts_a_requested_backfill_at_once(db, tmp_path, monkeypatch):
    """An idle coordinator waits for the state database's notice of a new request (not
    for its next poll): `request` announces it when it commits."""
    from walstream.backfill import coordinator as module

    db.execute("CREATE TABLE woken (id int PRIMARY KEY)")
    pub = db.create_publication("woken")
    cfg = config(db, tmp_path, pub, db.create_slot(), [files("files", tmp_path / "out")])
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    monkeypatch.setattr(module, "IDLE", 120.0)  # a poll would come after two minutes
    coordinator = Coordinator(cfg, None, store, parallelism=1)
    idle = threading.Thread(target=coordinator._step)
    idle.start()
    try:
        wait_until(lambda: coordinator._listener is not None, 30)
        request(cfg, store, "files")
        idle.join(30)
        assert not idle.is_alive(), "the request did not wake the coordinator"
    finally:
        coordinator.stopping.set()
        idle.join(150)
        coordinator._close_listener()
