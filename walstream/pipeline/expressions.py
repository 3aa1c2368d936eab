"""The Spark SQL a sink's settings become: which changes, their group, key, route, message.

Pure text: `projection` gives the WHERE clause and the select list that `pipeline.py`
applies to each batch; `expressions` lists what the user wrote, for `validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from walstream.change import CHANGE_COLUMNS
from walstream.config import SinkConfig
from walstream.engine.sql import quote, selection_expr
from walstream.formats import ARROW_FORMATS, RECORD_FORMATS, sql_format
from walstream.formats.keys import GROUP_KEY_SQL, MESSAGE_KEY_SQL, sql_idempotency_key


def group_expr(items: list[str] | None) -> str:
    """SQL for the group key: default schema + table + pk; `pk`, a column, `record.x` paths."""
    if not items:
        return GROUP_KEY_SQL
    parts = []
    for item in items:
        if item == "pk":
            parts.append(MESSAGE_KEY_SQL)
        elif item == "ordering_key":  # ingested events: their ordering key, else each its own
            parts.append(
                "coalesce(get_json_object(record, '$.ordering_key'), "
                "get_json_object(record, '$.id'))"
            )
        elif item in CHANGE_COLUMNS:
            parts.append(f"CAST(`{item}` AS STRING)")
        elif (
            item.startswith(("record.", "old."))
            and item.replace(".", "").replace("_", "").isalnum()
        ):
            col, _, path = item.partition(".")
            parts.append(f"get_json_object(`{col}`, {quote('$.' + path)})")
        else:
            parts.append(f"CAST(({item}) AS STRING)")
    return "concat_ws('\u001f', " + ", ".join(parts) + ")"


#: Spark hands a NULL array to a Python task ~7x slower than an empty one (from Arrow
#: to rows and back; 48k against 371k rows/s in one column, docs/performance-log.md):
#: a task gets an empty array instead, which every consumer reads as "none".
NO_NULL_ARRAY = "coalesce(`{0}`, CAST(array() AS ARRAY<STRING>))"

#: The row columns a SQL-made message replaces: they travel on to the delivery worker
#: only for rows without one (`Projection.sql_message`).
TRIMMED = ("record", "old", "annotations")


@dataclass(frozen=True)
class Projection:
    where: str  # the rows the sink takes
    keep: list[str]  # the change columns delivery reads
    # _group, _key, and _route, _message, _ikey when the sink has them (unchanged_toast
    # and json_nulls when delivery reads them, see NO_NULL_ARRAY)
    columns: list[str]
    sql_message: bool  # SQL makes the message (its format), not Python
    #: The format the delivery worker makes each Arrow batch's messages in (formats/: each format's `arrow`),
    #: instead of SQL or Python row by row; None: not there.
    worker_format: str | None = None

    @property
    def names(self) -> list[str]:
        """The output column names, in order."""
        return [k.strip("`") for k in self.keep] + [c.rsplit(" AS ", 1)[1] for c in self.columns]


def projection(
    sink: SinkConfig, skip_before: int | None = None, backfill: bool = False, db: str = ""
) -> Projection:
    """What `prepare` selects for this sink (see its docstring)."""
    dest = sink.destination
    cols = [f"({group_expr(sink.group_by or dest.group_by())}) AS _group"]
    cols.append(f"CAST(({dest.key_expression()}) AS STRING) AS _key")
    route = dest.route_expression()
    if route is not None:
        cols.append(f"CAST(({route}) AS STRING) AS _route")
    if isinstance(sink.transform, dict):
        fields = ", ".join(f"{quote(k)}, ({v})" for k, v in sink.transform.items())
        cols.append(f"to_json(named_struct({fields})) AS _message")
    worker = worker_format(sink, backfill)
    formatted = None if worker is not None else sql_message(sink, db, backfill)
    if formatted is not None:
        cols.append(f"{formatted} AS _message")
    if formatted is not None or worker is not None or isinstance(sink.transform, dict):
        cols.append(f"{sql_idempotency_key(backfill)} AS _ikey")
    keep = [f"`{c}`" for c in delivery_columns(sink)]
    for array in ("unchanged_toast", "json_nulls"):  # an empty array where it is NULL
        if f"`{array}`" in keep:
            keep.remove(f"`{array}`")
            cols.append(f"{NO_NULL_ARRAY.format(array)} AS {array}")
    if backfill:  # a read row's idempotency key is its backfill id and pk
        keep += ["backfill"] + ([] if "`pk`" in keep else ["`pk`"])
    where = selection_expr(sink)
    if skip_before is not None:
        where = f"lsn >= {int(skip_before)} AND {where}"
    return Projection(where, keep, cols, formatted is not None, worker)


def worker_format(sink: SinkConfig, backfill: bool) -> str | None:
    """The sink's format when the delivery worker makes its messages over Arrow columns
    (each format's `arrow` rendering): a batch of changes only, no transform. Batches with backfill rows
    keep the SQL form (`sql_message`), the mirror's format is made in Python."""
    if backfill or sink.transform is not None:
        return None
    name = sink.destination.message_format() or sink.format
    return name if name in ARROW_FORMATS else None


def sql_message(sink: SinkConfig, db: str, backfill: bool) -> str | None:
    """The sink's message format as SQL (see formats.sql_format), when delivery uses it:
    no transform (a SQL one makes `_message` itself, a Python one needs the row)."""
    if sink.transform is not None:
        return None
    name = sink.destination.message_format() or sink.format
    return sql_format(name, sink=sink.name, db=db, backfill=backfill)


def delivery_columns(sink: SinkConfig) -> list[str]:
    """The change columns an executor reads to build this sink's messages.

    `pk` and `unchanged_toast` are never in a message (the key and group are computed
    before); a SQL transform's `_message` replaces the formatted row entirely.
    `table_oid` and `json_nulls` are in no format's message: only the mirror, Python
    transforms and Debezium's records (their table's types, unchanged TOAST) read them;
    `change_lsn` and `last_commit_lsn` only Debezium's (`source.lsn`, `source.sequence`).
    """
    if sink.destination.message_format() == "mirror":
        skipped = ("annotations", "xid", "change_lsn", "last_commit_lsn")
        return [c for c in CHANGE_COLUMNS if c not in skipped]
    if sink.format in RECORD_FORMATS and sink.transform is None:  # debezium: by type
        return [c for c in CHANGE_COLUMNS if c not in ("pk", "annotations")]
    skip = {"pk", "unchanged_toast", "change_lsn", "last_commit_lsn"}
    if isinstance(sink.transform, dict):
        skip |= {"xid", "record", "old", "annotations"}
    if not isinstance(sink.transform, str):
        skip |= {"table_oid", "json_nulls"}
    return [c for c in CHANGE_COLUMNS if c not in skip]


def expressions(sink: SinkConfig) -> list[str]:
    """The Spark SQL a sink's config brings (filter, transform fields, group_by, a key or
    route expression): what `validate` must analyze. None: nothing needs Spark to check."""
    dest = sink.destination
    found = [sink.filter] if sink.filter else []
    if isinstance(sink.transform, dict):
        found += list(sink.transform.values())
    found += list(sink.group_by or [])
    if not dest.default_key():
        found.append(dest.key_expression())
    route = dest.route_expression()
    if route is not None:
        found.append(route)
    return found
