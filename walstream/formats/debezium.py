"""The `debezium` format: Debezium's envelope, `{"before", "after", "source": {...}, "op",
"ts_ms"}`. Python, Spark SQL and Arrow make the same bytes."""

from __future__ import annotations

import time
from typing import Any

from walstream.change import ChangeRow
from walstream.formats.base import Formatter
from walstream.formats.text import each, json_string, sql_json_string, sql_lit

#: Debezium's `op` of each action.
DEBEZIUM_OP = {"insert": "c", "update": "u", "delete": "d", "read": "r", "truncate": "t"}
#: Debezium's marker on incremental-snapshot reads (a backfill's rows).
SNAPSHOT = ',"snapshot":"incremental"'


def python(*, sink: str, db: str) -> Formatter:
    db_json = json_string(db)

    def fmt(c: ChangeRow) -> str:
        if c.action == "delete":
            before, after = c.old or c.record or "null", "null"
        elif c.action == "update":
            before, after = c.old or "null", c.record or "null"
        else:
            before, after = "null", c.record or "null"
        return (
            f'{{"before":{before},"after":{after},"source":{{"connector":"walstream",'
            f'"name":{json_string(c.source)},"db":{db_json},"schema":{json_string(c.schema)},'
            f'"table":{json_string(c.table)},"lsn":{c.lsn},"txId":{"null" if c.xid is None else c.xid},'
            f'"ts_ms":{c.committed_at_us // 1000}{SNAPSHOT if c.backfill is not None else ""}}},'
            f'"op":"{DEBEZIUM_OP[c.action]}",'
            f'"ts_ms":{time.time_ns() // 1_000_000}}}'
        )

    return fmt


def sql(*, sink: str, db: str, backfill: bool) -> str:
    before = (
        "CASE action WHEN 'delete' THEN coalesce(old, record, 'null') "
        "WHEN 'update' THEN coalesce(old, 'null') ELSE 'null' END"
    )
    after = "CASE WHEN action = 'delete' THEN 'null' ELSE coalesce(record, 'null') END"
    op = (
        "CASE action " + " ".join(f"WHEN '{a}' THEN '{o}'" for a, o in DEBEZIUM_OP.items()) + " END"
    )
    snapshot = (
        f"CASE WHEN backfill IS NOT NULL THEN {sql_lit(SNAPSHOT)} ELSE '' END" if backfill else "''"
    )
    return (
        f"concat('{{\"before\":', {before}, ',\"after\":', {after}, "
        f'\',"source":{{"connector":"walstream","name":\', {sql_json_string("source")}, '
        f"',\"db\":', {sql_lit(json_string(db))}, ',\"schema\":', {sql_json_string('`schema`')}, "
        f"',\"table\":', {sql_json_string('`table`')}, ',\"lsn\":', lsn, "
        f"',\"txId\":', coalesce(CAST(xid AS STRING), 'null'), "
        f'\',"ts_ms":\', unix_millis(committed_at), {snapshot}, \'}},"op":"\', {op}, '
        f"'\",\"ts_ms\":', unix_millis(current_timestamp()), '}}')"
    )


def arrow(col: dict[str, Any], *, sink: str, db: str) -> Any:
    """Rows of a streaming batch (no backfill rows: their batches are made in SQL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    null = pa.scalar("null")
    at = col["committed_at"].cast(pa.int64())
    action, old = col["action"], col["old"]
    delete, update = pc.equal(action, "delete"), pc.equal(action, "update")
    before = pc.if_else(
        delete,
        pc.coalesce(old, col["record"], null),
        pc.if_else(update, pc.coalesce(old, null), null),
    )
    pieces = [
        '{"before":',
        before,
        ',"after":',
        pc.if_else(delete, null, pc.coalesce(col["record"], null)),
        ',"source":{"connector":"walstream","name":',
        each(col["source"], json_string),
        f',"db":{json_string(db)},"schema":',
        each(col["schema"], json_string),
        ',"table":',
        each(col["table"], json_string),
        ',"lsn":',
        col["lsn"].cast(pa.string()),
        ',"txId":',
        pc.coalesce(col["xid"].cast(pa.string()), null),
        ',"ts_ms":',
        each(at, lambda us: str(us // 1000)),
        '},"op":"',
        each(action, lambda a: DEBEZIUM_OP.get(a)),  # unknown: NULL, left to Python
        f'","ts_ms":{time.time_ns() // 1_000_000}}}',
    ]
    return pc.binary_join_element_wise(*pieces, "")
