"""Postgres's own `test_decoding` plugin as the oracle for what values a change carried."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

UNCHANGED = object()  # test_decoding's "unchanged-toast-datum"

_HEAD = re.compile(r"^table ([^:]+): (INSERT|UPDATE|DELETE|TRUNCATE): ?(.*)$", re.S)


@dataclass
class OracleChange:
    table: str  # schema.table as printed
    action: str
    old: dict[str, Any] | None  # old-key / old tuple, if printed
    new: dict[str, Any] | None
    types: dict[str, str]


def _parse_tuple(s: str, pos: int) -> tuple[dict[str, Any], dict[str, str], int]:
    values: dict[str, Any] = {}
    types: dict[str, str] = {}
    n = len(s)
    while pos < n:
        while pos < n and s[pos] == " ":
            pos += 1
        if pos >= n or s.startswith("new-tuple:", pos):
            break
        lb = s.index("[", pos)
        name = s[pos:lb].strip('"')
        rb = s.index("]:", lb)
        types[name] = s[lb + 1 : rb]
        pos = rb + 2
        if s.startswith("B'", pos):  # bit strings print as B'1010'
            pos += 1
        if s[pos] == "'":
            pos += 1
            buf = []
            while True:
                q = s.index("'", pos)
                buf.append(s[pos:q])
                if q + 1 < n and s[q + 1] == "'":
                    buf.append("'")
                    pos = q + 2
                else:
                    pos = q + 1
                    break
            values[name] = "".join(buf)
        else:
            end = s.find(" ", pos)
            end = n if end < 0 else end
            token = s[pos:end]
            pos = end
            if types[name] == "boolean" and token in ("true", "false"):
                values[name] = token[0]  # the type's own text output is t / f
            elif token == "null":
                values[name] = None
            elif token == "unchanged-toast-datum":
                values[name] = UNCHANGED
            else:
                values[name] = token
    return values, types, pos


def parse_change(line: str) -> OracleChange | None:
    m = _HEAD.match(line)
    if not m:
        return None
    table, action, rest = m.groups()
    if action == "TRUNCATE":
        return OracleChange(table, action, None, None, {})
    old = None
    types: dict[str, str] = {}
    pos = 0
    if rest.startswith("old-key:"):
        old, types, pos = _parse_tuple(rest, len("old-key:"))
        pos = rest.index("new-tuple:", pos) + len("new-tuple:")
    if rest.startswith("(no-tuple-data)"):
        return OracleChange(table, action, None, None, {})
    values, t2, _ = _parse_tuple(rest, pos)
    types.update(t2)
    if action == "DELETE":
        return OracleChange(table, action, values, None, types)
    return OracleChange(table, action, old, values, types)


def oracle_changes(conn: Any, slot: str) -> list[OracleChange]:
    """Consume a test_decoding slot with SQL and parse its row changes."""
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '0', "
        "'skip-empty-xacts', '1', 'include-rewrites', '0')",
        (slot,),
    ).fetchall()
    out = []
    for (data,) in rows:
        change = parse_change(data)
        if change is not None:
            out.append(change)
    return out
