"""Where a table's live rows of some keys are: their data files and row positions, for
deletes written as deletes (merge-on-read) instead of rewritten files.

Given a table's key index (`key_index.py`) the rows are found in memory and only the files
holding them are read; without one, only the files whose key statistics can hold one of the
keys are read, and of them only the key columns (and the columns asked for). A row a
deletion vector already deletes is not live.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from walstream.lake.plain import plain
from walstream.lake.plan import HistoryPlan, Key, MirrorPlan, key_of

#: Rows per row group of the files merge-on-read writes: a batch reads back only the groups
#: that hold the rows it needs (`rows_at`: the versions a history ends, TOAST values).
ROW_GROUP = 16_384


@dataclass(frozen=True)
class DataFile:
    """A live data file: `path` as the filesystem opens it, `name` as the table's log names
    it, each key column's (min, max) where its statistics have them, and the positions
    already deleted (read only when the file is), with an identity of those deletes that
    changes when they do (None: unknown, read them each time). Where deletes only ever add
    up (Iceberg's delete files: the identity is the tuple of them), `deleted_in(parts)`
    reads the positions of some of them, so a known set grown by a few is read by those."""

    path: str
    name: str
    bounds: dict[str, tuple[Any, Any]]
    deleted: Callable[[], Any]
    deletes_id: Hashable = None
    deleted_in: Callable[[Sequence[Any]], Any] | None = None


@dataclass(frozen=True)
class Located:
    """The live rows of the keys asked for: positions per file name, and the rows (the key
    columns and the columns asked for, with `_file` and `_pos`)."""

    positions: dict[str, list[int]]
    rows: Any


def might_hold(file: DataFile, keys: Any) -> Any:
    """The keys (a pyarrow Table of key columns) the file's statistics do not rule out."""
    import pyarrow.compute as pc

    for column, (low, high) in file.bounds.items():
        if keys.num_rows == 0:
            break
        if low is None or high is None or column not in keys.column_names:
            continue
        values = keys[column]
        try:
            inside = pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
        except Exception:  # a bound of another type (a widened column): no pruning on it
            continue
        keys = keys.filter(pc.fill_null(inside, True))
    return keys


def locate(
    filesystem: Any, files: Sequence[DataFile], keys: Any, columns: Sequence[str] = ()
) -> Located:
    """The live rows of `keys` (a pyarrow Table of the key columns) in `files`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key = keys.column_names
    positions: dict[str, list[int]] = {}
    found = []
    for file in files:
        candidates = might_hold(file, keys)
        if candidates.num_rows == 0:
            continue
        data = read_keys(filesystem, file, keys.schema, columns)
        # the join on the keys alone (Arrow joins no list or struct column), then the rows
        at = data.select([*key, "_pos"]).join(candidates, keys=key, join_type="left semi")
        hits = data.take(pa.array(sorted(at["_pos"].to_pylist()), pa.int64()))
        if hits.num_rows == 0:
            continue
        deleted = file.deleted()
        if len(deleted):
            gone = pa.array(list(deleted), pa.int64())
            hits = hits.filter(pc.invert(pc.is_in(hits["_pos"], value_set=gone)))
        if hits.num_rows == 0:
            continue
        positions[file.name] = sorted(hits["_pos"].to_pylist())
        found.append(hits.append_column("_file", pa.repeat(file.name, hits.num_rows)))
    rows = pa.concat_tables(found, promote_options="permissive") if found else None
    return Located(positions, rows)


def read_keys(filesystem: Any, file: DataFile, key_schema: Any, columns: Sequence[str] = ()) -> Any:
    """A data file's key columns (in `key_schema`'s types) and `columns`, with `_pos`, each
    row's position in the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = key_schema.names
    wanted = list(dict.fromkeys([*key, *columns]))
    with filesystem.open_input_file(file.path) as f:
        data = pq.read_table(f, columns=[c for c in wanted if c in _names(f)])
    data = _as_read(data, wanted, key_schema)
    return data.append_column("_pos", pa.array(range(data.num_rows), pa.int64()))


def _as_read(data: Any, wanted: Sequence[str], key_schema: Any) -> Any:
    """Columns read from a data file as a reader sees them: a column the file predates is
    NULL, the keys in their own types (a file may hold views or a narrower type)."""
    import pyarrow as pa

    for c in wanted:
        if c not in data.column_names:
            data = data.append_column(c, pa.nulls(data.num_rows))
    for c in key_schema.names:
        i = data.column_names.index(c)
        data = data.set_column(i, c, data[c].cast(key_schema.field(c).type))
    return data


def current_rows(
    filesystem: Any,
    files: Sequence[DataFile],
    key_schema: Any,
    columns: Sequence[str],
    keys: list[Key],
    index: Any = None,
) -> dict[Key, dict[str, Any]]:
    """The live rows of `keys` (tuples, in `key_schema`'s columns), by key: what a
    merge-on-read mirror fills unchanged TOAST values from. With `index` (a
    `key_index.KeyIndex`), only the files holding them are read."""
    import pyarrow as pa

    key = key_schema.names
    wanted = pa.Table.from_pylist([dict(zip(key, k, strict=True)) for k in keys]).cast(key_schema)
    if index is not None:
        with index.lock:
            if index.sync(filesystem, files, key_schema):
                at = index.positions(files, wanted)
                found = rows_at(filesystem, files, at, key_schema, columns)
            else:
                found = locate(filesystem, files, wanted, columns).rows
    else:
        found = locate(filesystem, files, wanted, columns).rows
    if found is None:
        return {}
    return {key_of(r, key): {c: r[c] for c in columns} for r in found.to_pylist()}


def rows_at(
    filesystem: Any,
    files: Sequence[DataFile],
    positions: dict[str, list[int]],
    key_schema: Any,
    columns: Sequence[str],
) -> Any:
    """The rows at `positions` (by file name), with `_file` and `_pos`: of each file that
    holds one, only the row groups that do are read."""
    import bisect

    import pyarrow as pa
    import pyarrow.parquet as pq

    by_name = {f.name: f for f in files}
    key = key_schema.names
    wanted = list(dict.fromkeys([*key, *columns]))
    found = []
    for name, at in positions.items():
        with filesystem.open_input_file(by_name[name].path) as f:
            parquet = pq.ParquetFile(f)
            meta = parquet.metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            groups = sorted({bisect.bisect_right(starts, p) - 1 for p in at})
            names = set(parquet.schema_arrow.names)
            data = parquet.read_row_groups(groups, columns=[c for c in wanted if c in names])
        offset, before = {}, 0  # where each group read starts in `data`
        for g in groups:
            offset[g], before = before, before + meta.row_group(g).num_rows
        take = [offset[g] + p - starts[g] for p in at for g in [bisect.bisect_right(starts, p) - 1]]
        data = _as_read(plain(data).take(pa.array(take, pa.int64())), wanted, key_schema)
        data = data.append_column("_pos", pa.array(at, pa.int64()))
        found.append(data.append_column("_file", pa.repeat(name, data.num_rows)))
    return pa.concat_tables(found, promote_options="permissive") if found else None


def replaced(
    filesystem: Any,
    files: Sequence[DataFile],
    plan: MirrorPlan,
    key: Sequence[str],
    index: Any = None,
    also: Any = None,
) -> dict[str, list[int]]:
    """The positions (by file) of the live rows a mirror plan upserts or deletes, and of
    the keys `also` (a pyarrow Table of key columns: keys the executors planned); none
    when every key is new to the table (inserted in the batch first). With `index` (a
    `key_index.KeyIndex`), found in memory; else in the files."""
    import pyarrow as pa

    ups = plan.upserts.select(list(key))
    parts = [] if plan.appends_only else [ups, plan.deletes.select(list(key)).cast(ups.schema)]
    if also is not None:
        parts.append(also.select(list(key)).cast(ups.schema))
    touched = pa.concat_tables(parts) if parts else None
    if touched is None or not touched.num_rows:
        return {}
    if index is not None:
        with index.lock:
            if index.sync(filesystem, files, touched.schema):
                return index.positions(files, touched)
    return locate(filesystem, files, touched).positions


def _names(f: Any) -> set[str]:
    """The column names of an open Parquet file (its footer only)."""
    import pyarrow.parquet as pq

    names = set(pq.read_schema(f).names)
    f.seek(0)
    return names


def live_range(
    filesystem: Any,
    files: Sequence[DataFile],
    columns: Sequence[str],
    column: str,
    low: Any,
    high: Any,
) -> Any:
    """`columns` of the live rows whose `column` is within [low, high] (files whose
    statistics rule the range out are not read)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = list(dict.fromkeys([*columns, column]))
    out = []
    for file in files:
        bound = file.bounds.get(column)
        if bound is not None and bound[0] is not None and bound[1] is not None:
            try:
                if bound[1] < low or bound[0] > high:
                    continue
            except TypeError:  # bounds of another type: read the file
                pass
        with filesystem.open_input_file(file.path) as f:
            data = plain(pq.read_table(f, columns=wanted))
        keep = pc.and_(pc.greater_equal(data[column], low), pc.less_equal(data[column], high))
        deleted = file.deleted()
        if len(deleted):
            positions = pa.array(range(data.num_rows), pa.int64())
            gone = pa.array(list(deleted), pa.int64())
            keep = pc.and_(keep, pc.invert(pc.is_in(positions, value_set=gone)))
        out.append(data.filter(pc.fill_null(keep, False)).select(list(columns)))
    if not out:
        return pa.table({c: pa.array([]) for c in columns})
    return pa.concat_tables(out, promote_options="permissive")


def closed_versions(
    filesystem: Any,
    files: Sequence[DataFile],
    plan: HistoryPlan,
    key: Sequence[str],
    key_schema: Any,
    schema: Any,
    index: Any,
) -> tuple[dict[str, list[int]], Any]:
    """The current versions a history plan ends: their positions (by file), and the rows
    again as closed versions (`valid_to` set, `is_current` false) in the table's `schema`.
    `index`: the table's `key_index.KeyIndex` of current rows (`where="is_current"`)."""
    import pyarrow as pa

    ending = None
    if plan.close_all_at is None:
        wanted = [dict(zip(key, k, strict=True)) for k in plan.closes]
        ending = pa.Table.from_pylist(wanted, schema=key_schema)
    with index.lock:
        if index.sync(filesystem, files, key_schema):
            at = index.positions(files, ending)
        else:  # too large to index: the current rows found in the files
            at = _current_positions(filesystem, files, key_schema, ending)
    rows = rows_at(filesystem, files, at, key_schema, schema.names)
    if rows is None:
        return {}, schema.empty_table()
    ends = [
        plan.closes.get(key_of(r, key), plan.close_all_at) for r in rows.select(key).to_pylist()
    ]
    valid_to = pa.array(ends, schema.field("valid_to").type)
    rows = rows.set_column(rows.schema.get_field_index("valid_to"), "valid_to", valid_to)
    done = pa.repeat(False, rows.num_rows)
    rows = rows.set_column(rows.schema.get_field_index("is_current"), "is_current", done)
    return at, rows.select(schema.names).cast(schema)


def _current_positions(
    filesystem: Any, files: Sequence[DataFile], key_schema: Any, keys: Any | None
) -> dict[str, list[int]]:
    """The positions of the current rows (`is_current`) of `keys` (None: of every key)."""
    import pyarrow.compute as pc

    out = {}
    for file in files:
        data = read_keys(filesystem, file, key_schema, ["is_current"])
        data = data.filter(pc.fill_null(data["is_current"], False))
        if keys is not None:
            data = data.join(keys, keys=key_schema.names, join_type="left semi")
        deleted = file.deleted()
        at = sorted(p for p in data["_pos"].to_pylist() if p not in deleted)
        if at:
            out[file.name] = at
    return out
