"""Spark's classes kept in a class data sharing archive, so the driver JVM starts sooner.

A Spark start loads some 20,000 classes from ~250 jars, searching the jars one after
the other for each: on a 2-core machine about 4-5 s of an 11 s `SparkSession` start.
Java's class data sharing (CDS) keeps loaded classes in an archive file that later
JVMs map instead of loading them again (measured: 11.2 s -> 6.3-7.1 s to a running
session). `save_classes.py` writes the archive (`bin/setup` runs it once: `python -m
walstream.pipeline.save_classes`, and so can a user after `pip install`; walstream works
without it, only starts slower). `archive_options` gives a local driver JVM the
archive when one was saved for this Java and these jars. The JVM checks the archive
against its class path itself and ignores it, silently, when the jars changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The JVM says nothing about the archive (a mismatch only costs the speed-up).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: What the saving job runs (save_classes._job); a new one saves a new archive.
JOB = 2  # 2: with a streaming query into a foreachBatch


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "walstream"


def archive_path(java_home: Path) -> Path:
    """Where the archive for this Java and this PySpark's jars lives (it may not exist)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    h = hashlib.sha256(f"{JOB}:{java_home.resolve()}".encode())
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
