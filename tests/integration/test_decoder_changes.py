"""What arrives for each kind of change: identity, TOAST, truncate, messages, big transactions."""

from __future__ import annotations

import json
import random
import string

import pytest

from tests.oracle import UNCHANGED, oracle_changes
from walstream.capture.stream import max_protocol_version
from walstream.change import PG_EPOCH_UNIX_US, ChangeRow
from walstream.decode import pgoutput as po
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder, TxnContext
from walstream.postgres.replication import server_version

#: Debian's server and the newest major (tests/conftest.py).
ON_EVERY_SERVER = True

STREAM = "-c logical_decoding_work_mem=64kB"  # forces protocol-2 streaming of big transactions


def decode_all(db, slot, pub, on_message=None, **kw) -> list[ChangeRow]:
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("src", meta.types, meta.primary_keys, on_message=on_message)
    return [
        row for m in db.read(slot, pub, **kw) for row in decoder.decode(m.payload, m.data_start)
    ]


def J(text):
    return None if text is None else json.loads(text)


@pytest.fixture
def accounts(db):
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric)")
    db.execute("INSERT INTO accounts VALUES (1, 'ann', 10), (2, 'bob', 20)")
    return db


def test_replica_identity_default(accounts):
    db = accounts
    pub, slot = db.create_publication("accounts"), db.create_slot()
    db.execute("UPDATE accounts SET balance = 11 WHERE id = 1")  # non-key update
    db.execute("UPDATE accounts SET id = 3 WHERE id = 2")  # key update
    db.execute("DELETE FROM accounts WHERE id = 1")
    rows = decode_all(db, slot, pub)
    assert [(r.action, r.pk) for r in rows] == [
        ("update", ["1"]),
        ("update", ["3"]),
        ("delete", ["1"]),
    ]
    assert J(rows[0].record) == {"id": 1, "owner": "ann", "balance": "11"}
    assert rows[0].old is None  # DEFAULT sends no old tuple for a non-key update
    assert J(rows[1].record) == {"id": 3, "owner": "bob", "balance": "20"}
    assert J(rows[1].old) == {"id": 2}  # key-only old tuple; nulls of other columns not invented
    assert J(rows[2].record) == {"id": 1} and J(rows[2].old) == {"id": 1}
    assert all(r.unchanged_toast is None for r in rows)


def test_replica_identity_full(accounts):
    db = accounts
    db.execute("ALTER TABLE accounts REPLICA IDENTITY FULL")
    pub, slot = db.create_publication("accounts"), db.create_slot()
    db.execute("UPDATE accounts SET balance = 11 WHERE id = 1")
    db.execute("DELETE FROM accounts WHERE id = 2")
    rows = decode_all(db, slot, pub)
    assert [(r.action, r.pk) for r in rows] == [("update", ["1"]), ("delete", ["2"])]
    assert J(rows[0].old) == {"id": 1, "owner": "ann", "balance": "10"}
    assert J(rows[0].record) == {"id": 1, "owner": "ann", "balance": "11"}
    assert J(rows[1].record) == {"id": 2, "owner": "bob", "balance": "20"}
    assert J(rows[1].old) == J(rows[1].record)


def test_cursor_and_transaction_fields(accounts):
    db = accounts
    pub, slot = db.create_publication("accounts"), db.create_slot()
    with db.conn.transaction():
        db.execute("INSERT INTO accounts VALUES (5, 'eve', 1)")
        db.execute("INSERT INTO accounts VALUES (6, 'fay', 2)")
        xid = int(db.execute("SELECT txid_current()")[0][0])
    db.execute("INSERT INTO accounts VALUES (7, 'gus', 3)")
    rows = decode_all(db, slot, pub)
    assert [(r.seq, r.pk) for r in rows] == [(0, ["5"]), (1, ["6"]), (0, ["7"])]
    assert rows[0].lsn == rows[1].lsn < rows[2].lsn
    assert rows[0].xid == xid and rows[2].xid == xid + 1
    assert rows[0].source == "src" and (rows[0].schema, rows[0].table) == ("public", "accounts")
    assert rows[0].cursor < rows[1].cursor < rows[2].cursor
    assert rows[0].committed_at_us > PG_EPOCH_UNIX_US


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_unchanged_toast_is_never_invented(db, identity):
    db.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
    db.execute(
        "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL"
    )  # no compression: always TOASTed
    db.execute(f"ALTER TABLE docs REPLICA IDENTITY {identity}")
    body = "".join(random.choices(string.ascii_letters, k=20_000))
    db.execute("INSERT INTO docs VALUES (1, 'v1', %s)", (body,))
    pub, slot = db.create_publication("docs"), db.create_slot()
    oracle_slot = db.create_slot("test_decoding")
    db.execute("UPDATE docs SET title = 'v2' WHERE id = 1")  # body untouched

    (change,) = oracle_changes(db.conn, oracle_slot)
    assert change.new["body"] is UNCHANGED  # Postgres did not send it
    (row,) = decode_all(db, slot, pub)
    record = J(row.record)
    assert record["title"] == "v2"
    if identity == "FULL":
        assert record["body"] == body  # filled from the old tuple, which has it
        assert row.unchanged_toast is None
        assert J(row.old)["body"] == body
    else:
        assert "body" not in record  # left out, never a wrong value
        assert row.unchanged_toast == ["body"]


def test_truncate_of_several_tables(db):
    db.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    db.execute("INSERT INTO a VALUES (1); INSERT INTO b VALUES (1)")
    pub, slot = db.create_publication("a", "b"), db.create_slot()
    db.execute("TRUNCATE a, b")
    rows = decode_all(db, slot, pub)
    assert [(r.action, r.table, r.seq, r.pk, r.record) for r in rows] == [
        ("truncate", "a", 0, [], None),
        ("truncate", "b", 1, [], None),
    ]
    assert rows[0].lsn == rows[1].lsn


def test_logical_messages_inside_and_outside_transactions(accounts):
    db = accounts
    pub, slot = db.create_publication("accounts"), db.create_slot()
    db.execute("SELECT pg_logical_emit_message(false, 'walstream:heartbeat', 'hb-1')")
    with db.conn.transaction():
        db.execute("INSERT INTO accounts VALUES (10, 'before', 0)")
        db.execute(
            "SELECT pg_logical_emit_message(true, 'walstream:annotations', %s)",
            (json.dumps({"user": "ann", "reason": "refund"}),),
        )
        db.execute("SELECT pg_logical_emit_message(true, 'app:audit', 'in-txn')")
        db.execute("INSERT INTO accounts VALUES (11, 'after', 0)")
    db.execute("INSERT INTO accounts VALUES (12, 'next txn', 0)")
    seen: list[tuple[str, bool, bytes, TxnContext | None]] = []

    def hook(msg: po.Message, txn: TxnContext | None) -> None:
        if msg.prefix != "test:mark":
            seen.append((msg.prefix, msg.transactional, msg.content, txn))

    rows = decode_all(db, slot, pub, on_message=hook)
    assert [(r.pk, J(r.annotations)) for r in rows] == [
        (["10"], None),
        (["11"], {"user": "ann", "reason": "refund"}),  # annotations apply from where they are set
        (["12"], None),  # and end with their transaction
    ]
    assert [(p, t, c) for p, t, c, _ in seen] == [
        ("walstream:heartbeat", False, b"hb-1"),
        ("app:audit", True, b"in-txn"),
    ]
    assert seen[0][3] is None  # outside any transaction
    assert seen[1][3] is not None and seen[1][3].lsn == rows[1].lsn


def test_annotations_that_are_not_json_pass_on_as_a_json_string_with_a_warning(accounts, caplog):
    db = accounts
    pub, slot = db.create_publication("accounts"), db.create_slot()
    with db.conn.transaction():
        db.execute("SELECT pg_logical_emit_message(true, 'walstream:annotations', 'ticket 42 {')")
        db.execute("INSERT INTO accounts VALUES (20, 'annotated', 0)")
    with caplog.at_level("WARNING", logger="walstream.decode.decoder"):
        rows = decode_all(db, slot, pub)
    assert [(r.pk, r.annotations) for r in rows] == [(["20"], '"ticket 42 {"')]
    assert J(rows[0].annotations) == "ticket 42 {"  # valid JSON: a string, nothing dropped
    assert "transaction annotations are not JSON" in caplog.text


@pytest.mark.parametrize("mode", ["proto1", "proto2-streamed"])
def test_hundred_thousand_row_transaction(db, mode):
    db.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    pub, slot = db.create_publication("big"), db.create_slot()
    db.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 100000) g")
    db.execute("INSERT INTO big VALUES (0, 'after')")
    kw = (
        {"proto_version": 2, "streaming": True, "extra_options": STREAM} if mode != "proto1" else {}
    )
    raw = db.read(slot, pub, **kw)
    kinds = {m.payload[:1] for m in raw}
    assert (b"S" in kinds) == (mode != "proto1")  # the big transaction really was streamed
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("src", meta.types, meta.primary_keys)
    rows = [r for m in raw for r in decoder.decode(m.payload, m.data_start)]
    assert len(rows) == 100_001
    assert [r.seq for r in rows[:100_000]] == list(range(100_000))
    assert {r.lsn for r in rows[:100_000]} == {rows[0].lsn}
    assert [r.pk[0] for r in rows[:100_000]] == [str(i) for i in range(1, 100_001)]
    assert J(rows[99_999].record) == {"id": 100000, "payload": _md5("100000")}
    assert rows[-1].pk == ["0"] and rows[-1].lsn > rows[0].lsn and rows[-1].seq == 0


@pytest.mark.parametrize(("proto", "streaming"), [(2, True), (4, "parallel")])
def test_streamed_transaction_with_rolled_back_savepoint_and_aborted_transaction(
    db, proto, streaming
):
    if proto > max_protocol_version(server_version(db.conn)):
        pytest.skip(f"protocol {proto} needs PostgreSQL 16+ (on the newest server it runs)")
    db.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    pub, slot = db.create_publication("big"), db.create_slot()
    with db.conn.transaction():
        db.execute("INSERT INTO big SELECT g, 'kept' FROM generate_series(1, 3000) g")
        db.execute("SAVEPOINT s1")
        db.execute("INSERT INTO big SELECT g, 'rolled back' FROM generate_series(3001, 6000) g")
        db.execute("ROLLBACK TO SAVEPOINT s1")
        db.execute("INSERT INTO big SELECT g, 'kept too' FROM generate_series(6001, 9000) g")
    db.conn.autocommit = False
    db.execute("INSERT INTO big SELECT g, 'aborted' FROM generate_series(10001, 15000) g")
    db.conn.rollback()
    db.conn.autocommit = True
    raw = db.read(slot, pub, proto_version=proto, streaming=streaming, extra_options=STREAM)
    assert b"A" in {m.payload[:1] for m in raw}  # Postgres sent stream aborts
    meta = load_metadata(db.conn)
    decoder = ChangeDecoder("src", meta.types, meta.primary_keys)
    rows = [r for m in raw for r in decoder.decode(m.payload, m.data_start)]
    ids = [int(r.pk[0]) for r in rows]
    assert ids == list(range(1, 3001)) + list(range(6001, 9001))
    assert [r.seq for r in rows] == list(range(6000))
    assert not decoder.streams  # nothing left buffered


def _md5(s: str) -> str:
    import hashlib

    return hashlib.md5(s.encode()).hexdigest()


def test_each_change_carries_its_tables_oid_which_a_rename_keeps(accounts):
    """`table_oid`: a renamed table keeps it (fast and full decoding paths alike: insert,
    update, delete, truncate), a table created again under the name has another."""
    db = accounts
    pub, slot = db.create_publication(), db.create_slot()
    (first,) = db.execute("SELECT 'accounts'::regclass::oid::int8")[0]
    db.execute("INSERT INTO accounts VALUES (3, 'cy', 30)")
    db.execute("ALTER TABLE accounts RENAME TO ledger")
    db.execute("UPDATE ledger SET balance = 0 WHERE id = 3")
    db.execute("DELETE FROM ledger WHERE id = 1")
    db.execute("TRUNCATE ledger")
    db.execute("DROP TABLE ledger")
    db.execute("CREATE TABLE ledger (id int PRIMARY KEY)")
    db.execute("INSERT INTO ledger VALUES (1)")
    (second,) = db.execute("SELECT 'ledger'::regclass::oid::int8")[0]
    rows = decode_all(db, slot, pub)
    assert second != first
    assert [(r.table, r.action, r.table_oid) for r in rows] == [
        ("accounts", "insert", first), ("ledger", "update", first),
        ("ledger", "delete", first), ("ledger", "truncate", first), ("ledger", "insert", second),
    ]  # fmt: skip
