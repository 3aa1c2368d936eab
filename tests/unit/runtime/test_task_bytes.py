"""How many raw WAL bytes a Spark task of a source takes when the config does not say."""

from __future__ import annotations

from walstream.config import parse_config
from walstream.runtime.query import SPREAD_TASK_BYTES, WHOLE_BATCH_BYTES, task_bytes

SINKS = [{"name": "out", "source": "app", "destination": {"type": "file", "path": "/tmp/x"}}]


def configured(source: dict[str, object]) -> int | None:
    base = {"name": "app", "dsn": "postgresql://walstream@127.0.0.1:5432/app"}
    plan = parse_config({"sources": [{**base, **source}], "sinks": SINKS})
    return plan.sources[0].partition_bytes


def test_a_small_local_master_takes_each_batch_in_one_task():
    assert configured({}) is None
    for master in ("local", "local[2]", "local[*]"):
        assert task_bytes(None, master, 2) == WHOLE_BATCH_BYTES
    assert task_bytes(None, "local[1]", 1) == WHOLE_BATCH_BYTES


def test_cores_to_spare_or_a_cluster_spread_the_batch():
    assert task_bytes(None, "local[*]", 8) == SPREAD_TASK_BYTES
    assert task_bytes(None, "spark://10.0.0.1:7077", 2) == SPREAD_TASK_BYTES


def test_a_source_of_table_sinks_only_spreads_the_batch_over_the_cores():
    """Its batch is typed in the JVM and collected: one task would type on one core."""
    for master in ("local", "local[2]", "local[*]"):
        assert task_bytes(None, master, 2, tables_only=True) == SPREAD_TASK_BYTES
    assert task_bytes(65536, "local[2]", 2, tables_only=True) == 65536


def test_the_configured_size_wins():
    assert configured({"partition_bytes": 65536}) == 65536
    assert task_bytes(65536, "local[2]", 2) == 65536
    assert task_bytes(WHOLE_BATCH_BYTES, "spark://10.0.0.1:7077", 64) == WHOLE_BATCH_BYTES
