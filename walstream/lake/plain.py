"""Arrow data other writers wrote, as walstream works on it: dictionary-encoded columns
decoded, and string and binary views (at any depth) as plain strings and binaries.

delta-rs 1.x reads both (and writes views into the files it rewrites), and pyarrow has no
`take` for views — which a filter, a dictionary's cast and picking rows by position are.
"""

from __future__ import annotations

from typing import Any


def plain_type(t: Any) -> Any:
    """`t` with its string and binary views, at any depth, as plain strings and binaries."""
    import pyarrow as pa

    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    return t


def plain(table: Any) -> Any:
    """`table` (a pyarrow Table) decoded and without views; itself when it has neither."""
    import pyarrow as pa

    def column(col: Any) -> Any:
        t = col.type
        if pa.types.is_dictionary(t):
            values = plain_type(t.value_type)
            return pa.chunked_array(
                [
                    pa.DictionaryArray.from_arrays(c.indices, c.dictionary.cast(values)).cast(
                        values
                    )
                    for c in col.chunks
                ],
                values,
            )
        flat = plain_type(t)
        return col if flat == t else col.cast(flat)

    if all(
        not pa.types.is_dictionary(f.type) and plain_type(f.type) == f.type for f in table.schema
    ):
        return table
    return pa.table([column(c) for c in table.columns], names=table.column_names)
