"""The `mirror` format (internal: chosen by the postgres destination, not by `format`):
what the Postgres mirror sink needs of a change. Python only."""

from __future__ import annotations

import json

from walstream.change import ChangeRow
from walstream.formats.base import Formatter
from walstream.formats.text import json_string


def mirror(c: ChangeRow) -> str:
    """The row, the old key or row (a changed key), which unchanged TOAST values were not
    sent, the source table's OID, and which json/jsonb values are the JSON null
    (`json_nulls`, only when there are some)."""
    toast = json.dumps(c.unchanged_toast) if c.unchanged_toast else "null"
    oid = c.table_oid if c.table_oid is not None else "null"
    nulls = f',"json_nulls":{json.dumps(c.json_nulls)}' if c.json_nulls else ""
    return (
        f'{{"action":"{c.action}","schema":{json_string(c.schema)},"table":{json_string(c.table)},'
        f'"oid":{oid},"record":{c.record or "null"},"old":{c.old or "null"},'
        f'"unchanged_toast":{toast}{nulls}}}'
    )


def python(*, sink: str, db: str) -> Formatter:
    return mirror
