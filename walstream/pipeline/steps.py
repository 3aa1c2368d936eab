"""A sink's per-batch Spark steps, built once as JVM objects and applied to every batch.

Each micro-batch runs the same steps for a sink: select its rows, add `_group`,
`_key`, `_route`, `_message`, then `mapInArrow` the delivery function. Building
them from text every batch costs tens of milliseconds of py4j calls and SQL
parsing on the driver — most of a small batch's time. `SinkSteps` parses the
expressions once and keeps the JVM's Column objects (and the delivery UDF, pickled
once); a batch then costs a few py4j calls. What differs per batch (its id, the
partition count, whether it is a replay) reaches the tasks as a Spark local
property of the job (`BATCH_PROPERTY`), not inside the pickled function.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from walstream.config import SinkConfig
from walstream.delivery.deliver import DeliveryPlan
from walstream.delivery.route import Route
from walstream.engine.frames import arrow_map_udf, column_seq
from walstream.pipeline.expressions import TRIMMED, projection
from walstream.pipeline.tasks import STATS_DDL, deliver_arrow

#: The local property that carries a batch's part of a sink's DeliveryPlan to its tasks.
BATCH_PROPERTY = "walstream.batch.{sink}"


@dataclass(frozen=True)
class BatchPart:
    """What a sink's tasks learn per batch (the rest of the plan is pickled once).

    `route`: how the tasks deliver (`delivery/route.py`). `fresh`: the ledger holds nothing of this batch (not a replay), so a task's first
    attempt delivers all of its partition without asking the ledger. `unblocked`: the
    sink has no parked messages, so no group is blocked. A retried task attempt asks
    both: its earlier attempt may have delivered or parked part of the partition.
    """

    query_id: str
    batch_id: int
    partitions: int
    route: str = Route.ROWS
    fresh: bool = False
    unblocked: bool = False

    def text(self) -> str:
        return json.dumps(vars(self))

    @classmethod
    def parse(cls, text: str) -> BatchPart:
        return cls(**json.loads(text))

    def apply(self, plan: DeliveryPlan, first_attempt: bool) -> DeliveryPlan:
        return replace(
            plan,
            query_id=self.query_id,
            batch_id=self.batch_id,
            partitions=self.partitions,
            route=Route(self.route),
            fresh=self.fresh and first_attempt,
            unblocked=self.unblocked and first_attempt,
        )


class SinkSteps:
    """One sink's steps for batches with (`backfill`) or without backfill rows."""

    def __init__(
        self,
        spark: Any,
        sink: SinkConfig,
        skip_before: int | None = None,
        backfill: bool = False,
        db: str = "",
        plan: DeliveryPlan | None = None,
    ) -> None:
        from pyspark.sql import functions as F

        self.context = spark.sparkContext
        self.sink = sink.name
        p = projection(sink, skip_before, backfill, db)
        self._where = F.expr(p.where)._jc
        self._select = column_seq(spark, [F.expr(c) for c in (*p.keep, *p.columns)])
        names = p.names
        self._trim = None
        if p.sql_message:  # where SQL made the message, the row's JSON columns need not travel on
            self._trim = column_seq(
                spark,
                [
                    F.expr(f"CASE WHEN _message IS NULL THEN `{c}` END AS `{c}`")
                    if c in TRIMMED
                    else F.col(c)
                    for c in names
                ],
            )
        self.names = names
        #: Each message is made in SQL or Arrow (`_message`), not by a Python step.
        self.messages_made = "_message" in names or p.worker_format is not None
        self.plan = plan
        self._deliver = None
        if plan is not None:
            udf = arrow_map_udf(batch_deliverer(plan), STATS_DDL)  # no pandas on the driver
            self._deliver = udf(*[F.col(n) for n in names])._jc

    def prepare(self, df: Any) -> Any:
        """The sink's rows of `df` with the columns delivery reads (see `projection`)."""
        from pyspark.sql import DataFrame

        jdf = df._jdf.filter(self._where).select(self._select)
        if self._trim is not None:
            jdf = jdf.select(self._trim)
        return DataFrame(jdf, df.sparkSession)  # each query runs in its own session

    def deliver(self, prepared: Any) -> Any:
        """`prepared` (or it regrouped) mapped through the delivery function: one row of
        counts per partition when collected (after `start`)."""
        from pyspark.sql import DataFrame

        assert self._deliver is not None, "SinkSteps made without a DeliveryPlan"
        return DataFrame(
            prepared._jdf.mapInArrow(self._deliver, False, None), prepared.sparkSession
        )

    def start(self, part: BatchPart) -> None:
        """The jobs this thread runs next deliver batch `part` (a Spark local property)."""
        self.context.setLocalProperty(BATCH_PROPERTY.format(sink=self.sink), part.text())


def batch_deliverer(plan: DeliveryPlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function of `SinkSteps`: the plan completed by the job's BatchPart."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        text = ctx.getLocalProperty(BATCH_PROPERTY.format(sink=plan.sink)) if ctx else None
        if text is None:
            raise RuntimeError(f"sink {plan.sink}: a delivery task ran without its batch")
        first = ctx is not None and ctx.attemptNumber() == 0
        yield from deliver_arrow(BatchPart.parse(text).apply(plan, first))(batches)

    return run
