"""A table's data files written on the executors, committed by the driver.

A changelog table takes every change as a new row: nothing in a batch depends on the
rows the table has. So its rows need not come to the driver. Each task types its
part of the batch (`typed.py`), writes it as one Parquet file under the sink's
staging directory (in the checkpoint directory, which every executor reaches), and
returns the file's name and counts. The driver then commits the files into the table
as they are, in one commit with the batch's marker (`TableSink.adopt_files`). When
the table's columns differ from the files' (a column added or widened at the source
since the table was written), the driver reads the files back and writes the batch
the way it writes any other (`write_batch`), which changes the table's schema first.

A merge-on-read mirror's or history's (`stage_by_key`): the batch is shuffled by key, so
each key's changes are in one task, which types them, keeps each key's newest version (a
history: makes every change a version), writes those as one file and returns the keys it
touched (a history: when each key's current version ends); the driver deletes the table's
rows of those keys (its key index; a history appends them closed) and commits the files.
A key whose unchanged TOAST value only the table has comes to the driver as its changes;
a truncate or a key change sends the whole batch the driver's way (docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from walstream.decode.table_shape import TableShape
from walstream.engine.frames import map_in_arrow
from walstream.errors import SinkError
from walstream.lake.contract import ENDS, StagedRows
from walstream.lake.plan import (
    changelog_rows,
    fill_toast,
    from_target,
    history_plan,
    history_schema,
    key_changes,
    mirror_plan,
)
from walstream.lake.positions import ROW_GROUP
from walstream.lake.typed import RAW_COLUMNS, arrow_typable, arrow_typed, to_batch, typed_rows

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


_BY_KEY_DDL = (
    "path STRING, changes BIGINT, rows BIGINT, newest_us BIGINT, problem STRING, fix STRING, "
    "fallback STRING, touched BINARY, held BINARY"
)


@dataclass(frozen=True)
class StagedByKey:
    """What the executors did with one mirror or history table's changes of a batch."""

    changes: int  # the table's changes in the batch
    newest_us: int
    #: Why the batch must be written through the driver instead (a truncate, a key
    #: change, a value pyarrow could not type); None: `staged` and `held` are the batch.
    fallback: str | None
    staged: StagedRows | None  # None: no change of the table, or `fallback`
    #: The changes of keys whose unchanged TOAST values the table holds (TableBatch rows,
    #: in WAL order), for the driver.
    held: Any


def stage_by_key(
    rows: Any, shape: TableShape, stage: str, name: str, only: bool, complete: bool, mode: str
) -> StagedByKey:
    """A merge-on-read mirror's or history's (`mode`) changes among `rows` (the batch's
    change rows) planned and written by the executors under `stage` (emptied first),
    shuffled by key (`pk`) over the application's cores (a key's changes in one task, as
    a task needs); `name` prefixes the files' names in the table. A table pyarrow types
    (`arrow_typable`) is typed in the tasks, else by the JVM. `complete`: see
    `TableBatch.complete`. A value its column cannot hold fails the batch here (a
    SinkError, not retryable)."""
    import pyarrow as pa

    _empty(stage)
    if not only:
        rows = rows.where((rows["schema"] == shape.schema) & (rows["table"] == shape.table))
    rows = rows.repartition(rows.sparkSession.sparkContext.defaultParallelism, "pk")
    by_arrow = arrow_typable(shape)
    typed = rows.select(*RAW_COLUMNS) if by_arrow else typed_rows(rows, shape, only=only)
    writer = _by_key_writer(shape, stage, by_arrow, only, complete, mode)
    out = map_in_arrow(typed, writer, _BY_KEY_DDL)
    got = out.collect()
    for r in got:
        if r.problem is not None:
            raise SinkError(r.problem, r.fix, retryable=False)
    changes = sum(r.changes for r in got)
    newest = max((r.newest_us for r in got), default=0)
    fallback = next((r.fallback for r in got if r.fallback is not None), None)
    if fallback is not None or not got:
        return StagedByKey(changes, newest, fallback, None, None)
    written = sorted((r for r in got if r.rows), key=lambda r: r.path)
    files = tuple((r.path, f"{name}-{i}.parquet") for i, r in enumerate(written))
    touched = [_from_ipc(r.touched) for r in got if r.touched is not None]
    held = pa.concat_tables([_from_ipc(r.held) for r in got])
    held = held.sort_by([("_lsn", "ascending"), ("_seq", "ascending")])
    # a task whose keys were all new (inserted here first) touched none the table has
    keys = pa.concat_tables(touched) if touched else None
    return StagedByKey(changes, newest, None, StagedRows(files, keys), held)


def _by_key_schema() -> Any:
    """`_BY_KEY_DDL` in Arrow."""
    import pyarrow as pa

    return pa.schema(
        [
            ("path", pa.string()),
            ("changes", pa.int64()),
            ("rows", pa.int64()),
            ("newest_us", pa.int64()),
            ("problem", pa.string()),
            ("fix", pa.string()),
            ("fallback", pa.string()),
            ("touched", pa.binary()),
            ("held", pa.binary()),
        ]
    )


def _to_ipc(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _from_ipc(data: Any) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(bytes(data))).read_all()


def _by_key_writer(
    shape: TableShape, stage: str, by_arrow: bool, only: bool, complete: bool, mode: str
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: this task's keys' newest versions (a mirror's) or every
    version (a history's) as one file (see `stage_by_key`), and what it touched."""
    key = list(shape.key)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        got = [b for b in batches if b.num_rows]
        if not got:
            return
        schema = _by_key_schema()
        answer = {"path": "", "rows": 0, "newest_us": 0, "problem": None, "fix": None}
        answer.update(fallback=None, touched=None, held=None, changes=0)
        typed = pa.Table.from_batches(got)
        if by_arrow:
            typed = arrow_typed(typed, shape, only)
            if typed is None:  # the JVM names or types the value pyarrow refused
                answer["fallback"] = "a value pyarrow does not type"
                yield pa.RecordBatch.from_pylist([answer], schema=schema)
                return
        try:
            rows = to_batch(typed, shape)
        except SinkError as exc:
            answer.update(problem=exc.problem, fix=exc.fix)
            yield pa.RecordBatch.from_pylist([answer], schema=schema)
            return
        answer["changes"] = rows.num_rows
        answer["newest_us"] = pc.max(rows["_committed_at"]).cast(pa.int64()).as_py() or 0
        if pc.any(pc.equal(rows["_op"], "truncate")).as_py():
            answer["fallback"] = "a truncate"
        elif pc.any(key_changes(rows, key)).as_py():
            answer["fallback"] = "a key change"
        elif mode == "history":
            answer.update(_write_history(rows, shape, stage))
        else:
            answer.update(_write_mirror(rows, shape, stage, complete))
        yield pa.RecordBatch.from_pylist([answer], schema=schema)

    return run


def _write_mirror(rows: Any, shape: TableShape, stage: str, complete: bool) -> dict[str, Any]:
    """A task's rows planned: the changes of keys only the table can fill in held for the
    driver, each other key's newest version written as one file."""
    import pyarrow as pa

    key = list(shape.key)
    rest, out = _held(rows, key)
    plan = mirror_plan(rest, key, shape.names, complete)
    if not plan.appends_only:
        ups = plan.upserts.select(key)
        out["touched"] = _to_ipc(pa.concat_tables([ups, plan.deletes.select(key).cast(ups.schema)]))
    out.update(_written(plan.upserts, stage))
    return out


def _write_history(rows: Any, shape: TableShape, stage: str) -> dict[str, Any]:
    """A task's rows planned as a history's: the changes of keys only the table can fill in
    held for the driver, every other change a version, written as one file; `touched`:
    each key and when the table's current version of it ends (`ENDS`)."""
    import pyarrow as pa

    key = list(shape.key)
    rest, out = _held(rows, key)
    plan = history_plan(rest, key, shape.names, history_schema(rest.schema, shape.names))
    ends = [{**dict(zip(key, k, strict=True)), ENDS: at} for k, at in plan.closes.items()]
    fields = [
        *(rest.schema.field(k) for k in key),
        pa.field(ENDS, rest.schema.field("_committed_at").type),
    ]
    out["touched"] = _to_ipc(pa.Table.from_pylist(ends, schema=pa.schema(fields)))
    out.update(_written(plan.versions, stage))
    return out


def _held(rows: Any, key: list[str]) -> tuple[Any, dict[str, Any]]:
    """The rows whose key's values the batch itself gives, TOAST filled in; the others
    held for the driver (the answer's `held`)."""
    import pyarrow.compute as pc

    held = from_target(rows, key)

    def no_target(keys: list[Any]) -> dict[Any, Any]:
        raise AssertionError(f"from_target left keys {keys[:3]} to the executors")

    rest = fill_toast(rows.filter(pc.invert(held)), key, no_target)
    return rest, {"held": _to_ipc(rows.filter(held))}


def _written(rows: Any, stage: str, row_group_size: int | None = ROW_GROUP) -> dict[str, Any]:
    """`rows` as this task's file under `stage` (none when there are none): its `path` and
    `rows`. `row_group_size` None: pyarrow's own (a changelog's files)."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs
    from pyspark import TaskContext

    if not rows.num_rows:
        return {}
    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else 0
    filesystem, root = pafs.FileSystem.from_uri(stage)
    path = f"{root}/part-{part:05d}.parquet"
    pq.write_table(rows, path, filesystem=filesystem, row_group_size=row_group_size)
    return {"path": f"{stage.rstrip('/')}/part-{part:05d}.parquet", "rows": rows.num_rows}


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
        newest = pc.max(rows["_committed_at"]).cast(pa.int64()).as_py() or 0
        answer = {"newest_us": newest, "problem": None, "fix": None}
        yield pa.RecordBatch.from_pylist(
            [{**answer, **_written(rows, stage, row_group_size=None)}], schema=schema
        )

    return run
