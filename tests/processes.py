"""Which of Spark's Python processes run under a process (from /proc, as the benchmarks
read them: `bench.backlog._descendants`)."""

from __future__ import annotations

from bench.backlog import _descendants

#: Spark's daemons and workers of its one-shot planning steps (walstream/engine/planners.py).
PLANNING = "pyspark.sql.worker."
#: The daemon that forks Spark's task workers.
TASKS_DAEMON = "pyspark.daemon pyspark.worker"


def running(pid: int, what: str) -> dict[int, str]:
    """The processes under `pid` whose command line holds `what` (pid → command line)."""
    return {p: line for p, line in _descendants(pid).items() if p != pid and what in line}
