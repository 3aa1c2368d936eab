"""`walstream run -c` with a broken walstream.yaml: exit code 2 and one line per problem that
names the key (and never a connection string). Nothing starts: no Spark, no database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

GOOD: dict[str, Any] = {
    "sources": [{"name": "app", "dsn": "postgresql://walstream:s3cret@127.0.0.1:1/app"}],
    "sinks": [
        {"name": "files", "source": "app", "destination": {"type": "file", "path": "/tmp/x"}}
    ],
}


def run(tmp_path: Path, cfg: Any) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "walstream.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
    return subprocess.run(
        [sys.executable, "-m", "walstream.cli", "run", "-c", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def sink(**kw: Any) -> dict[str, Any]:
    return {**GOOD, "sinks": [{**GOOD["sinks"][0], **kw}]}


@pytest.mark.parametrize(
    ("cfg", "line"),
    [
        ({**GOOD, "sourcez": []}, "sourcez: unknown key (check its spelling and level)"),
        (sink(batch_size="many"), "sinks[0].batch_size: Input should be a valid integer"),
        (
            sink(destination={"type": "carrier-pigeon"}),
            "sinks[0].destination: Input tag 'carrier-pigeon' found using 'type' does not match",
        ),
        (sink(source="nope"), "sinks[0].source: 'nope' is not a source; sources are ['app']"),
        (
            {**GOOD, "sources": [{"name": "app", "dsn": "not a dsn s3cret"}]},
            "sources[0].dsn: not a Postgres connection string",
        ),
        ({"sinks": GOOD["sinks"]}, "sources: required key is missing"),
        ("sources: [oops", "is not valid YAML"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "unknown-sink-type",
        "missing-source",
        "bad-dsn",
        "no-sources",
        "bad-yaml",
    ],
)
def test_config_error_exits_2_naming_the_key(tmp_path, cfg, line):
    out = run(tmp_path, cfg)
    assert out.returncode == 2, out.stdout + out.stderr
    assert line in out.stderr
    assert out.stderr.startswith("error: ")
    assert "fix: " in out.stderr
    assert "s3cret" not in out.stderr + out.stdout  # a connection string is never echoed
    assert "Traceback" not in out.stderr
    assert "starting Spark" not in out.stdout  # nothing started


def test_missing_config_file_says_how_to_get_one(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "walstream.cli", "run", "-c", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"config file {tmp_path / 'nope.yaml'} does not exist" in out.stderr


@pytest.mark.parametrize(
    ("transform", "problem"),
    [
        ("nosuch_module_xyz:fn", "No module named 'nosuch_module_xyz'"),
        ("json:no_such_function", "module 'json' has no attribute 'no_such_function'"),
        ("json:__name__", "transform 'json:__name__' is not a function"),
    ],
    ids=["no-module", "no-function", "not-callable"],
)
def test_a_transform_that_cannot_be_imported_exits_2_before_anything_starts(
    tmp_path, transform, problem
):
    out = run(tmp_path, sink(transform=transform))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: sink files: " in out.stderr and problem in out.stderr
    assert "nothing was started" in out.stderr and "Traceback" not in out.stderr
    assert "starting Spark" not in out.stdout
