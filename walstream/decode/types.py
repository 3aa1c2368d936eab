"""Postgres types as walstream decodes them: session settings and the type registry.

The codecs (built-in scalar types, and arrays of any element) are in `values/codecs.py`;
here are the settings every decoding connection uses and the registry that maps any
type OID (domains, enums, arrays of them) to a codec.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from walstream.values.codecs import BUILTIN, BUILTIN_ARRAYS, TEXT, Codec, array_codec

__all__ = [
    "BUILTIN",
    "BUILTIN_ARRAYS",
    "SESSION_SETTINGS",
    "TEXT",
    "Codec",
    "PgType",
    "TypeRegistry",
    "load_types",
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
