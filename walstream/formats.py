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
_DEBEZIUM_OP = {"insert": "c", "update": "u", "delete": "d", "read": "r", "truncate": "t"}
_SNAPSHOT = ',"snapshot":"incremental"'  # Debezium's marker on incremental-snapshot reads
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Formatter = Callable[[ChangeRow], str]


@functools.lru_cache(maxsize=4096)  # the changes of a transaction share their commit time
def iso_timestamp(us: int) -> str:
    """Microseconds since the Unix epoch as ISO 8601 UTC with microseconds: `...T01:02:03.000004Z`."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=4096)  # schema, table and source names repeat on every message
def _str(value: str) -> str:
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
    sink_json = _str(sink)

    def fmt(c: ChangeRow) -> str:
        changes = changed_values(c.record, c.old) if c.action == "update" else "null"
        return (
            f'{{"record":{c.record or "null"},"changes":{changes},"action":"{c.action}",'
            f'"metadata":{{"table_schema":{_str(c.schema)},"table_name":{_str(c.table)},'
            f'"commit_timestamp":"{iso_timestamp(c.committed_at_us)}","commit_lsn":{c.lsn},'
            f'"commit_idx":{c.seq},"idempotency_key":"{change_key(c)}",'
            f'"transaction_annotations":{c.annotations or "null"},'
            f'"sink":{{"name":{sink_json}}},"source":{{"name":{_str(c.source)}}}}}}}'
        )

    return fmt


def debezium(db: str) -> Formatter:
    """Debezium's envelope: `{"before", "after", "source": {...}, "op", "ts_ms"}`."""
    db_json = _str(db)

    def fmt(c: ChangeRow) -> str:
        if c.action == "delete":
            before, after = c.old or c.record or "null", "null"
        elif c.action == "update":
            before, after = c.old or "null", c.record or "null"
        else:
            before, after = "null", c.record or "null"
        return (
            f'{{"before":{before},"after":{after},"source":{{"connector":"walstream",'
            f'"name":{_str(c.source)},"db":{db_json},"schema":{_str(c.schema)},'
            f'"table":{_str(c.table)},"lsn":{c.lsn},"txId":{"null" if c.xid is None else c.xid},'
            f'"ts_ms":{c.committed_at_us // 1000}{_SNAPSHOT if c.backfill is not None else ""}}},'
            f'"op":"{_DEBEZIUM_OP[c.action]}",'
            f'"ts_ms":{time.time_ns() // 1_000_000}}}'
        )

    return fmt


def record(c: ChangeRow) -> str:
    """The row only: after the change, or what is known of it before a delete."""
    return c.record or "null"


def mirror(c: ChangeRow) -> str:
    """What the Postgres mirror sink needs of a change: the row, the old key or row (a
    changed key), which unchanged TOAST values were not sent."""
    toast = json.dumps(c.unchanged_toast) if c.unchanged_toast else "null"
    return (
        f'{{"action":"{c.action}","schema":{_str(c.schema)},"table":{_str(c.table)},'
        f'"record":{c.record or "null"},"old":{c.old or "null"},"unchanged_toast":{toast}}}'
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
