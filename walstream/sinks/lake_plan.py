"""What one batch does to a lake table, per mode, computed on Arrow before any write.

Pure functions of a `TableBatch`'s rows (sorted by WAL cursor) and, where a mode
needs them, the target's current rows of the batch's keys. The Delta and Iceberg
sinks turn a plan into their own single commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import SinkError

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


def fill_toast(rows: Any, key: Sequence[str], current: CurrentRows) -> Any:
    """Rows with every unchanged TOAST value filled in, from the key's previous version in
    the batch or else the target's current row; an unknown one stops the batch."""
    pa = _pa()
    toast = rows.column("_toast")
    if toast.null_count == len(toast) or not any(t for t in toast.to_pylist() if t):
        return rows
    data = rows.to_pylist()
    wanted, seen = [], set()
    for r in data:  # keys whose first in-batch version lacks a value: the target has it
        if r["_op"] == "truncate":
            break
        k = key_of(r, key)
        if r["_toast"] and k not in seen:
            wanted.append(k)
        seen.add(k)
    target = current(wanted) if wanted else {}
    prev: dict[Key, dict[str, Any]] = {}
    for r in data:
        if r["_op"] == "truncate":
            prev.clear()
            target = {}
            continue
        k = key_of(r, key)
        if r["_toast"]:
            base = prev.get(k) or target.get(k)
            if base is None:
                raise SinkError(
                    f"lake: a change of key {k} at {r['_lsn']}:{r['_seq']} left "
                    f"{', '.join(r['_toast'])} out (an unchanged TOAST value) and the lake "
                    "table has no earlier version of the row to take it from",
                    "backfill the table into the sink first (`walstream backfill`), or set "
                    "`ALTER TABLE ... REPLICA IDENTITY FULL` so Postgres sends every value",
                    retryable=False,
                )
            for c in r["_toast"]:
                r[c] = base.get(c)
            r["_toast"] = None
        if r["_op"] == "delete":
            prev.pop(k, None)
            target.pop(k, None)
        else:
            prev[k] = r
    return pa.Table.from_pylist(data, schema=rows.schema)


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
    rows: Any, key: Sequence[str], columns: Sequence[str], complete: bool = False,
    present: Callable[[Any], Any] | None = None,
) -> MirrorPlan:  # fmt: skip
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
        return MirrorPlan(truncated, upserts, newest.filter(deleted).select(list(key)), False,
                          found)  # fmt: skip
    return MirrorPlan(truncated, upserts, newest.filter(deleted).select(list(key)))


@dataclass
class HistoryPlan:
    """History (SCD 2): close the target's current rows named, then append the versions."""

    #: Key -> when the target's current version of it ends (its first change in the batch).
    closes: dict[Key, Any] = field(default_factory=dict)
    #: The batch's first truncate: every other current row of the target ends then.
    close_all_at: Any = None
    versions: Any = None  # pyarrow Table: the source columns + HISTORY


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
            _op=r["_op"], _lsn=r["_lsn"], _seq=r["_seq"], valid_from=at,
            valid_to=at if deleted else None, is_current=not deleted,
        )  # fmt: skip
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
