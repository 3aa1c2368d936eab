"""What one batch does to a lake table, per mode: the plans, computed before any write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from walstream.errors import SinkError
from walstream.lake.plan import (
    fill_toast,
    from_target,
    history_plan,
    key_changes,
    mirror_plan,
    split_moves,
)

SCHEMA = pa.schema([
    ("_op", pa.string()), ("_lsn", pa.int64()), ("_seq", pa.int32()),
    ("_committed_at", pa.timestamp("us", tz="UTC")), ("_toast", pa.list_(pa.string())),
    ("id", pa.int64()), ("v", pa.string()), ("w", pa.string()),
])  # fmt: skip
HISTORY = pa.schema([
    ("id", pa.int64()), ("v", pa.string()), ("w", pa.string()), ("_op", pa.string()),
    ("_lsn", pa.int64()), ("_seq", pa.int32()), ("valid_from", pa.timestamp("us", tz="UTC")),
    ("valid_to", pa.timestamp("us", tz="UTC")), ("is_current", pa.bool_()),
])  # fmt: skip


def at(s: int) -> datetime:
    return datetime(2024, 1, 1, 0, 0, s, tzinfo=UTC)


def rows(*changes: tuple[Any, ...]) -> pa.Table:
    """(op, lsn, id, v, w[, toast]) each; seq 0, committed at second `lsn`."""
    out = []
    for op, lsn, id_, v, w, *toast in changes:
        out.append({"_op": op, "_lsn": lsn, "_seq": 0, "_committed_at": at(lsn),
                    "_toast": toast[0] if toast else None, "id": id_, "v": v, "w": w})  # fmt: skip
    return pa.Table.from_pylist(out, schema=SCHEMA)


def no_target(keys: list[Any]) -> dict[Any, Any]:
    return {}


def test_mirror_takes_the_newest_version_of_each_key_in_wal_order():
    plan = mirror_plan(
        rows(("insert", 1, 1, "a", "x"), ("insert", 2, 2, "b", "x"), ("update", 3, 1, "a2", "x"),
             ("delete", 4, 2, None, None), ("insert", 5, 3, "c", "x")),
        ["id"], ["id", "v", "w"],
    )  # fmt: skip
    assert not plan.truncated
    assert plan.upserts.to_pylist() == [
        {"id": 1, "v": "a2", "w": "x"},
        {"id": 3, "v": "c", "w": "x"},
    ]
    assert plan.deletes.to_pylist() == [{"id": 2}]


def test_mirror_after_a_truncate_keeps_only_what_followed_it():
    plan = mirror_plan(
        rows(("insert", 1, 1, "a", "x"), ("truncate", 2, None, None, None),
             ("insert", 3, 2, "b", "x"), ("delete", 4, 2, None, None), ("insert", 5, 3, "c", "x")),
        ["id"], ["id", "v", "w"],
    )  # fmt: skip
    assert plan.truncated
    assert plan.upserts.to_pylist() == [{"id": 3, "v": "c", "w": "x"}]
    assert plan.deletes.to_pylist() == [{"id": 2}]


def test_a_batch_ending_in_a_truncate_empties_the_table_and_writes_nothing():
    # Nothing follows the truncate: the plan is made from no rows (it used to fail on the
    # untyped empty index, and the stream stopped: seen in CI when a batch ended there).
    plan = mirror_plan(
        rows(("insert", 1, 1, "a", "x"), ("truncate", 2, None, None, None)),
        ["id"], ["id", "v", "w"], complete=True,
    )  # fmt: skip
    assert plan.truncated
    assert plan.upserts.num_rows == 0 and plan.deletes.num_rows == 0


def test_unchanged_toast_comes_from_the_batch_or_the_target_and_is_never_null():
    batch = rows(
        ("update", 1, 1, "a2", None, ["w"]),  # from the target's row
        ("insert", 2, 2, "b", "big"),
        ("update", 3, 2, "b2", None, ["w"]),  # from the insert before it
    )
    asked: list[Any] = []

    def target(keys: list[Any]) -> dict[Any, Any]:
        asked.extend(keys)
        return {(1,): {"id": 1, "v": "a", "w": "old big"}}

    filled = fill_toast(batch, ["id"], target)
    assert asked == [(1,)]
    assert [(r["id"], r["v"], r["w"], r["_toast"]) for r in filled.to_pylist()] == [
        (1, "a2", "old big", None), (2, "b", "big", None), (2, "b2", "big", None),
    ]  # fmt: skip
    with pytest.raises(SinkError, match=r"key \(7,\).*left w out") as e:
        fill_toast(rows(("update", 1, 7, "q", None, ["w"])), ["id"], no_target)
    assert "REPLICA IDENTITY FULL" in (e.value.fix or "")


def test_after_a_truncate_the_target_no_longer_gives_toast_values():
    batch = rows(("truncate", 1, None, None, None), ("update", 2, 1, "a2", None, ["w"]))
    with pytest.raises(SinkError, match="no earlier version"):
        fill_toast(batch, ["id"], lambda keys: {(1,): {"id": 1, "w": "gone"}})


def test_history_chains_versions_and_closes_what_the_target_has_current():
    plan = history_plan(
        rows(("insert", 1, 1, "a", "x"), ("update", 2, 1, "a2", "x"), ("update", 3, 5, "e", "x"),
             ("delete", 4, 1, "a2", None)),
        ["id"], ["id", "v", "w"], HISTORY,
    )  # fmt: skip
    # key 5 existed before the batch: its current version ends at its first change here
    assert plan.closes == {(1,): at(1), (5,): at(3)}
    assert plan.close_all_at is None
    got = [
        (r["id"], r["_op"], r["valid_from"], r["valid_to"], r["is_current"])
        for r in plan.versions.to_pylist()
    ]
    assert got == [
        (1, "insert", at(1), at(2), False),
        (1, "update", at(2), at(4), False),
        (5, "update", at(3), None, True),
        (1, "delete", at(4), at(4), False),  # a delete is a version that never is current
    ]


def test_history_truncate_ends_every_open_version_and_the_targets():
    plan = history_plan(
        rows(("insert", 1, 1, "a", "x"), ("truncate", 2, None, None, None),
             ("insert", 3, 2, "b", "x")),
        ["id"], ["id", "v", "w"], HISTORY,
    )  # fmt: skip
    assert plan.close_all_at == at(2)
    assert plan.closes == {(1,): at(1)}
    assert [(r["id"], r["valid_to"], r["is_current"]) for r in plan.versions.to_pylist()] == [
        (1, at(2), False), (2, None, True),
    ]  # fmt: skip


def test_a_complete_batch_of_new_keys_is_an_append():
    batch = rows(("insert", 1, 1, "a", "x"), ("update", 2, 1, "a2", "x"),
                 ("insert", 3, 2, "b", "x"), ("delete", 4, 2, None, None))  # fmt: skip
    plan = mirror_plan(batch, ["id"], ["id", "v", "w"], complete=True)
    assert plan.appends_only
    assert plan.upserts.to_pylist() == [{"id": 1, "v": "a2", "w": "x"}]
    assert plan.deletes.num_rows == 0  # key 2 never reached the table
    # a filtered sink may have missed a delete: the same batch merges
    assert not mirror_plan(batch, ["id"], ["id", "v", "w"], complete=False).appends_only
    # a key whose first change is an update is in the table already: merge
    assert not mirror_plan(
        rows(("insert", 1, 1, "a", "x"), ("update", 2, 9, "z", "x")), ["id"], ["id", "v", "w"],
        complete=True,
    ).appends_only  # fmt: skip


def test_read_keys_the_table_lacks_make_an_append_and_those_it_has_a_merge():
    asked: list[list[int]] = []

    def has(*present: int) -> Any:
        def lookup(keys: pa.Table) -> pa.Table:
            asked.append(keys.column("id").to_pylist())
            return keys.filter(pc.is_in(keys["id"], pa.array(present, pa.int64())))

        return lookup

    batch = rows(("insert", 1, 1, "a", "x"), ("read", 2, 5, "r", "y"), ("read", 2, 6, "s", "y"),
                 ("update", 3, 6, "s2", "y"))  # fmt: skip
    plan = mirror_plan(batch, ["id"], ["id", "v", "w"], complete=True, present=has())
    assert asked == [[5, 6]]  # only the keys first read here are looked up
    assert plan.appends_only and plan.deletes.num_rows == 0
    assert [r["id"] for r in plan.upserts.to_pylist()] == [1, 5, 6]
    plan = mirror_plan(batch, ["id"], ["id", "v", "w"], complete=True, present=has(6))
    assert not plan.appends_only and plan.present.to_pylist() == [{"id": 6}]
    # a key first updated here is in the table: merge, and nothing is looked up
    asked.clear()
    updated = rows(("read", 2, 5, "r", "y"), ("update", 3, 7, "u", "y"))
    plan = mirror_plan(updated, ["id"], ["id", "v", "w"], complete=True, present=has())
    assert asked == [] and not plan.appends_only and plan.present is None


MOVES = pa.schema([*SCHEMA, ("_before", pa.struct([("id", pa.int64()), ("v", pa.string()),
                                                   ("w", pa.string())]))])  # fmt: skip


def moves(*changes: tuple[Any, ...]) -> pa.Table:
    """(op, lsn, id, v, w, toast, old id) each: `old id` is the key Postgres sent as the old
    tuple (a key change under REPLICA IDENTITY DEFAULT), None when it sent none."""
    out = []
    for op, lsn, id_, v, w, toast, old in changes:
        before = None if old is None else {"id": old, "v": None, "w": None}
        out.append({"_op": op, "_lsn": lsn, "_seq": 0, "_committed_at": at(lsn), "_toast": toast,
                    "id": id_, "v": v, "w": w, "_before": before})  # fmt: skip
    return pa.Table.from_pylist(out, schema=MOVES)


def test_a_key_change_deletes_the_old_key_and_takes_its_toast_value():
    batch = moves(
        ("insert", 1, 1, "a", "big1", None, None),
        ("update", 2, 100, "a2", None, ["w"], 1),  # id 1 -> 100, w unchanged (TOAST)
        ("update", 3, 7, "b2", None, ["w"], 2),  # 2 -> 7: the target has 2's value
    )
    filled = split_moves(fill_toast(batch, ["id"], lambda keys: {
        k: {"id": 2, "v": "b", "w": "big2"} for k in keys if k == (2,)}), ["id"])  # fmt: skip
    got = [(r["_op"], r["id"], r["w"]) for r in filled.to_pylist()]
    assert got == [("insert", 1, "big1"), ("delete", 1, None), ("update", 100, "big1"),
                   ("delete", 2, None), ("update", 7, "big2")]  # fmt: skip
    plan = mirror_plan(filled, ["id"], ["id", "v", "w"])
    assert plan.upserts.to_pylist() == [{"id": 100, "v": "a2", "w": "big1"},
                                        {"id": 7, "v": "b2", "w": "big2"}]  # fmt: skip
    assert plan.deletes.to_pylist() == [{"id": 1}, {"id": 2}]
    # history: the old key's version ends with a delete, the new key's begins
    history = history_plan(filled, ["id"], ["id", "v", "w"], HISTORY)
    assert history.closes[(2,)] == at(3)  # the target's current version of 2 ends then
    ops = [(r["_op"], r["id"], r["is_current"]) for r in history.versions.to_pylist()]
    assert ops == [("insert", 1, False), ("delete", 1, False), ("update", 100, True),
                   ("delete", 2, False), ("update", 7, True)]  # fmt: skip


def test_an_update_whose_old_tuple_has_the_same_key_is_no_key_change():
    # REPLICA IDENTITY FULL sends the old row with every update
    batch = moves(("update", 1, 5, "v", "w", None, 5))
    assert split_moves(batch, ["id"]).num_rows == 1


def test_a_value_neither_the_batch_nor_the_target_has_comes_from_the_source():
    asked: list[Any] = []

    def source(keys: list[Any]) -> dict[Any, Any]:
        asked.extend(keys)
        return {(3,): {"id": 3, "v": "now", "w": "from-source"}, (9,): {"id": 9, "w": "nine"}}

    batch = moves(
        ("update", 1, 3, "a", None, ["w"], None),  # the lake has no row 3 yet (a backfill goes)
        ("update", 2, 3, "b", None, ["w"], None),  # takes the first one's, once filled
        ("update", 3, 4, "c", None, ["w"], None),  # gone from the source by now: left out
        ("update", 4, 9, "d", None, ["w"], 4),  # 4 -> 9: no NULL copied, the source has 9
    )
    filled = fill_toast(batch, ["id"], no_target, source)
    assert asked == [(3,), (4,), (9,)]  # one lookup, of the keys nothing else could fill
    assert [(r["id"], r["w"], r["_toast"]) for r in filled.to_pylist()] == [
        (3, "from-source", None), (3, "from-source", None), (9, "nine", None)]  # fmt: skip
    with pytest.raises(SinkError, match="no earlier version"):  # no source: it stops
        fill_toast(batch, ["id"], no_target)


def test_the_keys_only_the_table_can_fill_in_are_told_apart_from_the_batchs_own():
    batch = rows(
        ("update", 1, 1, "a", None, ["w"]),  # 1's first change lacks w: the table has it
        ("insert", 2, 2, "b", "big2"),
        ("update", 3, 2, "b2", None, ["w"]),  # 2 was inserted here: the batch fills it in
        ("update", 4, 1, "a2", None, ["w"]),
        ("update", 5, 3, "c", "big3"),  # 3's first change has every value
        ("update", 6, 3, "c2", None, ["w"]),
        ("delete", 7, 4, None, None),
    )
    held = from_target(batch, ["id"]).to_pylist()
    assert held == [True, False, False, True, False, False, False]
    # the rest needs no row of the table (`fill_toast` would ask for it)
    rest = batch.filter(pc.invert(pa.array(held)))

    def asked(keys: list[Any]) -> dict[Any, Any]:
        raise AssertionError(keys)

    filled = fill_toast(rest, ["id"], asked)
    assert [r["w"] for r in filled.to_pylist()] == ["big2", "big2", "big3", "big3", None]
    assert from_target(rows(("insert", 1, 1, "a", "x")), ["id"]).to_pylist() == [False]


def test_a_key_change_is_found_in_arrow():
    batch = moves(
        ("update", 1, 1, "a", "x", None, None),  # no old tuple: the key stayed
        ("update", 2, 100, "a", "x", None, 1),  # 1 -> 100
        ("update", 3, 5, "a", "x", None, 5),  # REPLICA IDENTITY FULL: the same key
        ("delete", 4, 6, None, None, None, 6),
    )
    assert key_changes(batch, ["id"]).to_pylist() == [False, True, False, False]
