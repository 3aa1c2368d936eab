"""Delta commits walstream writes itself: deletes by position (deletion vectors) with new
data files, in one version of the log (Delta's PROTOCOL.md, "Actions" and "Action
Reconciliation").

delta-rs commits appends, merges and overwrites but no deletion vectors; this module
writes the version's JSON itself, created only if absent (the log's one rule for writers;
`storage.Store.create`, on local disk and S3), after reading the live files' vectors from the log (checkpoint, then the JSON versions
after it). A logical file is its path and its vector: deleting more rows of a file is
`remove` of the file with its old vector and `add` of it with the union.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Hashable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import SinkError
from walstream.lake import deletion_vectors as dv
from walstream.lake.storage import Store


class CommitConflict(SinkError):
    """Another writer took the version first: read the table again and retry."""

    def __init__(self, location: str, version: int) -> None:
        super().__init__(
            f"Delta: version {version} of {location} was written by another writer",
            "nothing to do: the batch is written again on the next attempt",
            retryable=True,
        )


@dataclass
class LiveFile:
    """A data file of the current version as the log has it: its add action (the vector
    included, when it has one)."""

    add: dict[str, Any]

    @property
    def path(self) -> str:
        return str(self.add["path"])

    @property
    def vector(self) -> dict[str, Any] | None:
        return self.add.get("deletionVector")


@dataclass
class Snapshot:
    """The live files of a version, by path, and its protocol and metadata actions."""

    version: int
    files: dict[str, LiveFile] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


#: The table features a table that takes deletion vectors lists (writer version 7 names each
#: feature; `appendOnly` and `invariants` are what writer version 2 had without naming them).
DV_PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["deletionVectors"],
    "writerFeatures": ["appendOnly", "invariants", "deletionVectors"],
}
ENABLE = "delta.enableDeletionVectors"


def _takes_vectors(current: Snapshot) -> list[dict[str, Any]]:
    """The protocol and metadata actions that let the table take deletion vectors, if it
    does not yet."""
    out: list[dict[str, Any]] = []
    protocol = current.protocol
    if "deletionVectors" not in (protocol.get("writerFeatures") or []):
        if protocol.get("minWriterVersion", 0) == 7:
            out.append(
                {
                    "protocol": {
                        **protocol,
                        "readerFeatures": [
                            *(protocol.get("readerFeatures") or []),
                            "deletionVectors",
                        ],
                        "writerFeatures": [
                            *(protocol.get("writerFeatures") or []),
                            "deletionVectors",
                        ],
                        "minReaderVersion": 3,
                    }
                }
            )
        elif protocol.get("minReaderVersion", 1) <= 1 and protocol.get("minWriterVersion", 2) <= 2:
            out.append({"protocol": DV_PROTOCOL})
        else:
            raise SinkError(
                f"Delta: the table's protocol {protocol} has features walstream cannot add "
                "deletion vectors beside",
                "use `updates: copy_on_write` for this table",
                retryable=False,
            )
    configuration = current.metadata.get("configuration") or {}
    if configuration.get(ENABLE) != "true":
        out.append(
            {"metaData": {**current.metadata, "configuration": {**configuration, ENABLE: "true"}}}
        )
    return out


LOG = "_delta_log"


def snapshot(store: Store, version: int, since: Snapshot | None = None) -> Snapshot:
    """The live files of `version`, replayed from the newest checkpoint at or below it and
    the JSON versions after; or, given an earlier snapshot `since`, from it (versions are
    written once, so only those after it are read)."""
    import pyarrow.parquet as pq

    if since is not None and since.version <= version:
        files = dict(since.files)
        try:
            return _replay(store, since.version + 1, version, files, since.protocol, since.metadata)
        except FileNotFoundError:  # versions cleaned up since (past the log's retention)
            pass
    files = {}
    protocol: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    start = 0
    checkpoint = _checkpoint_at_or_below(store, version)
    if checkpoint is not None:
        start = checkpoint + 1
        table = pq.read_table(
            store.path(f"{LOG}/{checkpoint:020d}.checkpoint.parquet"),
            columns=["add", "protocol", "metaData"],
            filesystem=store.filesystem,
        )
        for add in table.column("add").to_pylist():
            if add is not None:
                add["partitionValues"] = dict(add.get("partitionValues") or [])
                files[add["path"]] = LiveFile({k: v for k, v in add.items() if v is not None})
        protocol = _present(table.column("protocol").to_pylist()) or {}
        metadata = _present(table.column("metaData").to_pylist()) or {}
        metadata = {k: v for k, v in metadata.items() if v is not None}
        for name in ("configuration", "format"):
            if isinstance(metadata.get(name), list):
                metadata[name] = dict(metadata[name])
        if isinstance(metadata.get("format"), dict) and isinstance(
            metadata["format"].get("options"), list
        ):
            metadata["format"]["options"] = dict(metadata["format"]["options"])
        protocol = {k: v for k, v in protocol.items() if v is not None}
    return _replay(store, start, version, files, protocol, metadata)


def _replay(
    store: Store,
    start: int,
    version: int,
    files: dict[str, LiveFile],
    protocol: dict[str, Any],
    metadata: dict[str, Any],
) -> Snapshot:
    """The JSON versions `start`..`version` applied to the live files, protocol and metadata
    before them."""
    for v in range(start, version + 1):
        for line in store.read(f"{LOG}/{v:020d}.json").decode().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = LiveFile(action["add"])
            elif "protocol" in action:
                protocol = action["protocol"]
            elif "metaData" in action:
                metadata = action["metaData"]
            elif "remove" in action:
                removed = action["remove"]
                live = files.get(removed["path"])
                if live is not None and _same_vector(live.vector, removed.get("deletionVector")):
                    del files[removed["path"]]
    return Snapshot(version, files, protocol, metadata)


def checkpoint_interval(current: Snapshot) -> int:
    """Every how many versions the table wants a checkpoint (`delta.checkpointInterval`,
    100 by default, as Delta's)."""
    configured = (current.metadata.get("configuration") or {}).get("delta.checkpointInterval")
    try:
        return max(1, int(configured)) if configured is not None else 100
    except ValueError:
        return 100


def _present(values: list[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _same_vector(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two vectors are one (the protocol's uniqueId: storage type, path, offset)."""
    if a is None or b is None:
        return a is b
    key = ("storageType", "pathOrInlineDv", "offset")
    return all(a.get(k) == b.get(k) for k in key)


def _vector_id(vector: dict[str, Any] | None) -> tuple[Any, ...]:
    """What identifies a file's deletes: its vector's unique id, or none."""
    if vector is None:
        return ("none",)
    return tuple(vector.get(k) for k in ("storageType", "pathOrInlineDv", "offset"))


def _checkpoint_at_or_below(store: Store, version: int) -> int | None:
    found = [
        int(name.split(".", 1)[0])
        for name, _ in store.names(LOG)
        if name.endswith(".checkpoint.parquet") and name.count(".") == 2
    ]
    below = [v for v in found if v <= version]
    return max(below) if below else None


def data_files(store: Store, current: Snapshot, key: Sequence[str]) -> list[Any]:
    """The live files of a snapshot as `positions.DataFile`s (paths in `store.filesystem`):
    key bounds from their statistics, deleted positions from their vectors."""
    from walstream.lake.positions import DataFile

    out = []
    for live in current.files.values():
        try:
            numbers = json.loads(live.add.get("stats") or "{}")
        except ValueError:
            numbers = {}
        low, high = numbers.get("minValues") or {}, numbers.get("maxValues") or {}
        bounds = {k: (low.get(k), high.get(k)) for k in key if k in low and k in high}
        out.append(
            DataFile(
                store.path(live.path),
                live.path,
                bounds,
                functools.partial(deleted_positions, store, live),
                _vector_id(live.vector),
            )
        )
    return out


def drop_unused_vectors(store: Store, current: Snapshot, older_than: float) -> int:
    """Delete the DV files no live file names that are older than `older_than` (a Unix
    time): a vector superseded by a union, or folded by a compaction, is only needed by a
    reader of an old version. delta-rs' vacuum leaves them. How many were deleted."""
    named = {
        dv.Descriptor.of_action(f.vector).file_name
        for f in current.files.values()
        if f.vector is not None
    }
    dropped = 0
    for name, modified in store.names():
        if not (name.startswith("deletion_vector_") and name.endswith(".bin")) or name in named:
            continue
        if modified < older_than:
            store.delete(name)
            dropped += 1
    return dropped


def deleted_positions(store: Store, live: LiveFile) -> Any:
    """The rows a live file's vector deletes already (an empty bitmap when none)."""
    if live.vector is None:
        return dv.positions()
    return dv.read(store.filesystem, store.root, dv.Descriptor.of_action(live.vector))


def delete_commit(
    store: Store,
    current: Snapshot,
    positions: Mapping[str, Iterable[int]],
    adds: Sequence[dict[str, Any]] = (),
    *,
    app_id: str,
    batch_id: int,
    metadata: Mapping[str, str] | None = None,
    known: MutableMapping[str, tuple[Hashable, Any]] | None = None,
) -> int:
    """Commit version `current.version + 1`: the rows at `positions` (data file path ->
    row positions) deleted, the data files `adds` (add actions of files already in the
    table's directory) added, and the batch's application transaction. The new version;
    CommitConflict when another writer took it.

    `known`: files' deleted positions by the id of their vector (a key index's): a file's
    vector known there is not read again, and once committed each file's new vector is
    entered there (a batch does not read back what the one before it wrote)."""
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        *(_takes_vectors(current) if positions else []),
        {"txn": {"appId": app_id, "version": batch_id, "lastUpdated": now}},
    ]
    changed = [(path, rows) for path, rows in positions.items()]
    unions = []
    for path, rows in changed:
        live = current.files.get(path)
        if live is None:
            raise SinkError(
                f"Delta: {store.location} has no live data file {path} at version "
                f"{current.version}",
                "a bug in walstream: the positions were read from another version",
                retryable=False,
            )
        have = (known or {}).get(path)
        if have is not None and have[0] == _vector_id(live.vector):
            union = have[1] | dv.positions(rows)
        else:
            union = deleted_positions(store, live)
            union.update(rows)
        unions.append(union)
    descriptors = dv.write(store.filesystem, store.root, unions) if unions else []
    for (path, _), descriptor in zip(changed, descriptors, strict=True):
        old = current.files[path].add
        actions.append({"remove": _removed(old, now)})
        actions.append({"add": _with_vector(old, descriptor.action())})
    actions.extend({"add": a} for a in adds)
    info = {
        "timestamp": now,
        "operation": "WRITE",
        "operationParameters": {"mode": "Append"},
        "engineInfo": "walstream",
        **(metadata or {}),
    }
    actions.append({"commitInfo": info})
    version = current.version + 1
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    if not store.create(f"{LOG}/{version:020d}.json", text.encode()):
        raise CommitConflict(store.location, version)
    if known is not None:
        for (path, _), descriptor, union in zip(changed, descriptors, unions, strict=True):
            known[path] = (_vector_id(descriptor.action()), union)
    return version


def _removed(add: Mapping[str, Any], now: int) -> dict[str, Any]:
    """The remove action of a data file whose vector changes: only what the protocol asks
    for (a batch of random keys removes and re-adds hundreds of files; every byte here is
    written once a file a batch). Partition values are kept where the table has them."""
    out: dict[str, Any] = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "size": add["size"],
    }
    if add.get("partitionValues"):
        out.update(extendedFileMetadata=True, partitionValues=add["partitionValues"])
    if add.get("deletionVector") is not None:
        out["deletionVector"] = add["deletionVector"]
    return out


def _with_vector(add: Mapping[str, Any], vector: dict[str, Any]) -> dict[str, Any]:
    """The add action of a data file with its new vector: the same file, its statistics
    marked wide (`tightBounds: false`, as the protocol asks of a file whose deleted rows
    the min/max may still count) and its unset fields left out (a checkpoint's nulls)."""
    out = {k: v for k, v in add.items() if v is not None and k != "deletionVector"}
    out.update(dataChange=True, deletionVector=vector)
    if out.get("stats"):
        stats = json.loads(out["stats"])
        stats["tightBounds"] = False
        out["stats"] = json.dumps(stats, separators=(",", ":"))
    return out


#: Parquet physical types whose footer min/max are Delta statistics as they are.
STAT_TYPES = ("INT32", "INT64")


def stats(meta: Any) -> str:
    """A data file's Delta statistics from its Parquet footer: rows, null counts, and
    min/max of integer and text columns (what data skipping on keys needs)."""
    out: dict[str, Any] = {
        "numRecords": meta.num_rows,
        "minValues": {},
        "maxValues": {},
        "nullCount": {},
    }
    schema = meta.schema
    for i in range(meta.num_columns):
        column = schema.column(i)
        if column.max_definition_level > 1:  # nested: no statistics
            continue
        stats = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if not stats or any(s is None for s in stats):
            continue
        name = column.name
        if all(s.has_null_count for s in stats):
            out["nullCount"][name] = sum(s.null_count for s in stats)
        text = column.physical_type == "BYTE_ARRAY" and str(column.logical_type) == "String"
        if (
            column.physical_type in STAT_TYPES and str(column.logical_type) in ("None", "Int")
        ) or text:
            values = [s for s in stats if s.has_min_max]
            if len(values) == len(stats):
                out["minValues"][name] = min(s.min for s in values)
                out["maxValues"][name] = max(s.max for s in values)
    return json.dumps(out, separators=(",", ":"))
