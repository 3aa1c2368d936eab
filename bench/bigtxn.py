"""One very large transaction, with and without `streaming: true`: memory, disk, latency.

    .venv/bin/python -m bench.bigtxn [--rows 5000000] [--modes at-commit,streamed]

For each mode, in its own process and with its own PostgreSQL:

1. starts `walstream run`'s Runtime (walstream's default Spark settings, one
   parquet file sink) and waits until a first row is delivered (caught up);
2. runs one transaction of ROWS inserts into the 8-column table (one
   INSERT ... SELECT), and waits until every row is delivered;
3. samples every SAMPLE seconds: resident memory of the driver JVM, of the
   Runtime's Python process and of Spark's Python processes; the bytes the server
   spilled to its own disk (`pg_stat_replication_slots.spill_bytes`) and streamed
   (`stream_bytes`); the size of walstream's spool files (open, unnamed files in the
   spill directory, read through /proc/<pid>/fd of the processes below this one).

Prints, per mode: how long the transaction ran, commit → first row delivered,
commit → last row delivered, peak memory, the server's spill and walstream's spool;
then streamed against at commit as ratios (bench.report shows them).

Settings: PostgreSQL's `logical_decoding_work_mem` is its default (64MB): a larger
transaction is spilled (at commit) or streamed (streamed) past that; the source's
`max_buffer_bytes` is walstream's default (32 MiB), and its spool keeps a quarter of
that in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.backlog import GROUPS, _descendants, rss_by_group
from bench.results import figure
from bench.stream import with_slot, write
from walstream.config import parse_config
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime

MODES = ("at-commit", "streamed")


def spool_bytes(spill_dir: Path) -> int:
    """Bytes in walstream's spool files: unnamed files (O_TMPFILE) in `spill_dir`, found
    through the open files of this process's descendants."""
    total = 0
    prefix = str(spill_dir) + "/"
    for pid in _descendants(os.getpid()):
        fds = Path(f"/proc/{pid}/fd")
        try:
            entries = list(fds.iterdir())
        except OSError:
            continue
        for fd in entries:
            try:
                target = os.readlink(fd)
                if target.startswith(prefix) and target.endswith("(deleted)"):
                    total += fd.stat().st_size
            except OSError:
                continue
    return total


@dataclass
class Peaks:
    """Peaks of what the sampler saw."""

    rss: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0.0))
    total_rss: float = 0.0
    spool: int = 0
    server_spill: int = 0
    streamed: int = 0


def sample(dsn: str, spill_dir: Path, every: float, peaks: Peaks, stop: threading.Event) -> None:
    with connect(dsn, autocommit=True) as conn:
        while not stop.wait(every):
            mem = rss_by_group()
            for g, mb in mem.items():
                peaks.rss[g] = max(peaks.rss[g], mb)
            peaks.total_rss = max(peaks.total_rss, sum(mem.values()))
            peaks.spool = max(peaks.spool, spool_bytes(spill_dir))
            row = conn.execute(
                "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots"
                " WHERE slot_name = 'bench'"
            ).fetchone()
            if row is not None:
                peaks.server_spill, peaks.streamed = int(row[0]), int(row[1])


def one(mode: str, rows: int, every: float) -> dict[str, float]:
    """Run one mode; its figures."""
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-bigtxn-"))
    try:
        with EmbeddedPostgres(
            settings={"fsync": "off", "synchronous_commit": "off", "max_wal_size": "4GB"}
        ) as pg:
            dsn = pg.dsn()
            with connect(dsn, autocommit=True) as conn:
                with_slot(conn)
            source = {"name": "bench", "dsn": dsn, "slot": "bench", "publication": "bench"}
            if mode == "streamed":
                source |= {"streaming": True, "spill_dir": str(work)}
            cfg = parse_config(
                {
                    "spark": {"master": "local[2]", "checkpoint_dir": str(work / "checkpoints")},
                    "sources": [source],
                    "sinks": [{"name": "files", "source": "bench",
                               "destination": {"type": "file", "path": str(work / "out"),
                                               "format": "parquet"}}],
                }
            )  # fmt: skip
            runtime = Runtime(cfg).start()
            peaks, stop = Peaks(), threading.Event()
            sampler = threading.Thread(target=sample, args=(dsn, work, every, peaks, stop))
            try:
                with connect(dsn, autocommit=True) as conn:
                    write(conn, 0, 1, 1)
                wait_delivered(runtime, 1, 300)
                sampler.start()
                t0 = time.monotonic()
                with connect(dsn, autocommit=True) as conn:
                    write(conn, 1, rows, rows)  # one INSERT ... SELECT: one transaction
                committed = time.monotonic()
                print(f"  {mode}: the transaction of {rows:,} rows ran {committed - t0:.1f}s",
                      flush=True)  # fmt: skip
                first = wait_delivered(runtime, 2, 3600)
                last = wait_delivered(runtime, rows + 1, 3600)
            finally:
                stop.set()
                runtime.stop()
                if sampler.ident is not None:
                    sampler.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "transaction_s": committed - t0,
        "first_s": first - committed,
        "last_s": last - committed,
        "peak_rss_mb": peaks.total_rss,
        **{f"peak_{g}_mb": mb for g, mb in peaks.rss.items()},
        "server_spill_mb": peaks.server_spill / 2**20,
        "streamed_mb": peaks.streamed / 2**20,
        "spool_mb": peaks.spool / 2**20,
    }


def wait_delivered(runtime: Runtime, n: int, timeout: float) -> float:
    """Poll until the file sink has `n` rows; when (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runtime.poll()
        if runtime.fatal is not None:
            raise SystemExit(f"walstream stopped: {runtime.fatal}")
        p = runtime.progress().get("files")
        if p is not None and p.delivered + p.skipped >= n:
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"{n:,} rows were not delivered within {timeout:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--modes", default=",".join(MODES), help="at-commit, streamed or both")
    ap.add_argument("--sample-seconds", type=float, default=0.5)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child: one mode
    args = ap.parse_args()
    if args.rows < 1:
        raise SystemExit("--rows must be at least 1")
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.rows, args.sample_seconds)), flush=True)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: one or more of {', '.join(MODES)}")
    results: dict[str, dict[str, float]] = {}
    for mode in modes:
        print(f"{mode}: {args.rows:,} rows in one transaction", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "bench.bigtxn", "--one", mode, "--rows", str(args.rows),
             "--sample-seconds", str(args.sample_seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines = proc.stdout.splitlines()
        print("\n".join(line for line in lines if not line.startswith("RESULT ")), flush=True)
        found = [line for line in lines if line.startswith("RESULT ")]
        if proc.returncode or not found:
            raise SystemExit(f"{mode} failed (exit {proc.returncode})")
        results[mode] = json.loads(found[-1][len("RESULT ") :])
    report(results, args.rows)


ROWS = (
    ("transaction_s", "the transaction ran", "s"),
    ("first_s", "commit → first row delivered", "s"),
    ("last_s", "commit → last row delivered", "s"),
    ("peak_rss_mb", "peak RSS, all processes", "MB"),
    *((f"peak_{g}_mb", f"  peak {g}", "MB") for g in GROUPS),
    ("server_spill_mb", "spilled by the server (pg_replslot)", "MB"),
    ("streamed_mb", "streamed by the server", "MB"),
    ("spool_mb", "walstream's spool on disk, peak", "MB"),
)


def report(results: dict[str, dict[str, float]], rows: int) -> None:
    modes = list(results)
    print()
    print(f"one transaction of {rows:,} rows")
    print(f"{'':<40}" + "".join(f"{m:>14}" for m in modes))
    for key, label, unit in ROWS:
        print(f"{label:<40}" + "".join(f"{results[m][key]:>11,.1f} {unit:<2}" for m in modes))
    if "at-commit" in results and "streamed" in results:
        base, s = results["at-commit"], results["streamed"]
        for key, label, unit in ROWS[:4]:
            figure("bigtxn", f"{label}, streamed", s[key], unit,
                   reference=f"{label}, at commit", reference_value=base[key])  # fmt: skip
        for key, label, unit in ROWS[-3:]:
            figure("bigtxn", f"{label}, streamed", s[key], unit)
            figure("bigtxn", f"{label}, at commit", base[key], unit)


if __name__ == "__main__":
    main()
