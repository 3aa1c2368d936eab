"""The pipeline's side of backfills: where the stream reaches a chunk's high watermark,
the chunk's rows join the batch (DBLog).

Per micro-batch of a source with running backfills (driver side, in foreachBatch):
1. the batch's watermark rows are collected and recorded with their cursor and batch;
2. each chunk whose high watermark is in the batch is claimed (a replay claims it
   again), its staged rows read back minus those the stream overrides (`dblog.py`),
   the rest action `read` rows at the high watermark's place (its lsn; seq = its seq
   + 1 + the row's ordinal);
3. while a window is still open, the batch's changes of the backfilled tables are
   staged, so a high watermark in a later batch sees the whole window.

All of it is Spark work over files: the driver holds watermarks, never rows. A table
sink's chunks are staged typed and placed by its writer (`lake/typed.py`). Chunk files
go once the batch that emitted them is committed, window files once no window needs them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from walstream.backfill.dblog import drop_sql, moved_key
from walstream.backfill.store import BackfillStore, Mark
from walstream.backfill.typed import ReadRows, TypedChunk, TypedReads
from walstream.decode.decoder import WATERMARK
from walstream.engine.sql import quote

log = logging.getLogger(__name__)


class Staging:
    """Where a source's backfill files live: `<checkpoint_dir>/_backfill/<source>/`."""

    def __init__(self, checkpoint_dir: str, source: str) -> None:
        self.root = f"{checkpoint_dir.rstrip('/')}/_backfill/{source}"

    def chunk(self, backfill: int, n: int, attempt: int) -> str:
        return f"{self.root}/{backfill}/chunk-{n}-{attempt}.parquet"

    def window(self, query_id: str, batch: int) -> str:
        return f"{self.root}/windows/{query_id}/{_WINDOW}{batch}"

    def _fs(self) -> tuple[Any, str]:
        from pyarrow import fs as pafs

        return pafs.FileSystem.from_uri(self.root)

    def exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        filesystem, p = pafs.FileSystem.from_uri(path)
        return filesystem.get_file_info(p).type != pafs.FileType.NotFound

    def mark_quiet(self, window: str) -> None:
        """Stage a window file of a batch without changes: a directory holding only
        `_QUIET` (no Spark job; `quiet` tells it from a window Spark wrote)."""
        from pyarrow import fs as pafs

        filesystem, p = pafs.FileSystem.from_uri(window)
        filesystem.create_dir(p, recursive=True)
        with filesystem.open_output_stream(f"{p}/{_QUIET}"):
            pass

    def quiet(self, window: str) -> bool:
        """Whether a window file was staged by a batch without changes (`mark_quiet`)."""
        return self.exists(f"{window.rstrip('/')}/{_QUIET}")

    def remove_chunk(self, backfill: int, n: int) -> None:
        """Every attempt's file of a chunk (and a partial `.tmp`)."""
        from pyarrow import fs as pafs

        filesystem, root = self._fs()
        selector = pafs.FileSelector(f"{root}/{backfill}", allow_not_found=True)
        for info in filesystem.get_file_info(selector):
            if info.base_name.startswith(f"chunk-{n}-"):
                filesystem.delete_file(info.path)

    def remove_windows(self, query_id: str, before: int) -> None:
        """Window files of batches before `before` (and of other queries)."""
        from pyarrow import fs as pafs

        filesystem, root = self._fs()
        selector = pafs.FileSelector(f"{root}/windows", allow_not_found=True)
        for info in filesystem.get_file_info(selector):
            if info.type != pafs.FileType.Directory:
                continue
            if info.base_name != query_id:
                filesystem.delete_dir(info.path)
                continue
            inner = pafs.FileSelector(info.path, allow_not_found=True)
            for batch in filesystem.get_file_info(inner):
                n = batch.base_name.removeprefix(_WINDOW)
                # an older layout's file counts as missing: its chunk is read again
                if not (batch.base_name.startswith(_WINDOW) and n.isdigit()) or int(n) < before:
                    filesystem.delete_dir(batch.path)


@dataclass(frozen=True)
class _Target:
    sink: str
    schema: str
    table: str
    key_columns: tuple[str, ...]
    oid: int | None = None  # the source table's OID when the backfill started

    @property
    def table_id(self) -> tuple[str, str]:
        return (self.schema, self.table)


@dataclass(frozen=True)
class _Found:
    """What quiet windows hold (`_rows`' counts, without a job)."""

    changed: int
    cut: int
    moved: int


@dataclass(frozen=True)
class _Emit:
    """A chunk this batch delivers: its backfill's target, its watermarks, commit time."""

    target: _Target
    low: Mark
    high: Mark
    committed_us: int


#: The file of a window staged by a batch without changes (`Staging.mark_quiet`).
_QUIET = "_QUIET"
#: A window file's name (and layout: the key columns' JSON for typed reads, in `record`).
_WINDOW = "keys-"
_WINDOW_COLUMNS = ("`schema`", "`table`", "pk", "lsn", "seq", "action", "record", "old")
_WINDOW_DDL = (
    "`schema` STRING, `table` STRING, pk ARRAY<STRING>, lsn BIGINT, seq INT, action STRING, "
    "record STRING, old STRING"
)
#: Up to this many stream changes in the chunks' windows, their keys are broadcast.
BROADCAST_ROWS = 250_000
_STAGED_DDL = (
    "pk ARRAY<STRING>, record STRING, ord INT, backfill BIGINT, chunk INT, json_nulls ARRAY<STRING>"
)


class BackfillMerge:
    def __init__(
        self, store: BackfillStore, source: str, staging: Staging, typed: Set[str] = frozenset()
    ) -> None:
        self.store = store
        self.source = source
        self.staging = staging
        #: Sinks whose chunks are staged typed (`reads_typed`): placed as `TypedReads`.
        self.typed = typed
        #: The last batch `reads` saw: how many of its rows are changes (not watermarks).
        self.changes: int | None = None

    # -- at the start of every batch ----------------------------------------------------------
    def batch_started(self, query_id: str, batch_id: int) -> dict[int, tuple[str, str, str]]:
        """The previous batch is committed (Spark starts a batch only then): remove the
        files of chunks it or earlier ones emitted. The backfills this batch takes part in."""
        committed = self.store.committed_chunks(self.source, query_id, batch_id)
        committed += self.store.abandoned_chunks(self.source)
        for b, n in committed:
            self.staging.remove_chunk(b, n)
        self.store.cleaned(committed)
        # Window files from the first batch a chunk still to emit (or to emit again, in a
        # replay of this batch) opened its window on are kept; older ones can go.
        floor = self.store.window_floor(self.source, query_id, batch_id)
        self.staging.remove_windows(query_id, batch_id if floor is None else floor)
        return self.store.active_ids(self.source, query_id, batch_id)

    def batch_delivered(self) -> None:
        for id_ in self.store.finish_delivered(self.source):
            log.warning("backfill %d is done: every chunk is delivered", id_)

    # -- in a batch with running backfills ---------------------------------------------------
    def _marks(
        self, df: Any, batch_id: int, query_id: str, running: dict[int, tuple[str, str, str]]
    ) -> list[tuple[Mark, int]]:
        """The batch's watermarks of running backfills of this source, in WAL order, each
        with its commit time (µs), recorded in the store; counts the batch's changes."""
        found = (
            df.where(f"action = '{WATERMARK}'")
            .selectExpr("lsn", "seq", "unix_micros(committed_at) AS us", "record")
            .collect()
        )
        # `df` is cached: counting it is cheap, and a batch of watermarks only (a backfill
        # reading chunks starts many) spares each sink its jobs over the stream's changes
        self.changes = df.count() - len(found)
        marks: list[tuple[Mark, int]] = []  # with the commit time (µs) of each
        for r in found:
            try:
                m = json.loads(r.record)
                if m.get("source") != self.source or int(m["backfill"]) not in running:
                    continue
                mark = Mark(
                    int(m["backfill"]),
                    int(m["chunk"]),
                    int(m["attempt"]),
                    str(m["mark"]),
                    int(r.lsn),
                    int(r.seq),
                    batch_id,
                )
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed backfill watermark: %r", r.record)
                continue
            marks.append((mark, int(r.us)))
        marks.sort(key=lambda x: x[0].cursor)
        self.store.record_marks([m for m, _ in marks], query_id)
        return marks

    def reads(
        self, df: Any, batch_id: int, query_id: str, running: dict[int, tuple[str, str, str]]
    ) -> dict[str, Any]:
        """sink -> the read rows this batch delivers: a DataFrame (change columns + backfill),
        or for a sink in `typed` a `TypedReads`."""
        spark = df.sparkSession
        marks = self._marks(df, batch_id, query_id, running)

        keys = self._keys_view(df, running)
        targets = self._targets(running)
        emits = self._claim(marks, batch_id, query_id, targets)
        out: dict[str, Any] = {}
        if emits:
            inside, em = self._inside(spark, keys, emits, query_id, batch_id)
            placed = self._rows(spark, inside, em, emits)
            for sink in sorted({e.target.sink for e in emits}):
                chunks = tuple(
                    TypedChunk(
                        e.high.backfill,
                        e.high.chunk,
                        e.high.attempt,
                        e.target.schema,
                        e.target.table,
                        self.staging.chunk(e.high.backfill, e.high.chunk, e.high.attempt),
                        e.high.lsn,
                        e.high.seq,
                        e.committed_us,
                    )
                    for e in emits
                    if e.target.sink == sink
                )
                if sink in self.typed:
                    out[sink] = TypedReads(chunks, inside)
                else:
                    assert placed is not None
                    rows, found = placed
                    out[sink] = ReadRows(
                        rows.where(f"_sink = {quote(sink)}").drop("_sink"),
                        chunks,
                        inside,
                        found.changed,
                        found.cut,
                        found.moved,
                    )

        self._stage_window(keys, running, targets, query_id, batch_id)
        return out

    def _claim(
        self,
        marks: list[tuple[Any, int]],
        batch_id: int,
        query_id: str,
        targets: dict[int, _Target],
    ) -> list[_Emit]:
        """The chunks whose high watermark is in this batch and that this batch emits (an
        attempt already emitted, or whose window cannot be read, is not)."""
        emits: list[_Emit] = []
        claimed: set[tuple[int, int]] = set()
        for high, us in marks:
            if high.mark != "high" or (high.backfill, high.chunk) in claimed:
                continue
            low = self.store.low(high.backfill, high.chunk, high.attempt)
            if low is None:
                log.warning(
                    "backfill %d chunk %d: high watermark without its low one; the chunk is read "
                    "again",
                    high.backfill,
                    high.chunk,
                )
                self.store.requeue(high.backfill, high.chunk, high.attempt)
                continue
            windows = [self.staging.window(query_id, b) for b in range(low.batch, batch_id)]
            missing = [w for w in windows if not self.staging.exists(w)]
            if missing:
                log.warning(
                    "backfill %d chunk %d: the stream's keys of %d earlier batch(es) of its window "
                    "are gone (a new checkpoint?); the chunk is read again",
                    high.backfill,
                    high.chunk,
                    len(missing),
                )
                self.store.requeue(high.backfill, high.chunk, high.attempt)
                continue
            if not self.store.emit(high.backfill, high.chunk, high.attempt, batch_id, query_id):
                continue  # another attempt of this chunk was emitted
            claimed.add((high.backfill, high.chunk))
            emits.append(_Emit(targets[high.backfill], low, high, us))
        return emits

    def _stage_window(
        self,
        keys: Any,
        running: dict[int, tuple[str, str, str]],
        targets: dict[int, _Target],
        query_id: str,
        batch_id: int,
    ) -> None:
        """Keep this batch's keys of the tables whose chunks are still open (past the first
        low watermark): their windows read them when their high watermark comes."""
        open_lows = self.store.open_lows(list(running))
        if not open_lows:
            return
        if self.changes == 0:  # watermarks only: a marker, not a Spark job writing nothing
            self.staging.mark_quiet(self.staging.window(query_id, batch_id))
            return
        first = min(m.cursor for m in open_lows)
        tables = {(targets[m.backfill].schema, targets[m.backfill].table) for m in open_lows}
        cond = " OR ".join(f"(`schema` = {quote(s)} AND `table` = {quote(t)})" for s, t in tables)
        (
            keys.where(
                f"({cond}) AND (lsn > {first[0]} OR (lsn = {first[0]} AND seq > {first[1]}))"
            )
            .write.mode("overwrite")
            .parquet(self.staging.window(query_id, batch_id))
        )

    def _keys_view(self, df: Any, running: dict[int, tuple[str, str, str]]) -> Any:
        """This batch's changes of the backfilled tables, as window rows."""
        tables = {(s, t) for _, s, t in running.values()}
        cond = " OR ".join(f"(`schema` = {quote(s)} AND `table` = {quote(t)})" for s, t in tables)
        return df.where(f"action <> '{WATERMARK}' AND ({cond})").selectExpr(
            "`schema`",
            "`table`",
            "pk",
            "lsn",
            "seq",
            "action",
            "record",
            "CASE WHEN action = 'update' THEN old END AS old",
        )

    def _targets(self, running: dict[int, tuple[str, str, str]]) -> dict[int, _Target]:
        found = self.store.key_columns(list(running))
        targets = {}
        for id_, (sink, schema, table) in running.items():
            keys, oid = found.get(id_, ([], None))
            targets[id_] = _Target(sink, schema, table, tuple(keys), oid)
        return targets

    def _inside(
        self, spark: Any, keys: Any, emits: list[_Emit], query_id: str, batch_id: int
    ) -> tuple[Any, Any]:
        """(each stream change inside an emitted chunk's window, with the chunk's columns:
        `backfill`, `chunk`, its target and watermarks, or None when the windows' batches
        had no change at all (no job then); the chunks)"""
        from pyspark.sql import functions as F

        em = spark.createDataFrame(
            [
                (
                    e.high.backfill,
                    e.high.chunk,
                    e.target.sink,
                    e.target.schema,
                    e.target.table,
                    e.target.oid,
                    e.low.lsn,
                    e.low.seq,
                    e.high.lsn,
                    e.high.seq,
                    e.committed_us,
                )
                for e in emits
            ],
            "backfill BIGINT, chunk INT, _sink STRING, _schema STRING, _table STRING, "
            "_oid BIGINT, low_lsn BIGINT, low_seq INT, high_lsn BIGINT, high_seq INT, "
            "committed_us BIGINT",
        )
        em = F.broadcast(em)
        first = min(e.low.batch for e in emits)
        windows = [
            w
            for w in (self.staging.window(query_id, b) for b in range(first, batch_id))
            if not self.staging.quiet(w)
        ]
        if not windows and self.changes == 0:
            return None, em  # no change in any batch of the windows: nothing inside
        window = keys
        if windows:
            stored = spark.read.schema(_WINDOW_DDL).parquet(*windows).selectExpr(*_WINDOW_COLUMNS)
            window = stored.unionByName(keys)
        # Each window change, paired with the chunks whose window holds it.
        inside = window.join(
            em,
            (F.col("schema") == F.col("_schema"))
            & (F.col("table") == F.col("_table"))
            & (
                (F.col("lsn") > F.col("low_lsn"))
                | ((F.col("lsn") == F.col("low_lsn")) & (F.col("seq") > F.col("low_seq")))
            )
            & (
                (F.col("lsn") < F.col("high_lsn"))
                | ((F.col("lsn") == F.col("high_lsn")) & (F.col("seq") < F.col("high_seq")))
            ),
        )
        return inside, em

    def _rows(self, spark: Any, inside: Any, em: Any, emits: list[_Emit]) -> tuple[Any, Any] | None:
        """The read rows of the (untyped) chunks emitted in this batch, as one DataFrame
        (its plan does not grow with the number of chunks): staged rows, minus those whose
        key changed in their chunk's window, at their high watermark's place; and the
        counts of the windows' changes (`changed`, `cut`, `moved`)."""
        from pyspark.sql import functions as F

        emits = [e for e in emits if e.target.sink not in self.typed]
        if not emits:
            return None
        # What the windows hold for these chunks, counted in one small job: a join that
        # can drop nothing (a quiet table's windows are empty) is left out, and with it
        # its per-row work (the key as JSON, a JSON path per key column).
        found = (
            _Found(0, 0, 0)
            if inside is None
            else inside.selectExpr(
                "count_if(action <> 'truncate') AS changed",
                "count_if(action = 'truncate') AS cut",
                "count_if(old IS NOT NULL) AS moved",
            ).first()
        )
        # The window's keys are usually few next to the chunks' rows. Sent to every task
        # (a hash lookup per row) instead of shuffling the rows to join them.
        small = F.broadcast if found.changed + found.cut <= BROADCAST_ROWS else (lambda d: d)
        staged = spark.read.schema(_STAGED_DDL).parquet(
            *(self.staging.chunk(e.high.backfill, e.high.chunk, e.high.attempt) for e in emits)
        )
        rows = staged.join(em, ["backfill", "chunk"])
        keyed = {e.target.table_id: e.target for e in emits if e.target.key_columns}
        moved = None
        if keyed and found.moved:
            moved = moved_key([(t.schema, t.table, t.key_columns) for t in keyed.values()])
        rows = drop_sql(rows, inside, small, moved, bool(found.changed), bool(found.cut))
        return rows.selectExpr(
            f"{quote(self.source)} AS source",
            "high_lsn AS lsn",
            "CAST(high_seq + 1 + ord AS INT) AS seq",
            "CAST(NULL AS BIGINT) AS xid",
            "timestamp_micros(committed_us) AS committed_at",
            "'read' AS action",
            "`_schema` AS `schema`",
            "`_table` AS `table`",
            "pk",
            "record",
            "CAST(NULL AS STRING) AS old",
            "CAST(NULL AS STRING) AS annotations",
            "CAST(NULL AS ARRAY<STRING>) AS unchanged_toast",
            "`_oid` AS table_oid",
            "json_nulls",
            "CAST(NULL AS BIGINT) AS change_lsn",
            "CAST(NULL AS BIGINT) AS last_commit_lsn",
            "backfill",
            "_sink",
        ), found
