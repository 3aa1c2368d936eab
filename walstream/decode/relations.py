"""A relation as pgoutput described it, and its compiled decoder of tuples into JSON."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring

from walstream.decode import pgoutput as po
from walstream.decode.types import TypeRegistry
from walstream.values.codecs import JSON
from walstream.values.rows import compile_tuple_encoder

_UNCHANGED = po.UNCHANGED_TOAST
_U32 = struct.Struct("!I").unpack_from
_I32 = struct.Struct("!i").unpack_from
_I16 = struct.Struct("!h").unpack_from


@dataclass(frozen=True, slots=True)
class RelationInfo:
    """A relation as pgoutput described it, plus the key walstream uses for `pk`."""

    oid: int
    schema: str
    table: str
    replica_identity: str
    columns: tuple[po.Column, ...]
    key_columns: tuple[str, ...]

    @classmethod
    def from_message(
        cls, rel: po.Relation, primary_key: Sequence[str] | None = None
    ) -> RelationInfo:
        names = {c.name for c in rel.columns}
        if primary_key and all(k in names for k in primary_key):
            key = tuple(primary_key)
        else:
            key = tuple(c.name for c in rel.columns if c.is_key)
        return cls(rel.oid, rel.schema, rel.name, rel.replica_identity, rel.columns, key)


class CompiledRelation:
    """Per-relation encoders: column JSON keys, value encoders, key positions."""

    __slots__ = (
        "encoders",
        "fast",
        "info",
        "json_set",
        "key_idx",
        "key_order",
        "key_set",
        "keys",
        "names",
    )

    def __init__(self, info: RelationInfo, types: TypeRegistry) -> None:
        self.info = info
        self.names = [c.name for c in info.columns]
        self.keys = [encode_basestring(c.name) + ":" for c in info.columns]
        self.encoders = [types.codec(c.type_oid).json for c in info.columns]
        pos = {n: i for i, n in enumerate(self.names)}
        self.key_idx = [pos[k] for k in info.key_columns]
        self.key_set = frozenset(self.key_idx)
        #: (JSON key, encoder, index in pk) of each key column, in column order
        self.key_order = [
            (self.keys[i], self.encoders[i], j)
            for i, j in sorted((i, j) for j, i in enumerate(self.key_idx))
        ]
        codecs = [types.codec(c.type_oid) for c in info.columns]
        #: json and jsonb columns: a value that is the JSON null is listed (`json_nulls`)
        self.json_set = frozenset(i for i, c in enumerate(codecs) if c is JSON)
        self.fast = compile_tuple_encoder(self.names, codecs, self.key_idx)

    def pk(self, values: po.TupleData, fallback: po.TupleData | None = None) -> list[str | None]:
        out: list[str | None] = []
        for i in self.key_idx:
            v = values[i] if i < len(values) else None
            if (v is None or v is _UNCHANGED) and fallback is not None and i < len(fallback):
                v = fallback[i]
            out.append(None if v is None or v is _UNCHANGED else v.decode("utf-8"))
        return out

    def fused(
        self, buf: bytes, pos: int
    ) -> tuple[str, list[str | None], list[str] | None, list[str] | None]:
        """Parse TupleData at `pos` and build (record JSON, pk, omitted columns, JSON-null
        columns) in one pass."""
        (ncols,) = _I16(buf, pos)
        pos += 2
        keys, encs, names = self.keys, self.encoders, self.names
        parts: list[str] = []
        append = parts.append
        omitted: list[str] | None = None
        nulls: list[str] | None = None
        key_vals: dict[int, bytes] = {}
        key_set, json_set = self.key_set, self.json_set
        for i in range(ncols):
            kind = buf[pos]
            if kind == 116:  # 't'
                (n,) = _I32(buf, pos + 1)
                v = buf[pos + 5 : pos + 5 + n]
                pos += 5 + n
                append(keys[i] + encs[i](v))
                if i in json_set and v.lstrip()[:1] == b"n":
                    nulls = [*(nulls or ()), names[i]]
                if i in key_set:
                    key_vals[i] = v
            elif kind == 110:  # 'n'
                pos += 1
                append(keys[i] + "null")
            elif kind == 117:  # 'u'
                pos += 1
                if omitted is None:
                    omitted = []
                omitted.append(names[i])
            else:
                raise IndexError(f"tuple column kind {kind}")  # slow path reports it
        pk: list[str | None] = [
            None if (kv := key_vals.get(i)) is None else kv.decode("utf-8") for i in self.key_idx
        ]
        return "{" + ",".join(parts) + "}", pk, omitted, nulls

    def keys_record(self, buf: bytes, pos: int) -> tuple[str, list[str | None]] | None:
        """A key-only old tuple (a delete under REPLICA IDENTITY DEFAULT) at `pos`: the
        JSON of its key columns and the pk, as `record(values, only_keys=True)` and `pk`
        make them from the parsed tuple; None for anything unusual (the full parser)."""
        fast = self.fast(buf, pos)  # compiled: the whole tuple, its other columns NULL
        if fast is None:
            return None
        pk = fast[1]
        return "{" + ",".join(
            [
                key + ("null" if (v := pk[j]) is None else enc(v.encode("utf-8")))
                for key, enc, j in self.key_order
            ]
        ) + "}", pk

    def record(
        self, values: po.TupleData, fill: po.TupleData | None = None, only_keys: bool = False
    ) -> tuple[str, list[str] | None, list[str] | None]:
        """(JSON object of the tuple, the unchanged TOAST columns left out and listed, the
        json/jsonb columns whose value is the JSON null); unchanged TOAST filled from `fill`."""
        parts = []
        omitted: list[str] | None = None
        nulls: list[str] | None = None
        keys, encs = self.keys, self.encoders
        key_set, json_set = self.key_set, self.json_set
        for i, v in enumerate(values):
            if only_keys and i not in key_set:
                continue
            if v is _UNCHANGED:
                v = fill[i] if fill is not None and i < len(fill) else _UNCHANGED
                if v is _UNCHANGED:
                    if omitted is None:
                        omitted = []
                    omitted.append(self.names[i])
                    continue
            if v is None:
                parts.append(keys[i] + "null")
                continue
            parts.append(keys[i] + encs[i](v))
            if i in json_set and v.lstrip()[:1] == b"n":
                nulls = [*(nulls or ()), self.names[i]]
        return "{" + ",".join(parts) + "}", omitted, nulls
