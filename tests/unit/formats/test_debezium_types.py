"""The pure parts of Debezium's column values (the values themselves are checked against
Debezium 3.6 in tests/integration/test_debezium_types.py)."""

from __future__ import annotations

import pytest

from walstream.errors import ConfigError
from walstream.formats.debezium_types import Column, PgColumn, Settings, _hstore, object_spans


def test_settings_take_debeziums_names_and_refuse_a_value_naming_the_choices():
    s = Settings.of({"decimal.handling.mode": "string", "money.fraction.digits": "3"})
    assert (s.decimal_handling_mode, s.money_fraction_digits, s.time_precision_mode) == (
        "string", 3, "adaptive"
    )  # fmt: skip
    with pytest.raises(ConfigError) as err:
        Settings.of({"time.precision.mode": "nanos"})
    assert "time.precision.mode is 'nanos'" in str(err.value)
    assert "adaptive, adaptive_time_microseconds, connect" in err.value.fix


def test_object_spans_give_each_members_json_text_as_written():
    text = '{"a": {"b": [1, 2.50]}, "c" : "x\\"y", "d":null , "e":[ ]}'
    assert object_spans(text) == {"a": '{"b": [1, 2.50]}', "c": '"x\\"y"', "d": "null", "e": "[ ]"}
    assert object_spans("{}") == {} and object_spans(" { } ") == {}


def test_hstore_text_becomes_a_map_with_nulls_escapes_and_the_string_null():
    text = '"a"=>"1", "b"=>NULL, "c d"=>"x\\"y", "e"=>"", "f"=>"NULL", "g\\\\h"=>"\\\\"'
    assert _hstore(text) == {
        "a": "1", "b": None, "c d": 'x"y', "e": "", "f": "NULL", "g\\h": "\\"
    }  # fmt: skip
    assert _hstore("") == {}


def test_a_json_columns_null_is_jsons_not_sqls():
    col = Column(PgColumn("doc", "jsonb"))
    assert col.value(None, "null", json_null=True) == "null"
    assert col.value(None, "null") is None
    assert col.value({"a": 1}, '{"a": 1}') == '{"a": 1}'


def test_isostring_times_are_javas_iso_text_with_a_z() -> None:
    """`time.precision.mode=isostring` (checked against Debezium in test_debezium_types):
    the fraction's digits up to the last non-zero one, years past 9999 with '+', the
    infinities as Debezium's numbers of them."""
    from walstream.formats.debezium_types import Column, PgColumn, Settings

    iso = Settings.of({"time.precision.mode": "isostring"})

    def value(type_: str, v: str) -> str:
        return Column(PgColumn("c", type_), iso).value(v)

    assert value("date", "2024-02-29") == "2024-02-29Z"
    assert value("time", "13:14:15.120000") == "13:14:15.12Z"
    assert value("time", "00:00:00") == "00:00:00Z"
    assert value("timestamp", "1969-12-31T23:59:59.999999") == "1969-12-31T23:59:59.999999Z"
    assert value("timestamp", "infinity") == "+294247-01-10T04:00:25.2Z"
    assert value("timestamp", "-infinity") == "-290308-12-21T19:59:27.6Z"
    assert Column(PgColumn("c", "timestamptz"), iso).schema()["name"] == (
        "io.debezium.time.ZonedTimestamp"
    )  # with a zone: as in every mode


@pytest.mark.parametrize(
    ("value", "digits", "debezium"),
    [
        ("2024-01-02T01:04:05.678Z", 6, "2024-01-02T01:04:05.678000Z"),
        ("2024-01-02T01:04:05Z", 6, "2024-01-02T01:04:05.000000Z"),
        ("2024-01-02T01:04:05.678901Z", 3, "2024-01-02T01:04:05.678Z"),
        ("2024-01-02T01:04:05.678901Z", 0, "2024-01-02T01:04:05Z"),
        ("-0043-03-15T00:00:00Z", 6, "-0043-03-15T00:00:00.000000Z"),  # BC: the full parser
        ("infinity", 6, "infinity"),
    ],
)
def test_a_timestamptz_keeps_its_columns_digits(value: str, digits: int, debezium: str) -> None:
    from walstream.formats.debezium_types import Column, PgColumn

    typmod = -1 if digits == 6 else digits
    assert Column(PgColumn("c", "timestamptz", typmod)).value(value) == debezium
