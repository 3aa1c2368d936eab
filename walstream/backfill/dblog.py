"""The DBLog rule, in one place: which of a backfill chunk's rows the stream overrides.

A chunk is read between its low and high watermark (its window) and joins the stream
at the high watermark's place, so a row is dropped when the window holds a newer
version of it: every row when the window holds a truncate of its table, else a row
whose key a change there has (its `pk`, or an update's old key when it moved).

Keys compare as the change row carries them (`pk`, the key columns' text), made one
string alike by `key_of` (Python), `KEY_SQL` (Spark SQL) and `key_text` (Arrow): each
part length-prefixed (`3:abc`, NULL `~`), joined by U+001F, so no two keys share one.

Executors: `drop_sql` (staged change rows in Spark, `merge.py`; moved keys from the
JSON of `old` and `record`), `dropped` (a staged batch delivered straight from its
file, `pipeline/reads.py`; a window where a key moved goes through Spark instead),
`keep_typed` (a table sink's typed rows, `lake/typed.py`: the file holds typed
columns, so the window's keys are typed alike and compared column by column).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from walstream.engine.sql import quote

#: Between a key's parts (U+001F, the unit separator).
SEP = "\x1f"
#: A NULL part (a length prefix never starts with it).
NULL = "~"


def key_sql(parts: str = "pk") -> str:
    """Spark SQL of an array of text (`pk`, or any array expression) as one string, as
    `key_of` makes it."""
    return (
        f"concat_ws('\\u001f', transform({parts}, x -> CASE WHEN x IS NULL THEN '~' "
        "ELSE concat(CAST(char_length(x) AS STRING), ':', x) END))"
    )


#: `pk` as one string.
KEY_SQL = key_sql()


def key_of(pk: Sequence[str | None]) -> str:
    """A key (its parts' text) as one string."""
    return SEP.join(NULL if v is None else f"{len(v)}:{v}" for v in pk)


def key_text(pk: Any) -> Any:
    """An Arrow list<string> column of keys as strings, as `key_of` makes them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pk = pk.combine_chunks() if isinstance(pk, pa.ChunkedArray) else pk
    values = pk.values
    lengths = pc.cast(pc.utf8_length(values), pa.string())
    parts = pc.fill_null(pc.binary_join_element_wise(lengths, values, ":"), NULL)
    return pc.binary_join(pa.ListArray.from_arrays(pk.offsets, parts), SEP)


def dropped(pk: Any, changed: Any) -> Any | None:
    """A mask of the rows (`pk`, list<string>) whose key is in `changed` (their window's
    keys, strings made by `key_of`); None when nothing is dropped."""
    import pyarrow.compute as pc

    if not len(changed):
        return None
    return pc.is_in(key_text(pk), value_set=changed)


def drop_sql(
    rows: Any,
    inside: Any,
    small: Callable[[Any], Any],
    moved_key: Callable[[str], str] | None,
    changed: bool,
    cut: bool,
) -> Any:
    """`rows` (staged change rows with `backfill`, `chunk`, `pk`, `record`) without those
    the stream overrides. `inside`: each change inside a chunk's window, with the chunk
    (`backfill`, `chunk`). `small`: how to ship a side of the join (broadcast when the
    windows are small). `moved_key(col)`: SQL of a row's key from JSON column `col`
    (None: no key moved in a window). `changed`/`cut`: a window holds a change of a key
    / a truncate (else that join is left out)."""
    from pyspark.sql import functions as F

    def same_chunk(*more: Any) -> Any:
        cond = (F.col("backfill") == F.col("_b")) & (F.col("chunk") == F.col("_c"))
        for c in more:
            cond = cond & c
        return cond

    if changed:
        keys = small(
            inside.where("action <> 'truncate'")
            .selectExpr("backfill AS _b", "chunk AS _c", f"{KEY_SQL} AS _k")
            .distinct()
        )
        rows = rows.selectExpr("*", f"{KEY_SQL} AS _s")
        rows = rows.join(keys, same_chunk(F.col("_s") == F.col("_k")), "left_anti").drop("_s")
    if cut:
        truncated = small(
            inside.where("action = 'truncate'")
            .selectExpr("backfill AS _b", "chunk AS _c")
            .distinct()
        )
        rows = rows.join(truncated, same_chunk(), "left_anti")
    if moved_key is not None:
        moved = small(
            inside.where("old IS NOT NULL")
            .selectExpr("backfill AS _b", "chunk AS _c", f"{moved_key('old')} AS _o")
            .distinct()
        )
        rows = rows.selectExpr("*", f"{moved_key('record')} AS _r")
        rows = rows.join(moved, same_chunk(F.col("_r") == F.col("_o")), "left_anti").drop("_r")
    return rows


def moved_key(tables: Sequence[tuple[str, str, Sequence[str]]]) -> Callable[[str], str]:
    """`moved_key(col)` of `drop_sql`, for rows of `tables` (schema, table, key columns)
    beside their chunk's `_schema` and `_table`: the key read from JSON column `col`."""

    def project(col: str) -> str:
        cases = []
        for schema, table, keys in tables:
            parts = ", ".join(f"get_json_object({col}, {quote(json_path(k))})" for k in keys)
            cases.append(
                f"WHEN `_schema` = {quote(schema)} AND `_table` = {quote(table)} "
                f"THEN {key_sql(f'array({parts})')}"
            )
        return f"CASE {' '.join(cases)} END"

    return project


def json_path(column: str) -> str:
    """A JSON path for get_json_object naming a column (any characters)."""
    return "$['" + column.replace("\\", "\\\\").replace("'", "\\'") + "']"


def keep_typed(data: Any, gone: Any | None, key: list[str]) -> Any:
    """Typed rows (`data`, with `_ord`) without those whose key columns are in `gone` (a
    table of the window's keys, typed as `data` is), in their order."""
    import pyarrow.compute as pc

    if gone is None:
        return data
    # joined on the key alone: Arrow joins no list columns
    kept = data.select([*key, "_ord"]).join(gone, keys=key, join_type="left anti")
    return data.take(pc.take(kept["_ord"], pc.sort_indices(kept["_ord"])))
