"""Iceberg position deletes walstream writes itself (the Iceberg spec, "Position Delete
Files", format version 2): rows of data files marked deleted without rewriting the files.

pyiceberg reads position deletes but writes none (its deletes rewrite files); here a
delete file is written on the spec (`file_path`, `pos`, sorted, with the spec's reserved
field ids) and added through pyiceberg's own snapshot producer, in a manifest of
`deletes` content. The tests read the result with DuckDB's iceberg extension and pyiceberg.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.lake.positions import DataFile
from walstream.lake.storage import file_at

#: Position delete files kept in memory once read (by their URI: each is written once).
DELETE_FILES_KEPT = 4096
_DELETE_FILES: dict[str, Any] = {}
_DELETE_FILES_LOCK = threading.Lock()

#: The spec's reserved field ids of a position delete file's columns.
FILE_PATH_ID = 2147483546
POS_ID = 2147483545


def data_files(table: Any, key: Sequence[str], known: LiveFiles | None = None) -> list[DataFile]:
    """The current snapshot's data files as `positions.DataFile`s: key bounds from their
    manifests, deleted positions from the position delete files that name them. With
    `known` (kept between batches), only the manifests new since are read."""
    if known is not None:
        return known.of(table, key)
    out = []
    for task in table.scan().plan_files():
        deletes = sorted(d.file_path for d in task.delete_files)
        out.append(_data_file(table, task.file, _bounds(table, key, task.file), deletes))
    return out


def _data_file(table: Any, f: Any, bounds: dict[str, Any], deletes: Sequence[str]) -> DataFile:
    return DataFile(
        file_at(table.io, f.file_path)[1],
        f.file_path,
        bounds,
        functools.partial(deleted_positions, table, f.file_path, deletes),
        tuple(deletes),
        functools.partial(deleted_positions, table, f.file_path),
    )


def _bounds(table: Any, key: Sequence[str], f: Any) -> dict[str, tuple[Any, Any]]:
    """The (min, max) of each key column a data file's manifest entry has."""
    from pyiceberg.conversions import from_bytes

    schema = table.schema()
    low, high = f.lower_bounds or {}, f.upper_bounds or {}
    bounds = {}
    for name in key:
        field = schema.find_field(name)
        if field.field_id in low and field.field_id in high:
            try:
                bounds[name] = (
                    from_bytes(field.field_type, low[field.field_id]),
                    from_bytes(field.field_type, high[field.field_id]),
                )
            except Exception:  # a type whose bounds do not decode plainly: no pruning
                continue
    return bounds


@dataclass(frozen=True)
class _Manifest:
    """A manifest's live entries: data files with their data sequence numbers, position
    delete files (path, sequence number); `plain` False when it holds deletes this module
    does not apply itself (equality deletes, deletion vectors)."""

    data: list[tuple[Any, int]]
    deletes: list[tuple[str, int]]
    plain: bool


@dataclass
class _Known:
    snapshot: int | None = None
    key: list[str] = field(default_factory=list)
    manifests: dict[str, _Manifest] = field(default_factory=dict)
    names: dict[str, frozenset[str]] = field(default_factory=dict)  # delete file -> data files
    bounds: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: list[DataFile] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LiveFiles:
    """The live data files of a sink's Iceberg tables, kept between batches: a manifest is
    read once (manifests are written once), a position delete file once (which data files
    it names), so a batch reads only what the commits since the last one added, not every
    manifest of a table that gains two a batch until optimize.

    A position delete applies to a data file it names whose data sequence number is not
    above its own (the spec's rule); a table holding equality deletes or deletion vectors
    is planned by pyiceberg instead."""

    def __init__(self) -> None:
        self._tables: dict[str, _Known] = {}
        self._lock = threading.Lock()

    def of(self, table: Any, key: Sequence[str]) -> list[DataFile]:
        snapshot = table.current_snapshot()
        if snapshot is None:
            return []
        with self._lock:
            known = self._tables.setdefault(table.location(), _Known())
        with known.lock:
            return self._follow(known, table, snapshot, list(key))

    def _follow(self, known: _Known, table: Any, snapshot: Any, key: list[str]) -> list[DataFile]:
        if known.snapshot == snapshot.snapshot_id and known.key == key:
            return known.files
        listed = snapshot.manifests(table.io)
        manifests = {
            m.manifest_path: known.manifests.get(m.manifest_path) or _read_manifest(table.io, m)
            for m in listed
        }
        if not all(m.plain for m in manifests.values()):
            known.manifests = manifests  # not read again by the next batch
            return data_files(table, key)
        named: dict[str, list[tuple[str, int]]] = {}
        names = {}
        for m in manifests.values():
            for path, seq in m.deletes:
                names[path] = known.names.get(path) or _named(table, path)
                for data_path in names[path]:
                    named.setdefault(data_path, []).append((path, seq))
        if known.key != key:
            known.bounds.clear()
        bounds, files = {}, []
        for m in manifests.values():
            for f, seq in m.data:
                path = f.file_path
                bounds[path] = known.bounds.get(path) or _bounds(table, key, f)
                deletes = sorted(d for d, d_seq in named.get(path, ()) if d_seq >= seq)
                files.append(_data_file(table, f, bounds[path], deletes))
        known.snapshot, known.key, known.manifests = snapshot.snapshot_id, key, manifests
        known.names, known.bounds, known.files = names, bounds, files
        return files


def _read_manifest(io: Any, manifest: Any) -> _Manifest:
    from pyiceberg.manifest import DataFileContent, FileFormat

    data, deletes, plain = [], [], True
    for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
        f, seq = entry.data_file, entry.sequence_number or 0
        if f.content == DataFileContent.DATA:
            data.append((f, seq))
        elif f.content == DataFileContent.POSITION_DELETES and f.file_format == FileFormat.PARQUET:
            deletes.append((f.file_path, seq))
        else:
            plain = False
    return _Manifest(data, deletes, plain)


def _named(table: Any, delete_file: str) -> frozenset[str]:
    """The data files a position delete file names."""
    import pyarrow.compute as pc

    return frozenset(pc.unique(_delete_file(table, delete_file)["file_path"]).to_pylist())


def deleted_positions(table: Any, path: str, delete_files: Sequence[str]) -> Any:
    """The positions of `path` the position delete files delete already."""
    import pyarrow.compute as pc

    from walstream.lake import deletion_vectors as dv

    out = dv.positions()
    for name in delete_files:
        data = _delete_file(table, name)
        out.update(data.filter(pc.equal(data["file_path"], path))["pos"].to_pylist())
    return out


def _delete_file(table: Any, name: str) -> Any:
    """A position delete file's rows; a delete file is written once: read once (up to the
    cache's size)."""
    import pyarrow.parquet as pq

    data = _DELETE_FILES.get(name)
    if data is None:
        with table.io.new_input(name).open() as f:
            data = pq.read_table(f, columns=["file_path", "pos"])
        _keep(name, data)
    return data


def _keep(name: str, data: Any) -> None:
    with _DELETE_FILES_LOCK:
        _DELETE_FILES[name] = data.select(["file_path", "pos"])
        while len(_DELETE_FILES) > DELETE_FILES_KEPT:
            _DELETE_FILES.pop(next(iter(_DELETE_FILES)))


def write_deletes(table: Any, positions: Mapping[str, Sequence[int]]) -> Any:
    """A position delete file of `positions` (data file path -> positions) in the table's
    data directory; its pyiceberg DataFile."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile as IcebergFile
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = pa.schema(
        [
            pa.field(
                "file_path",
                pa.string(),
                nullable=False,
                metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()},
            ),
            pa.field(
                "pos",
                pa.int64(),
                nullable=False,
                metadata={b"PARQUET:field_id": str(POS_ID).encode()},
            ),
        ]
    )
    rows = [(p, pos) for p in sorted(positions) for pos in sorted(positions[p])]
    data = pa.table(
        {"file_path": [p for p, _ in rows], "pos": [pos for _, pos in rows]}, schema=schema
    )
    location = f"{table.location().rstrip('/')}/data/walstream-deletes-{uuid.uuid4()}.parquet"
    output = table.io.new_output(location)
    with output.create(overwrite=False) as f:
        pq.write_table(data, f)
    _keep(location, data)  # the next batch finds what it names without reading it back
    size = len(table.io.new_input(location))
    delete = IcebergFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(rows),
        file_size_in_bytes=size,
        # the paths it names, so readers apply it only to files in that range (to one
        # file when it names one: Iceberg's "file-scoped" deletes)
        lower_bounds={FILE_PATH_ID: rows[0][0].encode()},
        upper_bounds={FILE_PATH_ID: rows[-1][0].encode()},
    )
    delete.spec_id = table.spec().spec_id
    return delete


def add_deletes(
    tx: Any,
    table: Any,
    deletes: Sequence[Any],
    props: Mapping[str, str],
    rows: Any = None,
    files: Sequence[str] = (),
) -> None:
    """A snapshot of the transaction adding the position delete files `deletes`, the
    data files of `rows` (a pyarrow Table in the table's schema, or None) and the Parquet
    data files `files` (written by others, in the table's columns, found by name): one
    snapshot a batch, so the table's metadata grows by one (pyiceberg copies it whole at
    each step of a commit)."""
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import (
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestFile,
        ManifestWriterV2,
    )
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifest(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

    class RowDelta(_FastAppendFiles):
        """A fast append whose added files are position delete files. The positions were
        read from the snapshot the transaction began on: if another commit landed since
        (pyiceberg retries a conflicting commit), they may name rewritten files, so the
        retry fails and the batch is written again from the new snapshot."""

        def _validate_concurrency(self) -> None:
            window = getattr(self, "_commit_window", None)
            if window is not None and not window.is_empty():
                raise ValidationException(
                    "the table changed while walstream wrote position deletes for it"
                )

        def _manifests(self) -> list[ManifestFile]:
            out: list[ManifestFile] = super()._manifests()
            if not deletes:
                return out
            writer = DeleteManifest(
                spec=self._transaction.table_metadata.spec(),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            )
            with writer:
                for d in deletes:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=d,
                        )
                    )
            return [*out, writer.to_manifest_file()]

    if files and tx.table_metadata.name_mapping() is None:
        from pyiceberg.table import TableProperties

        # the files carry no field ids: readers find their columns by name, as after
        # pyiceberg's own add_files, which sets the same mapping
        mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
        tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: mapping})
    producer = RowDelta(
        operation=Operation.OVERWRITE, transaction=tx, io=table.io, snapshot_properties=dict(props)
    )
    if rows is not None and rows.num_rows:
        from pyiceberg.io.pyarrow import (
            _check_pyarrow_schema_compatible,
            _dataframe_to_data_files,
        )

        metadata = tx.table_metadata
        _check_pyarrow_schema_compatible(  # as pyiceberg's append checks
            metadata.schema(), provided_schema=rows.schema, format_version=metadata.format_version
        )
        for data_file in _dataframe_to_data_files(
            table_metadata=metadata, write_uuid=producer.commit_uuid, df=rows, io=table.io
        ):
            producer.append_data_file(data_file)
    if files:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        for path in files:
            producer.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, path))
    producer.commit()
