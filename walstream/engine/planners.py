"""End Spark's Python planning processes once the queries run: memory a running query never uses.

Before a query reads a Python data source, Spark runs one-shot planning steps, each in
a `pyspark.daemon` of its own that it keeps for the session: on 2 cores six processes
and ~250 MB resident a running query never uses (docs/performance-log.md).
`release` stops those daemons the way Spark does when its session ends
(`PythonWorkerFactory.stop()`, reached by reflection: Spark has no call for it); a
query started later starts one again. The tasks' daemon and its warm workers stay.
It must run while nothing is being planned: the runtime calls it from the thread that
starts its queries, once every running query has reported progress.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: The worker modules of Spark's one-shot steps that plan a Python data source's read.
PLANNING_MODULES = frozenset(
    {
        "pyspark.sql.worker.lookup_data_sources",
        "pyspark.sql.worker.create_data_source",
        "pyspark.sql.worker.plan_data_source_read",
        "pyspark.sql.worker.data_source_pushdown_filters",
    }
)


def release(spark: Any) -> list[str]:
    """Stop the daemons (and idle workers) of Spark's planning steps; return the stopped
    steps' worker modules. Raises Py4J's errors if this Spark's internals differ."""
    sc = spark.sparkContext
    # Calls on the SparkEnv object itself make Py4J load its every method's types, which
    # name classes a local Spark does not ship: the field is read through java.lang.Class.
    field = sc._jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField(
        "pythonWorkers"
    )
    field.setAccessible(True)
    factories = field.get(sc._jsc.sc().env()).toList().iterator()  # a copy of the map
    stopped = []
    while factories.hasNext():
        entry = factories.next()
        module = entry._1().workerModule()
        if module in PLANNING_MODULES:
            entry._2().stop()
            stopped.append(str(module))
    return sorted(stopped)


def planning_over(queries: list[Any]) -> bool:
    """Every running query of `queries` (SourceQuery) has reported progress: none of them
    is being planned now; and at least one runs."""
    running = [sq.query for sq in queries if sq.query is not None]
    try:
        return bool(running) and all(q.isActive and q.lastProgress is not None for q in running)
    except Exception:  # a query going away: look again at the next tick
        return False


def release_after_planning(spark: Any, queries: list[Any]) -> bool:
    """`release` once `planning_over(queries)`; True when that was tried (done or failed:
    a failure is logged and only the memory stays)."""
    if not planning_over(queries):
        return False
    try:
        stopped = release(spark)
    except Exception as exc:
        log.info(
            "could not end Spark's planning processes (they stay until Spark stops, ~250 MB): %s",
            str(exc).splitlines()[0][:200],
        )
        return True
    if stopped:
        log.debug("ended Spark's planning processes: %s", ", ".join(stopped))
    return True
