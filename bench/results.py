"""Figures a benchmark reports, for `bench/report.py`.

Each benchmark prints its own table and also calls `figure(...)` for every figure;
when `WALSTREAM_BENCH_RESULTS` names a file (report.py sets it), each figure is
appended to it as one JSON line.
"""

from __future__ import annotations

import json
import os


def figure(
    bench: str,
    name: str,
    value: float,
    unit: str,
    *,
    reference: str | None = None,
    reference_value: float | None = None,
    target: str | None = None,
) -> None:
    """One figure; with a reference measured in the same run, report.py shows the ratio."""
    path = os.environ.get("WALSTREAM_BENCH_RESULTS")
    if not path:
        return
    line = {
        "bench": bench, "name": name, "value": value, "unit": unit, "reference": reference,
        "reference_value": reference_value, "target": target,
    }  # fmt: skip
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
