"""Small files: `walstream lake optimize SINK` and `optimize.every` compact lake tables."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import unique
from tests.lake import delta_rows, iceberg_rows, normalised, run_config, source_rows
from walstream.cli import app
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]


def delta_files(path: Path) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(str(path)).file_uris())


def iceberg_files(sink: Any) -> int:
    return len(sink._open("public", "o").inspect.files())


def write_in_batches(runtime: Runtime, db: Any, n: int, sinks: tuple[str, ...]) -> None:
    """n single-row transactions, each delivered before the next: one commit each."""
    for i in range(n):
        db.execute("INSERT INTO o VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = %s",
                   (i % 5, f"v{i}", f"v{i}"))  # fmt: skip

        def took(i: int = i) -> bool:
            runtime.poll()
            p = runtime.progress()
            return all(p.get(s) and p[s].delivered >= i + 1 for s in sinks)

        wait_until(took, 60, interval=0.1, message=lambda: f"{runtime.progress()}")


def test_lake_optimize_compacts_every_table_of_the_sink_and_keeps_its_rows(
    spark, db, tmp_path, caplog
):
    db.execute("CREATE TABLE o (id int PRIMARY KEY, v text)")
    pub = db.create_publication("o")
    slot = unique("slot")
    db.slots.append(slot)
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump(run_config(db, tmp_path, slot, pub, [
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "d" / "{table}"),
                         "optimize": {"retain": 0}}},
        {"name": "iceberg", "source": "app",
         "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path / "w")},
                         "optimize": {"every": "2s", "retain": 0}}},
    ])))  # fmt: skip
    plan = load_config(config)
    caplog.set_level(logging.INFO, logger="walstream.lake.writer")
    runtime = Runtime(plan, spark=spark).start()
    try:
        write_in_batches(runtime, db, 12, ("delta", "iceberg"))
    finally:
        runtime.stop()
    from walstream.sinks.registry import sink_for

    iceberg = sink_for(plan.sink("iceberg").destination)
    # optimize.every (iceberg): compacted between batches while the run went on
    assert any("sink iceberg: optimized public.o" in r.message for r in caplog.records)
    assert iceberg_files(iceberg) < 12
    # no schedule (delta): one file per merge until `walstream lake optimize`
    before = delta_files(tmp_path / "d" / "o")
    assert before >= 5
    result = CliRunner().invoke(app, ["lake", "optimize", "delta", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "public.o" in result.output and "files removed" in result.output
    assert delta_files(tmp_path / "d" / "o") == 1
    want = normalised(source_rows(db.dsn, "o"))
    assert normalised(delta_rows(tmp_path / "d" / "o")) == want
    assert normalised(iceberg_rows(db.dsn, "public.o")) == want

    refused = CliRunner().invoke(app, ["lake", "optimize", "delta", "-c", str(config),
                                       "--table", "public.nope"])  # fmt: skip
    assert refused.exit_code != 0
    assert "does not write public.nope" in str(refused.exception)
