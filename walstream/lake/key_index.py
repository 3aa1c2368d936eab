"""The key columns of a merge-on-read table's live data files, kept on the driver between
batches, so that finding the rows a batch replaces costs a probe in memory, not a read of
every file its keys may fall in (with keys spread over the table, that is every file).

Only what never changes is kept: a data file's key columns (a data file is written once)
and a file's deleted positions under one identity of its deletes (a Delta vector, a set of
Iceberg delete files). Which files are live comes from the table at each batch, so a
commit by another writer (a compaction, another sink) is followed, never trusted away.
Memory: the key columns plus 8 bytes a row (the file, the position); a table past
`MAX_ROWS` is not indexed (its batches read the files, as without the index).
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
class KeyIndex:
    """One table's index: each live file's key columns (with `_file` and `_pos`), and its
    deleted positions by the identity of its deletes."""

    key: list[str]
    #: A boolean column: only the rows where it is true are indexed (a history table's
    #: `is_current`: a row never changes in place, so a closed version is another row).
    where: str | None = None
    schema: list[tuple[str, Any]] | None = None  # the key types the files' keys are held in
    files: dict[str, Any] = field(default_factory=dict)
    deleted: dict[str, tuple[Hashable, Any]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # `_file` (an int32) -> the file's name
    rows: int = 0
    too_large: bool = False
    _combined: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, filesystem: Any, live: Sequence[DataFile], key_schema: Any) -> bool:
        """Follow the table's live files (read each new file's key columns, drop the files
        gone); False when the table is too large to index."""
        import pyarrow as pa
        import pyarrow.compute as pc

        types = [(f.name, f.type) for f in key_schema]
        if self.schema != types:  # the first batch, or a key type widened since
            self.files.clear()
            self.deleted.clear()
            self.names.clear()
            self.rows, self.schema, self._combined = 0, types, None
        names = {f.name for f in live}
        for gone in [n for n in self.files if n not in names]:
            self.rows -= self.files.pop(gone).num_rows
            self.deleted.pop(gone, None)
            self._combined = None
        if len(self.names) > 2 * len(self.files) + RENUMBER_SLACK:  # ids of files gone: renumber
            self.names = list(self.files)
            for i, (name, keys) in enumerate(self.files.items()):
                ids = pa.repeat(pa.scalar(i, pa.int32()), keys.num_rows)
                self.files[name] = keys.set_column(keys.num_columns - 1, "_file", ids)
        for f in live:
            if f.name in self.files or self.too_large:
                continue
            keys = read_keys(filesystem, f, key_schema, [self.where] if self.where else [])
            if self.where:
                keys = keys.filter(pc.fill_null(keys[self.where], False)).drop_columns(self.where)
            keys = keys.set_column(keys.num_columns - 1, "_pos", keys["_pos"].cast(pa.int32()))
            self.names.append(f.name)
            ids = pa.repeat(pa.scalar(len(self.names) - 1, pa.int32()), keys.num_rows)
            self.files[f.name] = keys.append_column("_file", ids)
            self.rows += keys.num_rows
            self._combined = None
            if self.rows > MAX_ROWS:
                log.warning(
                    "merge-on-read: not indexing the keys of a table of more than %d rows in "
                    "memory; its batches read its files' key columns instead",
                    MAX_ROWS,
                )
                self.files.clear()
                self.deleted.clear()
                self.names.clear()
                self.rows, self.too_large = 0, True
        return not self.too_large

    def positions(self, live: Sequence[DataFile], keys: Any | None) -> dict[str, list[int]]:
        """The live positions of `keys` (a pyarrow Table of the key columns; None: every
        key), by file name."""
        import pyarrow as pa

        if not self.files or (keys is not None and keys.num_rows == 0):
            return {}
        if self._combined is None:
            self._combined = pa.concat_tables(self.files.values())
        hits = (
            self._combined
            if keys is None
            else self._combined.join(keys, keys=self.key, join_type="left semi")
        )
        by_file: dict[str, list[int]] = {}
        for i, pos in zip(hits["_file"].to_pylist(), hits["_pos"].to_pylist(), strict=True):
            by_file.setdefault(self.names[i], []).append(pos)
        files = {f.name: f for f in live}
        out = {}
        for name, found in by_file.items():
            deleted = self._deleted(files[name])
            kept = sorted(p for p in found if p not in deleted)
            if kept:
                out[name] = kept
        return out

    def _deleted(self, file: DataFile) -> Any:
        """The file's deleted positions, read again only when its deletes changed."""
        known = self.deleted.get(file.name)
        if file.deletes_id is not None and known is not None and known[0] == file.deletes_id:
            return known[1]
        bitmap = file.deleted()
        if file.deletes_id is not None:
            self.deleted[file.name] = (file.deletes_id, bitmap)
        return bitmap


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

    def forget(self, location: str) -> None:
        with self._lock:
            self._by_table.pop(location, None)
