"""The pipeline stage: each micro-batch delivered to every sink of its source.

`batches.py` the foreachBatch (routes per sink, backfill rows placed, progress),
`expressions.py` + `steps.py` the Spark SQL and steps a sink becomes, `streamed.py`
the message sinks' columns on the stream, `tasks.py` one partition's delivery on an
executor, `reads.py` backfill chunks straight from their staged files,
`save_classes.py` Spark's classes saved for faster starts.
"""
