"""Spark's classes kept in a class data sharing archive, so the driver JVM starts sooner.

A Spark start loads some 20,000 classes from ~250 jars, searching the jars one after
the other for each: on a 2-core machine about 4-5 s of an 11 s `SparkSession` start.
Java's class data sharing (CDS) keeps loaded classes in an archive file that later
JVMs map instead of loading them again (measured: 11.2 s -> 6.3-7.1 s to a running
session). `build_archive` runs a small job of the kinds walstream runs (SQL message
formats, `mapInArrow`, the registered data source) in a JVM that writes the archive
as it exits; `bin/setup` runs it once (`python -m walstream.spark.classes`), and so
can a user after `pip install` (`walstream` works without it, only starts slower).
`archive_options` gives a local driver JVM the archive when one was built for this
Java and these jars. The JVM checks the archive against its class path itself and
ignores it, silently, when the jars changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: The JVM says nothing about the archive (a mismatch only costs the speed-up).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: Archives kept in the cache, newest first (each virtualenv's jars have their own).
KEEP = 3


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "walstream"


def archive_path(java_home: Path) -> Path:
    """Where the archive for this Java and this PySpark's jars lives (it may not exist)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    h = hashlib.sha256(str(java_home.resolve()).encode())
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return cache_dir() / f"spark-{pyspark.__version__}-{h.hexdigest()[:12]}.jsa"


def archive_options(java_home: Path) -> str | None:
    """The driver JVM's options that use the archive, or None when none was built."""
    if os.environ.get("WALSTREAM_CLASS_ARCHIVE", "on") == "off":
        return None
    path = archive_path(java_home)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else None


def build_archive(force: bool = False) -> Path | None:
    """Write the archive (in a child process: its JVM writes it when it exits); its path,
    or None when it could not be written (the reason is logged)."""
    from walstream.spark.session import find_java

    path = archive_path(find_java())
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "walstream.spark.classes", "--job", str(partial)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "WALSTREAM_CLASS_ARCHIVE": "off"},  # it writes one, uses none
    )  # fmt: skip
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        log.warning(
            "could not save Spark's classes for faster starts (%s); walstream runs without",
            (done.stderr.strip().splitlines() or ["no output"])[-1],
        )
        return None
    partial.replace(path)  # whole, or not there: a JVM never maps a half-written one
    log.info("saved Spark's classes in %s (%.0fs)", path, time.monotonic() - t0)
    _prune(path.parent)
    return path


def _prune(folder: Path) -> None:
    """Keep the KEEP newest archives (~160 MB each): one per Java and PySpark install."""
    saved = sorted(folder.glob("spark-*.jsa"), key=lambda f: f.stat().st_mtime, reverse=True)
    for old in saved[KEEP:]:
        old.unlink(missing_ok=True)
        log.info("removed an older archive of Spark's classes: %s", old)


def _job(target: Path) -> None:
    """The representative job, in a JVM that writes the archive to `target` at exit."""
    import walstream
    from walstream.config import parse_config
    from walstream.formats import sql_format, sql_idempotency_key
    from walstream.spark.session import build_spark

    cfg = parse_config({
        "spark": {"master": "local[1]", "conf": {
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target} {QUIET}",
        }},
        "sources": [{"name": "app", "dsn": "postgresql://walstream@127.0.0.1:1/app"}],
        "sinks": [{"name": "out", "source": "app",
                   "destination": {"type": "file", "path": "/nonexistent"}}],
    })  # fmt: skip
    spark = build_spark(cfg)
    walstream.register(spark)
    rows = spark.range(0, 1000).selectExpr(
        "'app' AS source", "id AS lsn", "CAST(id % 7 AS INT) AS seq", "id AS xid",
        "timestamp_micros(id) AS committed_at", "'insert' AS action", "'public' AS schema",
        "'t' AS table", "array(CAST(id AS STRING)) AS pk", "to_json(named_struct('id', id)) AS record",
        "CAST(NULL AS STRING) AS old", "CAST(NULL AS STRING) AS annotations",
    )  # fmt: skip
    for name in ("sequin", "debezium"):
        message = sql_format(name, sink="out", db="app", backfill=False)
        ikey = sql_idempotency_key(False)
        out = rows.selectExpr("*", f"{message} AS _message", f"{ikey} AS _ikey").repartition(2)

        def same(batches: object) -> object:
            yield from batches  # type: ignore[misc]

        out.mapInArrow(same, out.schema).where("lsn % 100 = 0").collect()
    spark.stop()


def main() -> None:
    if sys.argv[1:2] == ["--job"]:
        _job(Path(sys.argv[2]))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(0 if build_archive(force="--force" in sys.argv) else 1)


if __name__ == "__main__":
    main()
