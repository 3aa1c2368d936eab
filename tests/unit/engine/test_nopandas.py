"""A Python worker turns changes into Arrow batches without loading pandas (~50 MB per
worker), and pandas still works afterwards for code that asks for it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from walstream.change import ChangeRow
    from walstream.source.partition import arrow_batches
    from walstream.pipeline.tasks import deliver_arrow

    rows = [
        ChangeRow("app", 100 + i, i, 7, 1_700_000_000_000_000, "insert", "public", "t",
                  [str(i)], json.dumps({"k": i}), None, None, None)
        for i in range(3)
    ]
    batches = list(arrow_batches([[r] for r in rows], size=2))
    out = {"after_batches": "pandas" in sys.modules,
           "lsns": [v for b in batches for v in b.column("lsn").to_pylist()],
           "committed": str(batches[0].column("committed_at")[0])}
    import pandas
    import pyarrow as pa
    out["after_import"] = "pandas" in sys.modules
    out["to_pandas"] = pa.table({"a": [1, 2]}).to_pandas()["a"].tolist()
    print(json.dumps(out))
    """
)


def test_arrow_batches_leave_pandas_unloaded_and_importable() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["after_batches"] is False, "building the batches loaded pandas"
    assert out["lsns"] == [100, 101, 102]
    assert out["committed"] == "2023-11-14 22:13:20+00:00"
    assert out["after_import"] is True
    assert out["to_pandas"] == [1, 2]


def test_no_pandas_does_nothing_once_pandas_is_loaded() -> None:
    script = (
        "import sys, pandas\n"
        "from walstream.nopandas import no_pandas\n"
        "with no_pandas():\n"
        "    import pandas.api.types\n"
        "    n = len(sys.meta_path)\n"
        "print(n == len(sys.meta_path), 'pandas.api.types' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["True", "True"]
