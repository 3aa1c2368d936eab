"""A message's keys, each in every rendering: its idempotency key, its message key and
its group key.

- idempotency key: `base64("lsn:seq")`, or a backfill row's `base64("read:<id>:<pk
  JSON>")` — Python `change.change_key` (the change row's identity), Spark SQL
  `sql_idempotency_key`, Arrow `idempotency_keys` (a staged chunk's rows);
- message key (the default; a sink may compute its own): the key values joined by `,`
  — SQL `MESSAGE_KEY_SQL`, Arrow `message_keys`;
- group key (the default: one group per row of a table) — SQL `GROUP_KEY_SQL`, Arrow
  `group_keys`.
"""

from __future__ import annotations

from binascii import b2a_base64
from typing import Any

from walstream.formats.text import SQL_CONTROL

#: The default message key: `concat_ws(',', pk)` (NULL values are left out).
MESSAGE_KEY_SQL = "concat_ws(',', pk)"
#: The default group key: schema, table and message key, joined by U+001F.
GROUP_KEY_SQL = f"concat_ws('\u001f', `schema`, `table`, {MESSAGE_KEY_SQL})"


def sql_idempotency_key(backfill: bool) -> str:
    """`change_key` in SQL: `base64("lsn:seq")`, or for backfill rows (when the frame has
    the `backfill` column) `base64("read:<id>:<pk JSON>")`; NULL where Python must."""
    # CAST AS BINARY is the string's UTF-8 bytes, as encode(.., 'UTF-8') gives, without
    # the charset encoder encode() makes for every row.
    cursor = "base64(CAST(concat(lsn, ':', seq) AS BINARY))"
    if not backfill:
        return cursor
    # Spark's base64 breaks lines every 76 characters; Python's b2a_base64 does not.
    read = (
        "CASE WHEN concat_ws('', pk) RLIKE " + SQL_CONTROL + " THEN NULL ELSE "
        "regexp_replace(base64(CAST(concat('read:', backfill, ':', to_json(pk)) AS BINARY)), "
        "'[\\\\r\\\\n]', '') END"
    )
    return f"CASE WHEN backfill IS NULL THEN {cursor} ELSE {read} END"


def pk_json(pk: Any) -> Any:
    """Each row's pk (a list of strings) as `json.dumps(pk, ensure_ascii=False,
    separators=(",", ":"))` writes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from walstream.values import codecs as t
    from walstream.values.columns import column_json

    pk = pk.combine_chunks() if isinstance(pk, pa.ChunkedArray) else pk
    flat = column_json(pk.values, t.TEXT)  # the offsets index the unsliced values
    items = pa.ListArray.from_arrays(pk.offsets, flat)
    return pc.binary_join_element_wise("[", pc.binary_join(items, ","), "]", "")


def idempotency_keys(backfill: int, pk: Any) -> Any:
    """`read_idempotency_key(backfill, pk)` of each row."""
    import pyarrow as pa

    prefix = f"read:{backfill}:"
    return pa.array(
        [
            b2a_base64((prefix + j).encode(), newline=False).decode("ascii")
            for j in pk_json(pk).to_pylist()
        ],
        pa.string(),
    )


def message_keys(pk: Any) -> Any:
    """`MESSAGE_KEY_SQL` of each row (NULL values are left out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pk = pk.combine_chunks() if isinstance(pk, pa.ChunkedArray) else pk
    if not pk.flatten().null_count:
        return pc.binary_join(pk, ",")
    return pa.array([",".join(v for v in p if v is not None) for p in pk.to_pylist()])


def group_keys(schema: str, table: str, pk: Any) -> Any:
    """`GROUP_KEY_SQL` of each row of one table."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(f"{schema}\x1f{table}\x1f", message_keys(pk), "")
