"""Postgres types as walstream decodes them: session settings, arrays, the type registry.

The codecs of the built-in scalar types are in `codecs.py`; here are the settings
every decoding connection uses, array parsing, and the registry that maps any type
OID (domains, enums, arrays of them) to a codec.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from walstream.decode.codecs import BUILTIN, BUILTIN_ARRAYS, TEXT, Codec

__all__ = [
    "BUILTIN",
    "BUILTIN_ARRAYS",
    "SESSION_SETTINGS",
    "TEXT",
    "Codec",
    "PgType",
    "TypeRegistry",
    "array_codec",
    "load_types",
    "parse_array",
    "session_options",
]

#: GUCs walstream sets on every connection whose text output it decodes.
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
}


def session_options() -> str:
    """The libpq `options` value that applies SESSION_SETTINGS at connect time."""
    return " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in SESSION_SETTINGS.items())


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


@dataclass(frozen=True, slots=True)
class PgType:
    """What pg_type says about a non-built-in type."""

    oid: int
    name: str
    typtype: str  # b base, c composite, d domain, e enum, r range, m multirange, p pseudo
    base_oid: int  # domains: the base type
    elem_oid: int  # arrays: the element type
    delimiter: str = ","


class TypeRegistry:
    """Codec lookup by type OID: built-ins, plus types loaded from the catalog.

    Unknown OIDs resolve to TEXT, so a new type never stops the stream.
    """

    def __init__(self, catalog: Iterable[PgType] = ()) -> None:
        self._catalog: dict[int, PgType] = {t.oid: t for t in catalog}
        self._cache: dict[int, Codec] = {}

    @property
    def catalog(self) -> Mapping[int, PgType]:
        return self._catalog

    def add(self, types: Iterable[PgType]) -> None:
        for t in types:
            self._catalog[t.oid] = t
        self._cache.clear()

    def known(self, oid: int) -> bool:
        return oid in BUILTIN or oid in BUILTIN_ARRAYS or oid in self._catalog

    def codec(self, oid: int) -> Codec:
        codec = self._cache.get(oid)
        if codec is None:
            codec = self._cache[oid] = self._resolve(oid, depth=0)
        return codec

    def _resolve(self, oid: int, depth: int) -> Codec:
        if depth > 16:
            return TEXT
        if oid in BUILTIN:
            return BUILTIN[oid]
        if oid in BUILTIN_ARRAYS:
            return array_codec(self._resolve(BUILTIN_ARRAYS[oid], depth + 1))
        t = self._catalog.get(oid)
        if t is None:
            return TEXT
        if t.typtype == "d" and t.base_oid:
            return self._resolve(t.base_oid, depth + 1)
        if t.elem_oid and t.typtype == "b":
            # A true array type (typcategory 'A' rows are loaded with their element).
            return array_codec(self._resolve(t.elem_oid, depth + 1), t.delimiter)
        return TEXT


TYPE_QUERY = """
SELECT t.oid::int8, t.typname, t.typtype, t.typbasetype::int8,
       CASE WHEN t.typcategory = 'A' THEN t.typelem::int8 ELSE 0 END,
       coalesce(e.typdelim, ',')
FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem
WHERE t.oid = ANY(%s)
"""


def load_types(conn: Any, oids: Iterable[int]) -> list[PgType]:
    """Look up user-defined types (and, transitively, their bases and elements).

    `conn` is a psycopg (3) or psycopg2 connection for ordinary queries.
    """
    found: dict[int, PgType] = {}
    todo = {o for o in oids if o not in BUILTIN and o not in BUILTIN_ARRAYS}
    while todo:
        cur = conn.cursor()
        cur.execute(TYPE_QUERY, (sorted(todo),))
        rows = cur.fetchall()
        todo = set()
        for oid, name, typtype, base, elem, delim in rows:
            typtype = typtype.decode() if isinstance(typtype, bytes) else typtype
            found[oid] = PgType(int(oid), name, typtype, int(base), int(elem), delim)
            for dep in (int(base), int(elem)):
                if dep and dep not in found and dep not in BUILTIN and dep not in BUILTIN_ARRAYS:
                    todo.add(dep)
    return list(found.values())
