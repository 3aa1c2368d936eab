"""Delta Lake sink (`type: delta`): each source table kept as a Delta table, with delta-rs.

Tables live at `path` (a local directory or an object-store URI, `{schema}` and
`{table}` filled in per source table). Each micro-batch writes each table in one
Delta commit carrying the application transaction `(walstream/<sink>/<query id>,
batch id)`: a replayed batch finds its version recorded and writes nothing. Mirror
and history modes commit one MERGE; changelog appends. See `lake/contract.py` for the
modes and `docs/lakehouse.md` for the guide.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from walstream.errors import SinkError
from walstream.lake import delta_log
from walstream.lake.contract import (
    FilesBatch,
    LakeDestination,
    TableBatch,
    TableSink,
    Written,
    check_template,
    fill_template,
)
from walstream.lake.delta_log import stats
from walstream.lake.delta_on_read import (
    DeltaOnRead,
    arrow_schema,
    commit_properties,
    load_deltalake,
)
from walstream.lake.plan import history_plan, mirror_plan
from walstream.lake.positions import live_range
from walstream.lake.storage import Store, open_store
from walstream.lake.tables import (
    LakeTable,
    adoptable,
    dataset_field,
    footers,
    has_any_key,
    key_filter_rows,
    move_staged,
    present_keys,
    staged_or,
)
from walstream.sinks.registry import register

log = logging.getLogger(__name__)


class DeltaDestination(LakeDestination):
    """Delta tables at `path` (e.g. `./lake/{schema}/{table}` or `s3://bucket/{table}`)."""

    type: Literal["delta"]
    path: str = "./lake/{schema}/{table}"
    #: delta-rs object store settings (AWS_ACCESS_KEY_ID, AZURE_STORAGE_ACCOUNT_KEY, ...).
    storage_options: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_template(v, "path")

    @model_validator(mode="after")
    def _merge_on_read_here(self) -> DeltaDestination:
        if self.updates != "merge_on_read" or "://" not in self.path:
            return self
        if self.path.split("://", 1)[0] not in ("file", "s3", "s3a"):
            raise ValueError(
                "updates: merge_on_read writes tables on local disk and S3 (s3://, "
                "S3-compatible stores included); a table elsewhere takes updates: copy_on_write"
            )
        return self

    def location(self, schema: str, table: str) -> str:
        where = fill_template(self.path, schema, table)
        return where if "://" in where else str(Path(where).resolve())

    def location_for_messages(self, schema: str, table: str) -> str:
        where = self.location(schema, table)
        if "://" not in where:
            return where
        parts = urlsplit(where)
        return f"{parts.scheme}://{parts.hostname or ''}{parts.path}"


def _sql_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@register
class DeltaSink(TableSink):
    settings_model = DeltaDestination
    extra = "delta"
    config: DeltaDestination

    def __init__(self, config: DeltaDestination) -> None:
        super().__init__(config)
        self.options = {k: v.get_secret_value() for k, v in config.storage_options.items()}
        self._on_read = DeltaOnRead(self.options)  # updates: merge_on_read
        #: Each table as the last batch that succeeded left it (`_kept`).
        self._tables: dict[str, Any] = {}

    def target(self, schema: str, table: str) -> str:
        return self.config.location_for_messages(schema, table)

    def test_connection(self) -> None:
        dl = load_deltalake()
        uri = self.config.location("public", "probe")
        try:
            dl.DeltaTable.is_deltatable(uri, storage_options=self.options or None)
        except Exception as exc:
            raise SinkError(
                f"Delta: cannot reach {self.target('{schema}', '{table}')}: {exc}",
                "check `path` and `storage_options` (credentials, region, endpoint)",
                retryable=True,
            ) from exc

    def _store(self, location: str) -> Store:
        """The table's directory as walstream writes it itself (merge-on-read, adoption)."""
        return open_store(location, self.options)

    def _open(self, location: str) -> Any | None:
        dl = load_deltalake()
        if not dl.DeltaTable.is_deltatable(location, storage_options=self.options or None):
            return None
        return dl.DeltaTable(location, storage_options=self.options or None)

    def _kept(self, location: str) -> Any | None:
        """The table at `location` (None: there is none) as the last batch that succeeded
        left it, brought up to date with the commits since: opening it anew replays the
        log from its last checkpoint, up to 99 commits, which was a fifth of the time of a
        batch of a thousand changes. Not kept past a failed batch, and opened anew when
        the version it holds has left the log (the table was removed meanwhile)."""
        kept = self._tables.pop(location, None)
        if kept is not None and self._store(location).exists(
            f"{delta_log.LOG}/{kept.version():020d}.json"
        ):
            kept.update_incremental()
            return kept
        return self._open(location)

    def write_batch(self, batch: TableBatch) -> Written:
        lake = LakeTable(self.config, batch.shape.schema, batch.shape.table)
        table, written = self._write_batch(lake, batch)
        self._tables[lake.location] = table  # for the next batch (`_kept`)
        return written

    def _write_batch(self, lake: LakeTable, batch: TableBatch) -> tuple[Any, Written]:
        dl = load_deltalake()
        app_id = self._app_id(batch)
        commit = self._commit(batch)
        schema = lake.schema(batch)
        table = self._kept(lake.location)
        if table is None:
            table = dl.DeltaTable.create(
                lake.location,
                schema,
                mode="ignore",
                storage_options=self.options or None,
                partition_by=self.config.partition_by or None,
            )
        done = table.transaction_version(app_id)
        if done is not None and done >= batch.batch_id:
            return table, Written(lake.path_for_messages(), 0, replayed=True)
        widened = lake.check_schema(arrow_schema(table), schema)
        if widened:
            table = self._widen(table, widened)
        if self.config.mode == "changelog":
            rows = lake.changelog(batch)
            dl.write_deltalake(
                table,
                rows,
                mode="append",
                schema_mode="merge",
                commit_properties=commit,
                storage_options=self.options or None,
            )
            n = rows.num_rows
        elif self.config.mode == "mirror" and self.config.updates == "merge_on_read":
            n = self._on_read.mirror(table, lake, batch, app_id)
        elif self.config.updates == "merge_on_read":
            n = self._on_read.history(table, lake, batch, app_id)
        elif self.config.mode == "mirror":
            n = self._mirror(table, lake, batch, commit)
        else:
            n = self._history(table, lake, batch, commit)
        return table, Written(lake.path_for_messages(), n)

    def adopt_files(self, batch: FilesBatch) -> Written | None:
        """A mirror's new keys, or a changelog's rows, as the staged files themselves: each
        moved into the table's directory and added in one commit (with the batch's
        application transaction)."""
        if self.config.mode == "history" or self.config.partition_by:
            return None
        lake = LakeTable(self.config, batch.shape.schema, batch.shape.table)
        table, adopted = self._adopt(lake, self._kept(lake.location), batch)
        if table is not None:
            self._tables[lake.location] = table  # for the next batch (`_kept`)
        return adopted

    def _adopt(self, lake: LakeTable, table: Any, batch: FilesBatch) -> tuple[Any, Written | None]:
        """`adopt_files` on the table as it is now (None: there is none yet); the table
        after it, and what was written (None: the files cannot be adopted)."""
        dl = load_deltalake()
        done = None if table is None else table.transaction_version(self._app_id(batch))
        if done is not None and done >= batch.batch_id:
            return table, Written(lake.path_for_messages(), 0, replayed=True)
        store = self._store(lake.location)
        targets = [(store.filesystem, store.path(name)) for _, name in batch.files]
        now_at = [
            staged_or(path, target) for (path, _), target in zip(batch.files, targets, strict=True)
        ]
        metas = footers(now_at)
        wanted = lake.files_schema(batch, metas)
        existing = None if table is None else arrow_schema(table)
        if not adoptable([m.schema.to_arrow_schema() for m in metas], wanted, existing):
            return table, None
        key = list(batch.shape.key)
        if table is not None and self.config.mode == "mirror":
            ranged = lambda c, lo, hi: _key_range(table, store, key, c, lo, hi)  # noqa: E731
            if has_any_key(now_at, key, ranged):
                return table, None  # a key the table has: the rows are merged
        else:
            table = dl.DeltaTable.create(
                lake.location,
                wanted,
                mode="ignore",
                storage_options=self.options or None,
            )
        now = int(time.time() * 1000)
        actions = []
        for (path, name), target, meta in zip(batch.files, targets, metas, strict=True):
            move_staged(path, target)
            size = store.size(name)
            actions.append(dl.transaction.AddAction(name, size, {}, now, True, stats(meta)))
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(), commit_properties=self._commit(batch)
        )
        return table, Written(lake.path_for_messages(), sum(m.num_rows for m in metas))

    def _app_id(self, batch: TableBatch | FilesBatch) -> str:
        return f"walstream/{batch.sink}/{batch.query_id}"

    def _commit(self, batch: TableBatch | FilesBatch) -> Any:
        """The batch's commit properties: its application transaction and marker."""
        return commit_properties(self._app_id(batch), batch)

    def _widen(self, table: Any, widened: dict[str, Any]) -> Any:
        """Rewrite the table with the widened column types (its own commit: the data is
        the same, so a replay finds nothing left to widen)."""
        import pyarrow as pa

        data = _pa_table(table.scan()) if _has_vectors(table) else table.to_pyarrow_table()
        schema = pa.schema(
            [f.with_type(widened[f.name]) if f.name in widened else f for f in data.schema]
        )
        log.warning(
            "Delta table %s: widening %s (the table is rewritten once)",
            table.table_uri,
            ", ".join(f"{n} to {t}" for n, t in widened.items()),
        )
        load_deltalake().write_deltalake(
            table,
            data.cast(schema),
            mode="overwrite",
            schema_mode="overwrite",
            partition_by=self.config.partition_by or None,
            storage_options=self.options or None,
        )
        return self._open(table.table_uri)

    def _mirror(self, table: Any, lake: LakeTable, batch: TableBatch, commit: Any) -> int:
        """One MERGE of the newest version of each key; after a truncate, an overwrite."""
        import pyarrow as pa

        key, columns = list(batch.shape.key), batch.shape.names
        rows = lake.filled(batch, lambda keys: key_filter_rows(_current(table), key, keys))
        plan = mirror_plan(
            rows,
            key,
            columns,
            batch.complete,
            lambda keys: present_keys(
                lambda c, lo, hi: _key_range(table, self._store(lake.location), key, c, lo, hi),
                keys,
            ),
        )
        if plan.truncated or plan.appends_only:
            # after a truncate the table is what the batch left; new keys only: an append
            load_deltalake().write_deltalake(
                table,
                plan.upserts,
                mode="overwrite" if plan.truncated else "append",
                schema_mode="merge",
                commit_properties=commit,
                storage_options=self.options or None,
            )
            return int(plan.upserts.num_rows)
        source = lake.mirror_source(plan, key, columns)
        on = " AND ".join(f"t.{_sql_name(k)} = s.{_sql_name(k)}" for k in key)
        # a column dropped at the source stays; a row changed since has no value for it
        for f in arrow_schema(table):
            if f.name not in columns:
                source = source.append_column(f, pa.nulls(source.num_rows, f.type))
        cols = {_sql_name(c): f"s.{_sql_name(c)}" for c in source.schema.names if c != "_delete"}
        (
            table.merge(
                source,
                on,
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=commit,
            )
            .when_matched_delete("s._delete")
            .when_matched_update(cols, "NOT s._delete")
            .when_not_matched_insert(cols, "NOT s._delete")
            .execute()
        )
        return int(plan.upserts.num_rows)

    def _history(self, table: Any, lake: LakeTable, batch: TableBatch, commit: Any) -> int:
        """One MERGE: the closing rows end current versions, the new versions are inserted."""
        key, schema = list(batch.shape.key), lake.schema(batch)
        rows = lake.filled(batch, lambda keys: key_filter_rows(_current(table), key, keys))
        plan = history_plan(rows, key, batch.shape.names, schema)
        source = lake.history_source(plan, key, lambda: _current(table))
        on = " AND ".join(
            ["t.is_current", "s._close", *(f"t.{_sql_name(k)} = s.{_sql_name(k)}" for k in key)]
        )
        cols = {_sql_name(c): f"s.{_sql_name(c)}" for c in schema.names}
        (
            table.merge(
                source,
                on,
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=commit,
            )
            .when_matched_update({"valid_to": "s.valid_from", "is_current": "false"})
            .when_not_matched_insert(cols, "NOT s._close")
            .execute()
        )
        return int(plan.versions.num_rows)

    def scan(self, schema: str, table: str, columns: list[str]) -> Any | None:
        """delta-rs's scan, which applies deletion vectors."""
        import pyarrow as pa

        table_ = self._open(self.config.location(schema, table))
        return (
            None
            if table_ is None
            else pa.RecordBatchReader.from_stream(table_.scan(columns=columns))
        )

    def optimize(self, schema: str, table: str) -> dict[str, Any]:
        t = self._open(self.config.location(schema, table))
        if t is None:
            return {"table": self.target(schema, table), "missing": True}
        opt = self.config.optimize
        compacted = t.optimize.compact(target_size=opt.target_file_size)
        removed = t.vacuum(
            retention_hours=int(opt.retain // 3600),
            dry_run=False,
            enforce_retention_duration=False,
        )
        t.cleanup_metadata()
        out = {
            "table": self.target(schema, table),
            "files_added": compacted.get("numFilesAdded", 0),
            "files_removed": compacted.get("numFilesRemoved", 0),
            "files_deleted": len(removed),
        }
        t = self._open(self.config.location(schema, table))
        if t is not None and _has_vectors(t):
            store = self._store(self.config.location(schema, table))
            current = delta_log.snapshot(store, t.version())
            out["vectors_deleted"] = delta_log.drop_unused_vectors(
                store, current, time.time() - opt.retain
            )
        return out


def _has_vectors(table: Any) -> bool:
    """Whether the table takes deletion vectors (then only a reader that applies them may
    read it: delta-rs' `scan`, not its pyarrow dataset)."""
    return "deletionVectors" in (table.protocol().reader_features or [])


def _pa_table(reader: Any) -> Any:
    import pyarrow as pa

    return pa.table(reader)


def _key_range(table: Any, store: Store, key: list[str], column: str, low: Any, high: Any) -> Any:
    """The table's key columns where `column` is within [low, high]."""
    if _has_vectors(table):  # delta-rs' pyarrow dataset does not apply deletion vectors
        current = delta_log.snapshot(store, table.version())
        files = delta_log.data_files(store, current, key)
        return live_range(store.filesystem, files, key, column, low, high)
    data = table.to_pyarrow_dataset()
    field = dataset_field(data, column)
    return data.to_table(columns=key, filter=(field >= low) & (field <= high))


def _current(table: Any) -> Any:
    """The table's current rows (history: only `is_current` ones) as a pyarrow dataset."""
    import pyarrow.dataset as ds

    # a table with deletion vectors (merge_on_read once): read whole, through delta-rs' scan
    data = (
        ds.dataset(_pa_table(table.scan())) if _has_vectors(table) else table.to_pyarrow_dataset()
    )
    if "is_current" in data.schema.names:
        return data.filter(ds.field("is_current"))
    return data
