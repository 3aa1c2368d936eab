"""Sinks' projections computed once, on the streaming DataFrame, instead of every batch.

`SinkSteps.prepare` applies a sink's filter and columns (`projection`) to a batch's
DataFrame: Spark parses, analyses and plans the message format's SQL again every
batch, driven by py4j calls from the driver (~30 ms for the projection and ~50 ms for
planning the job, of a ~250 ms cycle at 5,000 changes/s on 2 cores). `Streamed` adds
those columns to the query's streaming DataFrame when the query starts, under names
of their own (`_ws<i>_<name>`, `_ws<i>_where`); Spark plans them inside its own batch
planning, and a batch only filters on the sink's `where` column and selects its
columns by name. Measured: ~15-20 ms less per batch cycle; a backlog's rate within
the noise of before (docs/performance-log.md, "the sinks' columns planned with the query").

Spark hands foreachBatch each batch as the result of that plan (a `LogicalRDD`), so
a batch's own filter or select cannot reach back into it: each sink's columns are
made only where its `where` holds (`CASE WHEN`), not for rows another sink takes,
watermarks or tables it leaves out. The change columns stay as they are: a lake
sink, a batch with backfill rows (which builds its sinks' columns per batch, as
before) and `walstream reset`'s `skip_before` read them (`raw`, `prepare`).
"""

from __future__ import annotations

from typing import Any

from walstream.change import CHANGE_COLUMNS
from walstream.config import SinkConfig
from walstream.engine.frames import column_seq
from walstream.pipeline.expressions import TRIMMED, projection


class Streamed:
    """One sink's columns on the streaming DataFrame (see the module's docstring)."""

    def __init__(self, sink: SinkConfig, index: int, db: str) -> None:
        p = projection(sink, None, False, db)
        self.prefix = f"_ws{index}_"
        self.where_name = f"{self.prefix}where"
        self._where = p.where
        self._computed = list(zip(p.names[len(p.keep) :], p.columns, strict=True))
        self._keep = p.names[: len(p.keep)]
        self._sql_message = p.sql_message
        self.names = p.names

    def add(self, df: Any) -> Any:
        """`df` (the streaming change rows) with this sink's columns added."""
        from pyspark.sql import functions as F

        df = df.withColumn(self.where_name, F.expr(self._where))
        computed = {}
        for name, text in self._computed:
            column = F.expr(text.rsplit(" AS ", 1)[0])  # made only for the sink's rows:
            computed[self.prefix + name] = F.when(F.col(self.where_name), column)
        df = df.withColumns(computed)
        if self._sql_message:  # the row's JSON travels on only where SQL made no message
            message = F.col(self.prefix + "_message")
            df = df.withColumns(
                {
                    self.prefix + c: F.when(message.isNull(), F.col(c))
                    for c in TRIMMED
                    if c in self._keep
                }
            )
        return df

    def select_columns(self, spark: Any) -> Any:
        """The JVM columns of a batch's select: this sink's columns under their own names."""
        from pyspark.sql import functions as F

        out = []
        for name in self.names:
            own = name not in self._keep or (self._sql_message and name in TRIMMED)
            out.append(F.col(self.prefix + name).alias(name) if own else F.col(f"`{name}`"))
        return column_seq(spark, out)


class StreamedSinks:
    """The streaming DataFrame's added columns for a source's message sinks."""

    def __init__(self, spark: Any, sinks: list[SinkConfig], db: str) -> None:
        self.spark = spark
        self.by_sink = {s.name: Streamed(s, i, db) for i, s in enumerate(sinks)}
        self._selects: dict[str, Any] = {}
        self._raw: Any = None

    def add(self, df: Any) -> Any:
        for streamed in self.by_sink.values():
            df = streamed.add(df)
        return df

    def prepare(self, df: Any, sink: str, skip_before: int | None) -> Any:
        """A batch's rows for `sink` with the columns delivery reads (as SinkSteps.prepare)."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        streamed = self.by_sink[sink]
        keep = F.col(streamed.where_name)
        if skip_before is not None:
            keep = (F.col("lsn") >= F.lit(int(skip_before))) & keep
        select = self._selects.get(sink)
        if select is None:
            select = self._selects[sink] = streamed.select_columns(self.spark)
        return DataFrame(df._jdf.filter(keep._jc).select(select), df.sparkSession)

    def raw(self, df: Any) -> Any:
        """A batch's change rows without the sinks' columns."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        if self._raw is None:
            self._raw = column_seq(self.spark, [F.col(f"`{c}`") for c in CHANGE_COLUMNS])
        return DataFrame(df._jdf.select(self._raw), df.sparkSession)
