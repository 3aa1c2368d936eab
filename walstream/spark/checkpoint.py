"""Repair what a killed driver leaves in a local Structured Streaming checkpoint.

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
from urllib.parse import urlparse

log = logging.getLogger(__name__)
_PARTIAL = re.compile(r"^\..*\.tmp$")


def remove_partial_writes(checkpoint: str) -> list[Path]:
    """Delete interrupted writes under a local checkpoint's offsets/ and commits/.

    Call it only while no query uses the checkpoint. Remote checkpoints (hdfs://,
    s3a://) are left alone. Returns the files removed.
    """
    url = urlparse(checkpoint)
    if url.scheme not in ("", "file"):
        return []
    root = Path(url.path if url.scheme else checkpoint)
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
            checkpoint, len(removed), ", ".join(f.name for f in removed),
        )  # fmt: skip
    return removed


def committed_lsn(checkpoint: str) -> int | None:
    """The LSN a query of walstream's source resumes from: where the last batch its local
    checkpoint committed ended. None when none committed (the query starts fresh from its
    slot), or the checkpoint is remote or unreadable."""
    url = urlparse(checkpoint)
    if url.scheme not in ("", "file"):
        return None
    root = Path(url.path if url.scheme else checkpoint)
    try:
        batches = [int(f.name) for f in (root / "commits").iterdir() if f.name.isdigit()]
        if not batches:
            return None
        lines = (root / "offsets" / str(max(batches))).read_text().splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):  # v1, the batch's metadata, then the source's offset
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict) and "lsn" in offset:
            return int(offset["lsn"])
    return None
