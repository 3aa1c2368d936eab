"""The Spark settings walstream starts with: a local master sized for a small machine,
a cluster left to Spark, the user's settings over walstream's."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from walstream.config import parse_config
from walstream.engine.session import (
    ARROW_NO_BYTE_BOUND,
    LOG_PROFILE,
    SMALL_MACHINE_JIT,
    spark_conf,
    spark_environment,
)
from walstream.errors import SetupError


@pytest.fixture(autouse=True)
def no_saved_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests see no saved class archive (test_classes.py covers one), on a machine
    with cores to spare unless they say otherwise."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)


SOURCES = [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:5432/app"}]
SINKS = [{"name": "out", "source": "app", "destination": {"type": "file", "path": "/tmp/x"}}]


def conf_of(spark: dict[str, Any], quiet: bool = True) -> dict[str, str]:
    return spark_conf(parse_config({"spark": spark, "sources": SOURCES, "sinks": SINKS}), quiet)


#: A local master's JVM options: the serial collector, a small young generation, and an old
#: generation kept near what is live.
JVM = "-XX:+UseSerialGC -Xms64m -XX:MaxNewSize=64m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=25"


def test_a_local_master_gets_a_small_heap_and_the_serial_collector():
    conf = conf_of({"master": "local[*]"})
    assert conf["spark.driver.memory"] == "512m"
    assert conf["spark.driver.extraJavaOptions"] == (
        f"-Dlog4j2.configurationFile={LOG_PROFILE.as_uri()} {JVM}"
    )
    assert conf_of({"master": "local[2]"}, quiet=False)["spark.driver.extraJavaOptions"] == JVM


def test_two_cores_get_only_the_quick_jit_compiler(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert SMALL_MACHINE_JIT == "-XX:TieredStopAtLevel=1"
    assert conf_of({"master": "local[*]"}, quiet=False)["spark.driver.extraJavaOptions"] == (
        f"{JVM} -XX:TieredStopAtLevel=1"
    )
    user = "-XX:TieredStopAtLevel=4"  # the user's comes last and wins
    conf = conf_of({"master": "local[2]", "conf": {"spark.driver.extraJavaOptions": user}}, False)
    assert conf["spark.driver.extraJavaOptions"].endswith(f"{SMALL_MACHINE_JIT} {user}")
    assert "spark.driver.extraJavaOptions" not in conf_of({"master": "spark://h:7077"}, False)


def test_a_cluster_master_keeps_sparks_memory_defaults():
    conf = conf_of({"master": "spark://10.0.0.1:7077"}, quiet=False)
    assert "spark.driver.memory" not in conf
    assert "spark.driver.extraJavaOptions" not in conf


def test_the_users_settings_win():
    conf = conf_of({
        "master": "local[2]",
        "conf": {"spark.driver.memory": "2g", "spark.driver.extraJavaOptions": "-Xms256m"},
    }, quiet=False)  # fmt: skip
    assert conf["spark.driver.memory"] == "2g"
    # theirs come last: the JVM takes the last -Xms
    assert conf["spark.driver.extraJavaOptions"] == f"{JVM} -Xms256m"


def test_a_users_collector_replaces_walstreams_jvm_options():
    conf = conf_of(
        {"master": "local[2]", "conf": {"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}},
        quiet=False,
    )
    assert conf["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"


@pytest.mark.parametrize("master", ["local[2]", "spark://cluster:7077"])
def test_arrow_batches_to_python_are_bounded_by_rows_only(master):
    conf = conf_of({"master": master})
    assert (
        conf["spark.sql.execution.arrow.maxBytesPerBatch"]
        == "2147483647"
        == str(ARROW_NO_BYTE_BOUND)
    )
    assert "spark.sql.execution.arrow.maxRecordsPerBatch" not in conf  # Spark's 10,000
    mine = {"master": master, "conf": {"spark.sql.execution.arrow.maxBytesPerBatch": "64m"}}
    assert conf_of(mine)["spark.sql.execution.arrow.maxBytesPerBatch"] == "64m"


MALLOC = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """What spark_environment sets, unset now and restored after the test."""
    for k in (*MALLOC, "PYSPARK_PYTHON", "SPARK_LOCAL_IP", "JAVA_HOME"):
        monkeypatch.setenv(k, "-")  # recorded, so the test's changes are undone
        monkeypatch.delenv(k)
    return monkeypatch


def test_a_local_masters_processes_give_large_freed_blocks_back(clean_environment):
    spark_environment("local[2]")
    assert {k: os.environ.get(k) for k in MALLOC} == {
        "MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "4194304"
    }  # fmt: skip


def test_the_environments_allocator_settings_win(clean_environment):
    clean_environment.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    spark_environment("local[*]")
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "131072"
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "4194304"


def test_a_cluster_keeps_the_allocators_defaults(clean_environment):
    spark_environment("spark://127.0.0.1:7077")
    assert [k for k in MALLOC if k in os.environ] == []


def test_a_cluster_master_needs_a_host_name_that_resolves(clean_environment):
    clean_environment.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    with pytest.raises(SetupError, match="does not resolve") as err:
        spark_environment("spark://10.0.0.1:7077")
    assert "export SPARK_LOCAL_IP=" in str(err.value.fix)
    clean_environment.setenv("SPARK_LOCAL_IP", "10.0.0.2")  # what the error says to do
    spark_environment("spark://10.0.0.1:7077")
