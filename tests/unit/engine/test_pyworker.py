"""Spark's Python workers on a local master import the installed PySpark, not pyspark.zip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from walstream.engine.pyworker import bundled_zips, worker_python

SHOW = "import os, sys; print(os.environ.get('PYTHONPATH')); print(sys.argv[1:]); sys.exit(3)"


def test_the_wrapper_drops_only_the_bundled_zip_and_runs_this_python(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    zip_path, py4j = bundled_zips()
    assert zip_path.name == "pyspark.zip" and py4j.name.startswith("py4j-")
    wrapper = worker_python()
    assert Path(wrapper).parent == tmp_path / "walstream" and os.access(wrapper, os.X_OK)
    entries = ["/a dir/with space", str(zip_path), "/other/pyspark.zip", str(py4j), "/b"]
    env = {**os.environ, "PYTHONPATH": ":".join(entries)}
    run = subprocess.run([wrapper, "-c", SHOW, "x y", "*"], env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 3, run.stderr
    path, argv = run.stdout.splitlines()
    assert path == "/a dir/with space:/other/pyspark.zip:/b"
    assert argv == "['x y', '*']"
    # nothing left: no PYTHONPATH at all (an empty one would add the working directory)
    env["PYTHONPATH"] = f"{zip_path}:{py4j}"
    run = subprocess.run([wrapper, "-c", SHOW], env=env, capture_output=True, text=True)
    assert run.stdout.splitlines()[0] == "None"
    assert worker_python() == wrapper  # written once, then reused


def test_a_spark_home_of_its_own_keeps_sparks_way(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.3.0-bin-hadoop3"))
    assert bundled_zips() == []
    assert worker_python() == sys.executable
    assert not (tmp_path / "walstream").exists()


def test_no_cache_directory_keeps_sparks_way(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # not a directory
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert worker_python() == sys.executable


@pytest.mark.spark
def test_the_sessions_workers_import_the_installed_pyspark(spark: Any) -> None:
    import pyspark

    def where(_: Any) -> Any:
        import sys

        import py4j
        import pyspark

        yield pyspark.__file__, py4j.__file__, [p for p in sys.path if p.endswith(".zip")]

    (found,) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    import py4j

    zips = [p for p in found[2] if not p.endswith("python311.zip")]  # the stdlib's slot
    assert (found[0], found[1], zips) == (pyspark.__file__, py4j.__file__, [])
