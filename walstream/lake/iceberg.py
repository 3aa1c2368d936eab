"""Apache Iceberg sink (`type: iceberg`): each source table kept as an Iceberg table (pyiceberg).

The catalog is, by default, a SQL catalog whose two tables live in the state
database's walstream schema, with data files under `catalog.warehouse`; a REST
catalog (Polaris, Nessie, Lakekeeper, Tabular...) is `catalog: {type: rest, uri}`.
Each micro-batch writes each table in one Iceberg transaction whose snapshots carry
`walstream.sink` and `walstream.batch` (query id and batch id): a replayed batch
finds its snapshot and writes nothing. Mirror deletes the batch's keys and appends
their newest rows; history closes current versions (delete + re-append) and appends
the new ones; changelog appends. See `docs/lakehouse.md`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from walstream.decode.table_shape import TableShape
from walstream.errors import SinkError
from walstream.lake import iceberg_deletes
from walstream.lake.catalog import (
    CATALOGS,
    IcebergDestination,
    ensure_schema,
    load_pyiceberg,
    sqlalchemy_url,
)
from walstream.lake.contract import (
    FilesBatch,
    TableBatch,
    TableSink,
    Written,
)
from walstream.lake.key_index import KeyIndexes
from walstream.lake.plan import Key, history_plan, key_of, mirror_plan
from walstream.lake.positions import closed_versions, current_rows, replaced
from walstream.lake.storage import file_at
from walstream.lake.tables import (
    LakeTable,
    adoptable,
    as_table,
    footers,
    has_any_key,
    key_schema,
    move_staged,
    present_keys,
    staged_footers,
    staged_or,
)
from walstream.sinks.registry import register

#: Snapshots walked back from the current one to find this sink's last batch.
_LOOKBACK = 1000


@register
class IcebergSink(TableSink):
    settings_model = IcebergDestination
    extra = "iceberg"
    config: IcebergDestination

    def __init__(self, config: IcebergDestination) -> None:
        super().__init__(config)
        self._indexes = KeyIndexes()  # merge-on-read: the tables' keys, between batches
        self._live = iceberg_deletes.LiveFiles()  # and their live files

    def target(self, schema: str, table: str) -> str:
        return self.config.location(schema, table)

    def _catalog(self) -> Any:
        c = self.config.catalog
        props = {k: v.get_secret_value() for k, v in c.properties.items()}
        warehouse = c.warehouse if "://" in c.warehouse else Path(c.warehouse).resolve().as_uri()
        props.setdefault("warehouse", warehouse)
        if c.type == "rest":
            assert c.uri is not None
            props["uri"] = c.uri.get_secret_value()
            if c.token is not None:
                props["token"] = c.token.get_secret_value()
            make = lambda: load_pyiceberg().catalog.load_catalog("walstream", type="rest", **props)  # noqa: E731
        else:
            dsn = c.uri.get_secret_value() if c.uri is not None else self.config.state_dsn
            if not dsn:
                raise SinkError(
                    "Iceberg: no database for the SQL catalog",
                    "declare the sink in walstream.yaml (the state database is used), or set "
                    "catalog.uri",
                    retryable=False,
                )
            if warehouse.startswith("file://"):
                Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
            props["uri"] = sqlalchemy_url(dsn, self.config.state_schema)
            import pyiceberg.catalog.sql as sql

            def make(dsn: str = dsn, schema: str = self.config.state_schema) -> Any:
                ensure_schema(dsn, schema)  # once per catalog: its tables go there
                return sql.SqlCatalog("walstream", **props)

        key = (c.type, tuple(sorted(props.items())))
        return CATALOGS.get(key, make)

    def test_connection(self) -> None:
        try:
            self._catalog().list_namespaces()
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"Iceberg: cannot reach the {self.config.catalog.type} catalog: "
                f"{type(exc).__name__}",
                "check catalog.uri, catalog.warehouse and the credentials in catalog.properties",
                retryable=True,
            ) from exc

    def _open(self, schema: str, table: str) -> Any | None:
        exc = load_pyiceberg().exceptions
        try:
            return self._catalog().load_table(self.target(schema, table))
        except exc.NoSuchTableError:
            return None

    def _create(self, shape: TableShape, schema: Any) -> Any:
        ident = self.target(shape.schema, shape.table)
        catalog = self._catalog()
        catalog.create_namespace_if_not_exists(ident.rsplit(".", 1)[0])
        table = catalog.create_table_if_not_exists(ident, schema=schema)
        if self.config.partition_by and table.spec().is_unpartitioned():
            with table.update_spec() as spec:
                for col in self.config.partition_by:
                    spec.add_identity(col)
            table = catalog.load_table(ident)
        return table

    def write_batch(self, batch: TableBatch) -> Written:
        lake = LakeTable(self.config, batch.shape.schema, batch.shape.table)
        schema = lake.schema(batch)
        table = self._open(batch.shape.schema, batch.shape.table) or self._create(
            batch.shape, schema
        )
        if self._replayed(table, batch):
            return Written(lake.path_for_messages(), 0, replayed=True)
        lake.check_schema(table.schema().as_arrow(), schema)
        props = {"walstream.sink": batch.sink, "walstream.batch": batch.marker}
        with table.transaction() as tx:
            with tx.update_schema() as update:  # a column added at the source
                update.union_by_name(schema)
            if self.config.mode == "changelog":
                rows = lake.changelog(batch)
                tx.append(rows.cast(schema), snapshot_properties=props)
                n = rows.num_rows
            elif self.config.mode == "mirror" and self.config.updates == "merge_on_read":
                n = self._mirror_on_read(tx, table, lake, batch, props)
            elif self.config.mode == "mirror":
                n = self._mirror(tx, table, lake, batch, props)
            elif self.config.updates == "merge_on_read":
                n = self._history_on_read(tx, table, lake, batch, props)
            else:
                n = self._history(tx, table, lake, batch, props)
        return Written(lake.path_for_messages(), n)

    def adopt_files(self, batch: FilesBatch) -> Written | None:
        """A mirror's new keys, or a changelog's rows, as the staged files themselves: each
        moved under the table's `data/` and added in one snapshot (pyiceberg reads their
        footers for statistics)."""
        from pyarrow import fs as pafs

        if self.config.mode == "history" or self.config.partition_by:
            return None
        lake = LakeTable(self.config, batch.shape.schema, batch.shape.table)
        table = self._open(batch.shape.schema, batch.shape.table)
        if table is not None and self._replayed(table, batch):
            return Written(lake.path_for_messages(), 0, replayed=True)
        staged = [path for path, _ in batch.files]
        existing = None if table is None else table.schema().as_arrow()
        # a try that moved them under the table before a crash created the table first
        if table is None:
            now_at = [pafs.FileSystem.from_uri(path) for path in staged]
        else:
            now_at = [
                staged_or(path, file_at(table.io, _data_file(table, name)))
                for path, name in batch.files
            ]
        metas = footers(now_at)
        wanted = lake.files_schema(batch, metas)
        if not adoptable([m.schema.to_arrow_schema() for m in metas], wanted, existing):
            return None
        key = list(batch.shape.key)
        if table is not None and self.config.mode == "mirror":
            ranged = lambda c, lo, hi: _key_range(table, key, c, lo, hi)  # noqa: E731
            if has_any_key(now_at, key, ranged):
                return None  # a key the table has: the rows are merged
        else:
            table = self._create(batch.shape, wanted)
        targets = [_data_file(table, name) for _, name in batch.files]
        for path, target in zip(staged, targets, strict=True):
            move_staged(path, file_at(table.io, target))
        rows = sum(m.num_rows for m in metas)
        props = {"walstream.sink": batch.sink, "walstream.batch": batch.marker}
        with table.transaction() as tx:
            tx.add_files(targets, snapshot_properties=props, check_duplicate_files=False)
        return Written(lake.path_for_messages(), rows)

    def _mirror(
        self, tx: Any, table: Any, lake: LakeTable, batch: TableBatch, props: dict[str, str]
    ) -> int:
        """Delete the batch's keys (everything after a truncate), append their newest rows."""
        key, schema = list(batch.shape.key), lake.schema(batch)
        rows = lake.filled(batch, lambda keys: self._rows(table, key, keys))
        plan = mirror_plan(
            rows,
            key,
            batch.shape.names,
            batch.complete,
            lambda keys: present_keys(lambda c, lo, hi: _key_range(table, key, c, lo, hi), keys),
        )
        if plan.appends_only:
            touched = []
        elif plan.present is not None:  # looked up: the table has only these (and deletes)
            touched = [key_of(r, key) for r in plan.deletes.select(key).to_pylist()]
            touched += [key_of(r, key) for r in plan.present.to_pylist()]
        else:
            touched = [
                key_of(r, key)
                for r in plan.deletes.select(key).to_pylist() + plan.upserts.select(key).to_pylist()
            ]
        if plan.truncated:
            _delete(tx, _always(), props)
        elif touched:
            _delete(tx, _keys_filter(key, touched), props)
        if plan.upserts.num_rows:
            tx.append(plan.upserts.cast(schema), snapshot_properties=props)
        return int(plan.upserts.num_rows)

    def _mirror_on_read(
        self, tx: Any, table: Any, lake: LakeTable, batch: TableBatch, props: dict[str, str]
    ) -> int:
        """The batch's keys marked deleted where the table has them (a position delete
        file) and their newest rows appended, in the batch's transaction; the keys the
        executors planned (`batch.staged`): their files added as they are."""
        import pyarrow as pa

        key, schema = list(batch.shape.key), lake.schema(batch)
        files = iceberg_deletes.data_files(table, key, self._live)
        fs, _ = file_at(table.io, table.location())  # where the data files are
        columns = batch.shape.names
        index = self._indexes.of(table.location(), key)
        rows_of = functools.partial(
            current_rows, fs, files, key_schema(batch), columns, index=index
        )
        rows = lake.filled(batch, rows_of)
        plan = mirror_plan(rows, key, columns, batch.complete)
        new = plan.upserts.cast(schema)
        staged = batch.staged
        if plan.truncated:
            _delete(tx, _always(), props)
            if new.num_rows:
                tx.append(new, snapshot_properties=props)
            return int(new.num_rows)
        also = None if staged is None else staged.touched
        positions = replaced(fs, files, plan, key, index, also)
        added, n, unadopted = self._staged(tx, table, lake, batch)
        if unadopted is not None:
            new = pa.concat_tables([new, unadopted.select(schema.names).cast(schema)])
        deletes = [iceberg_deletes.write_deletes(table, positions)] if positions else []
        if deletes or added:  # one snapshot: deletes, the new rows, the executors' files
            iceberg_deletes.add_deletes(tx, table, deletes, props, new, added)
        elif new.num_rows:
            tx.append(new, snapshot_properties=props)
        return int(new.num_rows) + n

    def _staged(
        self, tx: Any, table: Any, lake: LakeTable, batch: TableBatch
    ) -> tuple[list[str], int, Any]:
        """The files the executors staged for the batch (`batch.staged`) moved under the
        table's `data/`: their paths and rows; or, when their columns are not the table's
        now, their rows (written with the batch's own) instead."""
        if batch.staged is None or not batch.staged.files:
            return [], 0, None
        existing = tx.table_metadata.schema().as_arrow()
        targets = [_data_file(table, name) for _, name in batch.staged.files]
        placed = [
            (path, file_at(table.io, target))
            for (path, _), target in zip(batch.staged.files, targets, strict=True)
        ]
        metas, unadopted = staged_footers(placed, lake.schema(batch), existing)
        if metas is None:
            return [], 0, unadopted
        for path, target in placed:
            move_staged(path, target)
        return targets, sum(m.num_rows for m in metas), None

    def _history_on_read(
        self, tx: Any, table: Any, lake: LakeTable, batch: TableBatch, props: dict[str, str]
    ) -> int:
        """The current versions the batch ends marked deleted (a position delete file) and
        appended closed, beside its new versions, in the batch's transaction; the keys the
        executors wrote versions of (`batch.staged`): their files added as they are."""
        import pyarrow as pa

        key, schema = list(batch.shape.key), lake.schema(batch)
        files = iceberg_deletes.data_files(table, key, self._live)
        fs, _ = file_at(table.io, table.location())  # where the data files are
        index = self._indexes.of(table.location(), key, "is_current")
        keys, columns = key_schema(batch), batch.shape.names
        rows = lake.filled(
            batch, functools.partial(current_rows, fs, files, keys, columns, index=index)
        )
        plan = history_plan(rows, key, columns, schema)
        if batch.staged is not None:  # the keys whose versions the executors wrote
            plan.closes.update(batch.staged.ends(key))
        have = table.schema().as_arrow()
        full = pa.schema([*have, *(f for f in schema if f.name not in have.names)])
        positions, closed = closed_versions(fs, files, plan, key, keys, full, index)
        new = pa.concat_tables([closed, as_table(plan.versions, full)])
        added, n, unadopted = self._staged(tx, table, lake, batch)
        if unadopted is not None:
            new = pa.concat_tables([new, as_table(unadopted, full)])
        deletes = [iceberg_deletes.write_deletes(table, positions)] if positions else []
        if deletes or added:  # one snapshot: deletes, the new rows, the executors' files
            iceberg_deletes.add_deletes(tx, table, deletes, props, new, added)
        elif new.num_rows:
            tx.append(new, snapshot_properties=props)
        return int(plan.versions.num_rows) + n

    def _history(
        self, tx: Any, table: Any, lake: LakeTable, batch: TableBatch, props: dict[str, str]
    ) -> int:
        """End the current versions the batch replaces (delete them, append them closed),
        append the new versions."""
        import pyarrow as pa

        key, schema = list(batch.shape.key), lake.schema(batch)
        rows = lake.filled(batch, lambda keys: self._rows(table, key, keys))
        plan = history_plan(rows, key, batch.shape.names, schema)
        closes = dict(plan.closes)
        if plan.close_all_at is not None:  # a truncate ends every current version
            current = self._rows(table, key, None)
            for k in current:
                closes.setdefault(k, plan.close_all_at)
        else:
            current = self._rows(table, key, list(closes))
        ended = [
            {**row, "valid_to": closes[k], "is_current": False}
            for k, row in current.items()
            if k in closes
        ]
        if ended:
            ex = load_pyiceberg().expressions
            _delete(
                tx, ex.And(ex.EqualTo("is_current", True), _keys_filter(key, list(closes))), props
            )
            have = table.schema().as_arrow()
            full = pa.schema([*have, *(f for f in schema if f.name not in have.names)])
            tx.append(pa.Table.from_pylist(ended, schema=full), snapshot_properties=props)
        if plan.versions.num_rows:
            tx.append(plan.versions, snapshot_properties=props)
        return int(plan.versions.num_rows)

    def _rows(
        self, table: Any, key: list[str], keys: list[Key] | None
    ) -> dict[Key, dict[str, Any]]:
        """The table's current rows (history: `is_current`) of `keys` (None: all), by key."""
        ex = load_pyiceberg().expressions
        cond = ex.AlwaysTrue() if keys is None else _keys_filter(key, keys)
        if keys is not None and not keys:
            return {}
        if "is_current" in table.schema().column_names:
            cond = ex.And(ex.EqualTo("is_current", True), cond)
        rows = table.scan(row_filter=cond).to_arrow().to_pylist()
        return {key_of(r, key): r for r in rows}

    def _replayed(self, table: Any, batch: TableBatch | FilesBatch) -> bool:
        snap = table.current_snapshot()
        for _ in range(_LOOKBACK):
            if snap is None:
                return False
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get("walstream.sink") == batch.sink:
                query, _, done = props.get("walstream.batch", "").rpartition(":")
                return query == batch.query_id and done.isdigit() and int(done) >= batch.batch_id
            snap = (
                table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
            )
        return False

    def scan(self, schema: str, table: str, columns: list[str]) -> Any | None:
        """pyiceberg's scan, which applies position and equality deletes."""
        table_ = self._open(schema, table)
        if table_ is None:
            return None
        return table_.scan(selected_fields=tuple(columns)).to_arrow_batch_reader()

    def optimize(self, schema: str, table: str) -> dict[str, Any]:
        """Rewrite the table into files of about `target_file_size` when it has more small
        files than that needs (pyiceberg has no partial compaction), then expire snapshots
        older than `retain` (their files stay for readers of old metadata)."""
        import time
        from datetime import UTC, datetime

        t = self._open(schema, table)
        if t is None:
            return {"table": self.target(schema, table), "missing": True}
        files = t.inspect.files().select(["file_size_in_bytes"]).to_pylist()
        size = sum(f["file_size_in_bytes"] for f in files)
        needed = max(1, -(-size // self.config.optimize.target_file_size))
        rewritten = 0
        if len(files) > needed:
            data = t.scan().to_arrow()
            with t.transaction() as tx:
                tx.overwrite(data, snapshot_properties={"walstream.optimize": "compact"})
            rewritten = len(files)
        t = self._catalog().load_table(self.target(schema, table))
        before = len(t.snapshots())
        older = datetime.fromtimestamp(time.time() - self.config.optimize.retain, UTC)
        current = t.current_snapshot()
        if current is not None:
            t.maintenance.expire_snapshots().older_than(older).commit()
        t = self._catalog().load_table(self.target(schema, table))
        return {
            "table": self.target(schema, table),
            "files_rewritten": rewritten,
            "files_now": len(t.inspect.files()),
            "snapshots_expired": before - len(t.snapshots()),
        }


def _delete(tx: Any, where: Any, props: dict[str, str]) -> None:
    """Delete the rows matching `where` in the transaction (none matching is fine)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        tx.delete(where, snapshot_properties=props)


def _data_file(table: Any, name: str) -> str:
    """Where the table keeps a data file of this name."""
    return f"{table.location().rstrip('/')}/data/{name}"


def _key_range(table: Any, key: list[str], column: str, low: Any, high: Any) -> Any:
    """The table's key columns where `column` is within [low, high]."""
    ex = load_pyiceberg().expressions
    where = ex.And(ex.GreaterThanOrEqual(column, low), ex.LessThanOrEqual(column, high))
    return table.scan(row_filter=where, selected_fields=tuple(key)).to_arrow()


def _always() -> Any:
    return load_pyiceberg().expressions.AlwaysTrue()


def _keys_filter(key: list[str], keys: list[Key]) -> Any:
    """An Iceberg row filter matching exactly these keys. A composite key is each column's
    `In` (files skipped by their statistics) and the keys' equalities joined as a balanced
    tree of `Or`s: a chain of thousands nests deeper than Python's recursion limit."""
    ex = load_pyiceberg().expressions
    if len(key) == 1:
        return ex.In(key[0], sorted({k[0] for k in keys}, key=repr))
    unique = list(dict.fromkeys(keys))
    level: list[Any] = []
    for k in unique:
        one: Any = None
        for name, value in zip(key, k, strict=True):
            eq = ex.EqualTo(name, value)
            one = eq if one is None else ex.And(one, eq)
        level.append(one)
    while len(level) > 1:
        pairs = [level[i : i + 2] for i in range(0, len(level), 2)]
        level = [ex.Or(*p) if len(p) == 2 else p[0] for p in pairs]
    ins = [ex.In(name, sorted({k[i] for k in unique}, key=repr)) for i, name in enumerate(key)]
    out = level[0]
    for cond in ins:
        out = ex.And(cond, out)
    return out
