"""DataFrame steps the driver builds without pandas.

PySpark's `DataFrame.mapInArrow` goes through `pandas_udf`, which requires pandas on
the driver, and `createDataFrame` imports pandas to check what it was given: ~45 MB
in `walstream run`'s process for nothing walstream uses (see nopandas.py). These do
the same through the JVM's own calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def arrow_map_udf(func: Callable[[Iterator[Any]], Iterator[Any]], ddl: str) -> Any:
    """The UDF `mapInArrow` makes of `func` (Arrow batches in, Arrow batches of `ddl` out)."""
    from pyspark.sql.udf import UserDefinedFunction
    from pyspark.util import PythonEvalType

    return UserDefinedFunction(func, returnType=ddl, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)


def map_in_arrow(df: Any, func: Callable[[Iterator[Any]], Iterator[Any]], ddl: str) -> Any:
    """`df.mapInArrow(func, ddl)`, without pandas on the driver."""
    from pyspark.sql import DataFrame

    column = arrow_map_udf(func, ddl)(*[df[c] for c in df.columns])._jc
    return DataFrame(df._jdf.mapInArrow(column, False, None), df.sparkSession)


def planned_partitions(df: Any) -> int:
    """How many partitions `df`'s physical plan has; plans it (once: an action on the
    same DataFrame reuses that plan), runs no job."""
    return int(df._jdf.queryExecution().toRdd().getNumPartitions())


def empty_frame(spark: Any, schema: Any) -> Any:
    """An empty DataFrame of `schema` (a StructType), without pandas on the driver."""
    from pyspark.sql import DataFrame

    jschema = spark._jsparkSession.parseDataType(schema.json())
    rows = spark._jvm.java.util.ArrayList()
    return DataFrame(spark._jsparkSession.createDataFrame(rows, jschema), spark)


def column_seq(spark: Any, columns: list[Any]) -> Any:
    """A JVM Seq of `columns`' Java columns (for `_jdf.select` and the like)."""
    from pyspark.sql.classic.column import _to_seq

    return _to_seq(spark.sparkContext, [c._jc for c in columns])
