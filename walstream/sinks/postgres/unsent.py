"""Unsent TOAST values of rows the target does not have, read from the source.

Postgres leaves an unchanged TOASTed value out of an update, also of one that moves the
key. The mirror keeps the value its row has; a row it does not have yet would get NULL:
a backfilled row whose chunk the stream overrode (the DBLog rule drops a read row whose
key changed in its window, and the stream's update lacks the value), or a row of a table
mirrored without a backfill. Such values are read from the source row as it is now (a
later change of the row is applied after it, as always): one query on the target and one
on the source per table and chunk, only for updates that left values unsent. An unsent
value is never NULL (only a stored value is TOASTed), so a target row holding NULL there
is filled the same way: a row the source had already moved away when it was first read
gets its value at its next change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from walstream.errors import SinkError
from walstream.sinks.postgres.book import row_key
from walstream.sinks.postgres.sql import TableDef, ident, literal, to_text


def fill_unsent(
    target: Any,
    source: Callable[[], Any],
    changes: list[Any],
    todo: list[int],
    table_of: Callable[[Any], TableDef],
) -> int:
    """Give each update in `todo` that left values unsent for a row the target lacks (as
    the chunk's earlier changes leave it) those values from the source, as text in the
    change's `_texts` (`sql.statement` takes them as they are). How many were filled."""
    by_table: dict[tuple[str, str], list[int]] = {}
    for i in todo:
        c = changes[i]
        by_table.setdefault((c["schema"], c["table"]), []).append(i)
    filled = 0
    for (schema, name), rows in by_table.items():
        if not any(_unsent(changes[i]) for i in rows):
            continue
        try:
            table = table_of(changes[rows[0]])
        except SinkError:  # no target table, no key...: applying says so, change by change
            continue
        lacking = _lacking(target, table, [changes[i] for i in rows])
        if lacking:
            filled += _fill(source(), schema, name, table, lacking)
    return filled


def _unsent(change: Any) -> list[str]:
    return list(change.get("unchanged_toast") or ()) if change["action"] == "update" else []


def _lacking(target: Any, table: TableDef, changes: list[Any]) -> list[Any]:
    """The updates with unsent values whose row the target lacks when they apply: the
    target's rows before the chunk, then the chunk's changes in order."""
    pk = table.pk
    looked = [c for c in changes if _unsent(c)]
    wanted = sorted({n for c in looked for n in _unsent(c) if n in table.columns})
    rows = [c.get("old") or c.get("record") or {} for c in looked]
    before = _present(target, table, rows, wanted)  # key -> its unsent columns holding NULL
    known: dict[str, bool] = {}  # a key the chunk changed: whether its row is there now
    truncated = False
    out = []
    for c in changes:
        action = c["action"]
        record = c.get("record") or {}
        key = row_key(pk, record)
        if action == "truncate":
            known, truncated = {}, True
        elif action == "delete":
            known[key] = False
        elif _unsent(c):
            old = row_key(pk, c.get("old") or record)
            if old in known:
                at = known[old]
            else:  # the target's row as the chunk found it, complete in these columns
                nulls = before.get(old)
                at = not truncated and nulls is not None and not nulls & set(_unsent(c))
            if not at:
                out.append(c)
            known[old] = False
            known[key] = True
        else:
            old = c.get("old")
            if action == "update" and old:
                known[row_key(pk, old)] = False
            known[key] = True
    return out


def _present(
    target: Any, table: TableDef, keys: list[dict[str, Any]], columns: list[str]
) -> dict[str, set[str]]:
    """Of `keys` (records holding the key columns), those the target table has, each with
    which of `columns` hold NULL there."""
    data, match, cols = _keys(table, keys, "t")
    nulls = "".join(f", t.{ident(n)} IS NULL" for n in columns)
    found = target.execute(
        f"SELECT d._i{nulls} FROM ({data}) d JOIN {table.target} t ON {match}", (cols,)
    ).fetchall()
    return {
        row_key(table.pk, keys[i]): {n for n, null in zip(columns, flags, strict=True) if null}
        for i, *flags in found
    }


def _fill(source: Any, schema: str, name: str, table: TableDef, lacking: list[Any]) -> int:
    """The unsent values of `lacking`'s rows from the source table, as text."""
    wanted = sorted({n for c in lacking for n in _unsent(c) if n in table.columns})
    if not wanted:
        return 0
    data, match, cols = _keys(table, [c.get("record") or {} for c in lacking], "s")
    values = ", ".join(f"s.{ident(n)}::text" for n in wanted)
    rows = source.execute(
        f"SELECT d._i, {values} FROM ({data}) d JOIN {ident(schema)}.{ident(name)} s ON {match}",
        (cols,),
    ).fetchall()
    for i, *texts in rows:
        c = lacking[i]
        record = c.setdefault("record", {})
        c["_texts"] = dict(zip(wanted, texts, strict=True))
        for n in wanted:
            record.setdefault(n, None)  # sent now: a column of the statement
        c["unchanged_toast"] = [n for n in c.get("unchanged_toast") or () if n not in wanted]
    return len(rows)


def _keys(table: TableDef, keys: list[dict[str, Any]], alias: str) -> tuple[str, str, str]:
    """(a SELECT of the keys as the table's types with their index `_i`, the join of it
    with `alias`, its JSON parameter)."""
    rows = [
        {"_i": i, **{k: to_text(r.get(k), table.columns[k]) for k in table.pk}}
        for i, r in enumerate(keys)
    ]
    exprs = ", ".join(
        f"(r->>{literal(k)})::{table.columns[k].type_sql} AS {ident(k)}" for k in table.pk
    )
    data = f"SELECT (r->>'_i')::int AS _i, {exprs} FROM jsonb_array_elements(%s::jsonb) j(r)"
    match = " AND ".join(f"{alias}.{ident(k)} = d.{ident(k)}" for k in table.pk)
    return data, match, json.dumps(rows, ensure_ascii=False)
