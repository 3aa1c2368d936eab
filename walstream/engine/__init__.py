"""The engine: Spark itself, as walstream starts and tunes it.

`session.py` the SparkSession (local or a cluster) and its settings, `classes.py` +
`pyworker.py` + `warm.py` faster starts (saved JVM classes, precompiled PySpark,
warmed workers), `planners.py` the one-shot planning workers, `frames.py` DataFrames
over JVM objects, `sql.py` the Spark SQL a sink's selection becomes.
"""
