from __future__ import annotations

import json

from tests.unit.decode.test_pgoutput import tuple_data
from walstream.decode import pgoutput as po
from walstream.decode.relations import CompiledRelation, RelationInfo
from walstream.decode.types import TypeRegistry

COLUMNS = (
    po.Column('we"ird {name}', 23, -1, True),
    po.Column("t", 25, -1, False),
    po.Column("b", 16, -1, False),
    po.Column("n", 1700, -1, False),
    po.Column("j", 3802, -1, False),
    po.Column("ts", 1184, -1, False),
    po.Column("a", 1009, -1, False),
)


def compiled() -> CompiledRelation:
    info = RelationInfo(1, "public", "t", "d", COLUMNS, ('we"ird {name}',))
    return CompiledRelation(info, TypeRegistry())


def test_generated_encoder_equals_generic_path():
    rel = compiled()
    values = [
        b"7",
        'é "x"\n'.encode(),
        b"t",
        b"1.50",
        b'{"k": [1]}',
        b"2024-01-02 03:04:05+00",
        b'{a,"b c",NULL}',
    ]
    buf = b"\x00" + tuple_data(*values)
    fast = rel.fast(buf, 1)
    assert fast is not None
    record, pk = fast
    generic, omitted, json_nulls = rel.record(values)
    assert record == generic and omitted is None and json_nulls is None
    assert json.loads(record) == {
        'we"ird {name}': 7, "t": 'é "x"\n', "b": True, "n": "1.50",
        "j": {"k": [1]}, "ts": "2024-01-02T03:04:05Z", "a": ["a", "b c", None],
    }  # fmt: skip
    assert pk == ["7"]
    nulls = rel.fast(b"\x00" + tuple_data(*[None] * 7), 1)
    assert (
        nulls is not None
        and json.loads(nulls[0]) == dict.fromkeys(json.loads(record))
        and nulls[1] == [None]
    )


def test_generated_encoder_hands_unusual_tuples_to_the_generic_path():
    rel = compiled()
    assert (
        rel.fast(b"\x00" + tuple_data(b"1", "u", b"f", None, None, None, None), 1) is None
    )  # unchanged TOAST
    assert rel.fast(b"\x00" + tuple_data(b"1", b"x"), 1) is None  # column count differs
    record, pk, omitted, _ = rel.fused(
        b"\x00" + tuple_data(b"1", "u", b"f", None, None, None, None), 1
    )
    assert omitted == ["t"] and "t" not in json.loads(record) and pk == ["1"]


def test_a_json_null_goes_to_the_generic_path_which_lists_it():
    """jsonb's JSON null and SQL NULL are both `null` in the record: the column is listed in
    `json_nulls` (the compiled and generated encoders leave such a tuple to the generic
    path), and SQL NULL is not."""
    rel = compiled()
    for text in (b"null", b"  null "):  # json keeps its text as written
        values = [b"1", b"x", b"t", b"2", text, None, None]
        buf = b"\x00" + tuple_data(*values)
        assert rel.fast(buf, 1) is None
        record, pk, omitted, json_nulls = rel.fused(buf, 1)
        assert pk == ["1"]
        assert json.loads(record)["j"] is None and json_nulls == ["j"] and omitted is None
        assert rel.record(values)[2] == ["j"]
    # SQL NULL, a JSON string and an object holding null are not the JSON null
    for value in (None, b'"null"', b'{"a": null}', b"[null]"):
        values = [b"1", b"x", b"t", b"2", value, None, None]
        assert rel.record(values)[2] is None
        assert rel.fast(b"\x00" + tuple_data(*values), 1) is not None
