"""A backfill's `where`: one boolean expression over a table's columns, never SQL text.

The operator's text is parsed with Postgres's own parser (libpg_query, through
pglast) and accepted only when it is a single expression built from a small set of
pieces: column names, constants, casts, comparisons and the usual operators,
AND/OR/NOT, IS [NOT] NULL, IN lists, LIKE, BETWEEN, CASE, and calls of a list of
built-in scalar functions (each bound to `pg_catalog`, so a same-named function in
another schema is never called). Sub-queries, parameters, aggregates, window
functions and every other function are refused, with the reason.

What runs is not the operator's text but the expression printed back from the
checked tree: nothing outside it (a `)`, a `;`, a comment) can reach the database.
The queries that use it run in READ ONLY transactions (see `chunks`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from walstream.errors import ConfigError

#: Deepest nesting of an expression's tree (a longer chain is not a predicate anyone writes).
MAX_DEPTH = 64
MAX_LENGTH = 4000

#: Built-in scalar functions a predicate may call (all immutable or stable, none with side
#: effects, none that reads files, other tables, settings or the server's state).
FUNCTIONS = frozenset(
    {
        # text
        "lower",
        "upper",
        "initcap",
        "length",
        "char_length",
        "character_length",
        "octet_length",
        "bit_length",
        "btrim",
        "ltrim",
        "rtrim",
        "substring",
        "substr",
        "left",
        "right",
        "strpos",
        "position",
        "replace",
        "concat",
        "concat_ws",
        "starts_with",
        "split_part",
        "reverse",
        "lpad",
        "rpad",
        "translate",
        "overlay",
        "md5",
        "normalize",
        "like_escape",
        "similar_to_escape",
        "regexp_like",
        "regexp_replace",
        # numbers
        "abs",
        "ceil",
        "ceiling",
        "floor",
        "round",
        "trunc",
        "mod",
        "sign",
        "power",
        "sqrt",
        # time
        "now",
        "statement_timestamp",
        "transaction_timestamp",
        "date_trunc",
        "date_part",
        "extract",
        "age",
        "make_date",
        "make_time",
        "make_timestamp",
        "make_timestamptz",
        "make_interval",
        "to_timestamp",
        "to_date",
        "to_char",
        "to_number",
        "timezone",
        "isfinite",
        "overlaps",
        "date_bin",
        # json, arrays, ranges
        "jsonb_typeof",
        "json_typeof",
        "jsonb_array_length",
        "json_array_length",
        "jsonb_extract_path_text",
        "json_extract_path_text",
        "jsonb_path_exists",
        "array_length",
        "cardinality",
        "array_position",
        "array_lower",
        "array_upper",
        "lower_inc",
        "upper_inc",
        "isempty",
        "num_nulls",
        "num_nonnulls",
    }
)

#: Operators a predicate may use, spelled as Postgres spells them (LIKE is `~~`).
OPERATORS = frozenset(
    {
        "=",
        "<>",
        "!=",
        "<",
        ">",
        "<=",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "%",
        "^",
        "||",
        "~~",
        "!~~",
        "~~*",
        "!~~*",
        "~",
        "~*",
        "!~",
        "!~*",
        "->",
        "->>",
        "#>",
        "#>>",
        "@>",
        "<@",
        "?",
        "?|",
        "?&",
        "&&",
        "BETWEEN",
        "NOT BETWEEN",
        "BETWEEN SYMMETRIC",
        "NOT BETWEEN SYMMETRIC",
    }
)

_FIX = (
    "write one boolean expression over the table's columns, e.g. "
    "\"status = 'paid' AND created_at >= '2024-01-01'\""
)


class BadPredicate(ConfigError):
    """A `where` that is not one safe boolean expression (the API answers 422)."""

    def __init__(self, text: str, reason: str) -> None:
        shown = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"--where {shown!r} is refused: {reason}", _FIX)
        self.reason = reason


@dataclass(frozen=True)
class Predicate:
    """A checked boolean expression (`sql`: the text printed from its tree) and the
    columns it names. Make one with `parse` (an operator's text) or `trusted` (a
    publication's row filter, read from the catalog)."""

    sql: str
    columns: frozenset[str]

    @staticmethod
    def trusted(text: str) -> Predicate:
        """Text from the server's own catalog (a publication's row filter), used as is."""
        return Predicate(text, frozenset())

    def also(self, other: Predicate | None) -> Predicate:
        """Both predicates."""
        if other is None:
            return self
        return Predicate(f"({self.sql}) AND ({other.sql})", self.columns | other.columns)

    def check_columns(self, table: str, columns: Iterable[str]) -> None:
        unknown = sorted(self.columns - set(columns))
        if unknown:
            raise BadPredicate(
                self.sql, f"{table} has no column {', '.join(unknown)} (columns are named alone)"
            )


def parse(text: str) -> Predicate:
    """The operator's text as a Predicate, or BadPredicate saying why it is refused."""
    from pglast import ast, parse_sql
    from pglast.parser import ParseError
    from pglast.stream import RawStream

    if not text.strip():
        raise BadPredicate(text, "it is empty")
    if len(text) > MAX_LENGTH:
        raise BadPredicate(text, f"it is longer than {MAX_LENGTH:,} characters")
    if "\x00" in text:
        raise BadPredicate(text, "it holds a NUL character")
    try:
        statements = parse_sql("SELECT " + text)
    except ParseError as exc:
        raise BadPredicate(text, f"it is not valid SQL ({exc})") from None
    except RecursionError:
        raise BadPredicate(text, f"it is nested deeper than {MAX_DEPTH} levels") from None
    if len(statements) != 1:
        raise BadPredicate(text, "it holds more than one statement")
    stmt = statements[0].stmt
    if not isinstance(stmt, ast.SelectStmt) or not _only_target(stmt):
        raise BadPredicate(text, "it is not a single expression (it has more SQL around it)")
    targets = stmt.targetList or ()
    if len(targets) != 1 or targets[0].name is not None:
        raise BadPredicate(text, "it is not a single expression (a comma or an alias)")
    expr = targets[0].val
    columns: set[str] = set()
    _check(text, expr, columns)
    try:
        printed = RawStream()(expr)
    except Exception as exc:  # a tree pglast cannot print back is not one we run
        raise BadPredicate(text, f"it cannot be checked ({type(exc).__name__})") from None
    return Predicate(printed, frozenset(columns))


def _only_target(stmt: Any) -> bool:
    """A `SELECT <expr>` and nothing else: no FROM, WHERE, GROUP BY, ORDER BY, UNION..."""
    clauses = (
        "distinctClause",
        "intoClause",
        "fromClause",
        "whereClause",
        "groupClause",
        "havingClause",
        "windowClause",
        "valuesLists",
        "sortClause",
        "limitOffset",
        "limitCount",
        "lockingClause",
        "withClause",
        "larg",
        "rarg",
    )
    return stmt.op.name == "SETOP_NONE" and not any(getattr(stmt, c, None) for c in clauses)


def _check(text: str, root: Any, columns: set[str]) -> None:
    """Walk the tree (iteratively: a deep one must not overflow Python's stack)."""
    from pglast import ast

    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if node is None or isinstance(node, str | int | float | bool):
            continue
        if isinstance(node, tuple | list):
            stack.extend((n, depth) for n in node)
            continue
        if depth > MAX_DEPTH:
            raise BadPredicate(text, f"it is nested deeper than {MAX_DEPTH} levels")
        kind = type(node).__name__
        if kind not in _ALLOWED:
            raise BadPredicate(text, _REFUSED.get(kind, f"it uses {_article(kind)} ({kind})"))
        if isinstance(node, ast.ColumnRef):
            columns.add(_column(text, node))
            continue
        if isinstance(node, ast.FuncCall):
            _function(text, node)
            stack.extend((a, depth + 1) for a in node.args or ())
            continue
        if isinstance(node, ast.A_Expr):
            _operator(text, node)
        if isinstance(node, ast.TypeCast):
            stack.append((node.arg, depth + 1))  # the type name is only a name
            continue
        for name in node:  # a node iterates over its attribute names
            value = getattr(node, name)
            if isinstance(value, ast.Node | tuple | list):
                stack.append((value, depth + 1))


def _column(text: str, node: Any) -> str:
    from pglast import ast

    fields: tuple[Any, ...] = tuple(node.fields or ())
    if len(fields) != 1 or not isinstance(fields[0], ast.String):
        raise BadPredicate(text, "name columns alone, without a table or schema (and no *)")
    return str(fields[0].sval)


def _function(text: str, node: Any) -> None:
    from pglast import ast

    names = [str(n.sval) for n in node.funcname or () if isinstance(n, ast.String)]
    if not names or len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog"):
        raise BadPredicate(text, "it calls a function outside pg_catalog")
    name = names[-1]
    if name not in FUNCTIONS:
        raise BadPredicate(
            text,
            f"it calls {name}(), which a predicate may not call (allowed: the built-in text, "
            "number, time, json and array functions listed in docs/backfills.md)",
        )
    if (
        node.agg_star
        or node.agg_distinct
        or node.agg_order
        or node.agg_filter
        or node.over
        or node.agg_within_group
        or node.func_variadic
    ):
        raise BadPredicate(text, f"{name}() is called as an aggregate or window function")
    # Bound to the built-in: a function of the same name elsewhere on the search path
    # (an attacker's public.lower) is never the one called.
    node.funcname = (ast.String(sval="pg_catalog"), ast.String(sval=name))


def _operator(text: str, node: Any) -> None:
    from pglast import ast

    names = [str(n.sval) for n in node.name or () if isinstance(n, ast.String)]
    if len(names) == 2 and names[0] == "pg_catalog":
        names = names[1:]
    if len(names) != 1 or names[0] not in OPERATORS:
        raise BadPredicate(text, f"it uses the operator {'.'.join(names) or '?'}")


_ALLOWED = frozenset(
    {
        "A_Const",
        "ColumnRef",
        "TypeCast",
        "A_Expr",
        "BoolExpr",
        "NullTest",
        "BooleanTest",
        "FuncCall",
        "CoalesceExpr",
        "MinMaxExpr",
        "CaseExpr",
        "CaseWhen",
        "SQLValueFunction",
        "A_ArrayExpr",
        "A_Indirection",
        "A_Indices",
        "RowExpr",
        "CollateClause",
        "String",
        "Integer",
        "Float",
        "Boolean",
        "BitString",
    }
)

_REFUSED = {
    "SubLink": "it holds a sub-query",
    "ParamRef": "it holds a parameter ($1)",
    "A_Star": "it selects *",
    "GroupingFunc": "it uses GROUPING",
    "XmlExpr": "it uses an XML function",
}


def _article(kind: str) -> str:
    return {"ResTarget": "an alias", "MultiAssignRef": "an assignment"}.get(kind, "a construct")
