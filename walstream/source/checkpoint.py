"""Read where a Structured Streaming checkpoint resumes, and repair what a killed driver
leaves in a local one.

Spark writes each offset-log and commit-log entry to a hidden temporary file
(`offsets/.0.<uuid>.tmp`) and renames it into place. kill -9 between the two
leaves the temporary file behind. For every batch but the first this is
harmless. For batch 0, Spark 4 refuses to start while `offsets/` holds any
file (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), so a crash during a query's
very first batch would stop every restart.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from walstream.errors import SetupError

log = logging.getLogger(__name__)
_PARTIAL = re.compile(r"^\..*\.tmp$")


def remove_partial_writes(checkpoint: str) -> list[Path]:
    """Delete interrupted writes under a local checkpoint's offsets/ and commits/.

    Call it only while no query uses the checkpoint. Remote checkpoints (hdfs://,
    s3a://) are left alone. Returns the files removed.
    """
    if is_remote(checkpoint):
        return []
    root = _local_root(checkpoint)
    removed = []
    for log_dir in (root / "offsets", root / "commits"):
        if not log_dir.is_dir():
            continue
        for f in log_dir.iterdir():
            if _PARTIAL.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)
                removed.append(f)
    if removed:
        log.warning(
            "checkpoint %s: removed %d unfinished write(s) left by a crash: %s",
            checkpoint,
            len(removed),
            ", ".join(f.name for f in removed),
        )
    return removed


def _local_root(checkpoint: str) -> Path:
    """A local checkpoint's directory (a path, or a file: URI)."""
    url = urlparse(checkpoint)
    return Path(url.path if url.scheme else checkpoint)


def is_remote(checkpoint: str) -> bool:
    """Whether the checkpoint is on a Hadoop file system other than the local one."""
    return urlparse(checkpoint).scheme not in ("", "file")


def committed_lsn(checkpoint: str, spark: Any | None = None) -> int | None:
    """The LSN a query of walstream's source resumes from: where the last batch its
    checkpoint committed ended; None when none committed (the query starts fresh from
    its slot). A local checkpoint is read directly, a remote one (hdfs://, s3a://, ...)
    through `spark`'s Hadoop file system, with Spark's own settings for it.

    SetupError when the checkpoint cannot be read: resuming blind would take a dropped
    slot for a first start and skip the changes in between."""
    try:
        text = _remote(spark, checkpoint) if is_remote(checkpoint) else _local(checkpoint)
    except (OSError, ValueError, RuntimeError) as exc:
        raise SetupError(
            f"cannot read the streaming checkpoint {checkpoint}: {str(exc).strip()[:300]}",
            "check that spark.checkpoint_dir is reachable and readable (for a remote one, "
            "Spark's settings for its file system: spark.hadoop.*)",
        ) from exc
    for line in reversed((text or "").splitlines()):  # v1, the batch's metadata, the offset
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict) and "lsn" in offset:
            return int(offset["lsn"])
    return None


def _local(checkpoint: str) -> str | None:
    """The offset-log entry of the last committed batch (None: none committed)."""
    root = _local_root(checkpoint)
    try:
        batches = [int(f.name) for f in (root / "commits").iterdir() if f.name.isdigit()]
    except FileNotFoundError:
        return None
    return (root / "offsets" / str(max(batches))).read_text() if batches else None


def _remote(spark: Any | None, checkpoint: str) -> str | None:
    """`_local` through Spark's Hadoop FileSystem (py4j)."""
    if spark is None:
        raise RuntimeError("a remote checkpoint is read through Spark, which is not started")
    from py4j.protocol import Py4JError

    try:
        hadoop = spark._jvm.org.apache.hadoop.fs
        root = hadoop.Path(checkpoint)
        fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
        commits = hadoop.Path(root, "commits")
        if not fs.exists(commits):
            return None
        names = [s.getPath().getName() for s in fs.listStatus(commits)]
        batches = [int(n) for n in names if n.isdigit()]
        if not batches:
            return None
        stream = fs.open(hadoop.Path(root, f"offsets/{max(batches)}"))
        try:
            return str(spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
    except Py4JError as exc:
        raise OSError(str(exc).strip().splitlines()[0]) from exc


def check_staging(checkpoint_dir: str) -> None:
    """SetupError unless pyarrow opens `checkpoint_dir`: backfills and lake sinks stage
    their files under it (on the executors too) through pyarrow's file systems."""
    from pyarrow import fs as pafs

    try:
        pafs.FileSystem.from_uri(checkpoint_dir)
    except (OSError, ValueError) as exc:
        raise SetupError(
            f"spark.checkpoint_dir {checkpoint_dir}: walstream stages backfill chunks and lake "
            f"files under it through pyarrow, which cannot open it ({str(exc).strip()[:200]})",
            "use a location both Spark and pyarrow open: a local or mounted (NFS) path, s3:// "
            "(Spark reads it with spark.hadoop.fs.s3.impl = "
            "org.apache.hadoop.fs.s3a.S3AFileSystem), gs://, or hdfs:// where libhdfs is installed",
        ) from exc
