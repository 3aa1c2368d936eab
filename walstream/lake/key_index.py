"""The keys of a merge-on-read table's live data files, kept on the driver between batches,
so that finding the rows a batch replaces costs in proportion to the batch, not the table.

Each key is held as one sortable value (the key column itself, or a length-prefixed text
of a composite key) beside its file and position, in sorted runs: a new file is one run,
and runs of like size are merged, so a table has about log2(rows) runs and a batch's keys
are found by a binary search in each (`pyarrow.compute.search_sorted`).

Only what never changes is kept: a data file's keys (a data file is written once) and a
file's deleted positions under one identity of its deletes (a Delta vector, a set of
Iceberg delete files). Which files are live comes from the table at each batch, so a
commit by another writer (a compaction, another sink) is followed, never trusted away.
Memory: the keys plus 8 bytes a row; a table past `MAX_ROWS` is not indexed (its batches
read the files, as without the index).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.lake.positions import DataFile, read_keys

log = logging.getLogger(__name__)

#: Ids of files gone past which the live files are numbered afresh.
RENUMBER_SLACK = 1000
#: Rows past which a table is not indexed (about 3.2 GB of an int64 key and positions).
MAX_ROWS = 200_000_000


@dataclass
class _Run:
    """Keys in order (`k`, one Arrow array) with each one's file id and position (numpy)."""

    k: Any
    file: Any
    pos: Any


@dataclass
class KeyIndex:
    """One table's index: the live files' keys in sorted runs, each file's id (`files`,
    `names`), and each file's deleted positions by the identity of its deletes."""

    key: list[str]
    #: A boolean column: only the rows where it is true are indexed (a history table's
    #: `is_current`: a row never changes in place, so a closed version is another row).
    where: str | None = None
    schema: list[tuple[str, Any]] | None = None  # the key types the files' keys are held in
    files: dict[str, int] = field(default_factory=dict)  # live file -> its id
    names: list[str] = field(default_factory=list)  # id -> the file's name
    counts: dict[str, int] = field(default_factory=dict)  # live file -> rows indexed
    deleted: dict[str, tuple[Hashable, Any]] = field(default_factory=dict)
    rows: int = 0  # of the live files
    dead: int = 0  # of files gone, still in the runs
    too_large: bool = False
    _runs: list[_Run] = field(default_factory=list)
    _alive: Any = None  # a numpy bool per file id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, filesystem: Any, live: Sequence[DataFile], key_schema: Any) -> bool:
        """Follow the table's live files (read each new file's keys, drop the files gone);
        False when the table is too large to index."""
        types = [(f.name, f.type) for f in key_schema]
        if self.schema != types:  # the first batch, or a key type widened since
            self._reset()
            self.schema = types
        names = {f.name for f in live}
        for gone in [n for n in self.files if n not in names]:
            self._alive[self.files.pop(gone)] = False
            gone_rows = self.counts.pop(gone)
            self.rows, self.dead = self.rows - gone_rows, self.dead + gone_rows
            self.deleted.pop(gone, None)
        if len(self.names) > 2 * len(self.files) + RENUMBER_SLACK or self.dead > self.rows:
            self._renumber()  # the ids and rows of files gone given up
        new: list[_Run] = []
        for f in live:
            if f.name in self.files or self.too_large:
                continue
            new.append(self._read(f.name, read_keys(filesystem, f, key_schema, self._extra)))
            if self.rows > MAX_ROWS:
                log.warning(
                    "merge-on-read: not indexing the keys of a table of more than %d rows in "
                    "memory; its batches read its files' key columns instead",
                    MAX_ROWS,
                )
                self._reset()
                self.too_large, new = True, []
        if new:  # the files new since the last batch: one run, sorted once
            self._runs.append(self._merge(*new) if len(new) > 1 else _sorted(new[0]))
            while len(self._runs) > 1 and len(self._runs[-2].k) <= 2 * len(self._runs[-1].k):
                self._runs[-2:] = [self._merge(*self._runs[-2:])]
        return not self.too_large

    def positions(self, live: Sequence[DataFile], keys: Any | None) -> dict[str, list[int]]:
        """The live positions of `keys` (a pyarrow Table of the key columns; None: every
        key), by file name."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.files or (keys is not None and keys.num_rows == 0):
            return {}
        if keys is None:
            file = np.concatenate([r.file for r in self._runs])
            pos = np.concatenate([r.pos for r in self._runs])
        else:
            typed = keys.select(self.key).cast(pa.schema(self.schema or []))
            needles = pc.drop_null(pc.unique(sortable(typed, self.key)))
            found = [_search(r, needles) for r in self._runs]
            file = np.concatenate([r.file[at] for r, at in zip(self._runs, found, strict=True)])
            pos = np.concatenate([r.pos[at] for r, at in zip(self._runs, found, strict=True)])
        keep = self._alive[file]
        file, pos = file[keep], pos[keep]
        order = np.lexsort((pos, file))
        file, pos = file[order], pos[order]
        bounds = np.flatnonzero(np.diff(file)) + 1
        files = {f.name: f for f in live}
        out = {}
        for ids, found_pos in zip(np.split(file, bounds), np.split(pos, bounds), strict=True):
            if not len(ids):
                continue
            name = self.names[int(ids[0])]
            deleted = self._deleted(files[name])
            kept = [p for p in found_pos.tolist() if p not in deleted]
            if kept:
                out[name] = kept
        return out

    @property
    def _extra(self) -> list[str]:
        return [self.where] if self.where else []

    def _read(self, name: str, read: Any) -> _Run:
        """A new file's keys (`read`: its key columns, `_pos` and `where`), numbered."""
        import numpy as np
        import pyarrow.compute as pc

        if self.where:
            read = read.filter(pc.fill_null(read[self.where], False))
        file_id = len(self.names)
        self.names.append(name)
        self.files[name], self.counts[name] = file_id, read.num_rows
        self.rows += read.num_rows
        if file_id >= len(self._alive):
            self._alive = np.concatenate([self._alive, np.ones(len(self._alive), bool)])
        pos = read["_pos"].to_numpy().astype(np.int32)
        return _Run(sortable(read, self.key), np.full(len(pos), file_id, np.int32), pos)

    def _merge(self, *runs: _Run) -> _Run:
        """One sorted run of several, without the rows of files gone."""
        import numpy as np
        import pyarrow as pa

        file = np.concatenate([r.file for r in runs])
        pos = np.concatenate([r.pos for r in runs])
        k = pa.concat_arrays([r.k for r in runs])
        keep = self._alive[file]
        if not keep.all():
            self.dead -= len(keep) - int(keep.sum())
            k, file, pos = k.filter(pa.array(keep)), file[keep], pos[keep]
        return _sorted(_Run(k, file, pos))

    def _renumber(self) -> None:
        """Give up the ids of files gone: the live files numbered afresh, in order."""
        import numpy as np
        import pyarrow as pa

        new_id = np.full(len(self._alive), -1, np.int32)
        live_ids = sorted(self.files.values())
        new_id[live_ids] = np.arange(len(live_ids), dtype=np.int32)
        runs = []
        for r in self._runs:
            keep = self._alive[r.file]
            if keep.any():
                runs.append(_Run(r.k.filter(pa.array(keep)), new_id[r.file[keep]], r.pos[keep]))
        self._runs = runs
        self.names = [self.names[i] for i in live_ids]
        self.files = {n: i for i, n in enumerate(self.names)}
        self._alive, self.dead = np.ones(max(64, 2 * len(self.names)), bool), 0

    def _reset(self) -> None:
        import numpy as np

        self.files.clear()
        self.counts.clear()
        self.deleted.clear()
        self.names.clear()
        self._runs.clear()
        self.rows, self.dead = 0, 0
        self._alive = np.ones(64, bool)

    def _deleted(self, file: DataFile) -> Any:
        """The file's deleted positions, read again only when its deletes changed."""
        known = self.deleted.get(file.name)
        if file.deletes_id is not None and known is not None and known[0] == file.deletes_id:
            return known[1]
        if (  # deletes that add up, grown since: only the new ones read
            known is not None
            and file.deleted_in is not None
            and isinstance(file.deletes_id, tuple)
            and isinstance(known[0], tuple)
            and set(known[0]) <= set(file.deletes_id)
        ):
            bitmap = known[1] | file.deleted_in(sorted(set(file.deletes_id) - set(known[0])))
        else:
            bitmap = file.deleted()
        if file.deletes_id is not None:
            self.deleted[file.name] = (file.deletes_id, bitmap)
        return bitmap


def _sorted(run: _Run) -> _Run:
    import pyarrow.compute as pc

    order = pc.sort_indices(run.k).to_numpy()
    return _Run(run.k.take(order), run.file[order], run.pos[order])


def _search(run: _Run, needles: Any) -> Any:
    """The indexes in `run` of the keys equal to one of `needles` (each key's run of equal
    values: a key may be in several files, all but one of its rows deleted)."""
    import numpy as np
    import pyarrow.compute as pc

    low = pc.search_sorted(run.k, needles, side="left").to_numpy().astype(np.int64)
    high = pc.search_sorted(run.k, needles, side="right").to_numpy().astype(np.int64)
    hit = high > low
    low, count = low[hit], (high - low)[hit]
    if not len(count) or (count == 1).all():
        return low
    starts = np.repeat(np.cumsum(count) - count, count)
    return np.repeat(low, count) + np.arange(int(count.sum())) - starts


def _direct(t: Any) -> bool:
    """A type a key of one column is searched in as it is."""
    import pyarrow.types as pt

    plain = (pt.is_integer, pt.is_string, pt.is_large_string, pt.is_binary, pt.is_large_binary)
    return any(is_(t) for is_ in (*plain, pt.is_date, pt.is_timestamp, pt.is_time))


def sortable(table: Any, key: Sequence[str]) -> Any:
    """One value a key (the columns `key` of `table`), equal for equal keys: the column
    itself for a key of one column of a plain type, else each part's text, length-prefixed
    and joined by U+001F (as `backfill.dblog` makes keys: no two keys make one text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first = table[key[0]]
    if len(key) == 1 and _direct(first.type):
        return first.combine_chunks()
    parts = []
    for c in key:
        col = table[c].combine_chunks()
        if pa.types.is_fixed_size_binary(col.type):
            col = col.cast(pa.binary())
        if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
            col = col.cast(pa.string())
        col = col.cast(pa.large_binary())
        length = pc.cast(pc.binary_length(col), pa.string()).cast(pa.large_binary())
        parts.append(pc.binary_join_element_wise(length, col, pa.scalar(b":", pa.large_binary())))
    return pc.binary_join_element_wise(*parts, pa.scalar(b"\x1f", pa.large_binary()))


class KeyIndexes:
    """The indexes of a sink's tables, by location."""

    def __init__(self) -> None:
        self._by_table: dict[str, KeyIndex] = {}
        self._lock = threading.Lock()

    def of(self, location: str, key: Sequence[str], where: str | None = None) -> KeyIndex:
        with self._lock:
            index = self._by_table.get(location)
            if index is None or (index.key, index.where) != (list(key), where):
                index = self._by_table[location] = KeyIndex(list(key), where)
            return index
