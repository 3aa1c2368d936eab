"""Start Spark's Python workers while walstream starts, instead of in its first batch.

A cold first batch forks a Python worker per core and imports what reading and
delivering need (pyarrow, psycopg, the sinks' clients: 1-2 s of a 2-core machine). The
steps before the first batch (registering the source, checking the sinks' SQL, starting
the query) mostly wait on the JVM and on Spark's planning processes, so one small job
on a thread of its own does that work beside them. Spark keeps the workers for reuse:
the first batch finds them ready.

It warms one worker fewer than Spark has cores (at least one): the start-up steps it
runs beside fork Python processes of their own on the driver (the source's
registration and planning), and on a 2-core machine two warm-up tasks left them no core.
There, warming one worker brought the first message 1.3-2.4 s sooner in each of three
paired runs (docs/performance-log.md).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from walstream.engine.frames import map_in_arrow

log = logging.getLogger(__name__)

#: Spark's job group of the warm-up job.
JOB_GROUP = "walstream-warm"
#: What every stream task imports: reading the slot's changes, delivering them.
TASK_MODULES = ("walstream.source.partition", "walstream.pipeline.tasks")


def _importer(modules: Sequence[str]) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for name in modules:
            importlib.import_module(name)
        from walstream.sinks.registry import sink_types

        sink_types()  # imports every sink module (and the clients each imports up front)
        yield from batches

    return run


def warm_tasks(cores: int) -> int:
    """How many Python workers to warm on `cores` cores: all but one, at least one."""
    return max(1, cores - 1)


def warm_workers(spark: Any, modules: Sequence[str] = TASK_MODULES) -> threading.Thread:
    """Run, on a thread, `warm_tasks` tasks that import `modules` in a Python worker each."""

    def job() -> None:
        tasks = warm_tasks(spark.sparkContext.defaultParallelism)
        try:
            spark.sparkContext.setJobGroup(JOB_GROUP, "walstream: start the Python workers")
            ids = spark.range(0, tasks, numPartitions=tasks)
            map_in_arrow(ids, _importer(tuple(modules)), "id long").collect()
        except Exception as exc:  # only time is lost: the first batch starts them instead
            log.debug("warming the Python workers failed: %s", exc)

    thread = threading.Thread(target=job, name="walstream-warm", daemon=True)
    thread.start()
    return thread
