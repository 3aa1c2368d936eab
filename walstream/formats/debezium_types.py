"""Debezium's PostgreSQL connector's JSON for one column: its value and its Kafka Connect
schema, made from the value as the change row's `record` holds it and the column's
Postgres type (`load_columns`), under the Debezium properties that shape values
(`Settings`: Debezium's names and defaults).

The reference (Python) maker of `format: debezium`'s column values (issue 48).
`tests/integration/test_debezium_types.py` runs Debezium 3.6 itself on the same WAL and
compares every column, value and schema; the mapping and the deliberate differences are
in docs/from-debezium.md. A column Debezium does not send has no schema here
(`Column.schema` is None), and the message leaves it out as Debezium's does.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from walstream.errors import ConfigError

#: Microseconds in Debezium's month (365.25 / 12 days) and day.
_MONTH_US = 2_629_800_000_000
_DAY_US = 86_400_000_000
#: Days from 0001-01-01 (proleptic Gregorian day 1) to 1970-01-01.
_EPOCH_ORDINAL = 719_163


@dataclass(frozen=True)
class Settings:
    """The Debezium connector properties that shape a column's value (Debezium's defaults)."""

    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    time_precision_mode: Literal[
        "adaptive", "adaptive_time_microseconds", "connect", "isostring"
    ] = "adaptive"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    interval_handling_mode: Literal["numeric", "string"] = "numeric"
    hstore_handling_mode: Literal["json", "map"] = "json"
    money_fraction_digits: int = 2

    @classmethod
    def of(cls, props: dict[str, Any]) -> Settings:
        """From Debezium's property names (`decimal.handling.mode`, ...); an unknown value
        is a ConfigError naming the property and the values it takes."""
        allowed = {
            "decimal.handling.mode": ("precise", "double", "string"),
            "time.precision.mode": (
                "adaptive",
                "adaptive_time_microseconds",
                "connect",
                "isostring",
            ),
            "binary.handling.mode": ("bytes", "base64", "base64-url-safe", "hex"),
            "interval.handling.mode": ("numeric", "string"),
            "hstore.handling.mode": ("json", "map"),
        }
        kw: dict[str, Any] = {}
        for prop, values in allowed.items():
            if prop in props:
                value = str(props[prop])
                if value not in values:
                    raise ConfigError(
                        f"debezium: {prop} is {value!r}",
                        f"use one of {', '.join(values)} (Debezium's values)",
                    )
                kw[prop.replace(".", "_")] = value
        if "money.fraction.digits" in props:
            kw["money_fraction_digits"] = int(props["money.fraction.digits"])
        return cls(**kw)


@dataclass(frozen=True)
class PgColumn:
    """A column as the catalog describes it: its type's name (a domain's base type; an
    array's element type, with `array`), its typmod, its enum labels, NOT NULL."""

    name: str
    type: str
    typmod: int = -1
    array: bool = False
    labels: tuple[str, ...] = ()
    not_null: bool = False
    domain_array: bool = False  # an array of a domain: Debezium sends no such column
    category: str = ""  # pg_type.typcategory of the element (C composite, G geometric, ...)


#: Types Debezium sends as text.
_TEXT = frozenset(
    [
        "text",
        "varchar",
        "bpchar",
        "char",
        "xml",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "int4range",
        "int8range",
        "numrange",
        "tsrange",
        "tstzrange",
        "daterange",
        "citext",
        "ltree",
        "jsonpath",
        "pg_lsn",
    ]
)
_INTS = {"int2": "int16", "int4": "int32", "int8": "int64", "oid": "int64"}


class Column:
    """One column's Debezium schema and value maker."""

    def __init__(self, col: PgColumn, settings: Settings = Settings()) -> None:
        self.col = col
        self.settings = settings
        self._element: tuple[dict[str, Any], Any] | None
        if col.array:  # by its element, made as a column of the element's type
            scalar = PgColumn(col.name, col.type, col.typmod, labels=col.labels)
            self._element = Column(scalar, settings)._element
            unsendable = col.domain_array or col.type == "interval" or col.category in ("G", "C")
        else:
            self._element = self._scalar()
            unsendable = False
        self._unsupported = unsendable or self._element is None

    # -- schema ---------------------------------------------------------------------------
    def schema(self) -> dict[str, Any] | None:
        """The field's Kafka Connect schema (`field` named), or None: Debezium leaves the
        column out of its messages."""
        if self._unsupported:
            return None
        assert self._element is not None
        schema, _ = self._element
        if self.col.array:
            items = {**schema, "optional": not self.col.labels}
            out = {"type": "array", "items": items, "optional": not self.col.not_null}
        else:
            out = {**schema, "optional": not self.col.not_null}
        return {**out, "field": self.col.name}

    @property
    def as_is(self) -> bool:
        """Debezium's value is the record's value itself (integers, booleans, text ...)."""
        return not self.col.array and self._element is not None and self._element[1] is _same

    @property
    def needs_text(self) -> bool:
        """The value is made from its JSON text in the record (json, jsonb: `value`'s `raw`)."""
        return self.col.type in ("json", "jsonb")

    # -- value ----------------------------------------------------------------------------
    def value(self, v: Any, raw: str | None = None, json_null: bool = False) -> Any:
        """Debezium's value of `v` (the record's JSON value of the column; `raw`: its JSON
        text there, which json and jsonb columns are sent as; `json_null`: a json column's
        `null` is JSON's null, not SQL's — the change row's `json_nulls`)."""
        if json_null:
            return "null"
        if v is None:
            return None
        assert self._element is not None, f"{self.col.name}: a column Debezium does not send"
        _, make = self._element
        if self.col.array:
            if raw is not None and self.col.type in ("json", "jsonb"):
                return [None if s == "null" else s for s in _array_spans(raw)]
            if any(isinstance(x, list) for x in v):
                return [None] * len(v)  # a multi-dimensional array: Debezium's rows are nulls
            return [None if x is None else make(x, None) for x in v]
        return make(v, raw)

    # -- the types ------------------------------------------------------------------------
    def _scalar(self) -> tuple[dict[str, Any], Any] | None:
        """(schema without `optional`/`field`, value maker) of the column's scalar type."""
        t, mod, s = self.col.type, self.col.typmod, self.settings
        if self.col.labels:
            return (
                _named("string", "io.debezium.data.Enum", {"allowed": ",".join(self.col.labels)}),
                _same,
            )
        if t == "bool":
            return {"type": "boolean"}, _same
        if t in _INTS:
            return {"type": _INTS[t]}, _same
        if t == "float4":
            return {"type": "float"}, _same
        if t == "float8":
            return {"type": "double"}, _same
        if t in ("numeric", "money"):
            return self._decimal()
        if t in _TEXT:
            return {"type": "string"}, _same
        if t == "name":
            return {"type": "string"}, _same  # Debezium 3.6 sends null (DIFFERENCES)
        if t == "bytea":
            return self._binary()
        if t == "uuid":
            return _named("string", "io.debezium.data.Uuid"), _same
        if t in ("json", "jsonb"):
            return _named("string", "io.debezium.data.Json"), _json_text
        if t == "tsvector":
            return _named("string", "io.debezium.data.Tsvector"), _same
        if s.time_precision_mode == "isostring" and t in _ISO:
            return _named("string", _ISO[t][0]), _ISO[t][1]
        if t == "date":
            name = "org.apache.kafka.connect.data.Date" if _connect(s) else "io.debezium.time.Date"
            return _named("int32", name), lambda v, _: _days(v)
        if t == "time":
            names = ("org.apache.kafka.connect.data.Time", "io.debezium.time.Time")
            micro = "io.debezium.time.MicroTime"
            return self._clocked(mod, _time_us, "int32", (*names, micro), time_of_day=True)
        if t == "timetz":
            return _named("string", "io.debezium.time.ZonedTime"), lambda v, _: _timetz(v)
        if t == "timestamp":
            names = ("org.apache.kafka.connect.data.Timestamp", "io.debezium.time.Timestamp")
            micro = "io.debezium.time.MicroTimestamp"
            return self._clocked(mod, _timestamp_us, "int64", (*names, micro))
        if t == "timestamptz":
            digits = 6 if mod < 0 else mod
            return (
                _named("string", "io.debezium.time.ZonedTimestamp"),
                lambda v, _: _timestamptz(v, digits),
            )
        if t == "interval":
            if s.interval_handling_mode == "string":
                return _named("string", "io.debezium.time.Interval"), lambda v, _: _interval_text(v)
            return _named("int64", "io.debezium.time.MicroDuration"), lambda v, _: _interval(v)
        if t in ("bit", "varbit"):
            if t == "bit" and mod == 1:
                return {"type": "boolean"}, lambda v, _: v == "1"
            length = str(mod) if mod > 0 else str(2**31 - 1)
            return (
                _named("bytes", "io.debezium.data.Bits", {"length": length}),
                lambda v, _: _bits(v),
            )
        if t == "point":
            return _POINT_SCHEMA, lambda v, _: _point(v)
        if t == "hstore":
            if s.hstore_handling_mode == "map":
                return _HSTORE_MAP, lambda v, _: _hstore(v)
            return _named("string", "io.debezium.data.Json"), lambda v, _: json.dumps(
                _hstore(v), ensure_ascii=False, separators=(",", ":")
            )
        return None

    def _decimal(self) -> tuple[dict[str, Any], Any]:
        t, mod, s = self.col.type, self.col.typmod, self.settings
        if t == "money":
            scale, precision = s.money_fraction_digits, None
        elif mod >= 4:
            precision, scale = ((mod - 4) >> 16) & 0xFFFF, (mod - 4) & 0xFFFF
        else:
            precision = scale = None
        if s.decimal_handling_mode == "string":
            return {"type": "string"}, lambda v, _: _decimal_text(v, t == "money")
        if s.decimal_handling_mode == "double":
            return {"type": "double"}, lambda v, _: _decimal_double(v, t == "money")
        if scale is None:
            return _VARIABLE_SCALE, lambda v, _: _variable_scale(v)
        params = {"scale": str(scale)}
        if precision is not None:
            params["connect.decimal.precision"] = str(precision)
        schema = {**_named("bytes", "org.apache.kafka.connect.data.Decimal", params)}
        return schema, lambda v, _: _fixed_scale(v, scale, t == "money")

    def _binary(self) -> tuple[dict[str, Any], Any]:
        mode = self.settings.binary_handling_mode
        if mode == "bytes":
            return {"type": "bytes"}, _same  # the record's base64 is JsonConverter's bytes
        if mode == "base64":
            return {"type": "string"}, _same
        if mode == "base64-url-safe":
            return {"type": "string"}, lambda v, _: v.replace("+", "-").replace("/", "_")
        return {"type": "string"}, lambda v, _: base64.b64decode(v).hex()

    def _clocked(
        self,
        mod: int,
        micros: Any,
        millis_type: str,
        names: tuple[str, ...],
        time_of_day: bool = False,
    ) -> Any:
        """`time` or `timestamp` by `time.precision.mode`: `names` are the schema names of
        connect's, adaptive's milliseconds and the microseconds; `micros(v)` the value.
        adaptive_time_microseconds is adaptive but for `time` (`time_of_day`): always µs."""
        connect, millis, micro = names
        mode = self.settings.time_precision_mode
        if mode == "adaptive_time_microseconds" and not time_of_day:
            mode = "adaptive"
        if mode == "connect" or (mode == "adaptive" and 0 <= mod <= 3):
            name = connect if mode == "connect" else millis
            return _named(millis_type, name), lambda v, _: micros(v) // 1000
        return _named("int64", micro), lambda v, _: micros(v)


def _named(type_: str, name: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "name": name, "version": 1}
    if params:
        out["parameters"] = params
    return out


def _connect(s: Settings) -> bool:
    return s.time_precision_mode == "connect"


def _same(v: Any, _raw: str | None) -> Any:
    return v


def fields(spec: str) -> list[dict[str, Any]]:
    """A struct's field schemas from "type name, type name?, ..." (`?`: optional)."""
    out = []
    for part in spec.split(","):
        type_, name = part.split()
        out.append({"type": type_, "optional": name.endswith("?"), "field": name.rstrip("?")})
    return out


_VARIABLE_SCALE = {
    "type": "struct",
    "fields": fields("int32 scale, bytes value"),
    "name": "io.debezium.data.VariableScaleDecimal",
    "version": 1,
    "doc": "Variable scaled decimal",
}
_POINT_SCHEMA = {
    "type": "struct",
    "fields": fields("double x, double y, bytes wkb?, int32 srid?"),
    "name": "io.debezium.data.geometry.Point",
    "version": 1,
    "doc": "Geometry (POINT)",
}


_HSTORE_MAP = {
    "type": "map",
    "keys": {"type": "string", "optional": False},
    "values": {"type": "string", "optional": True},
}


# -- values -----------------------------------------------------------------------------------
def _unscaled_b64(n: int) -> str:
    """Java's `BigInteger.toByteArray` of n (big-endian two's complement, fewest bytes), base64."""
    return base64.b64encode(n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True)).decode()


def _money(v: str) -> Decimal:
    """'$1,234.50' / '-$12.50' (lc_monetary C) → Decimal."""
    return Decimal(re.sub(r"[^0-9.\-]", "", v))


def _decimal_of(v: Any, money: bool) -> Decimal | None:
    try:
        d = _money(v) if money else Decimal(str(v))
    except InvalidOperation:
        return None
    return None if not d.is_finite() else d


def _unscaled(d: Decimal, scale: int) -> int:
    """d * 10**scale, exactly (Decimal arithmetic would round past 28 digits)."""
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    n = int("".join(map(str, digits)) or "0")
    shift = scale + exp
    n = n * 10**shift if shift >= 0 else n // 10**-shift
    return -n if sign else n


def _fixed_scale(v: Any, scale: int, money: bool) -> str | None:
    d = _decimal_of(v, money)
    if d is None:
        return None  # NaN: Debezium's precise mode has no value for it
    return _unscaled_b64(_unscaled(d, scale))


def _variable_scale(v: Any) -> dict[str, Any] | None:
    d = _decimal_of(v, False)
    if d is None:
        return None
    exp = d.as_tuple().exponent
    scale = -exp if isinstance(exp, int) and exp < 0 else 0
    return {"scale": scale, "value": _unscaled_b64(_unscaled(d, scale))}


def _decimal_text(v: Any, money: bool) -> str:
    if str(v) == "NaN":
        return "NAN"
    return str(_money(v)) if money else str(v)


def _decimal_double(v: Any, money: bool) -> Any:
    if str(v) in ("NaN", "Infinity", "-Infinity"):
        return str(v)
    return float(_money(v)) if money else float(v)


def _json_text(v: Any, raw: str | None) -> str:
    """A json/jsonb value as Postgres' text: the record holds that text as is (`raw`)."""
    return raw if raw is not None else json.dumps(v, ensure_ascii=False, separators=(", ", ": "))


def _ordinal(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, any year (astronomical: 0 is 1 BC)."""
    y = year - (month <= 2)
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _days(v: str) -> int:
    if v in ("infinity", "-infinity"):
        # Postgres' ±infinity is ±2^31-1 days from 2000-01-01; Debezium adds 10,957 days in
        # 32 bits (an overflow it leaves in the value)
        pg = 2**31 - 1 if v == "infinity" else -(2**31)
        return _int32(pg + 10_957)
    m = re.fullmatch(r"(-?\d{4,})-(\d\d)-(\d\d)", v)
    assert m, f"not a date: {v!r}"
    return _ordinal(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day count from 1970-01-01, proleptic Gregorian, any year
    (Howard Hinnant's `civil_from_days`)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, doy - (153 * mp + 2) // 5 + 1


def _iso_date(days: int) -> str:
    """Java's ISO_LOCAL_DATE of a day count: four digits at least, '+' past 9999."""
    year, month, day = _civil(days)
    text = f"+{year}" if year > 9999 else f"{year:04d}" if year >= 0 else f"-{-year:04d}"
    return f"{text}-{month:02d}-{day:02d}"


def _iso_clock(us: int) -> str:
    """Java's ISO_LOCAL_TIME of microseconds of a day: the fraction's digits up to the last
    that is not zero, none when it is zero."""
    hours, rest = divmod(us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    fraction = f"{micros:06d}".rstrip("0")
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}" + (f".{fraction}" if fraction else "")


def _iso_timestamp(us: int) -> str:
    days, clock = divmod(us, 86_400_000_000)
    return f"{_iso_date(days)}T{_iso_clock(clock)}"


#: `time.precision.mode` isostring: (schema name, value maker) of these types: the
#: adaptive mode's number as ISO-8601 text with a 'Z' (Debezium's, infinities included).
_ISO: dict[str, tuple[str, Any]] = {
    "date": ("io.debezium.time.IsoDate", lambda v, _: _iso_date(_days(v)) + "Z"),
    "time": ("io.debezium.time.IsoTime", lambda v, _: _iso_clock(_time_us(v)) + "Z"),
    "timestamp": (
        "io.debezium.time.IsoTimestamp",
        lambda v, _: _iso_timestamp(_timestamp_us(v)) + "Z",
    ),
}


def _int32(n: int) -> int:
    return (n + 2**31) % 2**32 - 2**31


def _time_us(v: str) -> int:
    h, m, rest = v.split(":")
    sec, _, frac = rest.partition(".")
    return ((int(h) * 60 + int(m)) * 60 + int(sec)) * 1_000_000 + int((frac + "000000")[:6])


def _timetz(v: str) -> str:
    m = re.fullmatch(r"(\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d)(?::(\d\d))?(?::(\d\d))?", v)
    assert m, f"not a timetz: {v!r}"
    sign = -1 if m.group(2)[0] == "-" else 1
    offset = sign * (abs(int(m.group(2))) * 3600 + int(m.group(3) or 0) * 60 + int(m.group(4) or 0))
    us = (_time_us(m.group(1)) - offset * 1_000_000) % _DAY_US
    return _clock(us) + "Z"


def _clock(us: int) -> str:
    """HH:MM:SS and the fraction without its trailing zeros, as Debezium prints a time."""
    secs, frac = divmod(us, 1_000_000)
    out = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    if frac:
        out += "." + f"{frac:06d}".rstrip("0")
    return out


_TS = re.compile(r"(-?\d{4,})-(\d\d)-(\d\d)T(\d\d:\d\d:\d\d(?:\.\d+)?)(Z?)")


def _timestamp_us(v: str) -> int:
    if v == "infinity":
        return 9_223_372_036_825_200_000  # as Debezium 3.6 sends Postgres' infinity
    if v == "-infinity":
        return -9_223_372_036_832_400_000
    m = _TS.fullmatch(v)
    assert m, f"not a timestamp: {v!r}"
    days = _ordinal(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return days * _DAY_US + _time_us(m.group(4))


def _timestamptz(v: str, digits: int) -> str:
    if v in ("infinity", "-infinity"):
        return v
    if len(v) >= 20 and v[10] == "T" and v[19] in ".Z" and v[-1] == "Z" and v[:4].isdigit():
        # the common case, a year of four digits: the fraction padded or cut to `digits`
        frac = v[20:-1] if v[19] == "." else ""
        return v[:19] + ("." + (frac + "0" * digits)[:digits] if digits else "") + "Z"
    m = _TS.fullmatch(v)
    assert m, f"not a timestamptz: {v!r}"
    clock, _, frac = m.group(4).partition(".")
    year = int(m.group(1))
    date = f"{year:04d}" if year >= 0 else f"-{-year:04d}"
    out = f"{date}-{m.group(2)}-{m.group(3)}T{clock}"
    if digits:
        out += "." + (frac + "0" * digits)[:digits]
    return out + "Z"


_ISO_PART = re.compile(r"(-?\d+(?:\.\d+)?)([YMDHS])")


def _interval(v: str) -> int:
    """ISO 8601 (IntervalStyle iso_8601, as the record holds it) → Debezium's microseconds."""
    date, _, clock = v.removeprefix("P").partition("T")
    us = Decimal(0)
    for num, unit in _ISO_PART.findall(date):
        n = Decimal(num)
        us += n * {"Y": 12 * _MONTH_US, "M": _MONTH_US, "D": _DAY_US}[unit]
    for num, unit in _ISO_PART.findall(clock):
        n = Decimal(num)
        us += n * {"H": 3_600_000_000, "M": 60_000_000, "S": 1_000_000}[unit]
    return int(us)


def _interval_text(v: str) -> str:
    """ISO 8601 as Postgres writes it ('PT-1H-30M') → Debezium's form, every part written
    ('P0Y0M0DT-1H-30M0S')."""
    date, _, clock = v.removeprefix("P").partition("T")
    parts = {u: Decimal(0) for u in "YMDHmS"}
    for num, unit in _ISO_PART.findall(date):
        parts[unit] = Decimal(num)
    for num, unit in _ISO_PART.findall(clock):
        parts["m" if unit == "M" else unit] = Decimal(num)
    sec = format(parts["S"], "f")
    if "." in sec:
        sec = sec.rstrip("0").rstrip(".")
    y, mo, d, h, mi = (int(parts[u]) for u in "YMDHm")
    return f"P{y}Y{mo}M{d}DT{h}H{mi}M{sec}S"


_HSTORE_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"\s*=>\s*(?:NULL|"((?:[^"\\]|\\.)*)")')
_ESCAPED = re.compile(r"\\(.)")


def _hstore(v: str) -> dict[str, str | None]:
    """hstore's output text (`"a"=>"1", "b"=>NULL`) as a map."""
    out: dict[str, str | None] = {}
    for m in _HSTORE_PAIR.finditer(v):
        value = m.group(2)
        null = value is None and m.group(0).rstrip().endswith("NULL")
        out[_ESCAPED.sub(r"\1", m.group(1))] = None if null else _ESCAPED.sub(r"\1", value or "")
    return out


def _bits(v: str) -> str:
    """A bit string ('1010', most significant first) as Java's `BitSet.toByteArray` (little
    endian), base64."""
    n = int(v, 2) if v else 0
    size = max(1, (n.bit_length() + 7) // 8)
    return base64.b64encode(n.to_bytes(size, "little")).decode()


def _point(v: str) -> dict[str, Any]:
    x, y = (float(p) for p in v.strip("()").split(","))
    wkb = struct.pack("<BIdd", 1, 1, x, y)  # little endian, type 1 (Point)
    return {"x": x, "y": y, "wkb": base64.b64encode(wkb).decode(), "srid": None}


# -- raw JSON -------------------------------------------------------------------------------
_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def object_spans(text: str) -> dict[str, str]:
    """Each member's value in a JSON object as its JSON text there (key → raw text): a
    json or jsonb column is sent as Postgres' text, which the record holds as is."""
    out: dict[str, str] = {}
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i] != "{":
        raise ValueError("not a JSON object")
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i] == "}":
        return out
    while True:
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]  # past ':'
        _, end = _DECODER.raw_decode(text, i)
        out[key] = text[i:end]
        i = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text[i] == "}":
            return out
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]  # past ','


def _array_spans(text: str) -> list[str]:
    """Each element of a JSON array as its JSON text."""
    out: list[str] = []
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i] == "]":
        return out
    while True:
        _, end = _DECODER.raw_decode(text, i)
        out.append(text[i:end])
        i = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text[i] == "]":
            return out
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]


# -- the catalog ------------------------------------------------------------------------------
_COLUMNS = """
SELECT a.attname, a.atttypmod, a.attnotnull,
       t.typname, t.typtype, t.typcategory, t.oid,
       bt.typname, bt.typtype, bt.typcategory, bt.oid,
       et.typname, et.typtype, et.typcategory, et.oid, ebt.typname
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON bt.oid = t.typbasetype
LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
LEFT JOIN pg_type ebt ON ebt.oid = et.typbasetype
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def load_columns(conn: Any, table_oid: int) -> list[PgColumn]:
    """The table's columns as `Column` needs them (a psycopg connection; the table's OID):
    a domain as its base type, an array by its element type."""
    out = []
    for row in conn.execute(_COLUMNS, (table_oid,)).fetchall():
        name, typmod, not_null = row[0], int(row[1]), bool(row[2])
        own, base, element, element_base = row[3:7], row[7:11], row[11:15], row[15]
        domain_array = False
        if element[0] is not None:  # an array: by its element
            type_, kind, category, oid = element
            if kind == "d":
                domain_array, type_ = True, element_base
        elif own[1] == "d":  # a domain: its base type
            type_, kind, category, oid = base
        else:
            type_, kind, category, oid = own
        labels: tuple[str, ...] = ()
        if kind == "e":
            found = conn.execute(
                "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder",
                (oid,),
            ).fetchall()
            labels = tuple(str(r[0]) for r in found)
        out.append(
            PgColumn(
                name,
                str(type_),
                typmod,
                array=element[0] is not None,
                labels=labels,
                not_null=not_null,
                domain_array=domain_array,
                category="C" if kind == "c" else str(category),
            )
        )
    return out


_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def load_key(conn: Any, table_oid: int) -> list[str]:
    """The table's primary key columns (Debezium's record key; none without one: a
    replica identity index is not Debezium's key)."""
    return [str(r[0]) for r in conn.execute(_PRIMARY_KEY, (table_oid,)).fetchall()]
