"""The lake table of one source table: its schema per mode, and the rows a commit writes.

Shared by the Delta and Iceberg sinks: both turn a batch into the same Arrow data
(the target schema, filled TOAST values, the MERGE source of mirror and history),
then commit it their own way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from walstream.errors import SinkError
from walstream.lake.contract import FilesBatch, LakeDestination, TableBatch
from walstream.lake.plan import (
    CurrentRows,
    HistoryPlan,
    Key,
    MirrorPlan,
    changelog_rows,
    fill_toast,
    history_schema,
    key_of,
    split_moves,
)


def _pa() -> Any:
    import pyarrow as pa

    return pa


@dataclass(frozen=True)
class LakeTable:
    """Where one source table's rows go, in which mode."""

    config: LakeDestination
    schema_name: str
    table_name: str

    @property
    def location(self) -> str:
        return self.config.location(self.schema_name, self.table_name)

    def path_for_messages(self) -> str:
        return self.config.location_for_messages(self.schema_name, self.table_name)

    # -- schema ---------------------------------------------------------------------------------
    def schema(self, batch: TableBatch) -> Any:
        """The lake table's Arrow schema for this batch's columns, in the sink's mode."""
        pa = _pa()
        rows = batch.rows.schema
        cols = [rows.field(c) for c in batch.shape.names]
        ts = pa.timestamp("us", tz="UTC")
        mode = self.config.mode
        if mode == "mirror":
            return pa.schema(cols)
        if mode == "history":
            return history_schema(rows, batch.shape.names)
        return pa.schema(
            [
                pa.field("_op", pa.string()),
                pa.field("_lsn", pa.int64()),
                pa.field("_seq", pa.int32()),
                pa.field("_committed_at", ts),
                *cols,
                rows.field("_toast"),
                rows.field("_before"),
            ]
        )

    def check_schema(self, existing: Any, wanted: Any) -> dict[str, Any]:
        """The columns whose type widened at the source ({name: new Arrow type}); a type
        change that does not widen stops the sink. New columns, and new fields of
        `_before`, are added by the write."""
        have = {f.name: f.type for f in existing}
        widened = {}
        for f in wanted:
            old = have.get(f.name)
            if old is None or _same(old, f.type):
                continue
            merged = _merged(old, f.type)
            if merged is not None:
                if _rewritten(old, merged):
                    widened[f.name] = merged
                continue
            raise SinkError(
                f"lake table {self.path_for_messages()}: column {f.name} is {old} there but "
                f"{f.type} in the source now",
                "a type change the lake table cannot take (only int → bigint, real → double "
                "and a larger numeric precision are applied): rewrite the table (drop it and "
                "backfill), or leave the column out (columns: exclude: [...])",
                retryable=False,
            )
        return widened

    def files_schema(self, batch: FilesBatch, metas: Sequence[Any]) -> Any:
        """The columns staged files must have to be a table's data files as they are: a
        mirror's are the shape's; a changelog's are as the executors wrote them (the first
        file's, which `adoptable` holds the others and the table to)."""
        if self.config.mode == "changelog" and metas:
            return metas[0].schema.to_arrow_schema()
        return batch.shape.arrow_schema()

    # -- rows -----------------------------------------------------------------------------------
    def changelog(self, batch: TableBatch) -> Any:
        return changelog_rows(batch.rows, batch.shape.names)

    def filled(self, batch: TableBatch, current: CurrentRows) -> Any:
        """The batch's rows for mirror and history: unchanged TOAST values filled in
        (`current`: the table's current rows of some keys), a key change split into the old
        key's delete and the new key's update."""
        key = batch.shape.key
        return split_moves(fill_toast(batch.rows, key, current, batch.source_rows), key)

    def mirror_source(self, plan: MirrorPlan, key: Sequence[str], columns: Sequence[str]) -> Any:
        """Upserts and deletes as one MERGE source, `_delete` telling them apart."""
        pa = _pa()
        ups = plan.upserts.append_column("_delete", pa.repeat(False, plan.upserts.num_rows))
        dels = plan.deletes
        for name in columns:
            if name not in key:
                f = ups.schema.field(name)
                dels = dels.append_column(f, pa.nulls(dels.num_rows, f.type))
        dels = dels.append_column("_delete", pa.repeat(True, dels.num_rows))
        return pa.concat_tables([ups, dels.select(ups.schema.names).cast(ups.schema)])

    def history_source(
        self, plan: HistoryPlan, key: Sequence[str], current_keys: Callable[[], Any]
    ) -> Any:
        """The new versions (`_close` false) and one closing row (`_close` true, `valid_from`:
        when the current version ends) per current target row the batch ends."""
        pa = _pa()
        closes = dict(plan.closes)
        if plan.close_all_at is not None:  # a truncate ends every current row
            for k in _keys(current_keys(), key):
                closes.setdefault(k, plan.close_all_at)
        versions = plan.versions
        schema = versions.schema
        closing = pa.Table.from_pylist(
            [{**dict(zip(key, k, strict=True)), "valid_from": at} for k, at in closes.items()],
            schema=schema,
        )
        both = pa.concat_tables([versions, closing])
        flags = [False] * versions.num_rows + [True] * closing.num_rows
        return both.append_column("_close", pa.array(flags, pa.bool_()))


def widens(old: Any, new: Any) -> bool:
    """`new` holds every value of `old`, and both Delta and Iceberg can change one into the
    other: int → bigint, float → double, decimal(p, s) → decimal(p' > p, s)."""
    pa = _pa()
    if (old, new) in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64())):
        return True
    return (
        pa.types.is_decimal(old)
        and pa.types.is_decimal(new)
        and new.scale == old.scale
        and new.precision >= old.precision
    )


def _merged(old: Any, new: Any) -> Any | None:
    """The type a table column of type `old` takes for values of type `new`: `new` where it
    widens `old`; for a struct (`_before`), the union of both fields, each field merged
    (a field added at the source is added, a dropped one stays). None: it cannot."""
    pa = _pa()
    if _same(old, new):
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        news = {f.name: f for f in new}
        fields = []
        for f in old:
            if f.name in news:
                m = _merged(f.type, news[f.name].type)
                if m is None:
                    return None
                f = f.with_type(m)
            fields.append(f)
        have = {f.name for f in old}
        return pa.struct(fields + [f for f in new if f.name not in have])
    return new if widens(old, new) else None


def _rewritten(old: Any, merged: Any) -> bool:
    """Whether a column's values must be rewritten to become `merged`: a type widened, in
    it or in one of its fields (fields added to a struct are not: the write adds them)."""
    pa = _pa()
    if pa.types.is_struct(old) and pa.types.is_struct(merged):
        by_name = {f.name: f.type for f in merged}
        return any(_rewritten(f.type, by_name[f.name]) for f in old)
    return not _same(old, merged)


def _same(a: Any, b: Any) -> bool:
    """Types equal up to what writers normalise (large types, list element names, UTC)."""
    return _norm(a) == _norm(b)


def _norm(t: Any) -> Any:
    pa = _pa()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_norm(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _norm(f.type)) for f in t])
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz in ("UTC", "+00:00", "Etc/UTC") else t.tz)
    return t


def _keys(data: Any, key: Sequence[str]) -> list[Key]:
    """Every key of a pyarrow dataset."""
    return [key_of(r, key) for r in data.to_table(columns=list(key)).to_pylist()]


def key_schema(batch: TableBatch) -> Any:
    """The key columns' Arrow schema of a batch's rows."""
    return _pa().schema([batch.rows.schema.field(k) for k in batch.shape.key])


def dataset_field(data: Any, name: str) -> Any:
    """A filter's column of a pyarrow dataset. Text and binary columns are cast to their plain
    type: a file written by delta-rs' MERGE stores them as views, and Arrow compares a view's
    statistics with a plain value in no kernel (the cast costs those columns' file skipping)."""
    import pyarrow.dataset as ds

    pa = _pa()
    field = ds.field(name)
    t = data.schema.field(name).type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return field.cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return field.cast(pa.binary())
    return field


def key_filter_rows(data: Any, key: Sequence[str], keys: list[Key]) -> dict[Key, dict[str, Any]]:
    """The rows of a pyarrow dataset with these keys, by key."""

    first = sorted({k[0] for k in keys}, key=repr)
    rows = data.to_table(filter=dataset_field(data, key[0]).isin(first)).to_pylist()
    wanted = set(keys)
    return {k: r for r in rows if (k := key_of(r, key)) in wanted}


def present_keys(read_range: Callable[[str, Any, Any], Any], keys: Any) -> Any:
    """Which of `keys` (a pyarrow Table of key columns) a table has. `read_range(column,
    low, high)` reads the table's key columns where the first key column is within
    [low, high] (files outside it skipped by their statistics)."""
    import pyarrow.compute as pc

    if keys.num_rows == 0:
        return keys
    first = keys.column_names[0]
    bounds = pc.min_max(keys[first]).as_py()
    found = read_range(first, bounds["min"], bounds["max"])
    if found.num_rows == 0:
        return keys.slice(0, 0)
    found = found.select(keys.column_names).cast(keys.schema)
    return keys.join(found, keys=keys.column_names, join_type="left semi")


def adoptable(files: Any, wanted: Any, existing: Any | None) -> bool:
    """Whether staged files whose Arrow schemas are `files` can be a table's data files as
    they are: each has the shape's columns now (`wanted`) in their types, and so has the
    table (`existing`, None when it does not exist yet)."""
    names = wanted.names
    if any(
        s.names != names or not all(_same(a.type, b.type) for a, b in zip(s, wanted, strict=True))
        for s in files
    ):
        return False
    if existing is None:
        return True
    have = {f.name: f.type for f in existing}
    return set(have) == set(names) and all(_same(have[f.name], f.type) for f in wanted)


def staged_footers(
    files: Sequence[tuple[str, Placed]], wanted: Any, existing: Any
) -> tuple[list[Any] | None, Any]:
    """(the files' Parquet footers, None) when staged files (each: its staged path, where
    the table keeps it) can be the table's data files as they are (`adoptable`: the
    shape's columns `wanted`, as the table `existing` has them); else (None, their rows in
    `existing`'s schema), for the sink to write with its own (a column the table has that
    the batch does not, or of another type)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    at = [staged_or(staged, moved) for staged, moved in files]
    metas = footers(at)
    if adoptable([m.schema.to_arrow_schema() for m in metas], wanted, existing):
        return metas, None
    parts = []
    for filesystem, path in at:
        with filesystem.open_input_file(path) as f:
            parts.append(as_table(pq.read_table(f), existing))
    return None, pa.concat_tables(parts)


def as_table(rows: Any, schema: Any) -> Any:
    """Rows in a table's schema: a column the table has and the rows do not (dropped at the
    source) is NULL."""
    import pyarrow as pa

    for f in schema:
        if f.name not in rows.column_names:
            rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
    return rows.select(schema.names).cast(schema)


#: A file as (pyarrow filesystem, path in it): a table's files on object storage are opened
#: with the destination's credentials, not from their URI alone.
Placed = tuple[Any, str]


def staged_or(staged: str, moved: Placed) -> Placed:
    """Where a staged file is now: still staged, or at `moved`, where an earlier try of
    the batch moved it before it could commit."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(staged)
    if filesystem.get_file_info(path).type == pafs.FileType.File:
        return filesystem, path
    return moved


def footers(files: list[Placed]) -> list[Any]:
    """The Parquet footers (metadata) of these files."""
    import pyarrow.parquet as pq

    out = []
    for filesystem, path in files:
        with filesystem.open_input_file(path) as f:
            out.append(pq.read_metadata(f))
    return out


def has_any_key(
    files: list[Placed], key: list[str], read_range: Callable[[str, Any, Any], Any]
) -> bool:
    """Whether a table (read through `read_range`, see `present_keys`) has any key of these
    staged files."""
    import pyarrow.parquet as pq

    return any(
        present_keys(read_range, pq.read_table(path, columns=key, filesystem=fs)).num_rows
        for fs, path in files
    )


def move_staged(staged: str, target: Placed) -> None:
    """Move a staged file to where a table keeps its data files (any two filesystems). A
    try that moved it before a crash left it there: that is fine; neither is not."""
    from pyarrow import fs as pafs

    src_fs, src = pafs.FileSystem.from_uri(staged)
    dst_fs, dst = target
    if src_fs.get_file_info(src).type == pafs.FileType.NotFound:
        if dst_fs.get_file_info(dst).type == pafs.FileType.File:
            return
        raise SinkError(
            f"lake: the staged file {staged} is gone (and not at {dst})",
            "files under the checkpoint directory must stay while walstream runs: restore it; "
            "for a backfill's chunk, cancel the backfill (`walstream backfill cancel`) and "
            "request it again",
            retryable=False,
        )
    local = src_fs.type_name == dst_fs.type_name == "local"  # pyiceberg's is a subclass
    if dst_fs.type_name == "local":
        dst_fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
    if local or (src_fs.type_name == dst_fs.type_name and src_fs.equals(dst_fs)):
        src_fs.move(src, dst)
        return
    pafs.copy_files(src, dst, source_filesystem=src_fs, destination_filesystem=dst_fs)
    src_fs.delete_file(src)
