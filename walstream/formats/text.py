"""The text pieces every format writes, in each rendering: JSON strings, commit times,
Spark SQL literals, and Arrow's once-per-distinct-value step."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4096)  # the changes of a transaction share their commit time
def iso_timestamp(us: int) -> str:
    """Microseconds since the Unix epoch as ISO 8601 UTC with microseconds: `...T01:02:03.000004Z`."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=4096)  # schema, table and source names repeat on every message
def json_string(value: str) -> str:
    """`value` as a JSON string (non-ASCII characters kept as they are)."""
    return json.dumps(value, ensure_ascii=False)


# -- Spark SQL ---------------------------------------------------------------------------------
#: `iso_timestamp` of `committed_at`.
SQL_TIMESTAMP = "date_format(committed_at, \"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\")"

#: The control characters whose escapes differ (`\u000b` in Python, `\u000B` in Java);
#: the others are written alike (`\n`, `\t`, `\u0001`, ...). A value holding one is
#: left to Python (the SQL is NULL).
SQL_CONTROL = "'[\\\\x0b\\\\x0e\\\\x0f\\\\x1a-\\\\x1f]'"


def sql_lit(s: str) -> str:
    """A Spark SQL string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: What a JSON string escapes (`"`, `\\`, control characters): a name without any is
#: written between quotes as it is, without serialising JSON per row.
_ESCAPED = sql_lit(r'["\\\x00-\x1f]')


def sql_json_string(col: str) -> str:
    """A string column as a JSON string, as `json_string` writes it (NULL: left to Python)."""
    return (
        f"CASE WHEN NOT {col} RLIKE {_ESCAPED} THEN concat('\"', {col}, '\"') "
        f"WHEN {col} RLIKE {SQL_CONTROL} THEN NULL "
        f"ELSE substr(to_json(array({col})), 2, length(to_json(array({col}))) - 2) END"
    )


# -- Arrow -------------------------------------------------------------------------------------
def each(values: Any, fn: Callable[[Any], str | None]) -> Any:
    """`fn` of each value, computed once per distinct value (NULL stays NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    distinct = pc.unique(values)
    made = pa.array([None if v is None else fn(v) for v in distinct.to_pylist()], pa.string())
    return pc.take(made, pc.index_in(values, value_set=distinct))
