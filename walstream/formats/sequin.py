"""The `sequin` format: `{"record", "changes", "action", "metadata": {...}}` as Sequin
sends it. Python, Spark SQL and Arrow make the same bytes; only a sequin update with
old values has its `changes` made in Python (it compares JSON objects)."""

from __future__ import annotations

import json
from typing import Any

from walstream.change import ChangeRow, change_key
from walstream.formats.base import Formatter
from walstream.formats.keys import sql_idempotency_key
from walstream.formats.text import (
    SQL_TIMESTAMP,
    each,
    iso_timestamp,
    json_string,
    sql_json_string,
    sql_lit,
)


def changed_values(record: str | None, old: str | None) -> str:
    """Sequin's `changes`: old values of the columns whose value changed, as JSON text.

    `null` when Postgres sent no old values (REPLICA IDENTITY DEFAULT): what changed
    is then unknown, and an empty object would claim that nothing did.
    """
    if record is None or old is None:
        return "null"
    new, before = json.loads(record), json.loads(old)
    return json.dumps(
        {k: v for k, v in before.items() if k in new and new[k] != v},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def python(*, sink: str, db: str) -> Formatter:
    sink_json = json_string(sink)

    def fmt(c: ChangeRow) -> str:
        changes = changed_values(c.record, c.old) if c.action == "update" else "null"
        return (
            f'{{"record":{c.record or "null"},"changes":{changes},"action":"{c.action}",'
            f'"metadata":{{"table_schema":{json_string(c.schema)},"table_name":{json_string(c.table)},'
            f'"commit_timestamp":"{iso_timestamp(c.committed_at_us)}","commit_lsn":{c.lsn},'
            f'"commit_idx":{c.seq},"idempotency_key":"{change_key(c)}",'
            f'"transaction_annotations":{c.annotations or "null"},'
            f'"sink":{{"name":{sink_json}}},"source":{{"name":{json_string(c.source)}}}}}}}'
        )

    return fmt


def sql(*, sink: str, db: str, backfill: bool) -> str:
    """NULL for an update with old values (its `changes`: Python)."""
    record = "coalesce(record, 'null')"
    changes = "CASE WHEN action <> 'update' OR record IS NULL OR old IS NULL THEN 'null' END"
    return (
        f"concat('{{\"record\":', {record}, ',\"changes\":', {changes}, "
        f'\',"action":"\', action, \'","metadata":{{"table_schema":\', '
        f"{sql_json_string('`schema`')}, ',\"table_name\":', {sql_json_string('`table`')}, "
        f'\',"commit_timestamp":"\', {SQL_TIMESTAMP}, \'","commit_lsn":\', lsn, '
        f'\',"commit_idx":\', seq, \',"idempotency_key":"\', {sql_idempotency_key(backfill)}, '
        f"'\",\"transaction_annotations\":', coalesce(annotations, 'null'), "
        f'\',"sink":{{"name":\', {sql_lit(json_string(sink))}, \'}},"source":{{"name":\', '
        f"{sql_json_string('source')}, '}}}}}}')"
    )


def arrow(col: dict[str, Any], *, sink: str, db: str) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    null = pa.scalar("null")
    at = col["committed_at"].cast(pa.int64())
    pieces = [
        '{"record":',
        pc.coalesce(col["record"], null),
        ',"changes":',
        _changes(col, null),
        ',"action":"',
        col["action"],
        '","metadata":{"table_schema":',
        each(col["schema"], json_string),
        ',"table_name":',
        each(col["table"], json_string),
        ',"commit_timestamp":"',
        each(at, iso_timestamp),
        '","commit_lsn":',
        col["lsn"].cast(pa.string()),
        ',"commit_idx":',
        col["seq"].cast(pa.string()),
        ',"idempotency_key":"',
        col["_ikey"],
        '","transaction_annotations":',
        pc.coalesce(col["annotations"], null),
        f',"sink":{{"name":{json_string(sink)}}},"source":{{"name":',
        each(col["source"], json_string),
        "}}}",
    ]
    return pc.binary_join_element_wise(*pieces, "")


def _changes(col: dict[str, Any], null: Any) -> Any:
    """`changes`: `null`, but for updates with old values what `changed_values` makes."""
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
