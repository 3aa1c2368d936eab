"""The compiled tuple encoder (`_tuples.pyx`) builds exactly what the Python one builds,
for every codec and for the values that tend to break hand-written JSON."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest

from tests.unit.decode.test_pgoutput import tuple_data
from walstream.decode.types import TypeRegistry
from walstream.values import codecs as c
from walstream.values import rows as row_encoders
from walstream.values.codecs import array_codec

if os.environ.get("CI") == "true":  # CI's setup installs gcc: the build must be there
    from walstream.values import _tuples
else:
    _tuples = pytest.importorskip(
        "walstream.values._tuples",
        reason="the compiled decoder is not built (bin/setup builds it; it needs gcc)",
    )

REGISTRY = TypeRegistry()
#: One column per codec kind the compiled encoder knows, and two it hands to Python.
CODECS = {
    "int": c.INT, "text": c.TEXT, "bool": c.BOOL, "numeric": c.NUMERIC, "json": c.JSON,
    "float": c.FLOAT, "ts": c.TIMESTAMPTZ, "date": c.DATE, "bytea": c.BYTEA,
    "tags": array_codec(c.TEXT), "interval": REGISTRY.codec(1186), "timestamp": c.TIMESTAMP,
}  # fmt: skip
# fmt: off
VALUES: dict[str, list[bytes]] = {
    "int": [b"0", b"-9223372036854775808", b"42"],
    "text": [
        b"", b"plain", 'é "quoted" \\ back'.encode(), b"\n\r\t\x08\x0c", b"\x01\x1f\x7f",
        "emoji 🦆 and 中文".encode(), b"x" * 5000, b"</script>",
        bytes(range(1, 32)),  # every control character Postgres text can hold
    ],
    "bool": [b"t", b"f"],
    "numeric": [b"1.50", b"-0.0001", b"NaN", b"123456789012345678901234567890.5"],
    "json": [b'{"k": [1, null, "\\u00e9"]}', b"[]", '"é"'.encode(), b"3"],
    "float": [b"1.5", b"1e+100", b"-1.5e-07", b"NaN", b"Infinity", b"-Infinity"],
    "ts": [
        b"2024-01-02 03:04:05+00", b"2024-01-02 03:04:05.123456+00", b"2024-01-02 03:04:05+05:30",
        b"0044-03-15 10:00:00+00 BC", b"infinity", b"-infinity",
    ],
    "date": [b"2024-02-29", b"0044-03-15 BC", b"infinity"],
    "bytea": [b"\\x00ff10", b"\\x"],
    "tags": [b'{a,"b c",NULL}', b"{}", b'{"\\"q\\""}'],
    "interval": [b"P1Y2M3DT4H5M6S"],
    "timestamp": [b"2024-01-02 03:04:05.5", b"infinity"],
}
# fmt: on
NAMES = [*CODECS, 'we"ird\nname', "ключ"]


def encoders(names, codecs, key_idx):
    compiled = row_encoders.compile_tuple_encoder(names, codecs, key_idx)
    assert isinstance(compiled, _tuples.TupleEncoder), "the compiled encoder was not chosen"
    return compiled, row_encoders.python_tuple_encoder(names, codecs, key_idx)


def rows() -> list[list[bytes | None]]:
    """Every value of every column at least once, each row with every column."""
    longest = max(len(v) for v in VALUES.values())
    out: list[list[bytes | None]] = []
    for r in range(longest):
        row: list[bytes | None] = [vals[r % len(vals)] for vals in VALUES.values()]
        out.append([*row, f"k{r}".encode(), "значение".encode()])
    out.append([None] * len(NAMES))
    return out


def test_the_compiled_encoder_builds_what_the_python_encoder_builds():
    codecs = [*CODECS.values(), c.TEXT, c.TEXT]
    key_idx = [0, NAMES.index('we"ird\nname'), NAMES.index("text")]
    compiled, python = encoders(NAMES, codecs, key_idx)
    for row in rows():
        buf = b"Ixxxx" + tuple_data(*row)
        got = compiled(buf, 5)
        assert got == python(buf, 5), row
        assert got is not None
        record = json.loads(got[0])
        assert list(record) == NAMES
        assert got[1] == [None if row[i] is None else row[i].decode() for i in key_idx]  # type: ignore[union-attr]


def test_many_columns_and_long_values_take_the_heap_path():
    names = [f"c{i}" for i in range(300)]  # more columns than the stack's arrays hold
    codecs = [c.TEXT if i % 2 else c.INT for i in range(300)]
    compiled, python = encoders(names, codecs, [299, 0])
    row = [(b"v" * 100 + b'"' * 50) if i % 2 else str(i).encode() for i in range(300)]
    buf = tuple_data(*row)
    got = compiled(buf, 0)
    assert got is not None and got == python(buf, 0)
    assert len(got[0]) > 30_000 and got[1] == [row[299].decode(), "0"]


def test_a_relation_without_columns():
    compiled, python = encoders([], [], [])
    assert compiled(b"\x00\x00", 0) == python(b"\x00\x00", 0) == ("{}", [])


def rejected(encoder, buf: bytes, pos: int = 0) -> bool:
    """The encoder hands the tuple on: None, or an error the decoder takes as 'use the
    full parser' (the Python encoder raises where the compiled one answers None)."""
    try:
        return encoder(buf, pos) is None
    except (IndexError, struct.error, UnicodeDecodeError):
        return True


@pytest.mark.parametrize(
    ("why", "buf"),
    [
        ("unchanged TOAST", tuple_data(b"1", "u")),
        ("a binary column", b"\x00\x02t\x00\x00\x00\x011b\x00\x00\x00\x01x"),
        ("fewer columns than the relation", tuple_data(b"1")),
        ("more columns than the relation", tuple_data(b"1", b"a", b"b")),
        ("a value cut short", tuple_data(b"1", b"abcdef")[:-2]),
        ("a length past the end", b"\x00\x02t\x7f\xff\xff\xff1"),
        ("a negative length", b"\x00\x02t\xff\xff\xff\xff1"),
        ("the message ends before a column", tuple_data(b"1", b"a")[:8]),
        ("no column count", b"\x00"),
        ("text that is not UTF-8", tuple_data(b"1", b"\xff\xfe")),
        ("a key that is not UTF-8", tuple_data(b"\xc3", b"a")),
        ("an integer that is not ASCII", tuple_data("١".encode(), b"a")),
    ],
)
def test_unusual_tuples_go_to_the_full_parser(why, buf):
    names, codecs = ["id", "name"], [c.TEXT if why == "a key that is not UTF-8" else c.INT, c.TEXT]
    compiled, python = encoders(names, codecs, [0])
    assert rejected(python, buf), why
    assert compiled(buf, 0) is None, why


def test_a_codec_that_raises_raises_through_the_compiled_encoder():
    def broken(raw: bytes) -> str:
        raise ValueError(f"cannot encode {raw!r}")

    codec = c.Codec("broken", str, broken)
    compiled = row_encoders.compile_tuple_encoder(["x"], [codec], [])
    with pytest.raises(ValueError, match="cannot encode b'v'"):
        compiled(tuple_data(b"v"), 0)


def test_pure_python_can_be_asked_for(monkeypatch):
    monkeypatch.setenv("WALSTREAM_PURE_PYTHON", "1")
    assert row_encoders.compiled_module() is None
    monkeypatch.delenv("WALSTREAM_PURE_PYTHON")
    assert row_encoders.compiled_module() is _tuples


def test_a_build_older_than_its_source_is_not_used(monkeypatch, caplog):
    real = row_encoders.os.path.getmtime

    def newer_source(path):  # the source edited after any build: an hour from now
        return time.time() + 3600 if str(path).endswith(".pyx") else real(path)

    monkeypatch.setattr(row_encoders.os.path, "getmtime", newer_source)
    assert row_encoders.compiled_module() is None
    assert "Rebuild it with bin/setup" in caplog.text
