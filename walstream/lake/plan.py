"""What one batch does to a lake table, per mode, computed on Arrow before any write.

Pure functions of a `TableBatch`'s rows (sorted by WAL cursor) and, where a mode
needs them, the target's current rows of the batch's keys. The Delta and Iceberg
sinks turn a plan into their own single commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import SinkError

log = logging.getLogger(__name__)

#: Columns of a TableBatch's rows that are not source columns.
META = ("_op", "_lsn", "_seq", "_committed_at", "_toast", "_before")
#: Columns a history table adds to the source's.
HISTORY = ("_op", "_lsn", "_seq", "valid_from", "valid_to", "is_current")
#: Columns a changelog table adds to the source's.
CHANGELOG = ("_op", "_lsn", "_seq", "_committed_at", "_toast", "_before")

Key = tuple[Any, ...]
#: The target's current rows of some keys, by key (a row: {column: value}).
CurrentRows = Callable[[list[Key]], dict[Key, dict[str, Any]]]


def _pa() -> Any:
    import pyarrow as pa

    return pa


def key_of(row: dict[str, Any], key: Sequence[str]) -> Key:
    return tuple(row[k] for k in key)


def after_last_truncate(rows: Any) -> tuple[Any, bool]:
    """The rows after the batch's last truncate, and whether there was one."""
    ops = rows.column("_op").to_pylist()
    for i in range(len(ops) - 1, -1, -1):
        if ops[i] == "truncate":
            return rows.slice(i + 1), True
    return rows, False


def moved_from(r: dict[str, Any], key: Sequence[str]) -> Key | None:
    """The key an update moved its row from (Postgres sent the old key: `_before`), or None."""
    before = r.get("_before")
    if r["_op"] != "update" or not before:
        return None
    old = tuple(before.get(k) for k in key)
    if all(v is None for v in old) or old == key_of(r, key):
        return None
    return old


def fill_toast(
    rows: Any, key: Sequence[str], current: CurrentRows, source: CurrentRows | None = None
) -> Any:
    """Rows with every unchanged TOAST value filled in from the row's previous version: earlier
    in the batch, or else the target's current row (for a key change, the old key's), or
    else the source table's row now (`source`).

    The source's value is the one Postgres did not send unless a later change altered it;
    such a change carries the new value and is applied after this one, so a mirror ends
    equal to the source. A change of a row the source no longer has is left out: a later
    change deletes the row, or moves it to a key the source gives the value of then (a
    NULL written in its place would be copied by that move). Without `source` an unknown
    value stops the batch.
    """
    pa = _pa()
    toast = rows.column("_toast")
    if toast.null_count == len(toast) or not any(t for t in toast.to_pylist() if t):
        return rows
    data = rows.to_pylist()
    wanted, seen = [], set()
    for r in data:  # keys whose first in-batch version lacks a value: the target has it
        if r["_op"] == "truncate":
            break
        k, old = key_of(r, key), moved_from(r, key)
        if r["_toast"]:
            want = k if old is None else old
            if want not in seen:
                wanted.append(want)
        seen.add(k)
        if old is not None:
            seen.add(old)
    target = current(wanted) if wanted else {}
    unknown = _fill(data, key, target, None)
    if unknown and source is not None:
        found = source(unknown)
        _fill(data, key, target, found)
        gone = [r for r in data if r["_toast"]]
        if gone:  # usually deleted or moved later in this very batch
            log.info(
                "lake: %d change(s) left an unchanged TOAST value out for rows neither the lake "
                "table nor the source has any more (first: key %s, %s at %s:%s): left out, as "
                "a later change deletes the row or moves it to a key the source has",
                len(gone),
                key_of(gone[0], key),
                ", ".join(gone[0]["_toast"]),
                gone[0]["_lsn"],
                gone[0]["_seq"],
            )
            data = [r for r in data if not r["_toast"]]
    elif unknown:
        r = next(r for r in data if r["_toast"])
        raise SinkError(
            f"lake: a change of key {key_of(r, key)} at {r['_lsn']}:{r['_seq']} left "
            f"{', '.join(r['_toast'])} out (an unchanged TOAST value) and the lake "
            "table has no earlier version of the row to take it from",
            "backfill the table into the sink first (`walstream backfill`), or set "
            "`ALTER TABLE ... REPLICA IDENTITY FULL` so Postgres sends every value",
            retryable=False,
        )
    return pa.Table.from_pylist(data, schema=rows.schema)


def _fill(
    data: list[dict[str, Any]],
    key: Sequence[str],
    target: dict[Key, dict[str, Any]],
    source: dict[Key, dict[str, Any]] | None,
) -> list[Key]:
    """Fill `data`'s unchanged TOAST values in place, in WAL order, from the previous version
    (in the batch, in `target`, in `source`); the keys (deduplicated, in order) of the rows
    left unknown, which keep their `_toast`."""
    target = dict(target)
    prev: dict[Key, dict[str, Any]] = {}
    unknown: dict[Key, None] = {}
    for r in data:
        if r["_op"] == "truncate":
            prev.clear()
            target = {}
            continue
        k, old = key_of(r, key), moved_from(r, key)
        if r["_toast"]:
            frm = k if old is None else old
            found = (prev.get(frm), target.get(frm), (source or {}).get(k))
            # the first that is known (an earlier version whose own value is unknown is not)
            base = next((b for b in found if b is not None and not b.get("_toast")), None)
            if base is None:
                unknown[k] = None
            else:
                for c in r["_toast"]:
                    r[c] = base.get(c)
                r["_toast"] = None
        if old is not None:
            prev.pop(old, None)
            target.pop(old, None)
        if r["_op"] == "delete":
            prev.pop(k, None)
            target.pop(k, None)
        else:
            prev[k] = r
    return list(unknown)


def split_moves(rows: Any, key: Sequence[str]) -> Any:
    """The rows with a delete of the old key before each update that changed a row's key
    (the same cursor): mirror and history apply a key change as the old key's end and the
    new key's next version."""
    pa = _pa()
    import pyarrow.compute as pc

    if not pc.any(key_changes(rows, key)).as_py():
        return rows
    out: list[dict[str, Any]] = []
    moved = 0
    for r in rows.to_pylist():
        old = moved_from(r, key)
        if old is not None:
            before = dict(r["_before"])
            gone = {c: before.get(c) for c in r if c not in META}
            gone.update(
                _op="delete",
                _lsn=r["_lsn"],
                _seq=r["_seq"],
                _committed_at=r["_committed_at"],
                _toast=None,
                _before=r["_before"],
            )
            out.append(gone)
            moved += 1
        out.append(r)
    return rows if not moved else pa.Table.from_pylist(out, schema=rows.schema)


def key_changes(rows: Any, key: Sequence[str]) -> Any:
    """Which rows are updates that changed their row's key (a boolean array)."""
    pa = _pa()
    import pyarrow.compute as pc

    if "_before" not in rows.column_names or rows.num_rows == 0:
        return pa.repeat(False, rows.num_rows)
    # `_before` is there on every row (its fields NULL when Postgres sent no old tuple)
    # and, under REPLICA IDENTITY FULL, holds the key of every update.
    before = rows["_before"].combine_chunks()
    moves: Any = None
    for k in key:
        old = pc.struct_field(before, k)
        differs = pc.and_(pc.is_valid(old), pc.not_equal(old, rows[k].combine_chunks()))
        moves = differs if moves is None else pc.or_(moves, differs)
    return pc.and_(pc.equal(rows["_op"], "update"), pc.fill_null(moves, False))


def from_target(rows: Any, key: Sequence[str]) -> Any:
    """Which rows (a boolean array) are of a key whose first change in the batch left an
    unchanged TOAST value out: only the table's current row (or the source's) can fill
    it in. Every other key's values are known from the batch itself (`fill_toast` asks
    for no target row of them). Rows without a key change only (`key_changes`)."""
    pa = _pa()
    import pyarrow.compute as pc

    n = rows.num_rows
    lacking = pc.fill_null(pc.greater(pc.list_value_length(rows["_toast"]), 0), False)
    if n == 0 or not pc.any(lacking).as_py():
        return pa.repeat(False, n)
    at = pa.array(range(n), pa.int64())
    indexed = rows.select(list(key)).append_column("_i", at)
    first = indexed.group_by(list(key), use_threads=False).aggregate([("_i", "min")])["_i_min"]
    keys = indexed.take(first.filter(pc.take(lacking, first))).select(list(key))
    marked = indexed.join(keys, keys=list(key), join_type="left semi")["_i"]
    return pc.is_in(at, value_set=marked.combine_chunks())


@dataclass
class MirrorPlan:
    """Mirror (SCD 1): empty the table first when `truncated`, then upsert and delete."""

    truncated: bool
    upserts: Any  # pyarrow Table of the source columns
    deletes: Any  # pyarrow Table of the key columns
    #: Every upsert is a key the table cannot have (inserted in this batch, first) or was
    #: found not to have: the batch is an append, no merge.
    appends_only: bool = False
    #: When the plan looked the keys up: those the table has (a pyarrow Table of keys).
    present: Any = None


def mirror_plan(
    rows: Any,
    key: Sequence[str],
    columns: Sequence[str],
    complete: bool = False,
    present: Callable[[Any], Any] | None = None,
) -> MirrorPlan:
    """The newest version of each key after the last truncate.

    `complete`: the batch holds every change of the table (no filter, every action), so
    a key whose first change here is an insert is not in the table yet.
    `present(keys)`: which of these keys (a pyarrow Table) the table has. Asked when every
    other key is new and some were first read here (a backfill): when the table has none
    of them, the batch is an append.
    """
    pa = _pa()
    import pyarrow.compute as pc

    rows, truncated = after_last_truncate(rows)
    indexed = rows.select(list(key)).append_column("_i", pa.array(range(rows.num_rows), pa.int64()))
    ends = indexed.group_by(list(key), use_threads=False).aggregate([("_i", "max"), ("_i", "min")])
    positions = ends.column("_i_max")
    newest = rows.take(pc.take(positions, pc.sort_indices(positions)))  # in WAL order
    deleted = pc.equal(newest.column("_op"), "delete")
    first = rows.column("_op").take(ends.column("_i_min"))
    new = pc.equal(first, "insert") if complete else pa.repeat(False, len(first))
    read = pc.equal(first, "read")
    upserts = newest.filter(pc.invert(deleted)).select(list(columns))
    no_deletes = newest.slice(0, 0).select(list(key))
    if bool(pc.all(new).as_py()):  # inserted here first: a delete of one is a key never had
        return MirrorPlan(truncated, upserts, no_deletes, True)
    if not truncated and present is not None and bool(pc.all(pc.or_(new, read)).as_py()):
        found = present(ends.filter(read).select(list(key)))
        if found.num_rows == 0:
            return MirrorPlan(truncated, upserts, no_deletes, True, found)
        return MirrorPlan(
            truncated, upserts, newest.filter(deleted).select(list(key)), False, found
        )
    return MirrorPlan(truncated, upserts, newest.filter(deleted).select(list(key)))


@dataclass
class HistoryPlan:
    """History (SCD 2): close the target's current rows named, then append the versions."""

    #: Key -> when the target's current version of it ends (its first change in the batch).
    closes: dict[Key, Any] = field(default_factory=dict)
    #: The batch's first truncate: every other current row of the target ends then.
    close_all_at: Any = None
    versions: Any = None  # pyarrow Table: the source columns + HISTORY


def history_schema(rows: Any, columns: Sequence[str]) -> Any:
    """A history table's Arrow schema: the source `columns` as typed in `rows` (a schema),
    then its version columns (`HISTORY`)."""
    pa = _pa()
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            *(rows.field(c) for c in columns),
            pa.field("_op", pa.string()),
            pa.field("_lsn", pa.int64()),
            pa.field("_seq", pa.int32()),
            pa.field("valid_from", ts),
            pa.field("valid_to", ts),
            pa.field("is_current", pa.bool_()),
        ]
    )


def history_plan(rows: Any, key: Sequence[str], columns: Sequence[str], schema: Any) -> HistoryPlan:
    """Every change a version; each ends where the next change of its key (or a truncate)
    begins. `schema`: the history table's Arrow schema."""
    pa = _pa()
    plan = HistoryPlan()
    out: list[dict[str, Any]] = []
    open_: dict[Key, dict[str, Any]] = {}  # the batch's open version of each key
    truncated = False
    for r in rows.to_pylist():
        at = r["_committed_at"]
        if r["_op"] == "truncate":
            for v in open_.values():
                v["valid_to"], v["is_current"] = at, False
            open_.clear()
            if not truncated:
                plan.close_all_at, truncated = at, True
            continue
        k = key_of(r, key)
        if k in open_:
            open_[k]["valid_to"], open_[k]["is_current"] = at, False
        elif not truncated and k not in plan.closes:
            plan.closes[k] = at
        deleted = r["_op"] == "delete"
        v = {c: r.get(c) for c in columns}
        v.update(
            _op=r["_op"],
            _lsn=r["_lsn"],
            _seq=r["_seq"],
            valid_from=at,
            valid_to=at if deleted else None,
            is_current=not deleted,
        )
        out.append(v)
        if deleted:
            open_.pop(k, None)
        else:
            open_[k] = v
    plan.versions = pa.Table.from_pylist(out, schema=schema)
    return plan


def changelog_rows(rows: Any, columns: Sequence[str]) -> Any:
    """Every change as one row: its metadata, the row after it, `_before`."""
    return rows.select([*CHANGELOG[:4], *columns, "_toast", "_before"])
