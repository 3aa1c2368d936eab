"""A backfill's `where` is parsed by Postgres's own parser and accepted only as one safe
boolean expression; what runs is the expression printed back from the checked tree."""

from __future__ import annotations

import pytest

from walstream.backfill.predicate import BadPredicate, Predicate, parse

INJECTIONS = {
    "true); DROP TABLE orders; --": "not valid SQL",
    "true; DROP TABLE orders": "more than one statement",
    "1=1; COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'": "more than one statement",
    "id > 0) OR (1=1": "not valid SQL",
    "pg_sleep(5) IS NULL": "calls pg_sleep()",
    "pg_catalog.pg_sleep(5) IS NULL": "calls pg_sleep()",
    "public.lower(name) = 'a'": "outside pg_catalog",
    "(SELECT count(*) FROM pg_authid) > 0": "sub-query",
    "EXISTS (SELECT 1 FROM pg_shadow)": "sub-query",
    "id IN (SELECT id FROM orders)": "sub-query",
    "id > 1 UNION SELECT 1": "more SQL around it",
    "id > 1 FROM orders": "more SQL around it",
    "id = $1": "parameter",
    "count(*) > 1": "calls count()",
    "lo_export(1, '/tmp/x') > 0": "calls lo_export()",
    "pg_read_file('/etc/passwd') <> ''": "calls pg_read_file()",
    "current_setting('password_encryption') = 'x'": "calls current_setting()",
    "dblink_exec('x') = 'y'": "calls dblink_exec()",
    "set_config('role', 'postgres', false) = 'x'": "calls set_config()",
    "orders.id = 1": "name columns alone",
    "id OPERATOR(public.=) 1": "operator public.=",
    "id AS x": "an alias",
    "id > 0, true": "a comma",
    "lower(name) OVER () = 'a'": "window",
    "": "empty",
    "   ": "empty",
    "id = 1\x00": "NUL",
    "NOT " * 70 + "flag": "nested deeper",
    "x" * 5000: "longer than",
}


@pytest.mark.parametrize("text,reason", list(INJECTIONS.items()), ids=range(len(INJECTIONS)))
def test_injections_and_unsafe_expressions_are_refused_with_the_reason(text, reason):
    with pytest.raises(BadPredicate) as err:
        parse(text)
    assert reason in err.value.reason
    assert "boolean expression" in (err.value.fix or "")


@pytest.mark.parametrize(
    "text,printed,columns",
    [
        ("status = 'paid' and id > 3", "status = 'paid' AND id > 3", {"status", "id"}),
        ("id > 0 /* a comment */ -- and another", "id > 0", {"id"}),
        ("lower(name) LIKE 'a%'", "pg_catalog.lower(name) LIKE 'a%'", {"name"}),
        ("created_at >= now() - interval '1 day'",
         "created_at >= pg_catalog.now() - CAST('1 day' AS interval)", {"created_at"}),
        ("x BETWEEN 1 AND 2 OR y IS NOT DISTINCT FROM 3",
         "x BETWEEN 1 AND 2 OR y IS NOT DISTINCT FROM 3", {"x", "y"}),
        ("kind IN ('a', 'b') AND tags[1] IS NOT NULL",
         "kind IN ('a', 'b') AND (tags)[1] IS NOT NULL", {"kind", "tags"}),
        ("(doc->>'n')::int > coalesce(m, 0)",
         "CAST(doc ->> 'n' AS integer) > COALESCE(m, 0)", {"doc", "m"}),
        ("extract(year FROM d) = 2024", "EXTRACT(YEAR FROM d) = 2024", {"d"}),
        ("CASE WHEN a THEN b ELSE NOT c END", "CASE WHEN a THEN b ELSE NOT c END", {"a", "b", "c"}),
        ("\"Odd Name\" = 1", "\"Odd Name\" = 1", {"Odd Name"}),
    ],
)  # fmt: skip
def test_ordinary_predicates_are_printed_back_from_their_tree(text, printed, columns):
    p = parse(text)
    assert p.sql == printed and p.columns == columns
    assert parse(p.sql) == p  # what is stored parses to itself


def test_columns_are_checked_against_the_table_and_row_filters_are_added_as_they_are():
    p = parse("status = 'paid' AND nope > 1")
    with pytest.raises(BadPredicate, match=r"public\.orders has no column nope"):
        p.check_columns("public.orders", ["id", "status"])
    both = p.also(Predicate.trusted("region = 'eu'"))
    assert both.sql == "(status = 'paid' AND nope > 1) AND (region = 'eu')"
    assert p.also(None) is p
