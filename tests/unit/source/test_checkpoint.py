"""Where a local checkpoint resumes, read from its commit and offset logs as Spark wrote
them; a log that cannot be read is an error, never taken for a first start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from walstream.errors import SetupError
from walstream.source.checkpoint import committed_lsn, is_remote


def write_batch(root: Path, n: int, lsn: int, committed: bool = True) -> None:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    offset = {"lsn": lsn, "seq": 0}
    (root / "offsets" / str(n)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(offset)}")
    if committed:
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_last_committed_batch_is_where_it_resumes(tmp_path: Path) -> None:
    assert committed_lsn(str(tmp_path / "none")) is None  # no checkpoint: a first start
    write_batch(tmp_path, 0, 100)
    write_batch(tmp_path, 1, 250)
    write_batch(tmp_path, 2, 400, committed=False)  # planned, not committed
    (tmp_path / "commits" / ".3.abc.tmp").write_text("partial")
    assert committed_lsn(str(tmp_path)) == 250
    assert committed_lsn(tmp_path.as_uri()) == 250


def test_a_commit_without_its_offsets_is_an_error_not_a_first_start(tmp_path: Path) -> None:
    write_batch(tmp_path, 0, 100)
    (tmp_path / "offsets" / "0").unlink()
    with pytest.raises(SetupError, match=r"cannot read the streaming checkpoint") as err:
        committed_lsn(str(tmp_path))
    assert "spark.checkpoint_dir" in (err.value.fix or "")


def test_a_remote_checkpoint_needs_spark_to_be_read() -> None:
    assert is_remote("s3a://bucket/ckpt") and is_remote("hdfs://nn/ckpt")
    assert not is_remote("/var/ckpt") and not is_remote("file:///var/ckpt")
    with pytest.raises(SetupError, match="read through Spark, which is not started"):
        committed_lsn("s3a://bucket/ckpt/app")
