"""File sink (`type: file`): one file per micro-batch and partition, written atomically.

`path/batch-<batch id>-part-<partition>.jsonl` (one message per line) or `.parquet`.
A partition is written to a hidden temporary file and renamed into place when it
is complete, so readers never see half a batch, and a replayed batch id
replaces its files instead of adding duplicates.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from walstream.errors import SinkError
from walstream.fields import LocalPath
from walstream.sinks.base import (
    BatchInfo,
    BatchSink,
    Capabilities,
    DestinationSettings,
    Kind,
    Message,
)
from walstream.sinks.registry import register


class FileDestination(DestinationSettings):
    type: Literal["file"]
    path: LocalPath
    format: Literal["jsonl", "parquet"] = "jsonl"

    def for_shard(self, shard: int) -> FileDestination:
        """Each shard's copy writes under `shard-<i>` (the shards' batch ids overlap)."""
        return self.model_copy(update={"path": self.path / f"shard-{shard}"})

    def read_back(self) -> list[bytes]:
        return read_messages(self.path, self.format)


_NAME = re.compile(r"^batch-(\d+)-part-(\d+)\.(jsonl|parquet)$")


def batch_file(path: Path, batch_id: int, partition: int, fmt: str) -> Path:
    return path / f"batch-{batch_id:012d}-part-{partition:04d}.{fmt}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@register
class FileSink(BatchSink):
    settings_model = FileDestination
    capabilities = Capabilities(Kind.BATCHES, columns=True)
    config: FileDestination

    def begin(self, batch: BatchInfo) -> None:
        super().begin(batch)
        self.path = Path(self.config.path)
        self.target = batch_file(self.path, batch.batch_id, batch.partition, self.config.format)
        self.tmp = self.target.with_name(f".{self.target.name}.{os.getpid()}.tmp")
        self._file: IO[bytes] | None = None
        self._writer: Any = None  # parquet: one row group per delivered chunk

    def deliver(self, messages: Sequence[Message]) -> None:
        with self._writing():
            if self.config.format == "parquet":
                self._write_row_group(messages)
            else:
                self._write_lines(
                    b"".join(m.value + b"\n" for m in messages if m.value is not None)
                )

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError while writing is a retryable SinkError naming the file."""
        try:
            yield
        except OSError as exc:
            raise SinkError(
                f"cannot write {self.tmp}: {exc}",
                "check that the directory is writable and the disk has space",
                retryable=True,
            ) from exc

    def _write_lines(self, data: bytes) -> None:
        if self._file is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._file = self.tmp.open("wb")
        self._file.write(data)

    def deliver_columns(self, batch: Any) -> None:
        """Messages formatted by Spark, written column by column (no step per message)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        col = dict(zip(batch.schema.names, batch.columns, strict=True))
        with self._writing():
            if self.config.format == "parquet":
                self._open_parquet()
                table = pc.binary_join_element_wise(col["schema"], col["table"], ".")
                arrays = [
                    col["lsn"].cast(pa.int64()),
                    col["seq"].cast(pa.int64()),
                    col["_ikey"].cast(pa.string()),
                    table.cast(pa.string()),
                    col["action"].cast(pa.string()),
                    col["_key"].cast(pa.string()),
                    col["_message"].cast(pa.string()),
                ]
                self._writer.write_batch(
                    pa.RecordBatch.from_arrays(arrays, schema=_parquet_schema(pa))
                )
            else:
                self._write_lines(("\n".join(col["_message"].to_pylist()) + "\n").encode())

    def _open_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._file = self.tmp.open("wb")
            self._writer = pq.ParquetWriter(self._file, _parquet_schema(pa))

    def finish(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
                f, self._file = self._file, None
                assert f is not None
                if not f.closed:
                    f.close()
                with open(self.tmp, "rb") as done:  # durable before the rename
                    os.fsync(done.fileno())
            elif self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None
            else:
                return
            os.replace(self.tmp, self.target)
            _fsync_dir(self.path)
        except OSError as exc:
            raise SinkError(
                f"cannot complete {self.target}: {exc}",
                "check that the directory is writable and the disk has space",
                retryable=True,
            ) from exc

    def _write_row_group(self, messages: Sequence[Message]) -> None:
        """The chunk as one Parquet row group, built column by column (memory: one chunk)."""
        import pyarrow as pa

        self._open_parquet()
        keys = [m.key for m in messages]
        values = [m.value for m in messages]
        columns = [
            pa.array([m.lsn for m in messages], pa.int64()),
            pa.array([m.seq for m in messages], pa.int64()),
            pa.array([m.idempotency_key for m in messages], pa.string()),
            pa.array([m.table for m in messages], pa.string()),
            pa.array([m.action for m in messages], pa.string()),
            pa.array(keys, pa.binary()).cast(pa.string()),
            pa.array(values, pa.binary()).cast(pa.string()),
        ]
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=_parquet_schema(pa)))

    def close(self) -> None:
        if getattr(self, "_writer", None) is not None:
            with contextlib.suppress(Exception):  # an error is already on its way up
                self._writer.close()
        if getattr(self, "_file", None) is not None:
            assert self._file is not None
            self._file.close()
        if hasattr(self, "tmp"):
            with contextlib.suppress(FileNotFoundError):
                self.tmp.unlink()

    def test_connection(self) -> None:
        path = Path(self.config.path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".walstream-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SinkError(
                f"cannot write to {path}: {exc}",
                "choose a writable directory for destination.path",
                retryable=False,
            ) from exc

    def prepare_batch(self, sink: str, batch_id: int, partitions: int) -> None:
        """Before a (re)run of a batch: drop its leftovers a differently split run may have left."""
        path = Path(self.config.path)
        if not path.is_dir():
            return
        for f in path.iterdir():
            m = _NAME.match(f.name)
            if (m and int(m.group(1)) == batch_id and int(m.group(2)) >= partitions) or (
                f.name.startswith(f".batch-{batch_id:012d}-") and f.name.endswith(".tmp")
            ):
                f.unlink(missing_ok=True)


def _parquet_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("lsn", pa.int64()),
            ("seq", pa.int64()),
            ("idempotency_key", pa.string()),
            ("table", pa.string()),
            ("action", pa.string()),
            ("key", pa.string()),
            ("message", pa.string()),
        ]
    )


def read_messages(path: str | Path, fmt: str = "jsonl") -> list[bytes]:
    """Every message under `path` (in `fmt`), in batch and partition order (for tests and
    tools)."""
    out: list[bytes] = []
    for f in sorted(Path(path).glob(f"batch-*-part-*.{fmt}")):
        if fmt == "parquet":
            import pyarrow.parquet as pq

            out.extend(
                m.encode() for m in pq.read_table(f, columns=["message"])["message"].to_pylist()
            )
        else:
            out.extend(line for line in f.read_bytes().split(b"\n") if line)
    return out
