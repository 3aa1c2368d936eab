"""Every benchmark in bench/, at sizes that finish in about 25 minutes on 2 cores, in one table.

    .venv/bin/python -m bench.report [--only decode,kafka] [--scale 1.0]

Runs each benchmark as its own process (as `python -m bench.<name>` with the sizes
below, times `--scale`) and collects its figures (bench/results.py). Prints one
table: each figure, the reference measured in the same run (raw pgoutput receive,
`pg_recvlogical`, `COPY`, the local webhook receiver's ceiling, a bare INSERT), the
ratio and the target, and the peak resident memory of each benchmark's process tree
(sampled every 0.5 s: Spark's JVM and Python workers included). A benchmark that
fails is reported as failed with its last output lines; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.backlog import _descendants, _rss_mb, one_per_address_space

#: (benchmark, arguments at scale 1): 1-5 minutes each here, about 30 minutes in all.
PLAN: list[tuple[str, list[str]]] = [
    ("decode", ["--rows", "1000000", "--repeat", "2"]),
    ("stream", ["--changes", "1000000", "--latency-seconds", "15"]),
    ("kafka", ["--changes", "1000000", "--latency-seconds", "15"]),
    ("sinks", ["--messages", "20000"]),
    ("backlog", ["--changes", "2000000"]),
    ("bigtxn", ["--rows", "2000000"]),
    ("backfill", ["--rows", "2000000"]),
    ("events", ["--requests", "2000", "--threads", "8"]),
    ("shards", ["--changes", "500000"]),
    ("debezium", ["--changes", "500000", "--rates", "2000,5000", "--latency-seconds", "15"]),
    ("paths", ["--changes", "300000"]),
    ("verify", ["--rows", "5000000"]),  # the 5M rows: about 3 minutes
    ("lake", ["--rows", "5000000", "--changes", "500000", "--latency-seconds", "30",
              "--files-minutes", "3", "--only", "backfill,streaming,latency,files,scale",
              "--scale-rows", "100000,1000000", "--update-seconds", "30"]),
]  # fmt: skip
#: Arguments that are sizes (scaled by --scale).
SIZES = {"--rows", "--changes", "--messages", "--requests"}


def scaled(args: list[str], scale: float) -> list[str]:
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in SIZES:
            out[i + 1] = str(max(1, int(int(out[i + 1]) * scale)))
    return out


def run(name: str, args: list[str], results: Path) -> tuple[float, float, str | None]:
    """Run one benchmark; (seconds, peak MB of its process tree, error or None)."""
    env = {**os.environ, "WALSTREAM_BENCH_RESULTS": str(results), "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", f"bench.{name}", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.5):
            tree = one_per_address_space(_descendants(proc.pid))
            peak = max(peak, sum(_rss_mb(p) for p in tree))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"  [{name}] {line.rstrip()}", flush=True)
        tail = [*tail[-9:], line.rstrip()]
    code = proc.wait()
    done.set()
    sampler.join()
    error = None if code == 0 else f"exit {code}: " + " | ".join(tail[-3:])
    return time.monotonic() - t0, peak, error


def met(f: dict[str, Any]) -> bool | None:
    """Whether a figure meets its target: `>= 2x` / `<= 1.5x` compare the ratio to the
    reference, `<= 500 ms` the value in its unit; None when there is nothing to compare."""
    m = re.fullmatch(r"(>=|<=)\s*([0-9.]+)\s*(\S*)", (f.get("target") or "").strip())
    if m is None or f.get("value") is None:
        return None
    op, bound, unit = m.group(1), float(m.group(2)), m.group(3)
    if unit == "x":
        if not f.get("reference_value"):
            return None
        value = f["value"] / f["reference_value"]
    elif unit == f["unit"]:
        value = f["value"]
    else:
        return None
    return value >= bound if op == ">=" else value <= bound


def table(figures: list[dict[str, Any]], runs: dict[str, tuple[float, float, str | None]]) -> str:
    def num(v: float | None, unit: str) -> str:
        if v is None:
            return ""
        if unit == "/s":
            return f"{v:,.0f}/s"
        return f"{v:,.1f} {unit}" if v < 100 else f"{v:,.0f} {unit}"

    rows = [("benchmark", "figure", "value", "reference (same run)", "ratio", "target", "met")]
    for f in figures:
        ref = (
            f"{f['reference']}: {num(f['reference_value'], f['unit'])}"
            if f["reference"] and f["reference_value"] is not None
            else ""
        )
        ratio = (
            f"{f['value'] / f['reference_value']:.2f}x"
            if f["reference_value"] and f["value"] is not None
            else ""
        )
        ok = met(f)
        verdict = "" if ok is None else "yes" if ok else "NO"
        rows.append(
            (f["bench"], f["name"], num(f["value"], f["unit"]), ref, ratio, f["target"] or "",
             verdict)
        )  # fmt: skip
    for name, (secs, peak, error) in runs.items():
        rows.append((name, "peak RSS of the process tree", f"{peak:,.0f} MB", "", "", "", ""))
        rows.append((name, "run time", f"{secs:,.0f} s", "", "", "", ""))
        if error:
            rows.append((name, "FAILED", error[:120], "", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(7)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="comma-separated benchmarks (default: all)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every size")
    args = ap.parse_args()
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = only - {n for n, _ in PLAN}
    if unknown:
        ap.error(f"unknown benchmarks {sorted(unknown)}; choose from {[n for n, _ in PLAN]}")
    plan = [(n, scaled(a, args.scale)) for n, a in PLAN if not only or n in only]
    runs: dict[str, tuple[float, float, str | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "figures.jsonl"
        results.touch()
        t0 = time.monotonic()
        for name, bench_args in plan:
            print(f"== bench.{name} {' '.join(bench_args)}", flush=True)
            runs[name] = run(name, bench_args, results)
        total = time.monotonic() - t0
        figures = [json.loads(line) for line in results.read_text().splitlines() if line]
    cpus = os.cpu_count()
    mem = next(
        (int(line.split()[1]) / 1024**2 for line in Path("/proc/meminfo").read_text().splitlines()
         if line.startswith("MemTotal")), 0.0,
    )  # fmt: skip
    print()
    print(f"walstream benchmark report — {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
          f"{cpus} cores, {mem:.0f} GB, Python {platform.python_version()}, "
          f"{total / 60:.1f} min")  # fmt: skip
    print()
    print(table(figures, runs))
    verdicts = [v for v in (met(f) for f in figures) if v is not None]
    print()
    print(f"targets met: {sum(verdicts)} of {len(verdicts)}")
    if any(err for _, _, err in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
