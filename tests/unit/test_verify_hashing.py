"""How `walstream verify` hashes and compares rows (`verify/hashing.py`)."""

from __future__ import annotations

import decimal

import pyarrow as pa

from walstream.verify.hashing import SEVERAL, Hasher, Sums, compare

KEY = ("region", "id")
COLUMNS = ("region", "id", "arr", "doc", "price")


def table(rows: list[tuple]) -> pa.Table:
    region, id_, arr, doc, price = zip(*rows, strict=True) if rows else ([], [], [], [], [])
    return pa.table({
        "region": pa.array(region, pa.string()), "id": pa.array(id_, pa.int32()),
        "arr": pa.array(arr, pa.list_(pa.int32())), "doc": pa.array(doc, pa.string()),
        "price": pa.array(price, pa.decimal128(12, 2)),
    })  # fmt: skip


ROWS = [
    ("eu", 1, [1, None], '{"a": [1, null], "b": "x"}', decimal.Decimal("1.25")),
    ("", 2, [], None, None),
    ("us", 3, None, "null", decimal.Decimal("-0.50")),
    ("eu", 4, [7], '"text"', decimal.Decimal("0.00")),
]


def sums(hasher: Hasher, *parts: pa.Table) -> Sums:
    out = Sums()
    for p in parts:
        out.add(hasher.sums(p))
    return out


def test_sums_do_not_depend_on_order_or_batching_and_see_one_changed_value():
    h = Hasher(KEY, COLUMNS, 16, ["doc"])
    whole = sums(h, table(ROWS))
    assert whole.rows == 4
    assert not whole.different(sums(h, table(ROWS[2:]), table(ROWS[:2][::-1])))
    changed = list(ROWS)
    changed[2] = ("us", 3, [None], "null", decimal.Decimal("-0.50"))  # NULL array vs [NULL]
    differing = whole.different(sums(h, table(changed)))
    assert len(differing) == 1
    assert differing == {h.sums(table(ROWS[2:3]))[0][0]}  # the changed row's bucket
    assert 3 in h.keyed(table(ROWS), differing).column("id").to_pylist()


def test_json_text_is_compared_as_json_and_other_text_as_it_is():
    h = Hasher(KEY, COLUMNS, 16, ["doc"])
    compact = [r if r[1] != 1 else (*r[:3], '{"a":[1,null],"b":"x"}', r[4]) for r in ROWS]
    assert not sums(h, table(ROWS)).different(sums(h, table(compact)))
    plain = Hasher(KEY, COLUMNS, 16)  # no JSON columns: the spacing is a difference
    assert sums(plain, table(ROWS)).different(sums(plain, table(compact)))
    reordered = [r if r[1] != 1 else (*r[:3], '{"b": "x", "a": [1, null]}', r[4]) for r in ROWS]
    assert sums(h, table(ROWS)).different(sums(h, table(reordered)))  # jsonb never reorders


def test_compare_names_missing_extra_and_different_keys_with_both_sides_hashes():
    h = Hasher(KEY, COLUMNS, 16, ["doc"])
    source = h.keyed(table(ROWS))
    sink_rows = [
        ROWS[0],
        ("", 2, [], None, decimal.Decimal("9.99")),
        ROWS[3],
        ("zz", 9, [], None, None),
    ]
    sink = h.keyed(table(sink_rows))
    found = compare(source, sink, KEY)

    def hashes(side):
        keys = zip(side["region"].to_pylist(), side["id"].to_pylist(), strict=True)
        return dict(zip(keys, side["_h"].to_pylist(), strict=True))

    src, snk = hashes(source), hashes(sink)
    assert found.missing == {("us", 3): src[("us", 3)]}
    assert found.different == {("", 2): (src[("", 2)], snk[("", 2)])}
    assert src[("", 2)] != snk[("", 2)]
    assert found.extra == {("zz", 9): snk[("zz", 9)]}
    assert len(found) == 3
    assert found.state(("zz", 9)) == (None, snk[("zz", 9)])
    assert found.state(("us", 3)) == (src[("us", 3)], None)
    assert not len(compare(source, h.keyed(table(ROWS[::-1])), KEY))


def test_a_key_the_sink_has_twice_differs_whatever_its_rows():
    import pyarrow as pa

    from walstream.verify.hashing import compare

    source = pa.table({"k": ["a", "b"], "_h": pa.array([1, 2], pa.uint64())})
    sink = pa.table({"k": ["a", "b", "b"], "_h": pa.array([1, 2, 2], pa.uint64())})
    found = compare(source, sink, ["k"])
    assert (found.missing, found.extra, found.different) == ({}, {}, {("b",): (2, SEVERAL)})


def test_a_lake_scan_is_hashed_in_large_gathered_batches_with_every_row():
    """A lake reader's small batches are handed on gathered (each hash query costs as much
    for 8 rows as for many), every row once and in order; a batch of another schema (a
    file written with other encodings) starts a new table rather than failing."""
    from walstream.verify.sides import gathered

    small = [pa.record_batch({"id": pa.array(range(i, i + 3), pa.int64())}) for i in (0, 3, 6)]
    viewed = pa.record_batch({"id": pa.array([9, 10], pa.int64()), "t": pa.array(["a", "b"])})
    got = list(gathered(iter([*small, viewed, viewed]), 5))
    assert [t.num_rows for t in got] == [6, 3, 4]
    assert [v for t in got for v in t.column("id").to_pylist()] == [*range(11), 9, 10]
