"""The Postgres mirror's pure core: table definitions, values, and the statements that apply.

Values arrive as the decoder's JSON (bytea base64, arrays as JSON arrays, dates with
astronomical years); `to_text` turns each back into Postgres' text input for its
column's type, cast in the statement. `runs` groups consecutive changes into what one
statement can apply, and `statement` writes it. No connection here: `sink.py` runs
them.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walstream.sinks.postgres.book import row_key

_BC = re.compile(r"^(-?)(\d{4,})(-\d\d-\d\d)(?:T(.*))?$")


@dataclass
class Column:
    name: str
    type_sql: str  # format_type(): "numeric(10,3)", "mood[]", "character varying(10)"
    not_null: bool
    kind: str  # how a JSON value becomes text input: bytea, json, date, scalar
    array: bool
    delim: str = ","  # between array elements (box uses ';')


@dataclass
class TableDef:
    schema: str  # in the target
    name: str
    columns: dict[str, Column] = field(default_factory=dict)
    pk: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)  # DDL of the user-defined types it uses
    #: (sink, source schema, source table) filling it: one per target table
    filled_by: tuple[str, str, str] = ("", "", "")
    #: The source table's OID: it stays when the table is renamed (`mirror_rename`)
    source_oid: int = 0

    @property
    def target(self) -> str:
        return f"{ident(self.schema)}.{ident(self.name)}"


def missing(table: TableDef, change: Any) -> frozenset[str]:
    """The table's columns a whole row (insert, update, read) does not carry: the source
    dropped them, or never sends them (generated columns, a publication's column list)."""
    if change["action"] not in ("insert", "update", "read"):
        return frozenset()
    sent = (change.get("record") or {}).keys() | set(change.get("unchanged_toast") or ())
    return frozenset(table.columns.keys() - sent)


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def column_kind(type_name: str) -> str:
    """How a JSON value of this type becomes text input: bytea, json, date or scalar."""
    if type_name == "bytea":
        return "bytea"
    if type_name in ("json", "jsonb"):
        return "json"
    if type_name in ("date", "timestamp", "timestamptz"):
        return "date"
    return "scalar"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def if_missing(nsp: str, name: str, body: str) -> str:
    return (
        f"DO $walstream$ BEGIN IF to_regtype({literal(ident(nsp) + '.' + ident(name))}) "
        f"IS NULL THEN EXECUTE {literal(body)}; END IF; END $walstream$"
    )


# -- values: the decoder's JSON back to Postgres text input ------------------------------------
def _bc(text: str) -> str:
    """ISO dates with astronomical years ("-0043-03-15", "0000-...") as Postgres' "... BC"."""
    m = _BC.match(text)
    if not m or (not m.group(1) and int(m.group(2)) != 0):
        return text
    year = int(m.group(2)) + 1 if m.group(1) else 1
    time_part = f" {m.group(4)}" if m.group(4) else ""
    return f"{year:04d}{m.group(3)}{time_part} BC"


def _element(value: Any, kind: str) -> str | None:
    if value is None:
        return None
    if kind == "bytea":
        return "\\x" + base64.b64decode(value).hex()
    if kind == "json":
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _bc(value) if kind == "date" else value
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    return json.dumps(value, ensure_ascii=False)


def _array(value: Any, kind: str, delim: str = ",", top: bool = True) -> str:
    # A list inside a json[]/jsonb[] is a JSON value, not a dimension (read as 1-D).
    if isinstance(value, list) and (top or kind != "json"):
        return "{" + delim.join(_array(v, kind, delim, False) for v in value) + "}"
    text = _element(value, kind)
    if text is None:
        return "NULL"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_text(value: Any, col: Column) -> str | None:
    """A decoded JSON value as the text input of its column's type (None: SQL NULL)."""
    if value is None:
        return None
    if col.array and isinstance(value, list):
        return _array(value, col.kind, col.delim)
    return _element(value, col.kind)


def operations(table: TableDef, change: Any) -> list[tuple[str, Any]]:
    """What applying a change takes: an update that changed the key also deletes the row
    under the old key (Postgres sends the old key then); when it left TOASTed values
    unchanged (not sent), they move with the row from under the old key (`move`)."""
    action = change["action"]
    if action in ("truncate", "delete"):
        return [(action, change)]
    old = change.get("old") or {}
    record = change.get("record") or {}
    if action == "update" and old and any(k in old and old[k] != record.get(k) for k in table.pk):
        if _toast(table, change):
            return [("move", change)]
        return [("delete", {"record": old}), ("upsert", change)]
    return [("upsert", change)]


def _toast(table: TableDef, change: Any) -> list[str]:
    """The target's columns whose value the change left unchanged and did not send."""
    return [n for n in table.columns if n in set(change.get("unchanged_toast") or ())]


def row_keys(table: TableDef, change: Any) -> list[str] | None:
    """The keys of the rows a change touches (both keys of a key change); None: truncate."""
    if change["action"] == "truncate":
        return None
    out = []
    for kind, op in operations(table, change):
        if kind == "move":
            out.append(row_key(table.pk, op.get("old") or {}))
        out.append(row_key(table.pk, op.get("record") or {}))
    return out


#: Consecutive operations one statement applies: the table, the kind (upsert, delete,
#: truncate), and each operation with the index of its message.
Run = tuple[TableDef, str, list[tuple[int, Any]]]


def runs(changes: list[Any], todo: list[int], table_of: Callable[[Any], TableDef]) -> list[Run]:
    """Consecutive operations that one statement can apply: same table, same kind, same
    columns, each key once. Each holds (index of its message, the change)."""
    out: list[Run] = []
    run_key: Any = None
    keys: set[str] = set()
    for i in todo:
        c = changes[i]
        source_table = (c["schema"], c["table"])
        table = table_of(c)
        for kind, op in operations(table, c):
            record = op.get("record") or {}
            toast = frozenset(op.get("unchanged_toast") or ())
            cols = frozenset(record) - toast
            pks = [json.dumps([record.get(k) for k in table.pk])]
            if kind == "move":  # its old key too: one statement sees the table as it was
                pks.append(json.dumps([(op.get("old") or {}).get(k) for k in table.pk]))
            key = (source_table, kind, cols, toast if kind == "move" else None)
            if key != run_key or keys.intersection(pks) or kind == "truncate":
                out.append((table, kind, []))
                run_key, keys = key, set()
            keys.update(pks)
            out[-1][2].append((i, op))
    return out


def statement(table: TableDef, kind: str, changes: list[Any]) -> tuple[str, tuple[Any, ...]]:
    """The statement (and its parameters) that applies a run of one kind to `table`."""
    if kind == "truncate":
        return f"TRUNCATE {table.target}", ()
    toast = set(changes[0].get("unchanged_toast") or ())
    names = [n for n in table.columns if n in (changes[0].get("record") or {}) and n not in toast]
    if kind == "delete":
        names = table.pk
    cols = [table.columns[n] for n in names]
    rows = [
        {
            # a json/jsonb JSON null reads null in `record`, like SQL NULL: `json_nulls` tells;
            # `_texts`: values read from the source as text (unsent.py)
            n: c["_texts"][n]
            if n in c.get("_texts", ())
            else "null"
            if n in (c.get("json_nulls") or ())
            else to_text((c.get("record") or {}).get(n), col)
            for n, col in zip(names, cols, strict=True)
        }
        for c in changes
    ]
    exprs = ", ".join(
        f"(r->>{literal(n)})::{col.type_sql} AS {ident(n)}"
        for n, col in zip(names, cols, strict=True)
    )
    if kind == "move":
        return _move(table, names, exprs, rows, changes)
    data = json.dumps(rows, ensure_ascii=False)
    if kind == "delete":
        match = " AND ".join(f"t.{ident(k)} = d.{ident(k)}" for k in table.pk)
        return (
            f"DELETE FROM {table.target} t USING (SELECT {exprs} "
            f"FROM jsonb_array_elements(%s::jsonb) j(r)) d WHERE {match}",
            (data,),
        )
    updates = [n for n in names if n not in table.pk]
    conflict = (
        "DO UPDATE SET " + ", ".join(f"{ident(n)} = EXCLUDED.{ident(n)}" for n in updates)
        if updates
        else "DO NOTHING"
    )
    return (
        f"INSERT INTO {table.target} ({', '.join(ident(n) for n in names)}) "
        f"SELECT {exprs} FROM jsonb_array_elements(%s::jsonb) j(r) "
        f"ON CONFLICT ({', '.join(ident(k) for k in table.pk)}) {conflict}",
        (data,),
    )


def _move(
    table: TableDef, names: list[str], exprs: str, rows: list[dict[str, Any]], changes: list[Any]
) -> tuple[str, tuple[Any, ...]]:
    """Key changes that left TOASTed values unchanged: each row deleted under its old key
    and inserted under its new one, with the unsent values taken from the deleted row (a
    row the target did not have keeps what the new key's row has, or NULL)."""
    toast = _toast(table, changes[0])
    for i, (row, c) in enumerate(zip(rows, changes, strict=True)):
        row["_i"] = i
        old = c.get("old") or {}
        for k in table.pk:
            row[f"_o_{k}"] = to_text(old.get(k), table.columns[k])
    olds = ", ".join(
        f"(r->>{literal('_o_' + k)})::{table.columns[k].type_sql} AS {ident('_o_' + k)}"
        for k in table.pk
    )
    match = " AND ".join(f"t.{ident(k)} = d.{ident('_o_' + k)}" for k in table.pk)
    kept = ", ".join(f"t.{ident(n)}" for n in toast)
    targets = ", ".join(ident(n) for n in [*names, *toast])
    values = ", ".join([*(f"d.{ident(n)}" for n in names), *(f"g.{ident(n)}" for n in toast)])
    sets = [f"{ident(n)} = EXCLUDED.{ident(n)}" for n in names if n not in table.pk]
    sets += [f"{ident(n)} = coalesce(EXCLUDED.{ident(n)}, t.{ident(n)})" for n in toast]
    return (
        f"WITH d AS (SELECT (r->>'_i')::int AS _i, {exprs}, {olds} "
        f"FROM jsonb_array_elements(%s::jsonb) j(r)), "
        f"g AS (DELETE FROM {table.target} t USING d WHERE {match} RETURNING d._i, {kept}) "
        f"INSERT INTO {table.target} AS t ({targets}) SELECT {values} "
        f"FROM d LEFT JOIN g ON g._i = d._i "
        f"ON CONFLICT ({', '.join(ident(k) for k in table.pk)}) DO UPDATE SET {', '.join(sets)}",
        (json.dumps(rows, ensure_ascii=False),),
    )


def create_table(table: TableDef) -> list[str]:
    """The DDL that makes `table` in the target: its schema, user-defined types, the table."""
    cols = ", ".join(
        f"{ident(c.name)} {c.type_sql}{' NOT NULL' if c.not_null else ''}"
        for c in table.columns.values()
    )
    return [
        f"CREATE SCHEMA IF NOT EXISTS {ident(table.schema)}",
        *table.types,
        f"CREATE TABLE IF NOT EXISTS {table.target} ({cols}, "
        f"PRIMARY KEY ({', '.join(ident(k) for k in table.pk)}))",
    ]
