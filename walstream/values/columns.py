"""Postgres values as the canonical JSON, a column at a time in Arrow (a backfill chunk's
`record` and `pk`): byte for byte what the decoder's codecs make of the same text,
without their ≈ 27 µs a row in Python.

Each column comes as its output text (bytea as base64). Kernels cover: int and json
as they are; bool `t` → `true`; numeric quoted; float quoted for NaN/±Infinity; text
and text-like types quoted when nothing needs escaping; date and timestamp quoted
with a `T`; timestamptz in UTC with `Z`; bytea's base64 quoted. Any other value (a
string to escape, a BC date, another offset, an array, a type without a kernel) goes
through its codec in Python, that value only. `tests/unit/values/test_columns.py`
checks the output equals the codecs'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any

from psycopg import sql

from walstream.values import codecs as t

#: Text that JSON must escape (what `encode_basestring` escapes).
_ESCAPE = r'["\\\x00-\x1f]'
_TIMESTAMPTZ_UTC = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00$"
_PLAIN_DATE = r"^\d{4}-\d\d-\d\d$"
_PLAIN_TIMESTAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?$"


#: Types whose binary form (what ADBC's binary COPY reader gets) is their output text,
#: byte for byte, padding of char(n) included: read as they are, they cost Postgres no
#: conversion (0.17-0.28 µs a row for a char(22) and a text column, docs/performance-log.md).
#: Not `"char"`: its binary form of '' is a NUL byte.
TEXT_AS_SENT_OIDS = {19: "name", 25: "text", 1042: "bpchar", 1043: "varchar"}
#: ...by their names.
TEXT_AS_SENT = frozenset(TEXT_AS_SENT_OIDS.values())


def output_text(col: sql.Composable) -> sql.Composed:
    """A column as its type's output text, what COPY and pgoutput send (`::text` is not:
    it gives `true` for `t`, trims `char(n)`, adds `/128` to an inet), NULL kept."""
    # concat, not format('%s', ...): a `%` would be a placeholder where params are bound
    return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE concat({0}) END").format(col)


def select_texts(
    names: Sequence[str], codecs: Sequence[t.Codec], oids: Sequence[int] = ()
) -> list[sql.Composable]:
    """The SELECT list that reads each column as the text its kernel takes: the type's
    output text (as COPY gives it), bytea as one-line base64; a column of a type in
    `TEXT_AS_SENT_OIDS` (`oids`: the columns' type OIDs) as it is."""
    out: list[sql.Composable] = []
    for i, (name, codec) in enumerate(zip(names, codecs, strict=True)):
        col = sql.Identifier(name)
        if i < len(oids) and oids[i] in TEXT_AS_SENT_OIDS:
            out.append(col)
            continue
        if codec is t.BYTEA:
            expr = sql.SQL("translate(encode({}, 'base64'), E'\\n', '')").format(col)
        else:
            expr = output_text(col)
        out.append(sql.SQL("{} AS {}").format(expr, col))
    return out


def _quoted(pc: Any, values: Any) -> Any:
    return pc.binary_join_element_wise('"', values, '"', "")


def _patch(values: Any, kernel_out: Any, ok: Any, slow: Callable[[str], str]) -> Any:
    """`kernel_out` where `ok`, else `slow(value)` (the codec, per value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ok = pc.fill_null(ok, True)
    if pc.all(ok).as_py():
        return kernel_out
    texts = values.to_pylist()
    mask = ok.to_pylist()
    done = kernel_out.to_pylist()
    return pa.array(
        [d if m or v is None else slow(v) for v, d, m in zip(texts, done, mask, strict=True)],
        pa.string(),
    )


def column_json(values: Any, codec: t.Codec) -> Any:
    """A column's values (Arrow strings, Postgres text) as their JSON text; NULL → null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = values.cast(pa.string())

    def slow(v: str) -> str:
        return codec.json(v.encode("utf-8"))

    if codec is t.INT or codec is t.JSON:
        out = values
    elif codec is t.BOOL:
        out = pc.if_else(pc.equal(values, "t"), "true", "false")
    elif codec is t.NUMERIC:
        out = _quoted(pc, values)
    elif codec is t.FLOAT:
        special = pc.is_in(values, pa.array(["NaN", "Infinity", "-Infinity"]))
        out = pc.if_else(special, _quoted(pc, values), values)
    elif codec is t.TEXT:
        out = _patch(
            values,
            _quoted(pc, values),
            pc.invert(pc.match_substring_regex(values, _ESCAPE)),
            encode_basestring,
        )
    elif codec is t.DATE:
        out = _patch(
            values, _quoted(pc, values), pc.match_substring_regex(values, _PLAIN_DATE), slow
        )
    elif codec is t.TIMESTAMP:
        iso = pc.replace_substring(values, " ", "T", max_replacements=1)
        out = _patch(
            values, _quoted(pc, iso), pc.match_substring_regex(values, _PLAIN_TIMESTAMP), slow
        )
    elif codec is t.TIMESTAMPTZ:
        iso = pc.replace_substring(
            pc.utf8_slice_codeunits(values, 0, -3), " ", "T", max_replacements=1
        )
        out = _patch(
            values,
            pc.binary_join_element_wise('"', iso, 'Z"', ""),
            pc.match_substring_regex(values, _TIMESTAMPTZ_UTC),
            slow,
        )
    elif codec is t.BYTEA:
        out = _quoted(pc, values)  # base64 from the SELECT
    else:
        out = _patch(values, values, pa.repeat(False, len(values)), slow)
    return pc.fill_null(out, "null")


def records(
    columns: Sequence[Any],
    names: Sequence[str],
    codecs: Sequence[t.Codec],
    key_idx: Sequence[int],
) -> tuple[Any, Any]:
    """(record JSON, pk) of a batch of rows: `columns` as Postgres text, one Arrow array
    each. The same strings `rows.compile_fields_encoder` makes row by row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(columns[0]) if columns else 0
    if not names:
        return pa.repeat(pa.scalar("{}"), n), pa.array([[]] * n, pa.list_(pa.string()))
    parts: list[Any] = []
    for i, (name, codec, values) in enumerate(zip(names, codecs, columns, strict=True)):
        parts.append(("{" if i == 0 else ",") + encode_basestring(name) + ":")
        parts.append(column_json(values, codec))
    parts.append("}")
    record = pc.binary_join_element_wise(*parts, "")
    keys = [columns[i].cast(pa.string()) for i in key_idx]
    offsets = pa.array(
        range(0, n * len(keys) + 1, len(keys)) if keys else [0] * (n + 1), pa.int32()
    )
    flat = _interleave(keys, n)
    return record, pa.ListArray.from_arrays(offsets, flat)


def json_nulls(columns: Sequence[Any], names: Sequence[str], codecs: Sequence[t.Codec]) -> Any:
    """Each row's json/jsonb columns whose value is the JSON null (its text `null`), as
    the decoder lists them in `ChangeRow.json_nulls` (NULL for a row with none): in
    `record` the JSON null reads `null`, like SQL NULL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(columns[0]) if columns else 0
    found = [
        (name, pc.fill_null(pc.equal(values, "null"), False))
        for name, codec, values in zip(names, codecs, columns, strict=True)
        if codec is t.JSON
    ]
    if not found:
        return pa.nulls(n, pa.list_(pa.string()))
    out: list[list[str] | None] = [None] * n
    for name, mask in found:
        for i in pc.indices_nonzero(mask).to_pylist():
            out[i] = [*(out[i] or []), name]
    return pa.array(out, pa.list_(pa.string()))


def _interleave(keys: list[Any], n: int) -> Any:
    """Key columns' values row by row (k0 of row 0, k1 of row 0, k0 of row 1, ...)."""
    import pyarrow as pa

    if not keys:
        return pa.array([], pa.string())
    if len(keys) == 1:
        return keys[0]
    import pyarrow.compute as pc

    width = len(keys)
    order = pa.array([r * width + j for j in range(width) for r in range(n)], pa.int64())
    stacked = pa.concat_arrays(keys)
    return pc.take(stacked, pc.sort_indices(order))
