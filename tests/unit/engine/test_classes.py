"""Spark's saved classes (class data sharing): a local driver JVM gets the archive when one
was saved for this Java and these jars, nothing otherwise; a JVM never fails over it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from walstream.config import parse_config
from walstream.engine.classes import QUIET, archive_options, archive_path
from walstream.engine.session import find_java, spark_conf
from walstream.pipeline.save_classes import KEEP, _prune

SOURCES = [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:5432/app"}]
SINKS = [{"name": "out", "source": "app", "destination": {"type": "file", "path": "/tmp/x"}}]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("WALSTREAM_CLASS_ARCHIVE", raising=False)
    return tmp_path / "walstream"


def java_options(master: str, user: str = "") -> str:
    spark = {"master": master, "conf": {"spark.driver.extraJavaOptions": user} if user else {}}
    conf = spark_conf(parse_config({"spark": spark, "sources": SOURCES, "sinks": SINKS}), False)
    return conf.get("spark.driver.extraJavaOptions", "")


def test_the_archive_is_used_once_saved_and_the_users_options_still_win(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = archive_path(find_java())
    assert path.parent == cache and path.suffix == ".jsa"
    assert archive_options(find_java()) is None
    assert "SharedArchiveFile" not in java_options("local[2]")

    path.parent.mkdir(parents=True)
    path.write_bytes(b"saved classes")
    assert archive_options(find_java()) == f"-XX:SharedArchiveFile={path} {QUIET}"
    opts = java_options("local[2]", user="-Xshare:off")
    assert f"-XX:SharedArchiveFile={path}" in opts
    assert opts.endswith("-Xshare:off")  # later options win: the user can turn it off
    assert "SharedArchiveFile" not in java_options("spark://10.0.0.1:7077")  # not a local JVM

    monkeypatch.setenv("WALSTREAM_CLASS_ARCHIVE", "off")
    assert "SharedArchiveFile" not in java_options("local[2]")


def test_another_java_has_its_own_archive(cache: Path, tmp_path: Path) -> None:
    assert archive_path(find_java()) != archive_path(tmp_path)


def test_a_jvm_starts_quietly_with_an_archive_it_cannot_use(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsa"
    bad.write_bytes(b"not an archive")
    java = find_java() / "bin" / "java"
    done = subprocess.run(
        [str(java), f"-XX:SharedArchiveFile={bad}", *QUIET.split(), "-version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # it runs without (no -Xshare:on)
    assert "version" in done.stderr


def test_only_the_newest_archives_are_kept(tmp_path: Path) -> None:
    import os

    names = [f"spark-4.3.0-{i:012x}.jsa" for i in range(KEEP + 2)]
    for age, name in enumerate(names):  # names[0] is the newest
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "other.txt").write_text("not ours")
    _prune(tmp_path)
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted([*names[:KEEP], "other.txt"])
