"""Spark SQL text made from the config: literals, and which changes a sink takes."""

from __future__ import annotations

import fnmatch

from walstream.config import SinkConfig


def quote(s: str) -> str:
    """A Spark SQL string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def selection_expr(sink: SinkConfig) -> str:
    taken = sink.taken_actions()
    conds = ["action IN (" + ", ".join(quote(a) for a in taken) + ")" if taken else "FALSE"]
    if sink.tables:
        regexes = [fnmatch.translate(t) for t in sink.tables]
        conds.append(
            "("
            + " OR ".join(f"concat(`schema`, '.', `table`) RLIKE {quote(r)}" for r in regexes)
            + ")"
        )
    elif sink._outbox is not None:  # every table but the event outbox
        schema, table = sink._outbox
        conds.append(f"NOT (`schema` = {quote(schema)} AND `table` = {quote(table)})")
    if sink.event_types:
        types = ", ".join(quote(t) for t in sink.event_types)
        conds.append(f"get_json_object(record, '$.event_type') IN ({types})")
    if sink.filter:
        conds.append(f"({sink.filter})")
    return " AND ".join(conds)
