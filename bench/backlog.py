"""Memory of `walstream run` while it drains a large backlog: does it stay flat?

    .venv/bin/python -m bench.backlog [--changes 10000000] [--big ROWS] [--sample-seconds 2]

1. Writes CHANGES inserts into an 8-column table while walstream's slot exists and
   nothing reads it: 1,000-row transactions, plus one transaction of a tenth of
   the backlog or of BIG rows (a large transaction must not be held whole either:
   `--changes 6000000 --big 5000000` drains a 5M-row transaction between 500k
   changes before and after it).
2. Starts the Runtime of `walstream run` with walstream's default Spark settings
   and one file sink (parquet), and samples while it drains the slot: resident
   memory (VmRSS) of the driver JVM, of this Python process (the runtime, the
   retrier), of Spark's Python processes (the streaming source with its capture
   buffer, the delivery workers), and the slot's remaining backlog.
3. Prints the samples at every tenth of the drain, then the peak of each process
   group, the resident memory at 20 % and at 100 % of the drain, and the growth
   between them. Flat means the growth is small and does not scale with CHANGES:
   the target is at most 10% growth between 20% and 100% of a 10M drain
   (`--changes 10000000`), printed as met or not.

Memory that matters is bounded by settings, not by the backlog: capture's
buffer (`max_buffer_bytes`, 128 MB), a batch (`max_changes_per_batch`), the JVM
heap (`spark.driver.memory`, Spark's default 1g).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import figure
from bench.stream import with_slot, write
from walstream.config import parse_config
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.runtime import Runtime

#: Resident memory may grow at most this much between 20% and 100% of the drain.
GROWTH_TARGET_PCT = 10

GROUPS = ("driver JVM", "walstream driver (Python)", "Spark Python processes")


def _descendants(root: int) -> dict[int, str]:
    """pid → command line of every process below `root` (and root itself)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes()
        except OSError:  # gone between the listing and the reads: neither is kept
            continue
        parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        names[int(d.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    out: dict[int, str] = {}
    for pid in parents:
        p = pid
        while p not in (0, 1, root):
            p = parents.get(p, 0)
        if p == root:
            out[pid] = names[pid]
    return out


def _proc_mb(pid: int, file: str, key: str) -> float:
    """A `key:  N kB` line of /proc/<pid>/<file> in MB (0 for a process that is gone)."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


#: kcmp(2)'s number per machine, and its KCMP_VM: do two processes share one address space?
_KCMP = {"x86_64": 312, "aarch64": 272}
_KCMP_VM = 1


@functools.cache
def _kcmp() -> tuple[Any, int] | None:
    """libc and kcmp(2)'s number on this machine, looked up once (samplers call it often)."""
    number = _KCMP.get(os.uname().machine)
    return None if number is None else (ctypes.CDLL(None, use_errno=True), number)


def _same_memory(a: int, b: int) -> bool | None:
    """Whether processes `a` and `b` share one address space (kcmp), or None if unknown."""
    found = _kcmp()
    if found is None:
        return None
    libc, number = found
    answer = libc.syscall(number, a, b, _KCMP_VM, 0, 0)
    return None if answer < 0 else answer == 0


def one_per_address_space(pids: Iterable[int]) -> list[int]:
    """`pids` less each process that shares its address space with one already kept.

    A process that starts a program forks or vforks first, and until the child execs
    it shares the parent's memory (Java's ProcessBuilder: posix_spawn, a CLONE_VM child
    with the JVM's command line). Summing RSS or PSS over a process tree counts that
    memory twice: a sample that fell in such a window once read a 1.8 GB peak for a
    tree of 1.35 GB. Where kcmp(2) cannot tell, every process counts.
    """
    kept: list[int] = []
    for pid in pids:
        if not any(_same_memory(pid, k) for k in kept):
            kept.append(pid)
    return kept


def _rss_mb(pid: int) -> float:
    return _proc_mb(pid, "status", "VmRSS:")


def _pss_mb(pid: int) -> float:
    """Proportional set size: pages shared with other processes count by share."""
    return _proc_mb(pid, "smaps_rollup", "Pss:")


def rss_by_group() -> dict[str, float]:
    """Resident MB now: the driver JVM, this process, and the sum of Spark's Python processes."""
    return {g: mb for g, (mb, _) in rss_and_count().items()}


def grouped_processes() -> Iterator[tuple[int, str]]:
    """(pid, group) of this process and each process below it that is in a group."""
    me = os.getpid()
    tree = _descendants(me)
    for pid in one_per_address_space(tree):
        cmd = tree[pid]
        if pid == me:
            yield pid, "walstream driver (Python)"
        elif "java" in cmd.split(" ", 1)[0]:
            yield pid, "driver JVM"
        elif "python" in cmd:
            yield pid, "Spark Python processes"


def rss_and_count() -> dict[str, tuple[float, int]]:
    """(resident MB, processes) per group."""
    out = dict.fromkeys(GROUPS, (0.0, 0))
    for pid, group in grouped_processes():
        mb, n = out[group]
        out[group] = (mb + _rss_mb(pid), n + 1)
    return out


def jvm_live_heap_mb() -> float | None:
    """The driver JVM's heap in use right after a full GC (jcmd), or None without a JDK.

    Resident memory of a JVM grows toward its heap limit before the collector works
    hard, so RSS alone cannot tell a leak from a lazy collector; the live heap can.
    """
    for pid, cmd in _descendants(os.getpid()).items():
        if "java" not in cmd.split(" ", 1)[0]:
            continue
        jcmd = Path(os.readlink(f"/proc/{pid}/exe")).with_name("jcmd")
        if not jcmd.exists():
            return None
        subprocess.run([str(jcmd), str(pid), "GC.run"], capture_output=True, timeout=60)
        info = subprocess.run(
            [str(jcmd), str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60
        ).stdout
        m = re.search(r"heap\s+total \d+K, used (\d+)K", info)
        return int(m.group(1)) / 1024 if m else None
    return None


@dataclass
class Sampler:
    """Samples memory and the slot's backlog every `every` seconds on a thread."""

    dsn: str
    slot: str
    every: float
    rows: list[tuple[float, int, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def backlog_bytes(self, conn) -> int:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        return int(row[0] or 0) if row else 0

    def run(self) -> None:
        t0 = time.monotonic()
        with connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(self.every):
                self.rows.append((time.monotonic() - t0, self.backlog_bytes(conn), rss_by_group()))

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def write_backlog(dsn: str, changes: int, big: int | None = None) -> None:
    """CHANGES inserts: 1,000-row transactions and, in the middle, one of `big` rows (a
    tenth of them by default)."""
    big = changes // 10 if big is None else big
    half = (changes - big) // 2
    plan = [(1000, half), (big, big), (1000, changes - half - big)]  # (rows per txn, rows)
    t0 = time.perf_counter()
    done, step = 0, max(changes // 10, 1)
    next_report = step
    with connect(dsn, autocommit=True) as conn:
        for per_txn, rows in plan:
            end = done + rows
            while done < end:
                n = min(per_txn, end - done)
                write(conn, done + 1, n, n)  # one transaction of n rows
                done += n
                if done >= next_report:
                    rate = done / (time.perf_counter() - t0)
                    print(f"  written {done:>12,} of {changes:,} ({rate:,.0f}/s)", flush=True)
                    while next_report <= done:  # a large transaction passes several marks
                        next_report += step
    print(f"workload: {changes:,} inserts in {time.perf_counter() - t0:.0f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=10_000_000)
    ap.add_argument("--sample-seconds", type=float, default=2.0)
    ap.add_argument(
        "--big", type=int, default=None,
        help="rows of the one large transaction in the middle (default: a tenth of CHANGES)",
    )  # fmt: skip
    ap.add_argument(
        "--max-batch", type=int, default=None,
        help="source max_changes_per_batch (default: walstream's, 50,000)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.changes < 10:
        raise SystemExit("--changes must be at least 10")
    if args.big is not None and not 0 < args.big <= args.changes:
        raise SystemExit("--big must be between 1 and --changes")

    work = Path(tempfile.mkdtemp(prefix="walstream-bench-backlog-"))
    try:
        with EmbeddedPostgres(
            settings={"fsync": "off", "synchronous_commit": "off", "max_wal_size": "4GB"}
        ) as pg:
            dsn = pg.dsn()
            with connect(dsn, autocommit=True) as conn:
                with_slot(conn)
            write_backlog(dsn, args.changes, args.big)
            with connect(dsn, autocommit=True) as conn:
                wal = conn.execute(
                    "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots"
                ).fetchone()[0]  # type: ignore[index]
            print(
                f"backlog in the slot: {args.changes:,} changes, {int(wal) / 2**20:,.0f} MB of WAL"
            )

            cfg = parse_config(
                {
                    "spark": {"master": "local[2]", "checkpoint_dir": str(work / "checkpoints")},
                    "sources": [
                        {"name": "bench", "dsn": dsn, "slot": "bench", "publication": "bench",
                         **({"max_changes_per_batch": args.max_batch} if args.max_batch else {})}
                    ],
                    "sinks": [
                        {"name": "files", "source": "bench",
                         "destination": {"type": "file", "path": str(work / "out"),
                                         "format": "parquet"}}
                    ],
                }
            )  # fmt: skip
            sampler = Sampler(dsn, "bench", args.sample_seconds).start()
            t0 = time.perf_counter()
            runtime = Runtime(cfg).start()
            try:
                next_report = args.changes // 10
                heap: dict[str, float | None] = {}
                while True:
                    runtime.poll()
                    if runtime.fatal is not None:
                        raise SystemExit(f"walstream stopped: {runtime.fatal}")
                    p = runtime.progress().get("files")
                    done = 0 if p is None else p.delivered + p.skipped
                    if done >= next_report:
                        mem = rss_and_count()
                        print(
                            f"  delivered {done:>12,} ({done / (time.perf_counter() - t0):,.0f}/s)  "
                            + "  ".join(f"{k} {mb:,.0f} MB ({n})" for k, (mb, n) in mem.items()),
                            flush=True,
                        )
                        while next_report <= done:
                            next_report += args.changes // 10
                    if "at 20%" not in heap and done >= args.changes * 0.2:
                        heap["at 20%"] = jvm_live_heap_mb()
                    if done >= args.changes:
                        heap["at 100%"] = jvm_live_heap_mb()
                        break
                    time.sleep(0.1)
                elapsed = time.perf_counter() - t0
            finally:
                sampler.stop()
                runtime.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report(sampler.rows, args.changes, elapsed, heap)


def report(
    rows: list[tuple[float, int, dict[str, float]]],
    changes: int,
    elapsed: float,
    heap: dict[str, float | None],
) -> None:
    if not rows:
        raise SystemExit("no memory samples were taken; lower --sample-seconds")
    start_backlog = max(r[1] for r in rows) or 1

    def at(fraction: float) -> dict[str, float]:
        """The sample where `fraction` of the WAL backlog had been drained (first past it)."""
        for _, backlog, mem in rows:
            if 1 - backlog / start_backlog >= fraction:
                return mem
        return rows[-1][2]

    early, late = at(0.2), rows[-1][2]
    peak = {g: max(r[2][g] for r in rows) for g in GROUPS}
    print()
    print(f"drained {changes:,} changes in {elapsed:.0f}s ({changes / elapsed:,.0f}/s), "
          f"{len(rows)} samples")  # fmt: skip
    print(f"{'process group':<30}{'at 20%':>10}{'at 100%':>10}{'growth':>10}{'peak':>10}")
    for g in GROUPS:
        print(
            f"{g:<30}{early[g]:>7,.0f} MB{late[g]:>7,.0f} MB{late[g] - early[g]:>+7,.0f} MB"
            f"{peak[g]:>7,.0f} MB"
        )
    total_early, total_late = sum(early.values()), sum(late.values())
    print(
        f"{'all':<30}{total_early:>7,.0f} MB{total_late:>7,.0f} MB"
        f"{total_late - total_early:>+7,.0f} MB{max(sum(r[2].values()) for r in rows):>7,.0f} MB"
    )

    growth = (total_late - total_early) / total_early * 100 if total_early else float("nan")
    verdict = "met" if growth <= GROWTH_TARGET_PCT else "NOT met"
    print(
        f"growth 20% → 100% of the drain: {growth:+.1f}% (target <= {GROWTH_TARGET_PCT}%: {verdict})"
    )
    figure("backlog", f"drain of a {changes:,}-change backlog (changes/s)", changes / elapsed, "/s")
    figure("backlog", "resident memory at 100% of the drain", total_late, "MB",
           reference="at 20% of the drain", reference_value=total_early,
           target=f"<= {1 + GROWTH_TARGET_PCT / 100:g}x")  # fmt: skip
    figure("backlog", "peak RSS, all processes", max(sum(r[2].values()) for r in rows), "MB")
    early_heap, late_heap = heap.get("at 20%"), heap.get("at 100%")
    if early_heap is None or late_heap is None:
        print("driver JVM live heap after GC: n/a (jcmd not found: install a JDK to see it)")
    else:
        print(
            f"{'driver JVM live heap after GC':<30}{early_heap:>7,.0f} MB{late_heap:>7,.0f} MB"
            f"{late_heap - early_heap:>+7,.0f} MB"
        )


if __name__ == "__main__":
    main()
