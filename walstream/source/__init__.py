"""The source stage: a Spark Structured Streaming source over a replication slot.

`datasource.py` the Python data source (offsets are WAL cursors; `commit(end)` lets
the slot move), `partition.py` a partition's raw WAL decoded into change rows on an
executor, `options.py` its options, `checkpoint.py` what a checkpoint says of the slot.
"""
