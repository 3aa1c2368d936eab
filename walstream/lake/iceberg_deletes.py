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


def data_files(table: Any, key: Sequence[str]) -> list[DataFile]:
    """The current snapshot's data files as `positions.DataFile`s: key bounds from their
    manifests, deleted positions from the position delete files that apply to them."""
    from pyiceberg.conversions import from_bytes

    schema = table.schema()
    ids = {name: schema.find_field(name).field_id for name in key}
    types = {name: schema.find_field(name).field_type for name in key}
    out = []
    for task in table.scan().plan_files():
        f = task.file
        low, high = f.lower_bounds or {}, f.upper_bounds or {}
        bounds = {}
        for name, fid in ids.items():
            if fid in low and fid in high:
                try:
                    bounds[name] = (
                        from_bytes(types[name], low[fid]),
                        from_bytes(types[name], high[fid]),
                    )
                except Exception:  # a type whose bounds do not decode plainly: no pruning
                    continue
        deletes = [d.file_path for d in task.delete_files]
        out.append(
            DataFile(
                file_at(table.io, f.file_path)[1],
                f.file_path,
                bounds,
                functools.partial(deleted_positions, table, f.file_path, deletes),
                tuple(sorted(deletes)),
            )
        )
    return out


def deleted_positions(table: Any, path: str, delete_files: Sequence[str]) -> Any:
    """The positions of `path` the position delete files delete already."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from walstream.lake import deletion_vectors as dv

    out = dv.positions()
    for name in delete_files:
        data = _DELETE_FILES.get(name)
        if data is None:  # a delete file is written once: read once (up to the cache's size)
            with table.io.new_input(name).open() as f:
                data = pq.read_table(f, columns=["file_path", "pos"])
            with _DELETE_FILES_LOCK:
                _DELETE_FILES[name] = data
                while len(_DELETE_FILES) > DELETE_FILES_KEPT:
                    _DELETE_FILES.pop(next(iter(_DELETE_FILES)))
        out.update(data.filter(pc.equal(data["file_path"], path))["pos"].to_pylist())
    return out


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
    size = len(table.io.new_input(location))
    delete = IcebergFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(rows),
        file_size_in_bytes=size,
    )
    delete.spec_id = table.spec().spec_id
    return delete


def add_deletes(tx: Any, table: Any, deletes: Sequence[Any], props: Mapping[str, str]) -> None:
    """A snapshot of the transaction adding the position delete files `deletes`."""
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

    producer = RowDelta(
        operation=Operation.OVERWRITE, transaction=tx, io=table.io, snapshot_properties=dict(props)
    )
    producer.commit()
