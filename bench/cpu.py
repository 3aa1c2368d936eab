"""CPU time per process group, for a per-row breakdown of where a benchmark's time goes.

    before = cpu_by_group(pg.data)
    ... the measured work ...
    print_breakdown(cpu_by_group(pg.data), before, rows, rate_at_target)

Groups: the driver JVM, this Python process (the walstream driver), Spark's Python
processes, the embedded Postgres (its postmaster and every backend under it) and a
tansu broker this process started.
CPU is user + system time from /proc, plus that of children already reaped (a
Python worker that exited counts in its parent's). A process that started and ended
between the two readings without a parent in the groups is not counted.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.backlog import _descendants, grouped_processes
from bench.results import figure

POSTGRES = "Postgres (postmaster + backends)"
BROKER = "Kafka broker (tansu), if any"
GROUPS = ("driver JVM", "walstream driver (Python)", "Spark Python processes", POSTGRES, BROKER)
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK


def cpu_by_group(pg_data: Path | None = None) -> dict[str, float]:
    """CPU seconds used so far by each group (see the module doc); `pg_data`: the
    embedded Postgres's data directory (its postmaster.pid names the postmaster)."""
    out = dict.fromkeys(GROUPS, 0.0)
    for pid, group in grouped_processes():
        out[group] += _cpu_seconds(pid)
    for pid, cmd in _descendants(os.getpid()).items():
        if "tansu" in cmd.split(" ", 1)[0]:
            out[BROKER] += _cpu_seconds(pid)
    if pg_data is not None and (pg_data / "postmaster.pid").exists():
        postmaster = int((pg_data / "postmaster.pid").read_text().split()[0])
        for pid in _descendants(postmaster):
            out[POSTGRES] += _cpu_seconds(pid)
    return out


def print_breakdown(
    bench: str, after: dict[str, float], before: dict[str, float], rows: int,
    target_rate: float,
) -> None:  # fmt: skip
    """Print µs of CPU per row for each group, their sum, and the budget per row at
    `target_rate` rows/s on this machine's cores; each also as a figure."""
    cores = os.cpu_count() or 1
    budget = cores / target_rate * 1e6
    print(f"CPU per row ({rows:,} rows; at the target, {target_rate:,.0f} rows/s, "
          f"{cores} cores give {budget:.1f} µs per row in all):")  # fmt: skip
    total = 0.0
    for g in GROUPS:
        us = (after[g] - before[g]) / rows * 1e6
        total += us
        print(f"  {g:<36}{us:>8.2f} µs")
        figure(bench, f"CPU per row: {g}", us, "µs")
    print(f"  {'all':<36}{total:>8.2f} µs  ({total / budget:.1f}x the budget at the target)")
    figure(bench, "CPU per row: all", total, "µs", target=f"<= {budget:.1f} µs")
