"""The DBLog rule's key: one string per key, the same from Python and Arrow (and Spark SQL:
tests/integration/test_backfill_merge.py), never the same for two keys."""

from __future__ import annotations

import pyarrow as pa

from walstream.backfill.dblog import dropped, keep_typed, key_of, key_text

#: Keys whose parts hold the separator, the NULL mark, digits and colons, empty text,
#: and characters of several bytes: a naive join makes some of them one string.
KEYS = [
    ["a\x1fb", "c"],
    ["a", "b\x1fc"],
    ["1:a"],
    ["~"],
    [None],
    [""],
    ["", ""],
    [],
    ["é", "日本"],
    ["é日", "本"],
    ["2:ab"],
    ["ab"],
]


def test_every_key_is_its_own_string_alike_in_python_and_arrow() -> None:
    texts = [key_of(k) for k in KEYS]
    assert len(set(texts)) == len(KEYS)
    arrow = key_text(pa.array(KEYS, pa.list_(pa.string()))).to_pylist()
    assert arrow == texts
    sliced = key_text(pa.array(KEYS, pa.list_(pa.string())).slice(3, 4)).to_pylist()
    assert sliced == texts[3:7]  # a slice of a batch keys its own rows
    chunked = pa.chunked_array([pa.array(KEYS[:5], pa.list_(pa.string())),
                                pa.array(KEYS[5:], pa.list_(pa.string()))])  # fmt: skip
    assert key_text(chunked).to_pylist() == texts


def test_dropped_marks_the_rows_whose_key_the_window_changed() -> None:
    pk = pa.array([["1", "a"], ["1", "b"], ["2", "a"]], pa.list_(pa.string()))
    changed = pa.array([key_of(["1", "b"]), key_of(["2", "x"])], pa.string())
    mask = dropped(pk, changed)
    assert mask is not None and mask.to_pylist() == [False, True, False]
    assert dropped(pk, pa.array([], pa.string())) is None


def test_keep_typed_leaves_out_the_changed_keys_and_keeps_the_order() -> None:
    data = pa.table({
        "k1": pa.array([3, 1, 2, 1], pa.int64()), "k2": ["x", "y", "z", "x"],
        "v": [[1, None], None, [], [2]], "_ord": pa.array(range(4), pa.int32()),
    })  # fmt: skip
    gone = pa.table({"k1": pa.array([1, 9], pa.int64()), "k2": ["y", "x"]})
    kept = keep_typed(data, gone, ["k1", "k2"])
    assert kept.to_pydict() == {"k1": [3, 2, 1], "k2": ["x", "z", "x"],
                                "v": [[1, None], [], [2]], "_ord": [0, 2, 3]}  # fmt: skip
    assert keep_typed(data, None, ["k1", "k2"]) is data
