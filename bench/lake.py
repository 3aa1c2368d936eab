"""Lake sinks: backfill and streaming rates next to Postgres' own, latency, small files.

    .venv/bin/python -m bench.lake [--rows 5000000] [--changes 500000] [--rate 5000]
                                   [--latency-seconds 30] [--latency-tables 1]
                                   [--files-minutes 10]

On an embedded Postgres, with walstream's Runtime (`local[2]`):

1. backfill: an 8-column table (as bench.backfill) of ROWS rows backfilled into a Delta
   mirror, then into an Iceberg mirror, each timed from the request until every chunk is
   in the table, on a running walstream (a 1,000-row backfill first warms its Python
   workers); next to `COPY (SELECT * ...) TO STDOUT` of the same table (target 0.5×).
2. streaming: CHANGES inserts waiting in a slot, applied to a Delta mirror and an Iceberg
   mirror (each its own slot); next to `pg_recvlogical` of the same backlog.
3. latency: inserts at RATE/s (50-row transactions, synchronous_commit on) for
   LATENCY_SECONDS into a Delta mirror of a table with a publication of its own (or
   with LATENCY_TABLES - 1 idle tables beside it: a batch then finds its tables); each
   new log entry's time and the newest id its files hold (their statistics): commit →
   visible in the table, p50 / p99 over the rows; next to Spark's no-op foreachBatch
   floor on the same source, measured first (target 1.5×).
4. small files: inserts at 1,000/s for FILES_MINUTES into two Delta mirrors, one with
   `optimize.every: 1m`; the data files each table has at the end.
5. scale (`--only scale`): for each of SCALE_ROWS (100k, 1M by default; add 10M), a table
   of that many rows, and for each of SCALE_KINDS alone (Delta and Iceberg, copy-on-write
   and merge-on-read mirrors; the histories on request) a table backfilled, then single-row
   updates of random keys at UPDATE_RATE/s for UPDATE_SECONDS: bytes each table's directory grew by
   per update (and of which: data, deletes, log, checkpoints), next to the changed row's
   own size (target <= 4x) and the smallest table's figure (target: the largest within
   1.5x); the updates a batch (`--trigger-interval` sets spark.trigger_interval); drain
   time after the writer stops; a DuckDB read of the whole table, then the sink's
   optimize (maintenance: its time and bytes, apart) and the read again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.backfill import copy_rate, fill
from bench.backlog import write_backlog
from bench.cpu import cpu_by_group, print_breakdown
from bench.kafka import PROBE, floor_latencies, percentiles
from bench.results import figure
from bench.stream import TABLE, recvlogical
from walstream.backfill.requests import request
from walstream.backfill.store import DONE, BackfillStore
from walstream.change import parse_lsn
from walstream.config import parse_config
from walstream.engine.session import build_spark
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime


def lake_sink(name: str, kind: str, work: Path, **dest: Any) -> dict[str, Any]:
    where = (
        {"path": str(work / name / "{table}")}
        if kind == "delta"
        else {"table": f"{name.replace('-', '_')}.{{table}}",
              "catalog": {"warehouse": str(work / "warehouse")}}
    )  # fmt: skip
    return {"name": name, "source": "bench", "destination": {"type": kind, **where, **dest}}


def plan(
    dsn: str, work: Path, slot: str, sinks: list[dict[str, Any]], publication: str = "bench",
    trigger: float = 0.0, **source: Any,
) -> Any:  # fmt: skip
    return parse_config({
        "server": {"enabled": False},
        "spark": {"master": "local[2]", "checkpoint_dir": str(work / f"ckpt-{slot}"),
                  "trigger_interval": trigger},
        "sources": [{"name": "bench", "dsn": dsn, "slot": slot, "publication": publication,
                     **source}],
        "sinks": sinks,
    })  # fmt: skip


def wait(runtime: Runtime, done: Any, what: str, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        runtime.poll()
        if runtime.fatal is not None:
            raise SystemExit(f"walstream stopped: {runtime.fatal}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not done after {timeout:.0f}s: {runtime.progress()}")
        time.sleep(0.2)


def backfills(pg: EmbeddedPostgres, work: Path, rows: int) -> None:
    dsn = pg.dsn()
    copy = copy_rate(pg, rows)
    print(f"COPY TO STDOUT > /dev/null: {copy:,.0f} rows/s", flush=True)
    cfg = plan(dsn, work, "fill", [lake_sink("bf-delta", "delta", work),
                                    lake_sink("bf-iceberg", "iceberg", work),
                                    lake_sink("bf-warm", "delta", work)])  # fmt: skip
    runtime = Runtime(cfg).start()
    store = BackfillStore(cfg.state_dsn)
    try:
        # A running walstream has its Python workers and their imports ready: so does this
        # one, after a backfill of 1,000 rows into a third table (not timed).
        (warm,) = request(cfg, store, "bf-warm", where="id <= 1000")
        wait(runtime, lambda: getattr(store.get(warm.id), "status", None) == DONE, "warm-up")
        for sink in ("bf-delta", "bf-iceberg"):
            cpu = cpu_by_group(pg.data)
            t0 = time.perf_counter()
            (b,) = request(cfg, store, sink)

            def finished(b_id: int = b.id, sink: str = sink) -> bool:
                now = store.get(b_id)
                assert now is not None
                if now.status not in ("pending", "running", DONE):
                    raise SystemExit(f"backfill {now.status}: {now.error}")
                p = runtime.progress().get(sink)
                return now.status == DONE and p is not None and p.delivered >= rows

            wait(runtime, finished, f"backfill into {sink}")
            rate = rows / (time.perf_counter() - t0)
            kind = sink.split("-")[1]
            print(f"backfill into a {kind} mirror: {rate:,.0f} rows/s = {rate / copy:.3f}x COPY",
                  flush=True)  # fmt: skip
            figure("lake", f"backfill into {kind} (rows/s)", rate, "/s",
                   reference="COPY TO STDOUT", reference_value=copy, target=">= 0.5x")  # fmt: skip
            print_breakdown(f"lake {kind} backfill", cpu_by_group(pg.data), cpu, rows, copy * 0.5)
    finally:
        runtime.stop()


def streaming(
    pg: EmbeddedPostgres, work: Path, changes: int, updates: str = "copy_on_write"
) -> None:
    dsn = pg.dsn()
    with connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE accounts_history")
        for slot in ("raw", "st_delta", "st_iceberg"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    write_backlog(dsn, changes)
    with connect(dsn, autocommit=True) as conn:
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
    raw = changes / recvlogical(pg, "raw", end)
    print(f"pg_recvlogical of the backlog: {raw:,.0f} changes/s", flush=True)
    for kind in ("delta", "iceberg"):
        cfg = plan(dsn, work, f"st_{kind}", [lake_sink(f"st-{kind}", kind, work, updates=updates)])
        t0 = time.perf_counter()
        runtime = Runtime(cfg).start()

        def delivered(k: str = kind, r: Runtime = runtime) -> int:
            p = r.progress().get(f"st-{k}")
            return 0 if p is None else p.delivered

        try:
            wait(runtime, lambda: delivered() > 0, f"streaming into {kind}")
            first_at, first_n = time.perf_counter(), delivered()
            cpu = cpu_by_group(pg.data)
            wait(runtime, lambda: delivered() >= changes, f"streaming into {kind}")
            end = time.perf_counter()
            spent = cpu_by_group(pg.data)
        finally:
            runtime.stop()
        wall = changes / (end - t0)
        # as bench.kafka: from the first delivered batch (the wall-clock figure when the
        # first batch took the whole backlog)
        rate = (changes - first_n) / (end - first_at) if first_n < changes else wall
        print(f"streaming into a {kind} mirror ({updates}): {rate:,.0f} changes/s from the first batch = "
              f"{rate / raw:.3f}x raw; {wall:,.0f}/s with the start", flush=True)  # fmt: skip
        figure("lake", f"stream into {kind} mirror (changes/s)", rate, "/s",
               reference="pg_recvlogical", reference_value=raw, target=">= 0.35x")  # fmt: skip
        figure("lake", f"stream into {kind} mirror, start included (changes/s)", wall, "/s",
               reference="pg_recvlogical", reference_value=raw)  # fmt: skip
        print_breakdown(f"lake {kind} stream", spent, cpu, changes - first_n, raw * 0.35)


class Inserts:
    """Inserts into `lat` at `rate` rows/s (50-row transactions), each id's commit time."""

    def __init__(self, dsn: str, rate: int, seconds: float) -> None:
        self.dsn, self.rate, self.seconds = dsn, rate, seconds
        self.committed: dict[int, float] = {}  # last id of each transaction -> time.time()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        per = 50
        with connect(self.dsn, autocommit=True) as conn:
            # as the floor's writer (bench.kafka.steady): with it off, as the bench server
            # runs, the walsender sends a commit only once the WAL writer flushed it
            conn.execute("SET synchronous_commit = on")
            t0, n = time.monotonic(), 0
            while time.monotonic() - t0 < self.seconds:
                conn.execute(
                    "INSERT INTO lat SELECT g, clock_timestamp() "
                    "FROM generate_series(%s::bigint, %s::bigint) g", (n + 1, n + per),
                )  # fmt: skip
                n += per
                self.committed[n] = time.time()
                ahead = n / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)


def latency(
    pg: EmbeddedPostgres,
    work: Path,
    rate: int,
    seconds: float,
    tables: int = 1,
    updates: str = "copy_on_write",
) -> None:
    from deltalake import DeltaTable

    dsn = pg.dsn()
    with connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lat (id bigint PRIMARY KEY, at timestamptz)")
        # one table, as the floor's (with several, a batch first finds the tables it holds:
        # docs/lakehouse.md, "Spark jobs a batch"); `tables` > 1: idle others beside it
        others = [f"lat_{i}" for i in range(2, tables + 1)]
        for other in others:
            conn.execute(f"CREATE TABLE {other} (id bigint PRIMARY KEY, note text)")
        conn.execute(f"CREATE PUBLICATION lat FOR TABLE {', '.join(['lat', *others])}")
        conn.execute(PROBE.format("probe_floor"))
        conn.execute("CREATE PUBLICATION floor FOR TABLE probe_floor")
    cfg = plan(dsn, work, "lat", [lake_sink("lat", "delta", work, updates=updates)],
               publication="lat")  # fmt: skip
    spark = build_spark(cfg)
    # Spark's own micro-batch floor in the same session, as bench.kafka measures it
    floor_p50, _ = percentiles(floor_latencies(spark, dsn, rate, seconds, work)[0])
    print(f"no-op foreachBatch floor at {rate:,}/s: p50 {floor_p50:,.0f} ms", flush=True)
    runtime = Runtime(cfg, spark=spark).start()
    path = str(work / "lat" / "lat")
    seen: list[float] = []
    try:
        with connect(dsn, autocommit=True) as conn:  # the run is up once a first row is in
            conn.execute("INSERT INTO lat VALUES (0, now())")
        wait(runtime, lambda: (p := runtime.progress().get("lat")) is not None and p.delivered >= 1,
             "first row")  # fmt: skip
        writer = Inserts(dsn, rate, seconds)
        writer.thread.start()
        # A row is visible from the moment its commit's log entry exists: each new entry's
        # time and the largest id its added files hold (their statistics), read as they
        # appear, so the poll's own pace adds nothing (re-reading the table each time
        # added tens of ms a version once it had a hundred files).
        version, visible = DeltaTable(path).version(), 0
        log_dir = Path(path) / "_delta_log"
        while writer.thread.is_alive() or visible < max(writer.committed, default=0):
            runtime.poll()
            entry = log_dir / f"{version + 1:020d}.json"
            if not entry.exists():
                time.sleep(0.005)
                continue
            version, now = version + 1, entry.stat().st_mtime
            top = max(
                (json.loads(a["add"]["stats"])["maxValues"].get("id", 0)
                 for a in map(json.loads, entry.read_text().splitlines()) if "add" in a),
                default=0,
            )  # fmt: skip
            for last, at in writer.committed.items():
                if visible < last <= top:
                    seen.extend([now - at] * 50)
            visible = max(visible, top)
    finally:
        runtime.stop()
        spark.stop()
    seen.sort()
    p50, p99 = statistics.median(seen), seen[int(len(seen) * 0.99) - 1]
    published = "" if tables == 1 else f", a publication of {tables} tables"
    print(f"commit → visible in the Delta table at {rate:,}/s{published}: p50 "
          f"{p50 * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms over {len(seen):,} rows "
          f"(floor p50 {floor_p50:,.0f} ms: {p50 * 1000 / floor_p50:.2f}x)", flush=True)  # fmt: skip
    figure("lake", f"commit→visible p50 at {rate}/s{published} (ms)", p50 * 1000, "ms",
           reference="no-op foreachBatch p50", reference_value=floor_p50, target="<= 1.5x")  # fmt: skip
    figure("lake", f"commit→visible p99 at {rate}/s{published} (ms)", p99 * 1000, "ms")


def small_files(pg: EmbeddedPostgres, work: Path, minutes: float) -> None:
    from deltalake import DeltaTable

    dsn = pg.dsn()
    with connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE sf (id bigint PRIMARY KEY, at timestamptz)")
        conn.execute("ALTER PUBLICATION bench ADD TABLE sf")
    cfg = plan(dsn, work, "sf", [
        lake_sink("sf-plain", "delta", work),
        lake_sink("sf-optimized", "delta", work, optimize={"every": "1m", "retain": 0}),
    ], tables=["public.sf"])  # fmt: skip
    runtime = Runtime(cfg).start()
    try:
        with connect(dsn, autocommit=True) as conn:
            t0, n = time.monotonic(), 0
            while time.monotonic() - t0 < minutes * 60:
                conn.execute("INSERT INTO sf SELECT g, now() FROM generate_series(%s::bigint, "
                             "%s::bigint) g", (n + 1, n + 100))  # fmt: skip
                n += 100
                runtime.poll()
                time.sleep(max(0.0, n / 1000 - (time.monotonic() - t0)))
        wait(runtime, lambda: all((p := runtime.progress().get(s)) is not None and p.delivered >= n
                                  for s in ("sf-plain", "sf-optimized")), "small files")  # fmt: skip
    finally:
        runtime.stop()
    files = {
        s: len(DeltaTable(str(work / s / "sf")).file_uris()) for s in ("sf-plain", "sf-optimized")
    }
    print(f"data files after {minutes:g} min at 1,000 inserts/s: without optimize "
          f"{files['sf-plain']:,}, with optimize.every 1m {files['sf-optimized']:,}", flush=True)  # fmt: skip
    figure("lake", f"files after {minutes:g} min, no optimize", files["sf-plain"], "files")
    figure("lake", f"files after {minutes:g} min, optimize 1m", files["sf-optimized"], "files")


class Updates:
    """Single-row updates of random keys of `table` (ids 1..rows) at `rate`/s for `seconds`,
    each its own transaction."""

    def __init__(self, dsn: str, table: str, rows: int, rate: int, seconds: float) -> None:
        self.dsn, self.table, self.rows, self.rate, self.seconds = dsn, table, rows, rate, seconds
        self.done = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import random

        from psycopg import sql

        rng = random.Random(7)
        stmt = sql.SQL(
            "UPDATE {} SET delta = delta + 1, mtime = now(), note = md5(%s::text) WHERE id = %s"
        ).format(sql.Identifier(self.table))
        with connect(self.dsn, autocommit=True) as conn:
            t0 = time.monotonic()
            while time.monotonic() - t0 < self.seconds:
                n = rng.randint(1, self.rows)
                conn.execute(stmt, (n, n))
                self.done += 1
                ahead = self.done / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)


#: The scale part's mirrors: Delta and Iceberg, each copy-on-write and merge-on-read.
#: The scale part's tables: (format, updates, mode) by name.
KINDS = {
    "delta": ("delta", "copy_on_write", "mirror"),
    "deltamor": ("delta", "merge_on_read", "mirror"),
    "iceberg": ("iceberg", "copy_on_write", "mirror"),
    "icebergmor": ("iceberg", "merge_on_read", "mirror"),
    "deltahistory": ("delta", "copy_on_write", "history"),
    "deltamorhistory": ("delta", "merge_on_read", "history"),
    "iceberghistory": ("iceberg", "copy_on_write", "history"),
    "icebergmorhistory": ("iceberg", "merge_on_read", "history"),
}
#: Those run by default (the histories on request).
DEFAULT_KINDS = ("delta", "deltamor", "iceberg", "icebergmor")


def tree_bytes(path: Path) -> dict[str, int]:
    """The bytes under a table's directory by what they hold (`part_of`); a wrong
    directory is an error, not 0 bytes."""
    if not path.is_dir():
        raise SystemExit(f"no table directory {path}")
    out: dict[str, int] = {}
    for f in path.rglob("*"):
        if f.is_file():
            part = part_of(f)
            out[part] = out.get(part, 0) + f.stat().st_size
    return out


def part_of(f: Path) -> str:
    """What a lake table's file holds: data, deletes (Delta's vectors, Iceberg's position
    deletes), log (Delta's commits, Iceberg's metadata and manifests) or checkpoints."""
    if "checkpoint" in f.name:
        return "checkpoints"
    if f.name.startswith(("deletion_vector_", "walstream-deletes-")):
        return "deletes"
    if f.suffix == ".parquet":
        return "data"
    return "log"


def grown(before: dict[str, int], after: dict[str, int], updates: int) -> dict[str, float]:
    """The bytes each part of a table grew by, an update."""
    return {k: (after.get(k, 0) - before.get(k, 0)) / updates for k in sorted(after)}


def scale_one(
    pg: EmbeddedPostgres, work: Path, rows: int, rate: int, seconds: float, kinds: list[str],
    trigger: float,
) -> dict[str, Any]:  # fmt: skip
    """One table of `rows` rows, and for each of `kinds` alone (its own walstream, slot and
    mirror, so no other sink shares its batches): backfilled, then updated at random keys;
    bytes written per update, drain time, a DuckDB read."""
    dsn = pg.dsn()
    table = f"scale_{rows}"
    with connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (LIKE accounts_history INCLUDING ALL)")
        conn.execute(
            f"""INSERT INTO {table} SELECT g, g % 100000, g % 10, g % 100, (g % 9999) - 5000,
                now() - g * interval '1 second', 'filler', 'note ' || g
                FROM generate_series(1, {rows}) g"""
        )
        conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute(f"CREATE PUBLICATION scale_{rows} FOR TABLE {table}")
        row_size = float(
            conn.execute(f"SELECT avg(pg_column_size(t.*)) FROM {table} t").fetchone()[0]
        )  # type: ignore[index]
    out: dict[str, Any] = {"row_size": row_size}
    for kind in kinds:
        out[kind] = scale_kind(dsn, work, rows, kind, rate, seconds, pg.data, trigger)
    return out


def scale_kind(
    dsn: str, work: Path, rows: int, kind: str, rate: int, seconds: float, pg_data: Path,
    trigger: float,
) -> Any:  # fmt: skip
    """One table of `kind` (see KINDS) mirroring or keeping the history of `scale_<rows>`;
    the CPU each process group spent an update while they flowed and drained (the
    driver's share: what the executors do not take)."""
    table, name = f"scale_{rows}", f"sc{rows}-{kind}"
    fmt, updates, mode = KINDS[kind]
    sink = lake_sink(name, fmt, work, updates=updates, mode=mode)
    cfg = plan(dsn, work, f"scale_{rows}_{kind}", [sink], publication=table, trigger=trigger)
    directory = (
        work / name / table
        if fmt == "delta"
        else work / "warehouse" / name.replace("-", "_") / table
    )
    runtime = Runtime(cfg).start()
    store = BackfillStore(cfg.state_dsn)
    try:
        (b,) = request(cfg, store, name)
        wait(runtime, lambda: getattr(store.get(b.id), "status", None) == DONE,
             f"backfill of {rows:,} rows into {name}")  # fmt: skip
        before = tree_bytes(directory)
        start, batches = runtime.progress()[name].delivered, runtime.progress()[name].batches
        writer = Updates(dsn, table, rows, rate, seconds)
        cpu = cpu_by_group(pg_data)
        writer.thread.start()
        writer.thread.join()
        stopped = time.monotonic()
        wait(runtime, lambda: runtime.progress()[name].delivered - start >= writer.done,
             f"updates into {name}")  # fmt: skip
        drained = time.monotonic() - stopped
        print_breakdown(f"lake {name}", cpu_by_group(pg_data), cpu, writer.done, rate)
        parts = grown(before, tree_bytes(directory), writer.done)
        result = {
            "updates": writer.done,
            "bytes_per_update": sum(parts.values()),
            "parts": parts,
            "drain_s": drained,
            "per_batch": writer.done / max(1, runtime.progress()[name].batches - batches),
        }
        result.update(maintenance(cfg, name, table, directory, rows))
    finally:
        runtime.stop()
    return result


def maintenance(cfg: Any, name: str, table: str, directory: Path, rows: int) -> dict[str, Any]:
    """DuckDB's read of the table, the sink's optimize (what `optimize.every` runs: its
    time and the bytes it wrote, the maintenance a schedule amortises) and the read
    again; each read must find the source's rows."""
    from walstream.sinks.registry import sink_for

    fmt, mode = cfg.sink(name).destination.type, KINDS[name.split("-", 1)[1]][2]
    identifier = f"{name.replace('-', '_')}.{table}"
    out: dict[str, Any] = {}
    for when in ("read_s", "read_after_s"):
        if when == "read_after_s":
            before, t0 = sum(tree_bytes(directory).values()), time.perf_counter()
            done = sink_for(cfg.sink(name).destination).optimize("public", table)
            out["optimize_s"] = time.perf_counter() - t0
            print(f"  optimize: {done}", flush=True)
            out["optimize_bytes"] = sum(tree_bytes(directory).values()) - before
        t0 = time.perf_counter()
        n = duck_rows(fmt, mode, directory, cfg.state_dsn, identifier)
        out[when] = time.perf_counter() - t0
        assert n == rows, f"{name}: {n:,} current rows read back, {rows:,} in the source"
    return out


def duck_rows(fmt: str, mode: str, directory: Path, state_dsn: str, identifier: str) -> int:
    """How many current rows DuckDB reads from a lake table (its delta / iceberg extension;
    a history's rows `is_current`)."""
    from tests.lake import duck, iceberg_metadata

    where = " WHERE is_current" if mode == "history" else ""
    con = duck()
    try:
        if fmt == "delta":
            scan = f"SELECT count(*) FROM delta_scan(?){where}"
            return int(con.execute(scan, [str(directory)]).fetchone()[0])
        location = iceberg_metadata(state_dsn, identifier)
        assert location is not None, identifier
        scan = f"SELECT count(*) FROM iceberg_scan(?){where}"
        return int(con.execute(scan, [location.removeprefix("file://")]).fetchone()[0])
    finally:
        con.close()


def label(kind: str) -> str:
    """How the figures name a kind's table: `deltamor mirror`, `deltamorhistory table`."""
    return f"{kind} mirror" if KINDS[kind][2] == "mirror" else f"{kind} table"


def scale(
    pg: EmbeddedPostgres, work: Path, sizes: list[int], rate: int, seconds: float,
    kinds: list[str], trigger: float = 0.0,
) -> None:  # fmt: skip
    results = {}
    for rows in sizes:
        r = results[rows] = scale_one(pg, work, rows, rate, seconds, kinds, trigger)
        for kind in kinds:
            k = r[kind]
            print(f"{label(kind)} of {rows:,} rows, {k['updates']:,} random-key updates at "
                  f"{rate:,}/s: {k['bytes_per_update']:,.0f} B written per update "
                  f"({k['bytes_per_update'] / r['row_size']:.1f}x the row's {r['row_size']:.0f} B), "
                  f"drained {k['drain_s']:.1f}s after the writer stopped; DuckDB reads it in "
                  f"{k['read_s']:.2f}s; optimize (maintenance) took {k['optimize_s']:.1f}s and "
                  f"wrote {k['optimize_bytes'] / 1e6:,.1f} MB, then DuckDB read it in "
                  f"{k['read_after_s']:.2f}s", flush=True)  # fmt: skip
            print(f"  {k['per_batch']:,.0f} updates a batch; of which, an update: " + ", ".join(
                f"{part} {b:,.1f} B" for part, b in k["parts"].items()), flush=True)  # fmt: skip
    small, large = min(results), max(results)
    for kind in kinds:
        for what, unit in (("bytes_per_update", "B"), ("drain_s", "s")):
            figure("lake", f"{label(kind)} {what} at {large:,} rows", results[large][kind][what],
                   unit, reference=f"the same at {small:,} rows",
                   reference_value=results[small][kind][what], target="<= 1.5x")  # fmt: skip
        figure("lake", f"{label(kind)} DuckDB read after optimize at {large:,} rows",
               results[large][kind]["read_after_s"], "s", reference="before optimize",
               reference_value=results[large][kind]["read_s"])  # fmt: skip
        figure("lake", f"{label(kind)} bytes per update at {large:,} rows (B)",
               results[large][kind]["bytes_per_update"], "B", reference="the changed row's size",
               reference_value=results[large]["row_size"], target="<= 4x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--changes", type=int, default=500_000)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--latency-seconds", type=float, default=30)
    ap.add_argument(
        "--updates",
        choices=("copy_on_write", "merge_on_read"),
        default="copy_on_write",
        help="the streaming and latency parts' mirrors' `updates` (merge_on_read: the "
        "executors write the data files)",
    )
    ap.add_argument(
        "--latency-tables",
        type=int,
        default=1,
        help="the tables of the latency part's publication (the others stay idle)",
    )
    ap.add_argument("--files-minutes", type=float, default=10)
    ap.add_argument(
        "--scale-rows",
        default="100000,1000000",
        help="the table sizes of the scale part, comma-separated",
    )
    ap.add_argument(
        "--scale-kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"the tables of the scale part, each run alone, of {','.join(KINDS)}",
    )
    ap.add_argument("--update-rate", type=int, default=1600)
    ap.add_argument("--update-seconds", type=float, default=60)
    ap.add_argument(
        "--trigger-interval",
        type=float,
        default=0.0,
        help="the scale part's spark.trigger_interval (s): longer batches, fewer per-batch bytes",
    )
    ap.add_argument(
        "--only",
        default="backfill,streaming,latency,files",
        help="the parts to run, of backfill,streaming,latency,files,scale",
    )
    args = ap.parse_args()
    parts = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-lake-"))
    try:
        with EmbeddedPostgres(
            settings={"fsync": "off", "synchronous_commit": "off", "max_wal_size": "4GB"}
        ) as pg:
            if "backfill" in parts:
                t0 = time.perf_counter()
                fill(pg.dsn(), args.rows)  # creates the table
                print(f"table: {args.rows:,} rows × 8 columns in {time.perf_counter() - t0:.0f}s",
                      flush=True)  # fmt: skip
            with connect(pg.dsn(), autocommit=True) as conn:
                if "backfill" not in parts:
                    conn.execute(TABLE)
                conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history")
            if "backfill" in parts:
                backfills(pg, work, args.rows)
            if "streaming" in parts:
                streaming(pg, work, args.changes, args.updates)
            if "latency" in parts:
                latency(pg, work, args.rate, args.latency_seconds, args.latency_tables,
                        args.updates)  # fmt: skip
            if "files" in parts:
                small_files(pg, work, args.files_minutes)
            if "scale" in parts:
                sizes = [int(n) for n in args.scale_rows.split(",")]
                kinds = args.scale_kinds.split(",")
                unknown = set(kinds) - set(KINDS)
                if unknown:
                    ap.error(f"--scale-kinds: {', '.join(sorted(unknown))}: not of {list(KINDS)}")
                scale(pg, work, sizes, args.update_rate, args.update_seconds, kinds,
                      args.trigger_interval)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
