"""Partitioned tables, on Debian's PostgreSQL and the newest: with the source's
`publish_via_partition_root` every partition's changes arrive as the root table,
partitions created or attached later included, and a backfill of the root reads every
partition; without it changes arrive under each partition's name; `check` says which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TestDatabase, unique
from tests.integration.test_backfill import config, files, messages, replay, run_until_done
from tests.integration.test_decoder_changes import decode_all
from walstream.backfill.requests import request
from walstream.backfill.store import BackfillStore
from walstream.errors import SetupError
from walstream.postgres.prepare import prepare_capture
from walstream.postgres.publication import PublicationOptions
from walstream.postgres.setup import check_database
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

ON_EVERY_SERVER = True
VIA_ROOT = PublicationOptions(via_root=True)


def partitioned_table(db: TestDatabase) -> None:
    db.execute("CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (1) TO (101)")
    db.execute("CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (101) TO (201)")


def test_without_the_setting_partitions_arrive_under_their_own_names(db):
    partitioned_table(db)
    pub = db.create_publication("m")  # Postgres's default: publish_via_partition_root false
    slot = db.create_slot()
    db.execute("INSERT INTO m VALUES (1, 'a'), (150, 'b')")
    got = [(r.action, r.table, r.record) for r in decode_all(db, slot, pub)]
    assert got == [("insert", "m1", '{"id":1,"v":"a"}'), ("insert", "m2", '{"id":150,"v":"b"}')]
    (finding,) = [f for f in check_database(db.dsn, None, pub) if f.subject == "table public.m"]
    assert finding.message.startswith(
        "partitioned (2 partitions): changes arrive under each partition's name "
        "(public.m1, public.m2), not as public.m; publish_via_partition_root: true"
    )


def test_check_and_start_refuse_a_publication_that_disagrees(db):
    partitioned_table(db)
    slot, pub = unique("slot"), unique("pub")
    before = {
        f.subject: f for f in check_database(db.dsn, slot, pub, ["public.m"], options=VIA_ROOT)
    }
    assert before["table public.m"].message.startswith(
        "partitioned (2 partitions): every partition's changes arrive as public.m"
    )
    db.slots.append(slot)
    prepare_capture(db.dsn, slot, pub, ["public.m"], "app", options=VIA_ROOT)
    assert db.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (pub,)) == [
        (True,)
    ]
    found = {f.subject: f for f in check_database(db.dsn, slot, pub, ["public.m"])}
    disagree = found[f"publication {pub}"]
    assert disagree.level == "error"
    assert "publish_via_partition_root is true on the publication but false" in disagree.message
    assert disagree.fix == (
        f'ALTER PUBLICATION "{pub}" SET (publish_via_partition_root = false); '
        "or set publish_via_partition_root: true on the source"
    )
    with pytest.raises(SetupError) as info:
        prepare_capture(db.dsn, slot, pub, ["public.m"], "app")
    assert "publish_via_partition_root is true on the publication" in info.value.problem


@pytest.mark.spark
def test_partitions_arrive_as_the_root_added_ones_too_and_a_backfill_reads_them_all(
    spark: Any, db: TestDatabase, tmp_path: Path
) -> None:
    partitioned_table(db)
    db.execute("INSERT INTO m SELECT g, 'old' FROM generate_series(1, 8) g")
    db.execute("INSERT INTO m SELECT g, 'old' FROM generate_series(101, 108) g")
    out = tmp_path / "out"
    cfg = config(db, tmp_path, unique("pub"), unique("slot"), [files("files", out)],
                 tables=["public.m"], publish_via_partition_root=True)  # fmt: skip
    db.slots.append(cfg.sources[0].slot_name)
    store = BackfillStore(cfg.state_dsn)
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        (b,) = request(cfg, store, "files", chunk_size=3, target_seconds=0)  # across partitions
        db.execute("UPDATE m SET v = 'new' WHERE id IN (2, 102)")
        db.execute("INSERT INTO m VALUES (9, 'x'), (109, 'y')")
        run_until_done(rt, store, [b.id])
        db.execute("CREATE TABLE m3 PARTITION OF m FOR VALUES FROM (201) TO (301)")
        db.execute("INSERT INTO m VALUES (201, 'created')")
        db.execute("CREATE TABLE m4 (LIKE m INCLUDING ALL)")
        db.execute("INSERT INTO m4 VALUES (301, 'before attach')")
        db.execute("ALTER TABLE m ATTACH PARTITION m4 FOR VALUES FROM (301) TO (401)")
        db.execute("INSERT INTO m VALUES (302, 'attached')")
        db.execute("UPDATE m SET v = 'moved' WHERE id = 301")
        wait_until(lambda: any(m["record"]["v"] == "moved" for m in messages(out)), 60)
        table = dict(db.execute("SELECT id, v FROM m"))
        db.execute("ALTER TABLE m DETACH PARTITION m1")
        db.execute("INSERT INTO m1 VALUES (10, 'detached')")  # no longer published
        db.execute("INSERT INTO m VALUES (202, 'last')")
        wait_until(lambda: any(m["record"]["id"] == 202 for m in messages(out)), 60)
    got = messages(out)
    assert {m["metadata"]["table_name"] for m in got} == {"m"}  # never m1 ... m4
    changes = [(m["action"], m["record"]["id"], m["record"]["v"]) for m in got
               if m["action"] != "read"]  # fmt: skip
    assert changes == [
        ("update", 2, "new"), ("update", 102, "new"), ("insert", 9, "x"), ("insert", 109, "y"),
        ("insert", 201, "created"), ("insert", 302, "attached"), ("update", 301, "moved"),
        ("insert", 202, "last"),
    ]  # fmt: skip
    reads = sorted(m["record"]["id"] for m in got if m["action"] == "read")
    assert len(reads) == len(set(reads)) and set(range(1, 9)) | set(range(101, 109)) <= set(reads)
    # what the messages build up to before the detach is the table then (DBLog)
    before = [m for m in got if m["record"]["id"] not in (202,)]
    assert {k: r["v"] for k, r in replay(before, "m").items()} == table
