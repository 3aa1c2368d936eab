"""`walstream run` with `format: debezium` into Kafka against Debezium 3.6 itself on the same
WAL: the same topics, and in each the same records per key (the key, the tombstones, the
value's schema, before, after, op and source), under Debezium's defaults, under
`decimal.handling.mode=string` + `time.precision.mode=connect`, with schemas off and
truncates sent (`skipped.operations=none`), and with no tombstones, another placeholder of
unchanged TOAST values and three digits of money. The
tables: a composite primary key declared in another order than its columns (Debezium's
key follows the key's order), unchanged TOAST values, a primary-key update, REPLICA
IDENTITY FULL, a table with no primary key and a truncate (skipped by default, as
Debezium's `skipped.operations=t`). The full type matrix is test_debezium_types.py's."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import fresh_database, unique
from tests.debezium_engine import run_debezium_topics
from tests.kafka import consume
from walstream.config import parse_config
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

#: Debezium's `source` fields walstream does not send as Debezium does: docs/from-debezium.md.
SOURCE_LEFT = {"version"}
#: The envelope's processing time, different on each side.
TIMES = {"ts_ms", "ts_us", "ts_ns"}

BIG = "repeat(md5(random()::text), 200)"  # 6,400 bytes kept out of line (EXTERNAL)
TABLES = """
CREATE TABLE acct (region text, id int, v text, n numeric(10,2), doc jsonb, big text,
                   tags int[], at timestamptz, d date, t time, PRIMARY KEY (id, region));
ALTER TABLE acct ALTER big SET STORAGE EXTERNAL;
CREATE TABLE fullrow (id int PRIMARY KEY, v text, m money, span interval);
ALTER TABLE fullrow REPLICA IDENTITY FULL;
CREATE TABLE nokey (a text, b int);
ALTER TABLE nokey REPLICA IDENTITY FULL;
"""
WRITES = [
    f"INSERT INTO acct VALUES ('eu', 1, 'a', 1.5, '{{\"k\": [1, null]}}', {BIG}, '{{1,NULL,3}}', "
    "'2024-02-29 23:59:59.123456+02', '2024-02-29', '12:34:56.789')",
    "INSERT INTO acct (region, id, doc) VALUES ('us', 2, 'null')",
    "UPDATE acct SET v = 'b', n = -2 WHERE id = 1",  # big: an unchanged TOAST value
    "UPDATE acct SET id = 3 WHERE id = 2",  # the key moves: delete, tombstone, create
    "DELETE FROM acct WHERE id = 3",
    "INSERT INTO fullrow VALUES (1, 'x', 12.34, '1 year 2 mons 3 days 04:05:06.7')",
    "UPDATE fullrow SET v = 'y' WHERE id = 1",
    "DELETE FROM fullrow WHERE id = 1",
    "INSERT INTO nokey VALUES ('a', 1), ('b', NULL)",
    "UPDATE nokey SET b = 2 WHERE a = 'a'",
    "DELETE FROM nokey WHERE a = 'b'",
    "TRUNCATE acct",
]

PROFILES = {
    "defaults": {},
    "string-connect": {"decimal.handling.mode": "string", "time.precision.mode": "connect"},
    "no-schemas-truncates": {
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "skipped.operations": "none",  # the truncate is sent: op t, no key
    },
    "no-tombstones-placeholder-money": {
        "tombstones.on.delete": "false",
        "unavailable.value.placeholder": "__gone__",  # acct.big's unchanged TOAST value
        "money.fraction.digits": "3",
    },
}


def records_expected(props: dict[str, str]) -> int:
    """Debezium's records of WRITES: 17, without the 4 tombstones when they are off, with
    the truncate when it is sent."""
    off = props.get("tombstones.on.delete") == "false"
    return 17 - 4 * off + (props.get("skipped.operations") == "none")


def comparable(value: Any, schemas: bool, first_tx: int) -> Any:
    """A record value without what differs on purpose (the processing time; the source
    fields in SOURCE_LEFT; the first transaction's previous commit in `source.sequence`,
    which a Debezium started afresh does not know and walstream reads from the slot:
    docs/from-debezium.md); None for a tombstone."""
    if value is None:
        return None
    payload = value["payload"] if schemas else value
    out = {k: v for k, v in payload.items() if k not in TIMES}
    source = {k: v for k, v in payload["source"].items() if k not in SOURCE_LEFT}
    if source["txId"] == first_tx:
        source["sequence"] = json.loads(source["sequence"])[1]
    out["source"] = source
    return {"schema": value["schema"], "payload": out} if schemas else out


def per_key(records: list[tuple[Any, Any]], schemas: bool, first: int) -> dict[str, list[Any]]:
    """A topic's record values by key (in order: each key's records keep theirs)."""
    out: dict[str, list[Any]] = defaultdict(list)
    for key, value in records:
        out[json.dumps(key, sort_keys=True)].append(comparable(value, schemas, first))
    return dict(out)


def run_sink(spark: Any, db: Any, kafka: Any, tmp_path: Any, source: dict[str, Any],
             sink: dict[str, Any], done: Callable[[Any], bool]) -> Any:  # fmt: skip
    """`walstream run` of the database (`source` settings over it) with a Kafka sink `dbz`
    of `format: debezium` (`sink` settings over it) until `done(its progress)`; the Plan."""
    cfg = parse_config({
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, **source}],
        "sinks": [{
            "name": "dbz", "source": "app", "format": "debezium", **sink,
            "destination": {"type": "kafka", "bootstrap_servers": kafka.bootstrap_servers,
                            "create_topics": True},
        }],
    })  # fmt: skip
    if "slot" not in source:  # made by walstream: dropped with the database's
        db.slots.append(cfg.sources[0].slot_name)
    runtime = Runtime(cfg, spark=spark).start()
    try:

        def finished() -> bool:
            runtime.poll()
            progress = runtime.progress().get("dbz")
            return progress is not None and done(progress)

        wait_until(finished, 180, interval=0.5, message=lambda: f"{runtime.progress()}")
    finally:
        runtime.stop()
    return cfg


@pytest.mark.parametrize("profile", list(PROFILES))
def test_walstream_run_sends_debeziums_records(spark, pg, kafka, tmp_path, profile):
    props = PROFILES[profile]
    schemas = props.get("value.converter.schemas.enable", "true") == "true"
    prefix = unique("dbz")
    with fresh_database(pg) as db:
        for statement in TABLES.split(";"):
            if statement.strip():
                db.execute(statement)
        pub = db.create_publication("acct", "fullrow", "nokey")
        theirs, ours = db.create_slot(), db.create_slot()
        for w in WRITES:
            db.execute(w)
        # walstream's own WAL messages (heartbeats) are filtered as docs/from-debezium.md says
        debezium = run_debezium_topics(
            pg, db.name, theirs, pub,
            {"topic.prefix": prefix, "message.prefix.exclude.list": "walstream:.*", **props},
            tmp_path, records_expected(props),
        )  # fmt: skip
        run_sink(spark, db, kafka, tmp_path, {"slot": ours, "publication": pub},
                 {"debezium": {"topic.prefix": prefix, **props}},
                 lambda p: p.delivered >= len(debezium))  # fmt: skip
    assert len(debezium) == records_expected(props)  # no more
    topics: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for name, key, value in debezium:
        topics[name].append((key, value))
    sources = [(v["payload"] if schemas else v)["source"] for _, _, v in debezium if v]
    first_tx = sources[0]["txId"]
    # Debezium's sequence: the previous commit's end, then the change's own LSN; the first
    # transaction of a Debezium started afresh has no previous commit
    assert json.loads(sources[0]["sequence"])[0] is None
    assert all(json.loads(s["sequence"])[0] is not None for s in sources if s["txId"] != first_tx)
    assert sorted(topics) == [f"{prefix}.public.{t}" for t in ("acct", "fullrow", "nokey")]
    for name, theirs_records in topics.items():
        mine = [
            (None if m.key() is None else json.loads(m.key()),
             None if m.value() is None else json.loads(m.value()))
            for m in consume(kafka.bootstrap_servers, name, len(theirs_records))
        ]  # fmt: skip
        assert per_key(mine, schemas, first_tx) == per_key(theirs_records, schemas, first_tx), name
        firsts = [v for _, v in mine if v is not None]
        ours = (firsts[0]["payload"] if schemas else firsts[0])["source"]
        if ours["txId"] == first_tx:  # walstream knows where its slot's stream began
            assert int(json.loads(ours["sequence"])[0]) < ours["lsn"]
    # what the workload holds, as Debezium sent it: the key order, a moved key, no key
    acct = [k for k, _ in topics[f"{prefix}.public.acct"]]
    first = acct[0]["payload"] if schemas else acct[0]
    assert list(first) == ["id", "region"]  # the primary key's order, not the table's
    nokey = topics[f"{prefix}.public.nokey"]  # a null key, its delete's tombstone's too
    tombstones = props.get("tombstones.on.delete") != "false"
    assert [k for k, _ in nokey] == [None] * (4 + tombstones)
    assert (nokey[-1][1] is None) == tombstones


#: Debezium's `source` fields of an incremental snapshot's row that differ: `sequence`
#: (where its stream was when the row was read; null on walstream's backfill rows) and
#: the time (when it read the row; walstream's: when the chunk's high watermark
#: committed): docs/from-debezium.md. `lsn` and `txId` are null on both.
SNAPSHOT_POSITION = {"version", "sequence", "ts_ms", "ts_us", "ts_ns"}


def test_a_backfill_sends_the_rows_debeziums_incremental_snapshot_sends(spark, pg, kafka, tmp_path):
    """A table's rows read by a backfill (`backfill: on_create`) against Debezium's
    incremental snapshot of it (a signal in its signalling table): the same keys and
    records, op `r` and `source.snapshot` `incremental` on both."""
    prefix = unique("dbzsnap")
    with fresh_database(pg) as db:
        db.execute(TABLES.split(";")[0])  # acct: composite key, numeric, jsonb, big, arrays
        db.execute("CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32), "
                   "data varchar(2048))")  # fmt: skip
        db.execute(
            "INSERT INTO acct SELECT 'eu', g, 'v' || g, g / 3.0, jsonb_build_object('g', g), "
            "repeat('x', 50), ARRAY[g, NULL], '2024-01-01 00:00:00+00'::timestamptz + g * "
            "interval '1 hour', DATE '2024-01-01' + g, TIME '12:00' FROM generate_series(1, 40) g"
        )
        pub = db.create_publication("acct", "dbz_signal")
        theirs = db.create_slot()
        db.execute("INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', "
                   "'{\"data-collections\": [\"public.acct\"], \"type\": \"incremental\"}')")  # fmt: skip
        debezium = run_debezium_topics(
            pg, db.name, theirs, pub,
            {"topic.prefix": prefix, "signal.data.collection": "public.dbz_signal",
             "message.prefix.exclude.list": "walstream:.*"},
            tmp_path, 43,  # the signal's insert, its window's watermark rows, the 40 rows
        )  # fmt: skip
        run_sink(spark, db, kafka, tmp_path, {"publication": pub},
                 {"tables": ["public.acct"], "backfill": "on_create",
                  "debezium": {"topic.prefix": prefix}},
                 lambda p: p.delivered >= 40)  # fmt: skip
    snapshot = [(k, v) for t, k, v in debezium if t == f"{prefix}.public.acct"]
    assert len(snapshot) == 40
    mine = [(json.loads(m.key()), json.loads(m.value()))
            for m in consume(kafka.bootstrap_servers, f"{prefix}.public.acct", 40)]  # fmt: skip

    def rows(records: list[tuple[Any, Any]]) -> dict[str, Any]:
        out = {}
        for key, value in records:
            payload = dict(value["payload"])
            assert payload["op"] == "r" and payload["source"]["snapshot"] == "incremental"
            for field in TIMES:
                payload.pop(field)
            payload["source"] = {k: v for k, v in payload["source"].items()
                                 if k not in SNAPSHOT_POSITION}  # fmt: skip
            out[json.dumps(key, sort_keys=True)] = {"schema": value["schema"], "payload": payload}
        return out

    assert rows(mine) == rows(snapshot)


def test_a_table_dropped_before_its_changes_are_sent_makes_them_dead_letters(
    spark, pg, kafka, tmp_path
):
    """Debezium's values need a table's column types; a table dropped before walstream sent
    its changes has none left in the catalog: each of its changes becomes a dead letter
    naming the table (no message to retry), and the other tables' changes flow."""
    from walstream.delivery.parking import DEAD, ParkingLot

    prefix = unique("dropped")
    with fresh_database(pg) as db:
        db.execute("CREATE TABLE gone (id int PRIMARY KEY, v text)")
        db.execute("CREATE TABLE kept (id int PRIMARY KEY)")
        pub = db.create_publication("gone", "kept")
        slot = db.create_slot()
        db.execute("INSERT INTO gone VALUES (1, 'a'), (2, 'b')")
        db.execute("DROP TABLE gone")
        db.execute("INSERT INTO kept VALUES (1)")
        cfg = run_sink(spark, db, kafka, tmp_path, {"slot": slot, "publication": pub},
                       {"debezium": {"topic.prefix": prefix}},
                       lambda p: p.delivered >= 1 and p.dead >= 2)  # fmt: skip
        dead = ParkingLot(cfg.state_dsn).list(DEAD, "dbz")
    assert [(d.message.table, d.message.value) for d in dead] == [("public.gone", None)] * 2
    assert all("public.gone" in d.errors[0]["error"] and "no longer in the source's catalog"
               in d.errors[0]["error"] for d in dead)  # fmt: skip
    kept = consume(kafka.bootstrap_servers, f"{prefix}.public.kept", 1)
    assert json.loads(kept[0].key())["payload"] == {"id": 1}
