"""`walstream verify` of a history (SCD type 2) table: the source compared with the table's
current versions. Updates, a key change and deletes close versions and keep the table equal;
a current version closed behind walstream's back is a row missing in the sink, a second
current version of a key is one that differs, and a repair's read of each closes its current
versions and adds the source's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from walstream.backfill.store import DONE, BackfillStore
from walstream.cli import app
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

pytestmark = pytest.mark.spark


def verify(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["verify", "hist", "-c", str(config), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    assert result.stdout.startswith("{"), (result.stdout, result.exception)
    (table,) = json.loads(result.stdout)["tables"]
    return result.exit_code, table


def test_verify_compares_a_history_by_its_current_versions(spark, db, tmp_path):
    db.execute("CREATE TABLE acct (region text, id int, doc jsonb, tags text[], "
               "PRIMARY KEY (region, id))")  # fmt: skip
    db.execute("INSERT INTO acct SELECT (ARRAY['eu', 'ap 1'])[mod(g, 2) + 1], g, "
               "'{\"v\": [1, null]}', ARRAY['a', NULL] FROM generate_series(1, 100) g")  # fmt: skip
    pub = db.create_publication("acct")
    slot = db.create_slot()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [{"name": "hist", "source": "app", "backfill": "on_create",
                   "destination": {"type": "delta", "mode": "history",
                                   "path": str(tmp_path / "h" / "{table}")}}],
    }))  # fmt: skip
    plan = load_config(config)
    with supervised(Runtime(plan, spark=spark).start()):
        store = BackfillStore(plan.state_dsn)
        wait_until(lambda: [b.status for b in store.find()] == [DONE], 180, interval=0.5)
        db.execute("UPDATE acct SET doc = 'null' WHERE id <= 10")
        db.execute("UPDATE acct SET id = 1000 WHERE region = 'ap 1' AND id = 11")
        db.execute("DELETE FROM acct WHERE id BETWEEN 20 AND 24")
        code, report = verify(config)
        assert code == 0 and report["source_rows"] == report["sink_rows"] == 95, report

        from deltalake import DeltaTable

        history = DeltaTable(str(tmp_path / "h" / "acct"))
        # a current version closed by hand, and a closed one made current again
        history.update(updates={"is_current": "false"},
                       predicate="region = 'eu' AND id = 30 AND is_current")  # fmt: skip
        history.update(updates={"is_current": "true"},
                       predicate="region = 'eu' AND id = 2 AND NOT is_current")  # fmt: skip
        code, report = verify(config)
        assert code == 1 and report["sink_rows"] == 95, report  # 30 gone, 2 twice
        assert (report["missing"], report["different"], report["extra"]) == (
            [["eu", 30]], [["eu", 2]], []
        )  # fmt: skip
        # a repair's read of each key closes its current versions and adds the source's
        code, report = verify(config, "--repair")
        assert code == 0 and report["repaired"] == 2, report
        code, report = verify(config)
        assert code == 0 and report["source_rows"] == report["sink_rows"] == 95, report
