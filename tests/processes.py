"""The processes under a process (from /proc): which of Spark's Python processes run."""

from __future__ import annotations

import os

#: Spark's daemons and workers of its one-shot planning steps (walstream/spark/planners.py).
PLANNING = "pyspark.sql.worker."
#: The daemon that forks Spark's task workers.
TASKS_DAEMON = "pyspark.daemon pyspark.worker"


def descendants(pid: int) -> dict[int, str]:
    """pid → command line of every process under `pid` (not `pid` itself)."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                lines[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            continue
    out, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, p in parents.items():
            if p == parent and child in lines:
                out[child] = lines[child]
                todo.append(child)
    return out


def running(pid: int, what: str) -> dict[int, str]:
    """The processes under `pid` whose command line holds `what`."""
    return {p: line for p, line in descendants(pid).items() if what in line}
