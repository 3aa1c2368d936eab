"""Cast Postgres text-format values to JSON-faithful values, by type OID.

Values arrive as the text output of each type's output function, produced in
the walsender with the session settings of `decode.types.SESSION_SETTINGS` (ISO dates, UTC,
ISO 8601 intervals, hex bytea, round-trip floats). Every codec has two faces:
`value(text)` gives the Python/JSON value, `json(raw_bytes)` gives the JSON text
of that value directly (the decoder's fast path, no intermediate objects). An array
type's codec is `array_codec` of its element's (`parse_array` reads the array text).

Mapping (docs/architecture.md §2): bool → true/false; integers → numbers; float4/8
→ numbers, NaN/±Infinity → the strings "NaN"/"Infinity"/"-Infinity"; numeric →
exact string; bytea → base64 string; json/jsonb → nested JSON; timestamptz →
ISO 8601 in UTC with `Z`; timestamp (no zone) → ISO 8601 without zone; date,
time → ISO 8601; timetz → ISO 8601 with `±HH:MM`; interval → ISO 8601
duration; arrays → JSON arrays (nested for several dimensions, null elements
kept); enums, composites and unknown types → their text; domains → their
base type. An unknown OID never fails: it is passed on as text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    value: Callable[[str], Any]
    json: Callable[[bytes], str]


def _json_via_value(value: Callable[[str], Any]) -> Callable[[bytes], str]:
    dumps = json.dumps

    def enc(raw: bytes) -> str:
        return dumps(value(raw.decode("utf-8")), ensure_ascii=False)

    return enc


def _text_json(raw: bytes) -> str:
    return encode_basestring(raw.decode("utf-8"))


def _ascii_json(raw: bytes) -> str:
    return raw.decode("ascii")


def _bool_value(s: str) -> bool:
    return s == "t"


def _bool_json(raw: bytes) -> str:
    return "true" if raw == b"t" else "false"


_NONFINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
_NONFINITE_B = {b"NaN": '"NaN"', b"Infinity": '"Infinity"', b"-Infinity": '"-Infinity"'}


def _float_value(s: str) -> float | str:
    special = _NONFINITE.get(s)
    return special if special is not None else float(s)


def _float_json(raw: bytes) -> str:
    special = _NONFINITE_B.get(raw)
    if special is not None:
        return special
    s = raw.decode("ascii")
    # Postgres prints exponents like "1e+100" and "1.5e-07": valid JSON numbers.
    return s


def _bytea_value(s: str) -> str:
    if s.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(s[2:])).decode("ascii")
    return base64.b64encode(_bytea_unescape(s)).decode("ascii")


def _bytea_unescape(s: str) -> bytes:
    """Decode bytea 'escape' output format (used when bytea_output=escape)."""
    out = bytearray()
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            if s[i + 1] == "\\":
                out.append(92)
                i += 2
            else:
                out.append(int(s[i + 1 : i + 4], 8))
                i += 4
        else:
            out.extend(c.encode("utf-8"))
            i += 1
    return bytes(out)


def _bytea_json(raw: bytes) -> str:
    if raw[:2] == b"\\x":
        return '"' + base64.b64encode(bytes.fromhex(raw[2:].decode("ascii"))).decode("ascii") + '"'
    return '"' + _bytea_value(raw.decode("utf-8")) + '"'


def _json_value(s: str) -> Any:
    return json.loads(s)


def _json_json(raw: bytes) -> str:
    # json/jsonb text output is already JSON; pass it through untouched.
    return raw.decode("utf-8")


def _bc_year(date_part: str) -> str:
    """'0044-03-15' of a BC date → astronomical year ISO 8601 ('-0043-03-15')."""
    year, rest = date_part.split("-", 1)
    astro = 1 - int(year)
    return (f"-{-astro:04d}" if astro < 0 else f"{astro:04d}") + "-" + rest


def _offset(off: str) -> str:
    """'+00' → 'Z'; '+05' → '+05:00'; '-03:30' stays; '+01:02:03' keeps seconds."""
    if off in ("+00", "+00:00", "-00"):
        return "Z"
    return off + ":00" if len(off) == 3 else off


def _split_offset(s: str) -> tuple[str, str]:
    """Split '12:00:00+05:30' into ('12:00:00', '+05:30')."""
    for i in range(len(s) - 1, 0, -1):
        if s[i] in "+-":
            return s[:i], s[i:]
    return s, ""


def _date_value(s: str) -> str:
    if s.endswith(" BC"):
        return _bc_year(s[:-3])
    return s  # ISO already, or 'infinity' / '-infinity'


def _timestamp_value(s: str) -> str:
    bc = s.endswith(" BC")
    if bc:
        s = s[:-3]
    if " " not in s:
        return s  # infinity / -infinity
    d, t = s.split(" ", 1)
    return (_bc_year(d) if bc else d) + "T" + t


def _timestamptz_value(s: str) -> str:
    bc = s.endswith(" BC")
    if bc:
        s = s[:-3]
    if " " not in s:
        return s
    d, t = s.split(" ", 1)
    t, off = _split_offset(t)
    return (_bc_year(d) if bc else d) + "T" + t + _offset(off)


def _timetz_value(s: str) -> str:
    t, off = _split_offset(s)
    return t + _offset(off)


def _str_value(s: str) -> str:
    return s


def _int_value(s: str) -> int:
    return int(s)


def _quoted(value: Callable[[str], str]) -> Callable[[bytes], str]:
    def enc(raw: bytes) -> str:
        return '"' + value(raw.decode("ascii")) + '"'

    return enc


def _timestamptz_json(raw: bytes) -> str:
    s = raw.decode("ascii")
    # Common case with TimeZone=UTC: "2024-01-02 03:04:05.678+00".
    if s[-3:] == "+00" and len(s) > 19 and s[10] == " " and s[4] == "-":
        return '"' + s[:10] + "T" + s[11:-3] + 'Z"'
    return '"' + _timestamptz_value(s) + '"'


def _numeric_json(raw: bytes) -> str:
    return '"' + raw.decode("ascii") + '"'


TEXT = Codec("text", _str_value, _text_json)
INT = Codec("int", _int_value, _ascii_json)
BOOL = Codec("bool", _bool_value, _bool_json)
FLOAT = Codec("float", _float_value, _float_json)
NUMERIC = Codec("numeric", _str_value, _numeric_json)
BYTEA = Codec("bytea", _bytea_value, _bytea_json)
JSON = Codec("json", _json_value, _json_json)
DATE = Codec("date", _date_value, _quoted(_date_value))
TIMESTAMP = Codec("timestamp", _timestamp_value, _quoted(_timestamp_value))
TIMESTAMPTZ = Codec("timestamptz", _timestamptz_value, _timestamptz_json)
TIMETZ = Codec("timetz", _timetz_value, _quoted(_timetz_value))

# Base type OIDs (pg_type.dat) and their codecs.
BUILTIN: dict[int, Codec] = {
    16: BOOL,
    17: BYTEA,
    18: TEXT,  # "char"
    19: TEXT,  # name
    20: INT,  # int8
    21: INT,  # int2
    23: INT,  # int4
    25: TEXT,
    26: INT,  # oid
    28: INT,  # xid
    114: JSON,
    142: TEXT,  # xml
    650: TEXT,  # cidr
    700: FLOAT,
    701: FLOAT,
    774: TEXT,  # macaddr8
    790: TEXT,  # money (locale-formatted)
    829: TEXT,  # macaddr
    869: TEXT,  # inet
    1042: TEXT,  # bpchar
    1043: TEXT,  # varchar
    1082: DATE,
    1083: TEXT,  # time: already ISO 8601
    1114: TIMESTAMP,
    1184: TIMESTAMPTZ,
    1186: TEXT,  # interval: ISO 8601 with IntervalStyle=iso_8601
    1266: TIMETZ,
    1560: TEXT,  # bit
    1562: TEXT,  # varbit
    1700: NUMERIC,
    2950: TEXT,  # uuid
    3220: TEXT,  # pg_lsn
    3802: JSON,  # jsonb
    4072: TEXT,  # jsonpath
}

# Array type OID → element type OID, for the built-in arrays.
BUILTIN_ARRAYS: dict[int, int] = {
    1000: 16,
    1001: 17,
    1002: 18,
    1003: 19,
    1016: 20,
    1005: 21,
    1007: 23,
    1009: 25,
    1028: 26,
    1011: 28,
    199: 114,
    143: 142,
    651: 650,
    1021: 700,
    1022: 701,
    775: 774,
    791: 790,
    1040: 829,
    1041: 869,
    1014: 1042,
    1015: 1043,
    1182: 1082,
    1183: 1083,
    1115: 1114,
    1185: 1184,
    1187: 1186,
    1270: 1266,
    1561: 1560,
    1563: 1562,
    1231: 1700,
    2951: 2950,
    3221: 3220,
    3807: 3802,
    4073: 4072,
}


def parse_array(text: str, delimiter: str = ",") -> list[Any]:
    """Parse Postgres array text output into nested lists of element texts (None for NULL).

    Handles quoting, backslash escapes, NULL elements, several dimensions and the
    `[lo:hi]=` bounds decoration printed when a lower bound is not 1.
    """
    pos = 0
    if text.startswith("["):
        pos = text.index("=") + 1
    if text[pos] != "{":
        raise ValueError(f"not an array literal: {text[:40]!r}")
    result, end = _parse_array_level(text, pos, delimiter)
    if text[end:].strip():
        raise ValueError(f"trailing characters after array: {text[end:][:40]!r}")
    return result


def _parse_array_level(s: str, pos: int, delim: str) -> tuple[list[Any], int]:
    assert s[pos] == "{"
    pos += 1
    items: list[Any] = []
    n = len(s)
    if s[pos] == "}":
        return items, pos + 1
    while pos < n:
        c = s[pos]
        if c == "{":
            sub, pos = _parse_array_level(s, pos, delim)
            items.append(sub)
        elif c == '"':
            pos += 1
            buf = []
            while s[pos] != '"':
                if s[pos] == "\\":
                    pos += 1
                buf.append(s[pos])
                pos += 1
            pos += 1
            items.append("".join(buf))
        else:
            start = pos
            while s[pos] != delim and s[pos] != "}":
                pos += 1
            token = s[start:pos].strip()
            items.append(None if token.upper() == "NULL" else token)
        if s[pos] == delim:
            pos += 1
        elif s[pos] == "}":
            return items, pos + 1
        else:
            raise ValueError(f"unexpected {s[pos]!r} at {pos} in array literal")
    raise ValueError("unterminated array literal")


def array_codec(element: Codec, delimiter: str = ",") -> Codec:
    ev = element.value

    def convert(items: list[Any]) -> list[Any]:
        return [None if x is None else convert(x) if isinstance(x, list) else ev(x) for x in items]

    def value(s: str) -> list[Any]:
        return convert(parse_array(s, delimiter))

    ej = element.json
    dumps = json.dumps
    sep = delimiter.encode()

    def to_json(raw: bytes) -> str:
        # Fast path: one dimension, default bounds, no quoted or escaped elements
        # (Postgres quotes empty strings, "NULL" text, blanks and delimiters).
        if raw[:1] == b"{" and raw[1:2] != b"{" and b'"' not in raw and b"\\" not in raw:
            inner = raw[1:-1]
            if not inner:
                return "[]"
            return "[" + ",".join("null" if x == b"NULL" else ej(x) for x in inner.split(sep)) + "]"
        return dumps(value(raw.decode("utf-8")), ensure_ascii=False)

    return Codec(f"{element.name}[]", value, to_json)
