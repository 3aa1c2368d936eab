"""`walstream run`'s own process does not load pandas (~45 MB it never uses): neither
while Spark starts (PySpark's py4j converters import `pyspark.testing`, which imports
pandas) nor when a sink's delivery function is built (`pandas_udf` requires pandas), nor
when the sinks' SQL is checked and the workers started."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from walstream.config import parse_config
    from walstream.delivery.deliver import DeliveryPlan
    from walstream.delivery.ledger import Ledger
    from walstream.engine.session import build_spark
    from walstream.engine.frames import map_in_arrow
    from walstream.pipeline.batches import validate
    from walstream.pipeline.steps import SinkSteps
    from walstream.engine.warm import warm_workers

    def double(batches):
        import pyarrow.compute as pc
        for b in batches:
            yield b.set_column(0, "id", pc.multiply(b.column(0), 2))

    cfg = parse_config({
        "spark": {"master": "local[1]"},
        "sources": [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:1/app"}],
        "sinks": [{"name": "k", "source": "app", "destination": {
            "type": "kafka", "bootstrap_servers": "127.0.0.1:1", "topic": "t"}}],
    })
    spark = build_spark(cfg)
    out = {"after_spark": "pandas" in sys.modules}
    plan = DeliveryPlan(
        sink="k", destination=cfg.sinks[0].destination, format="sequin", db="app",
        batch_size=10, retry_timeout=1.0, ledger=Ledger(cfg.state_dsn, "walstream"),
        query_id="", batch_id=-1, partitions=1,
    )
    steps = SinkSteps(spark, cfg.sinks[0], None, False, "app", plan)
    out["after_udf"] = "pandas" in sys.modules
    out["udf"] = steps._deliver is not None
    validate(spark, cfg.sinks[0])  # the sinks' SQL, analysed over an empty frame
    warm_workers(spark).join()
    out["after_checks"] = "pandas" in sys.modules
    doubled = map_in_arrow(spark.range(0, 4, numPartitions=2), double, "id long")
    out["mapped"] = sorted(r.id for r in doubled.collect())
    spark.stop()
    import pandas
    out["importable"] = pandas.__name__ == "pandas"
    print(json.dumps(out))
    """
)


def test_the_driver_builds_spark_and_delivery_functions_without_pandas() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "after_spark": False, "after_udf": False, "udf": True, "after_checks": False,
        "mapped": [0, 2, 4, 6], "importable": True,
    }  # fmt: skip
