from __future__ import annotations

import json

import pytest

from walstream.decode.types import BUILTIN, TEXT, PgType, TypeRegistry
from walstream.values.codecs import parse_array


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", []),
        ("{1,2,3}", ["1", "2", "3"]),
        ('{NULL,null,"NULL"}', [None, None, "NULL"]),
        ('{"a\\"b","c\\\\d","e,f"}', ['a"b', "c\\d", "e,f"]),
        ("{{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
        ("{{{1}},{{2}}}", [[["1"]], [["2"]]]),
        ("[0:1]={5,6}", ["5", "6"]),
        ("[1:1][2:3]={{a,b}}", [["a", "b"]]),
        ('{"",x}', ["", "x"]),
    ],
)
def test_parse_array(text, expected):
    assert parse_array(text) == expected


def test_parse_array_with_other_delimiter():
    assert parse_array("{(1,1),(0,0);(2,2),(1,1)}", ";") == ["(1,1),(0,0)", "(2,2),(1,1)"]


@pytest.mark.parametrize("bad", ["1,2", "{1,2", "{1,2}x"])
def test_parse_array_rejects_garbage(bad):
    with pytest.raises((ValueError, IndexError)):
        parse_array(bad)


def test_unknown_oid_is_text_and_domains_resolve():
    reg = TypeRegistry(
        [PgType(90001, "posint", "d", 23, 0), PgType(90002, "_posint", "b", 0, 90001)]
    )
    assert reg.codec(424242) is TEXT
    assert reg.codec(90001).value("5") == 5
    assert reg.codec(90002).value("{1,NULL}") == [1, None]
    assert reg.known(90001) and not reg.known(424242)


@pytest.mark.parametrize(
    ("oid", "raw", "expected"),
    [
        (16, b"t", True),
        (20, b"-5", -5),
        (700, b"NaN", "NaN"),
        (701, b"1e+100", 1e100),
        (1700, b"-0.000", "-0.000"),
        (17, b"\\x", ""),
        (1184, b"2024-06-01 10:00:00+05:30", "2024-06-01T10:00:00+05:30"),
        (1184, b"0099-01-01 00:00:00+00 BC", "-0098-01-01T00:00:00Z"),
        (1114, b"infinity", "infinity"),
        (1266, b"10:00:00+01:02:03", "10:00:00+01:02:03"),
        (25, 'ünïcödé "q" \\'.encode(), 'ünïcödé "q" \\'),
    ],
)
def test_json_fast_path_equals_value_path(oid, raw, expected):
    codec = BUILTIN[oid]
    assert json.loads(codec.json(raw)) == expected
    assert codec.value(raw.decode()) == expected


def test_bytea_escape_format():
    assert BUILTIN[17].value("a\\000\\\\b") == "YQBcYg=="  # b"a\x00\\b"
