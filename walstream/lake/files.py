"""A changelog table's data files written on the executors, committed by the driver.

A changelog table takes every change as a new row: nothing in a batch depends on the
rows the table has. So its rows need not come to the driver. Each task types its
part of the batch (`typed.py`), writes it as one Parquet file under the sink's
staging directory (in the checkpoint directory, which every executor reaches), and
returns the file's name and counts. The driver then commits the files into the table
as they are, in one commit with the batch's marker (`TableSink.adopt_files`). When
the table's columns differ from the files' (a column added or widened at the source
since the table was written), the driver reads the files back and writes the batch
the way it writes any other (`write_batch`), which changes the table's schema first.

Mirror and history tables still write from the driver: their MERGE reads the rows
the table has (see docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from walstream.decode.table_shape import TableShape
from walstream.engine.frames import map_in_arrow
from walstream.errors import SinkError
from walstream.lake.plan import changelog_rows
from walstream.lake.typed import to_batch, typed_rows

_STATS_DDL = "path STRING, rows BIGINT, newest_us BIGINT, problem STRING, fix STRING"
#: A TableBatch's columns around the table's own (a changelog file has them in its order).
_BEFORE, _AFTER = ("_op", "_lsn", "_seq", "_committed_at", "_toast"), ("_before",)


@dataclass(frozen=True)
class StagedFiles:
    """What the executors wrote for one table of a batch."""

    #: (staged file, a name unique to it among the table's data files)
    files: tuple[tuple[str, str], ...]
    rows: int
    newest_us: int  # the newest commit time among the rows (µs)

    def as_batch_rows(self, shape: TableShape) -> Any:
        """The files' rows as a TableBatch's rows (for `write_batch`), in WAL order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        parts = [pq.read_table(path) for path, _ in self.files]
        table = pa.concat_tables(parts)
        return table.select([*_BEFORE, *shape.names, *_AFTER]).sort_by(
            [("_lsn", "ascending"), ("_seq", "ascending")]
        )


def stage_changelog(
    rows: Any, shape: TableShape, stage: str, name: str, only: bool = False
) -> StagedFiles:
    """Write the table's changes among `rows` (the batch's change rows) as changelog
    files under `stage` (a directory of this batch and table, emptied first), one per
    task; `name` prefixes their names in the table. A value its column cannot hold
    fails the batch here, as on the driver (a SinkError, not retryable). `only`: see
    `typed_rows`."""
    _empty(stage)
    typed = typed_rows(rows, shape, only=only, whole_before=True)
    out = map_in_arrow(typed, _writer(shape, stage), _STATS_DDL).collect()
    for r in out:
        if r.problem is not None:
            raise SinkError(r.problem, r.fix, retryable=False)
    written = sorted((r for r in out if r.rows), key=lambda r: r.path)
    return StagedFiles(
        tuple((r.path, f"{name}-{i}.parquet") for i, r in enumerate(written)),
        sum(r.rows for r in written),
        max((r.newest_us for r in written), default=0),
    )


def _empty(stage: str) -> None:
    """`stage` as an empty directory (a failed try of the batch may have left files)."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(stage)
    filesystem.create_dir(path, recursive=True)
    filesystem.delete_dir_contents(path, missing_dir_ok=True)


def discard(stage: str) -> None:
    """Remove `stage` and what is left in it (files a replayed or rewritten batch did not
    commit)."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(stage)
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_dir(path)


def _writer(shape: TableShape, stage: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: this task's typed rows as one changelog file."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from pyarrow import fs as pafs
        from pyspark import TaskContext

        schema = pa.schema(
            [
                ("path", pa.string()),
                ("rows", pa.int64()),
                ("newest_us", pa.int64()),
                ("problem", pa.string()),
                ("fix", pa.string()),
            ]
        )
        got = [b for b in batches if b.num_rows]
        if not got:
            return
        try:
            rows = changelog_rows(to_batch(pa.Table.from_batches(got), shape), shape.names)
        except SinkError as exc:
            yield pa.RecordBatch.from_pylist(
                [{"path": "", "rows": 0, "newest_us": 0, "problem": exc.problem, "fix": exc.fix}],
                schema=schema,
            )
            return
        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        filesystem, root = pafs.FileSystem.from_uri(stage)
        path = f"{root}/part-{part:05d}.parquet"
        pq.write_table(rows, path, filesystem=filesystem)
        newest = pc.max(rows["_committed_at"]).cast(pa.int64()).as_py() or 0
        uri = f"{stage.rstrip('/')}/part-{part:05d}.parquet"
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "path": uri,
                    "rows": rows.num_rows,
                    "newest_us": newest,
                    "problem": None,
                    "fix": None,
                }
            ],
            schema=schema,
        )

    return run
