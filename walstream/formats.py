"""Message formats: how a change row becomes the bytes a sink sends (sequin, debezium, record).

`record`, `old` and `annotations` arrive as JSON text from the decoder; they are
spliced into the message as they are, never parsed and re-encoded, except for
the `changes` of a sequin update, which compares old and new values.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from walstream.change import ChangeRow, change_key

FORMATS = ("sequin", "debezium", "record")
#: Debezium's `op` of each action.
DEBEZIUM_OP = {"insert": "c", "update": "u", "delete": "d", "read": "r", "truncate": "t"}
_SNAPSHOT = ',"snapshot":"incremental"'  # Debezium's marker on incremental-snapshot reads
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Formatter = Callable[[ChangeRow], str]


@functools.lru_cache(maxsize=4096)  # the changes of a transaction share their commit time
def iso_timestamp(us: int) -> str:
    """Microseconds since the Unix epoch as ISO 8601 UTC with microseconds: `...T01:02:03.000004Z`."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=4096)  # schema, table and source names repeat on every message
def json_string(value: str) -> str:
    """`value` as a JSON string (non-ASCII characters kept as they are)."""
    return json.dumps(value, ensure_ascii=False)


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


def sequin(sink: str) -> Formatter:
    """`{"record", "changes", "action", "metadata": {...}}` as Sequin sends it."""
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


def debezium(db: str) -> Formatter:
    """Debezium's envelope: `{"before", "after", "source": {...}, "op", "ts_ms"}`."""
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
            f'"ts_ms":{c.committed_at_us // 1000}{_SNAPSHOT if c.backfill is not None else ""}}},'
            f'"op":"{DEBEZIUM_OP[c.action]}",'
            f'"ts_ms":{time.time_ns() // 1_000_000}}}'
        )

    return fmt


def record(c: ChangeRow) -> str:
    """The row only: after the change, or what is known of it before a delete."""
    return c.record or "null"


def mirror(c: ChangeRow) -> str:
    """What the Postgres mirror sink needs of a change: the row, the old key or row (a
    changed key), which unchanged TOAST values were not sent, the source table's OID, and
    which json/jsonb values are the JSON null (`json_nulls`, only when there are some)."""
    toast = json.dumps(c.unchanged_toast) if c.unchanged_toast else "null"
    oid = c.table_oid if c.table_oid is not None else "null"
    nulls = f',"json_nulls":{json.dumps(c.json_nulls)}' if c.json_nulls else ""
    return (
        f'{{"action":"{c.action}","schema":{json_string(c.schema)},"table":{json_string(c.table)},'
        f'"oid":{oid},"record":{c.record or "null"},"old":{c.old or "null"},'
        f'"unchanged_toast":{toast}{nulls}}}'
    )


def formatter(name: str, *, sink: str, db: str) -> Formatter:
    if name == "mirror":  # internal: chosen by the postgres destination, not by `format`
        return mirror
    if name == "sequin":
        return sequin(sink)
    if name == "debezium":
        return debezium(db)
    if name == "record":
        return record
    raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")


# -- the same formats as Spark SQL -------------------------------------------------------------
# For a batch with backfill rows, the pipeline computes a message in the JVM when SQL can
# make it byte for byte what the functions above make (a batch of changes only is
# formatted by the delivery worker over Arrow columns: arrow_formats.py); executors then
# skip the per-row Python formatting (and a columnar sink, the Python loop altogether).
# Where SQL cannot, the expression is NULL and the row is formatted in Python as before:
# a sequin update with old values (its `changes` compares JSON objects), names or keys
# with one of the control characters Java escapes differently (`\u000B` where Python
# writes `\u000b`), an unknown action.

#: The control characters whose escapes differ (`\u000b` in Python, `\u000B` in Java);
#: the others are written alike (`\n`, `\t`, `\u0001`, ...).
_CONTROL = "'[\\\\x0b\\\\x0e\\\\x0f\\\\x1a-\\\\x1f]'"


def _sql_lit(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: What a JSON string escapes (`"`, `\\`, control characters): a name without any is
#: written between quotes as it is, without serialising JSON per row.
_ESCAPED = _sql_lit(r'["\\\x00-\x1f]')


def _sql_json_str(col: str) -> str:
    """A string column as a JSON string, as `json_string` writes it (NULL: left to Python)."""
    return (
        f"CASE WHEN NOT {col} RLIKE {_ESCAPED} THEN concat('\"', {col}, '\"') "
        f"WHEN {col} RLIKE {_CONTROL} THEN NULL "
        f"ELSE substr(to_json(array({col})), 2, length(to_json(array({col}))) - 2) END"
    )


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
        "CASE WHEN concat_ws('', pk) RLIKE " + _CONTROL + " THEN NULL ELSE "
        "regexp_replace(base64(CAST(concat('read:', backfill, ':', to_json(pk)) AS BINARY)), "
        "'[\\\\r\\\\n]', '') END"
    )
    return f"CASE WHEN backfill IS NULL THEN {cursor} ELSE {read} END"


def sql_format(name: str, *, sink: str, db: str, backfill: bool) -> str | None:
    """A Spark SQL expression equal to `formatter(name, ...)` of the row, or NULL where
    only Python can format it; None when the format has no SQL form (`mirror`)."""
    record = "coalesce(record, 'null')"
    ts = "date_format(committed_at, \"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\")"
    if name == "record":
        return record
    if name == "sequin":
        changes = "CASE WHEN action <> 'update' OR record IS NULL OR old IS NULL THEN 'null' END"
        return (
            f"concat('{{\"record\":', {record}, ',\"changes\":', {changes}, "
            f'\',"action":"\', action, \'","metadata":{{"table_schema":\', '
            f"{_sql_json_str('`schema`')}, ',\"table_name\":', {_sql_json_str('`table`')}, "
            f'\',"commit_timestamp":"\', {ts}, \'","commit_lsn":\', lsn, '
            f'\',"commit_idx":\', seq, \',"idempotency_key":"\', {sql_idempotency_key(backfill)}, '
            f"'\",\"transaction_annotations\":', coalesce(annotations, 'null'), "
            f'\',"sink":{{"name":\', {_sql_lit(json_string(sink))}, \'}},"source":{{"name":\', '
            f"{_sql_json_str('source')}, '}}}}}}')"
        )
    if name == "debezium":
        before = (
            "CASE action WHEN 'delete' THEN coalesce(old, record, 'null') "
            "WHEN 'update' THEN coalesce(old, 'null') ELSE 'null' END"
        )
        after = "CASE WHEN action = 'delete' THEN 'null' ELSE coalesce(record, 'null') END"
        op = "CASE action " + " ".join(
            f"WHEN '{a}' THEN '{o}'" for a, o in DEBEZIUM_OP.items()
        ) + " END"  # fmt: skip
        snapshot = (
            f"CASE WHEN backfill IS NOT NULL THEN {_sql_lit(_SNAPSHOT)} ELSE '' END"
            if backfill
            else "''"
        )
        return (
            f"concat('{{\"before\":', {before}, ',\"after\":', {after}, "
            f'\',"source":{{"connector":"walstream","name":\', {_sql_json_str("source")}, '
            f"',\"db\":', {_sql_lit(json_string(db))}, ',\"schema\":', {_sql_json_str('`schema`')}, "
            f"',\"table\":', {_sql_json_str('`table`')}, ',\"lsn\":', lsn, "
            f"',\"txId\":', coalesce(CAST(xid AS STRING), 'null'), "
            f'\',"ts_ms":\', unix_millis(committed_at), {snapshot}, \'}},"op":"\', {op}, '
            f"'\",\"ts_ms\":', unix_millis(current_timestamp()), '}}')"
        )
    return None
