"""Lake sinks in the pipeline: each table's changes of a batch as typed Arrow, one commit each.

For a sink whose destination writes tables (`type: delta`, `type: iceberg`) the
foreachBatch does not build messages. It selects the sink's rows (tables, actions,
filter), finds which tables the batch touches (no job when the sink can take one table
only), reads each table's shape from the source catalog, types the rows (`typed.py`:
the stream's on the executors, a backfill's staged typed already), brings them to the
driver as Arrow and hands them to the sink, which commits each table once (see
`lake/contract.py`). A value its column cannot hold pauses the sink (`write_or_pause`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from walstream.backfill.typed import TypedReads
from walstream.config import SinkConfig
from walstream.decode.table_shape import (
    TableGone,
    load_shape,
    publication_tables,
    rows_by_key,
)
from walstream.delivery.parking import ParkingLot
from walstream.engine.frames import planned_partitions
from walstream.engine.sql import selection_expr
from walstream.errors import SinkError
from walstream.lake.contract import FilesBatch, TableBatch, TableSink, Written
from walstream.lake.files import StagedFiles, discard, stage_by_key, stage_changelog
from walstream.lake.sources import LakeSources
from walstream.lake.typed import RAW_COLUMNS, arrow_typable, batch_rows, place, to_batch
from walstream.sinks.clients import on_source

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class TablesWritten:
    """What one batch wrote to one lake sink."""

    changes: int = 0  # changes of the batch the sink wrote
    skipped: int = 0  # changes of tables whose commit for this batch existed already (a replay)
    rows: int = 0  # rows added to lake tables
    tables: int = 0
    replayed: int = 0  # tables whose commit for this batch existed already
    max_committed_us: int = 0
    written: set[tuple[str, str]] = field(default_factory=set)  # source tables

    def add(self, rows: Any, written: Written, table: tuple[str, str]) -> None:
        """Count one table's TableBatch rows and what the sink did."""
        import pyarrow.compute as pc

        newest = pc.max(rows["_committed_at"]).cast("int64").as_py() or 0
        self.count(rows.num_rows, written, table, newest)

    def count(self, changes: int, written: Written, table: tuple[str, str], newest: int) -> None:
        if written.replayed:
            self.skipped += changes
        else:
            self.changes += changes
        self.rows += written.rows
        self.tables += 1
        self.replayed += int(written.replayed)
        self.written.add(table)
        self.max_committed_us = max(self.max_committed_us, newest)


@dataclass
class _Write:
    """What every table of one `write_tables` call shares."""

    sink: SinkConfig
    table_sink: TableSink
    query_id: str
    batch_id: int
    skip_before: int | None
    typed_reads: TypedReads | None
    stage: str | None
    sources: LakeSources | None
    dsn: str
    complete: bool  # every change of a table reaches the sink: an insert is a new key
    no_rows: bool  # no stream rows: only typed backfill rows, and no Spark job
    several: bool  # the batch's tables were found by a job
    rows: Any
    #: The batch's change rows collected as they are, when the job that found its tables
    #: brought them to the driver (`_tables_of`); None: each table's rows are its own job.
    raw: Any = None
    persisted: bool = False  # `rows` is cached for the jobs after the one that found them
    #: The batch spans several source partitions: a merge-on-read table's files are then
    #: written by the executors (`_executors_write`), a batch of one by the driver.
    spread: bool = False
    t_found: float = 0.0
    out: TablesWritten = field(default_factory=TablesWritten)

    def batch(self, shape: Any, rows: Any) -> TableBatch:
        return TableBatch(
            self.sink.name,
            self.query_id,
            self.batch_id,
            shape,
            rows,
            self.complete,
            None if rows is None else functools.partial(_source_rows, self.dsn, shape),
        )


def write_tables(
    df: Any,
    sink: SinkConfig,
    table_sink: TableSink,
    query_id: str,
    batch_id: int,
    skip_before: int | None = None,
    reads: Any = None,
    publication: str | None = None,
    empty: bool = False,
    stage: str | None = None,
    sources: LakeSources | None = None,
) -> TablesWritten:
    """Write the batch's changes (and backfill rows placed in it) to one lake sink.

    When the sink can take one table only (of `publication`), its rows are typed in one
    job; otherwise a first job finds the tables the batch has, then one job each.
    `empty`: the batch is known to hold no changes (only backfill rows, if any): no job.
    `stage`: a directory for files the executors write (a changelog table's, see
    `lake_files.py`); without it every table's rows come to the driver. `sources`: where
    a renamed or re-created source table is noticed before its first write (`renamed`).
    Each table takes one of three routes: files the executors wrote (`_staged`), a
    backfill's staged files as they are (`_adopted`), typed rows through the driver
    (`_typed`).
    """
    where = selection_expr(sink)
    if skip_before is not None:
        where = f"lsn >= {int(skip_before)} AND {where}"
    rows = df.where(where)
    typed_reads = reads if isinstance(reads, TypedReads) else None
    if reads is not None and typed_reads is None:  # ReadRows: a sink with a filter
        rows = rows.unionByName(reads.rows.where(where).drop("backfill"))
    assert table_sink.config.source_dsn is not None, "the plan fills in source_dsn"
    w = _Write(
        sink,
        table_sink,
        query_id,
        batch_id,
        skip_before,
        typed_reads,
        stage,
        sources,
        table_sink.config.source_dsn.get_secret_value(),
        complete=(
            skip_before is None
            and sink.filter is None
            and not sink.event_types
            and set(sink.actions) >= {"insert", "update", "delete", "truncate"}
        ),
        no_rows=empty and (reads is None or typed_reads is not None),
        several=False,
        rows=rows,
    )
    if stage is not None and _on_executors(table_sink.config) and not w.no_rows:
        # one partition (a small batch) is one job through the driver: the latency path
        w.spread = table_sink.config.mode == "changelog" or planned_partitions(rows) > 1
    t0 = time.monotonic()
    shapes = _shapes(w, publication)
    w.t_found = time.monotonic() - t0
    try:
        for shape in shapes:
            _write_table(w, shape)
    finally:
        if w.persisted:
            w.rows.unpersist()
    return w.out


def _shapes(w: _Write, publication: str | None) -> list[Any]:
    """The shapes of the tables this batch writes: the publication's one table (no job),
    else those the batch's rows and backfill reads have (a job; `w.rows` persisted unless
    `_preloaded` says no later job needs them)."""
    dest = w.table_sink.config
    placed_tables = (
        []
        if w.typed_reads is None
        else list(dict.fromkeys((c.schema, c.table) for c in w.typed_reads.chunks))
    )
    candidates = (
        on_source(
            w.dsn,
            lambda c: [t for t in publication_tables(c, publication) if w.sink.wants_table(*t)],
        )
        if publication is not None and not w.no_rows
        else []
    )
    w.several = len(candidates) != 1 and not w.no_rows

    def shapes_of(tables: list[tuple[str, str]]) -> list[Any]:
        return on_source(
            w.dsn,
            lambda c: [
                load_shape(c, schema, table, need_key=dest.mode != "changelog").select(
                    dest.columns.include, dest.columns.exclude
                )
                for schema, table in tables
            ],
        )

    if w.no_rows:
        return shapes_of(placed_tables)
    if not w.several:
        try:
            return shapes_of(candidates)
        except TableGone:
            # The publication's one table went away after the publication was read (dropped,
            # perhaps created again since): the batch's own tables decide, so that a batch
            # without its rows goes on and one with them pauses the sink, as it should.
            w.several = True
    known = _preloaded(w, candidates, shapes_of)
    if known is None:
        w.rows, w.persisted = w.rows.persist(), True
    try:
        tables = _tables_of(w)
        tables += [t for t in placed_tables if t not in tables]
        if known is None:
            return shapes_of(tables)
        others = shapes_of([t for t in tables if t not in known])
        return [known[t] if t in known else others.pop(0) for t in tables]
    except BaseException:
        if w.persisted:
            w.rows.unpersist()
            w.persisted = False
        raise


#: A publication of up to this many tables has their shapes read before a batch's job.
PRELOAD_TABLES = 32


def _preloaded(
    w: _Write, candidates: list[tuple[str, str]], shapes_of: Callable[[Any], list[Any]]
) -> dict[tuple[str, str], Any] | None:
    """The shapes of the publication's tables, read before the job that finds the batch's
    tables, when that job is the batch's only one: every table typed by pyarrow from the
    rows it collects (`batch_rows` with `raw`). None when a later job may read the rows
    again (a table typed in the JVM, files the executors write, too many tables or one
    gone): they are then cached first. Caching them for nothing made commit → visible of
    a publication of two tables p50 338 ms, p99 553-800 ms, against 311 and 498-554 ms
    (three runs each, bench.lake --latency-tables 2). A table the job
    finds that is not among these (added to the publication since) is read afterwards; if
    the JVM types it, its job reads the batch again from the source: slower, not wrong."""
    if _executors_write(w) or not candidates or len(candidates) > PRELOAD_TABLES:
        return None
    try:
        shapes = shapes_of(candidates)
    except TableGone:
        return None
    if not all(arrow_typable(s) for s in shapes):
        return None
    return dict(zip(candidates, shapes, strict=True))


def _tables_of(w: _Write) -> list[tuple[str, str]]:
    """The tables the batch's rows hold, found by a job on `w.rows`. Where the
    rows come to the driver (not a changelog's, which the executors write), that job
    collects them as they are (`w.raw`): a table pyarrow types then costs no job of its
    own, so a batch of several such tables is one job, as a batch of one table is."""
    if _executors_write(w):
        return [(r[0], r[1]) for r in w.rows.select("schema", "table").distinct().collect()]
    w.raw = w.rows.select(*RAW_COLUMNS).toArrow()
    pairs = w.raw.select(["schema", "table"]).group_by(["schema", "table"]).aggregate([])
    return list(zip(pairs["schema"].to_pylist(), pairs["table"].to_pylist(), strict=True))


def _write_table(w: _Write, shape: Any) -> None:
    """One table's rows of the batch, by the first route that takes them."""
    t1 = time.monotonic()
    placed = None if w.typed_reads is None else place(w.typed_reads, shape, w.skip_before)
    dest = w.table_sink.config
    if _executors_write(w) and not w.no_rows and placed is None:
        _staged(w, shape, t1)
        return
    arrow = (
        None
        if w.no_rows
        # one table published: its rows are the batch's, and another name stops it
        else batch_rows(w.rows, shape, not w.several, dest.mode == "changelog", w.raw)
    )
    if arrow is not None and arrow.num_rows == 0:
        arrow = None
    if placed is not None and arrow is None and placed.whole and _adopted(w, shape, placed):
        return  # only backfill rows, none dropped: the staged files did as they are
    _typed(w, shape, arrow, None if placed is None else placed.rows(), t1)


def _staged(w: _Write, shape: Any, t1: float) -> None:
    """A changelog table's rows, written to files by the executors and committed as such;
    a merge-on-read mirror's or history's (`_staged_by_key`)."""
    if w.table_sink.config.mode != "changelog":
        _staged_by_key(w, shape, t1)
        return
    done = _changelog_files(
        w.rows,
        shape,
        w.table_sink,
        w.batch(shape, None),
        f"{w.stage}/{w.batch_id}/{shape.schema}.{shape.table}",
        not w.several,
        functools.partial(renamed, w.sources, w.sink.name, w.table_sink, shape),
    )
    if done is None:
        return
    staged, wrote = done
    w.out.count(staged.rows, wrote, (shape.schema, shape.table), staged.newest_us)
    log.debug(
        "batch %d: sink %s committed %d file(s) the executors wrote, %d rows of %s.%s, to %s%s",
        w.batch_id,
        w.sink.name,
        len(staged.files),
        staged.rows,
        shape.schema,
        shape.table,
        wrote.target,
        " (replayed: written before)" if wrote.replayed else "",
    )


def _staged_by_key(w: _Write, shape: Any, t1: float) -> None:
    """A merge-on-read mirror's or history's keys planned and written by the executors,
    committed by the sink with the changes it must fill in itself; the batch through the
    driver when the executors cannot (`stage_by_key`'s fallback)."""
    stage = f"{w.stage}/{w.batch_id}/{shape.schema}.{shape.table}"
    name = f"walstream-{w.query_id}-{w.batch_id}"
    try:
        mode = w.table_sink.config.mode
        done = stage_by_key(w.rows, shape, stage, name, not w.several, w.complete, mode)
        if done.fallback is not None:
            log.debug(
                "batch %d: sink %s: %s.%s written through the driver: the batch has %s",
                w.batch_id,
                w.sink.name,
                shape.schema,
                shape.table,
                done.fallback,
            )
            arrow = batch_rows(w.rows, shape, not w.several)
            _typed(w, shape, arrow if arrow.num_rows else None, None, t1)
            return
        if done.staged is None:
            return  # no change of the table
        batch = replace(w.batch(shape, done.held), staged=done.staged)
        renamed(w.sources, w.sink.name, w.table_sink, shape)
        t2 = time.monotonic()
        written: Written = w.table_sink.write_batch(batch)
        w.out.count(done.changes, written, (shape.schema, shape.table), done.newest_us)
        _wrote(
            w,
            shape,
            written,
            ", %d file(s) by the executors, %d change(s) through the driver (planned %.3fs, "
            "commit %.3fs)",
            len(done.staged.files),
            done.held.num_rows,
            t2 - t1,
            time.monotonic() - t2,
        )
    finally:
        discard(stage)


def _adopted(w: _Write, shape: Any, placed: Any) -> bool:
    """A backfill's staged files committed as they are; False when the sink cannot."""
    files = FilesBatch(w.sink.name, w.query_id, w.batch_id, shape, placed.files())
    renamed(w.sources, w.sink.name, w.table_sink, shape)
    adopted = w.table_sink.adopt_files(files)
    if adopted is None:
        return False
    w.out.count(adopted.rows, adopted, (shape.schema, shape.table), placed.newest_us)
    log.debug(
        "batch %d: sink %s committed %d staged backfill file(s) of %s.%s, %d rows, to %s%s",
        w.batch_id,
        w.sink.name,
        len(files.files),
        shape.schema,
        shape.table,
        adopted.rows,
        adopted.target,
        " (replayed: written before)" if adopted.replayed else "",
    )
    return True


def _typed(w: _Write, shape: Any, arrow: Any, reads_part: Any, t1: float) -> None:
    """The table's stream rows (`arrow`) and backfill rows (`reads_part`, at their high
    watermarks' places) as one typed batch, written by the sink through the driver."""
    import pyarrow as pa

    if arrow is None and reads_part is None:
        return
    typed = None if arrow is None else to_batch(arrow, shape)
    if reads_part is not None:
        typed = (
            reads_part
            if typed is None
            else pa.concat_tables([typed, reads_part.cast(typed.schema)]).sort_by(
                [("_lsn", "ascending"), ("_seq", "ascending")]
            )
        )
    assert typed is not None
    batch = w.batch(shape, typed)
    renamed(w.sources, w.sink.name, w.table_sink, shape)
    t2 = time.monotonic()
    written: Written = w.table_sink.write_batch(batch)
    w.out.add(typed, written, (shape.schema, shape.table))
    _wrote(
        w,
        shape,
        written,
        " (tables %.3fs, typed rows %.3fs, commit %.3fs)",
        w.t_found,
        t2 - t1,
        time.monotonic() - t2,
    )


def _wrote(w: _Write, shape: Any, written: Written, more: str, *args: Any) -> None:
    """The DEBUG line of a table written: what, where, and `more` (a format of `args`)."""
    log.debug(
        "batch %d: sink %s wrote %d rows of %s.%s to %s%s" + more,
        w.batch_id,
        w.sink.name,
        written.rows,
        shape.schema,
        shape.table,
        written.target,
        " (replayed: written before)" if written.replayed else "",
        *args,
    )


def _source_rows(dsn: str, shape: Any, keys: list[tuple[Any, ...]]) -> dict[Any, Any]:
    """The source table's rows now of these keys (`TableBatch.source_rows`)."""
    return on_source(dsn, lambda c: rows_by_key(c, shape, keys))


def _executors_write(w: _Write) -> bool:
    """Whether the executors write the sink's table files, where they have a stage: a
    changelog's always, a merge-on-read mirror's or history's when the batch spans several
    partitions (one partition through the driver: commit → visible p50 191 ms against 247
    ms by one task and 344 ms shuffled, floor 156-162 ms, bench.lake --updates
    merge_on_read)."""
    return w.stage is not None and _on_executors(w.table_sink.config) and w.spread


def _on_executors(dest: Any) -> bool:
    """Whether a table's files are written by the executors: a changelog table's and a
    merge-on-read mirror's or history's (no partitions: each task writes one file)."""
    if dest.partition_by:
        return False
    return bool(dest.mode == "changelog" or dest.updates == "merge_on_read")


def _changelog_files(
    rows: Any,
    shape: Any,
    table_sink: TableSink,
    batch: TableBatch,
    stage: str,
    only: bool,
    check: Callable[[], None],
) -> tuple[StagedFiles, Written] | None:
    """One changelog table's rows of the batch, written by the executors under `stage` and
    committed as they are; None when the batch has none. When the table's columns are not
    the files' (changed at the source), the rows are written by the driver instead."""
    staged = stage_changelog(
        rows, shape, stage, f"walstream-{batch.query_id}-{batch.batch_id}", only
    )
    try:
        if not staged.rows:
            return None
        check()
        files = FilesBatch(batch.sink, batch.query_id, batch.batch_id, shape, staged.files)
        written = table_sink.adopt_files(files)
        if written is None:
            written = table_sink.write_batch(replace(batch, rows=staged.as_batch_rows(shape)))
        return staged, written
    finally:
        discard(stage)


def renamed(sources: LakeSources | None, sink: str, table_sink: TableSink, shape: Any) -> None:
    """SinkError (the sink pauses) when the source table of `shape` is not the one `sink`
    wrote under its name, or was written under another (`LakeSources.changed`)."""
    change = (
        None if sources is None else sources.changed(sink, shape.oid, shape.schema, shape.table)
    )
    if change is None:
        return
    name = f"{shape.schema}.{shape.table}"
    now = table_sink.config.location_for_messages(shape.schema, shape.table)
    if change.what == "recreated":
        raise SinkError(
            f"lake: source table {name} is a new table (OID {shape.oid}): this sink wrote "
            f"another table under that name (OID {change.old_oid}, since dropped or renamed), "
            f"and {now} still holds its rows, which no change of the new table will delete",
            f"empty or remove {now} and `walstream resume {sink}`, then `walstream backfill "
            f"{sink} --table {name}` for the rows it has already; or `walstream resume {sink}` "
            "to write into it as it is",
            retryable=False,
        )
    was = table_sink.config.location_for_messages(*change.was)
    raise SinkError(
        f"lake: source table {name} is {change.was[0]}.{change.was[1]} renamed (the same "
        f"table, OID {shape.oid}): this sink wrote its rows to {was}, and its changes from "
        f"now on would start {now} with only the rows they touch",
        f"move the lake table to {now} (Iceberg: rename it in the catalog; Delta: move its "
        f"directory) and `walstream resume {sink}`; or `walstream resume {sink}` to start it "
        f"anew and `walstream backfill {sink} --table {name}` to fill it",
        retryable=False,
    )


def write_or_pause(
    write: Callable[[], TablesWritten], sink: str, parking: ParkingLot, hold: Callable[[], None]
) -> TablesWritten:
    """`write()`; when it fails for good (a value or schema the table cannot take), pause
    the sink with the error as the reason and, once `walstream resume` clears it, try the
    batch again. `hold()` waits while the source's sinks are paused (the pipeline's)."""
    while True:
        try:
            return write()
        except SinkError as exc:
            if exc.retryable:
                raise  # the query restarts and replays the batch
            reason = f"{exc.problem} (fix: {exc.fix})" if exc.fix else exc.problem
            log.error("sink %s paused: %s; `walstream resume %s` once fixed", sink, reason, sink)
            parking.set_paused(sink, True, reason)
            hold()


class Upkeep:
    """`optimize.every`: compaction and cleanup of a lake sink's tables, run between batches
    by the pipeline (so it never races the sink's own commits)."""

    def __init__(self) -> None:
        self.tables: dict[str, set[tuple[str, str]]] = {}
        self.last: dict[str, float] = {}

    def after_batch(self, sink: str, table_sink: TableSink, written: TablesWritten) -> None:
        every = table_sink.config.optimize.every
        if every is None:
            return
        self.tables.setdefault(sink, set()).update(written.written)
        now = time.monotonic()
        started = self.last.setdefault(sink, now)
        if now - started < every:
            return
        self.last[sink] = now
        for schema, table in sorted(self.tables.pop(sink, set())):
            t0 = time.monotonic()
            try:
                result = table_sink.optimize(schema, table)
            except Exception as exc:  # maintenance only: the next round tries again
                log.warning("sink %s: optimizing %s.%s failed: %s", sink, schema, table, exc)
                continue
            log.info(
                "sink %s: optimized %s.%s in %.1fs: %s",
                sink,
                schema,
                table,
                time.monotonic() - t0,
                result,
            )
