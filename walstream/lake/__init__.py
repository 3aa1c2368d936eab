"""The lake wing: table sinks (Delta, Iceberg) and everything that writes them.

`contract.py` the settings and the TableSink contract; `plan.py` what a batch does to
a table per mode (mirror, history, changelog); `typed.py` a batch's changes as typed
Arrow rows; `writer.py` the driver's writing of a micro-batch, one commit per table;
`files.py` staged Parquet files the executors write; `tables.py` what both formats
share; `delta.py`, `iceberg.py` and `catalog.py` the formats; `sources.py` the source
tables a sink was made from (renames pause it). The registry loads delta and
iceberg by name (`sinks.registry.OWN_ELSEWHERE`); they are also the example entry points of
pyproject.toml.
"""
