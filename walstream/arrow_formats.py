"""The message formats over Arrow columns: a batch's messages in a few Arrow kernels.

`formats.py` formats one change row in Python. In a streaming batch, the delivery
worker formats its Arrow batch of change columns here instead, and the JVM only hands
the columns over (building the message in Spark SQL cost the JVM more than this costs
the worker: docs/performance-log.md, "2026-11-27, night"). Values that repeat across a batch
(names, commit times, actions) are formatted once per distinct value by the Python
functions of `formats.py` themselves; the per-row values (`record`, `old`, LSN, seq,
idempotency key) are joined in with one Arrow kernel per piece. The bytes are those of
`formats.py` (tests/unit/test_arrow_formats.py). A sequin update with old values (its
`changes` compares JSON objects) gets its `changes` from `formats.changed_values`,
row by row, for those rows only.

A row the formatter cannot make (an action a format does not know) gets a NULL
message, and delivery formats that batch in Python, as it does where SQL cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from walstream.formats import DEBEZIUM_OP, changed_values, iso_timestamp, json_string

#: The formats this module makes (the mirror's is made in Python).
ARROW_FORMATS = ("sequin", "debezium", "record")


def batch_messages(fmt: str, batch: Any, *, sink: str, db: str) -> Any:
    """Each row's message in format `fmt` as a string array, for a RecordBatch of change
    columns with `_ikey` (its idempotency keys). Rows with a `backfill` are not
    expected here: their batches are formatted by Spark SQL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = dict(zip(batch.schema.names, batch.columns, strict=True))
    null = pa.scalar("null")
    record = pc.coalesce(col["record"], null)
    if fmt == "record":
        return record
    at = col["committed_at"].cast(pa.int64())
    if fmt == "sequin":
        pieces = [
            '{"record":', record, ',"changes":', _changes(col, null), ',"action":"',
            col["action"], '","metadata":{"table_schema":', _each(col["schema"], json_string),
            ',"table_name":', _each(col["table"], json_string), ',"commit_timestamp":"',
            _each(at, iso_timestamp), '","commit_lsn":', col["lsn"].cast(pa.string()),
            ',"commit_idx":', col["seq"].cast(pa.string()), ',"idempotency_key":"',
            col["_ikey"], '","transaction_annotations":', pc.coalesce(col["annotations"], null),
            f',"sink":{{"name":{json_string(sink)}}},"source":{{"name":', _each(col["source"], json_string),
            "}}}",
        ]  # fmt: skip
    elif fmt == "debezium":
        action, old = col["action"], col["old"]
        delete, update = pc.equal(action, "delete"), pc.equal(action, "update")
        before = pc.if_else(
            delete, pc.coalesce(old, col["record"], null),
            pc.if_else(update, pc.coalesce(old, null), null),
        )  # fmt: skip
        pieces = [
            '{"before":', before, ',"after":', pc.if_else(delete, null, record),
            ',"source":{"connector":"walstream","name":', _each(col["source"], json_string),
            f',"db":{json_string(db)},"schema":', _each(col["schema"], json_string), ',"table":',
            _each(col["table"], json_string), ',"lsn":', col["lsn"].cast(pa.string()), ',"txId":',
            pc.coalesce(col["xid"].cast(pa.string()), null), ',"ts_ms":',
            _each(at, lambda us: str(us // 1000)), '},"op":"',
            _each(action, lambda a: DEBEZIUM_OP.get(a)),  # unknown: NULL, left to Python
            f'","ts_ms":{time.time_ns() // 1_000_000}}}',
        ]  # fmt: skip
    else:
        raise ValueError(f"format {fmt!r} is not made in Arrow; choose one of {ARROW_FORMATS}")
    return pc.binary_join_element_wise(*pieces, "")


def _each(values: Any, fn: Callable[[Any], str | None]) -> Any:
    """`fn` of each value, computed once per distinct value (NULL stays NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    distinct = pc.unique(values)
    made = pa.array([None if v is None else fn(v) for v in distinct.to_pylist()], pa.string())
    return pc.take(made, pc.index_in(values, value_set=distinct))


def _changes(col: dict[str, Any], null: Any) -> Any:
    """Sequin's `changes`: `null`, but for updates with old values what
    `formats.changed_values` makes of each."""
    import pyarrow as pa
    import pyarrow.compute as pc

    record, old = col["record"], col["old"]
    n = len(record)
    if old.null_count == n:  # no old values at all (REPLICA IDENTITY DEFAULT): the usual
        return pa.repeat(null, n)
    mask = pc.and_(pc.equal(col["action"], "update"), pc.and_(record.is_valid(), old.is_valid()))
    rows = pc.indices_nonzero(mask)
    made = [
        changed_values(r, o)
        for r, o in zip(record.take(rows).to_pylist(), old.take(rows).to_pylist(), strict=True)
    ]
    return pc.replace_with_mask(pa.repeat(null, n), mask, pa.array(made, pa.string()))
