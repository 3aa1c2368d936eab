"""A Delta sink's merge-on-read writes (`updates: merge_on_read`): the rows a batch replaces
or ends marked deleted in deletion vectors, the new rows appended, in one commit walstream
writes itself (`delta_log.delete_commit`). Mirror: the replaced rows are deleted, their new
versions appended. History: the current versions a batch ends are deleted and appended
again closed (`valid_to` set, `is_current` false), beside the new versions.

The rows are found in the table's key index (`key_index.py`), kept between batches, and the
log is replayed from the previous batch's snapshot.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from walstream.lake import delta_log
from walstream.lake.contract import FilesBatch, TableBatch
from walstream.lake.key_index import KeyIndex, KeyIndexes
from walstream.lake.plan import history_plan, mirror_plan
from walstream.lake.positions import ROW_GROUP, closed_versions, current_rows, replaced
from walstream.lake.storage import Store, open_store
from walstream.lake.tables import (
    LakeTable,
    as_table,
    key_schema,
    move_staged,
    staged_footers,
)


class DeltaOnRead:
    """The merge-on-read state of one Delta sink: its tables' key indexes and snapshots."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.indexes = KeyIndexes()
        self.snapshots: dict[str, delta_log.Snapshot] = {}

    def mirror(self, table: Any, lake: LakeTable, batch: TableBatch, app_id: str) -> int:
        """The batch's keys marked deleted where the table has them and their newest
        versions appended, in one commit; after a truncate, an overwrite. The keys the
        executors planned (`batch.staged`): their files added as they are."""
        key, columns = list(batch.shape.key), batch.shape.names
        table, store, current, files = self._state(table, lake, batch)
        index = self.indexes.of(lake.location, key)
        fs, keys = store.filesystem, key_schema(batch)
        rows = lake.filled(
            batch, functools.partial(current_rows, fs, files, keys, columns, index=index)
        )
        plan = mirror_plan(rows, key, columns, batch.complete)
        if plan.truncated:
            load_deltalake().write_deltalake(
                table,
                plan.upserts,
                mode="overwrite",
                schema_mode="merge",
                commit_properties=commit_properties(app_id, batch),
                storage_options=self.options or None,
            )
            return int(plan.upserts.num_rows)
        staged = batch.staged
        positions = replaced(
            fs, files, plan, key, index, None if staged is None else staged.touched
        )
        schema = arrow_schema(table)
        adds, new = staged_adds(store, lake, batch, schema, as_table(plan.upserts, schema))
        self._commit(lake, store, current, positions, new, app_id, batch, index, adds)
        return int(new.num_rows) + sum(int(a["stats_rows"]) for a in adds)

    def history(self, table: Any, lake: LakeTable, batch: TableBatch, app_id: str) -> int:
        """The current versions the batch ends deleted and appended closed, and its new
        versions appended, in one commit (a truncate ends every current version). The keys
        the executors wrote versions of (`batch.staged`): their files added as they are,
        their current versions closed when the executors say."""
        import pyarrow as pa

        key = list(batch.shape.key)
        table, store, current, files = self._state(table, lake, batch)
        index = self.indexes.of(lake.location, key, "is_current")
        fs, keys, columns = store.filesystem, key_schema(batch), batch.shape.names
        rows = lake.filled(
            batch, functools.partial(current_rows, fs, files, keys, columns, index=index)
        )
        plan = history_plan(rows, key, columns, lake.schema(batch))
        if batch.staged is not None:  # the keys whose versions the executors wrote
            plan.closes.update(batch.staged.ends(key))
        schema = arrow_schema(table)
        positions, closed = closed_versions(fs, files, plan, key, keys, schema, index)
        new = pa.concat_tables([closed, as_table(plan.versions, schema)])
        adds, new = staged_adds(store, lake, batch, schema, new)
        self._commit(lake, store, current, positions, new, app_id, batch, index, adds)
        return int(plan.versions.num_rows) + sum(int(a["stats_rows"]) for a in adds)

    def _state(self, table: Any, lake: LakeTable, batch: TableBatch) -> tuple[Any, ...]:
        """The table with the batch's new columns, its directory, the snapshot of its
        version (replayed from the previous batch's) and the live files."""
        table = with_columns(table, lake.schema(batch), self.options)  # before the snapshot
        store = open_store(lake.location, self.options)
        previous = self.snapshots.pop(lake.location, None)
        current = delta_log.snapshot(store, table.version(), previous)
        return table, store, current, delta_log.data_files(store, current, batch.shape.key)

    def _commit(
        self,
        lake: LakeTable,
        store: Store,
        current: delta_log.Snapshot,
        positions: dict[str, list[int]],
        new: Any,
        app_id: str,
        batch: TableBatch,
        index: KeyIndex,
        staged: Sequence[dict[str, Any]] = (),
    ) -> None:
        """One version: the positions deleted, the rows `new` in one new data file and the
        `staged` files' add actions; the files' new vectors entered in the key index."""
        adds = [data_file(store, new)] if new.num_rows else []
        adds += [{k: v for k, v in a.items() if k != "stats_rows"} for a in staged]
        if not positions and not adds:
            return
        with index.lock:
            version = delta_log.delete_commit(
                store,
                current,
                positions,
                adds,
                app_id=app_id,
                batch_id=batch.batch_id,
                metadata={"walstream.batch": batch.marker},
                known=index.deleted,
            )
        self.snapshots[lake.location] = current  # the next batch replays from here
        # delta-rs checkpoints after its own commits only: walstream does after its own, so
        # readers (and the next batch's snapshot) do not replay an ever longer log
        if version % delta_log.checkpoint_interval(current) == 0:
            dl = load_deltalake()
            dl.DeltaTable(lake.location, storage_options=self.options or None).create_checkpoint()


def load_deltalake() -> Any:
    from walstream.errors import optional_import

    return optional_import("deltalake", "deltalake (the Delta Lake sink)", "delta")


def commit_properties(app_id: str, batch: TableBatch | FilesBatch) -> Any:
    """A batch's commit properties: its application transaction and marker."""
    dl = load_deltalake()
    return dl.CommitProperties(
        app_transactions=[dl.Transaction(app_id=app_id, version=batch.batch_id)],
        custom_metadata={"walstream.batch": batch.marker},
    )


def with_columns(table: Any, schema: Any, options: dict[str, str]) -> Any:
    """The table with the columns of `schema` it lacks (added at the source) added, in a
    commit of its own (a replay finds them there and adds nothing)."""
    have = set(arrow_schema(table).names)
    new = [f for f in schema if f.name not in have]
    if not new:
        return table
    dl = load_deltalake()
    table.alter.add_columns([dl.schema.Field.from_arrow(f) for f in new])
    return dl.DeltaTable(table.table_uri, storage_options=options or None)


def arrow_schema(table: Any) -> Any:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def data_file(store: Store, rows: Any) -> dict[str, Any]:
    """`rows` as a new Parquet data file in the table's directory: its add action."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    buffer = pa.BufferOutputStream()
    pq.write_table(rows, buffer, compression="snappy", row_group_size=ROW_GROUP)
    data = buffer.getvalue()
    store.write(name, data.to_pybytes())
    return {
        "path": name,
        "partitionValues": {},
        "size": data.size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
        "stats": delta_log.stats(pq.read_metadata(pa.BufferReader(data))),
    }


def staged_adds(
    store: Store, lake: LakeTable, batch: TableBatch, schema: Any, new: Any
) -> tuple[list[dict[str, Any]], Any]:
    """The files the executors staged for the batch (`batch.staged`) as add actions, moved
    into the table's directory, and the rows `new`; when the files' columns are not the
    table's (`schema`) now, no actions and their rows added to `new` instead."""
    import pyarrow as pa

    staged = batch.staged
    if staged is None or not staged.files:
        return [], new
    placed = [(path, (store.filesystem, store.path(name))) for path, name in staged.files]
    metas, unadopted = staged_footers(placed, lake.schema(batch), schema)
    if metas is None:
        return [], pa.concat_tables([new, unadopted])
    adds = [
        staged_add(store, path, name, meta)
        for (path, name), meta in zip(staged.files, metas, strict=True)
    ]
    return adds, new


def staged_add(store: Store, staged: str, name: str, meta: Any) -> dict[str, Any]:
    """A file the executors staged, moved into the table's directory as `name`: its add
    action (`meta`: its Parquet footer; with `stats_rows`, its row count, which is not
    part of it)."""
    move_staged(staged, (store.filesystem, store.path(name)))
    return {
        "path": name,
        "partitionValues": {},
        "size": store.size(name),
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
        "stats": delta_log.stats(meta),
        "stats_rows": meta.num_rows,
    }
