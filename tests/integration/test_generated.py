"""Stored generated columns, on Debian's PostgreSQL and the newest: sent on 18 when the
source sets `publish_generated_columns`, never before 18, and a backfill reads exactly
the columns the stream sends; `check` says which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TestDatabase, unique
from tests.integration.test_backfill import config, files, messages, run_until_done
from tests.integration.test_decoder_changes import decode_all
from tests.lake import delta_rows
from tests.sinks.test_postgres import table_text
from walstream.backfill.requests import request
from walstream.backfill.store import BackfillStore
from walstream.errors import SetupError
from walstream.postgres.prepare import prepare_capture
from walstream.postgres.publication import PublicationOptions
from walstream.postgres.setup import check_database
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

ON_EVERY_SERVER = True
GENERATED = PublicationOptions(generated=True)


def newest(db: TestDatabase) -> bool:
    return db.conn.info.server_version >= 180000


def table(db: TestDatabase) -> None:
    db.execute(
        "CREATE TABLE g (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED)"
    )


def findings(db: TestDatabase, pub: str, options: PublicationOptions) -> dict[str, Any]:
    return {f.subject: f for f in check_database(db.dsn, None, pub, ["public.g"], options=options)}


def test_check_says_whether_generated_columns_are_sent(db):
    table(db)
    pub = unique("pub")
    plain = findings(db, pub, PublicationOptions())["table public.g"]
    if newest(db):
        assert plain.message == (
            "generated column(s) b: not sent; publish_generated_columns: true on the source "
            "sends them"
        )
        assert findings(db, pub, GENERATED)["table public.g"].message == (
            "generated column(s) b: sent (publish_generated_columns)"
        )
    else:
        assert plain.message == (
            "generated column(s) b: not sent, PostgreSQL before 18 cannot publish them "
            "(messages and backfills leave them out)"
        )
        refused = findings(db, pub, GENERATED)["publish_generated_columns"]
        assert refused.level == "error" and "cannot publish generated columns" in refused.message
        slot = unique("slot")
        with pytest.raises(SetupError) as info:
            prepare_capture(db.dsn, slot, pub, ["public.g"], "app", options=GENERATED)
        assert "set publish_generated_columns: false on the source" in (info.value.fix or "")


def test_a_publication_that_disagrees_is_refused_on_18(db):
    if not newest(db):
        pytest.skip("only PostgreSQL 18 can publish generated columns")
    table(db)
    slot, pub = unique("slot"), unique("pub")
    db.slots.append(slot)
    prepare_capture(db.dsn, slot, pub, ["public.g"], "app", options=GENERATED)
    assert db.execute("SELECT pubgencols FROM pg_publication WHERE pubname = %s", (pub,)) == [
        ("s",)
    ]
    disagree = findings(db, pub, PublicationOptions())[f"publication {pub}"]
    assert disagree.level == "error"
    assert disagree.fix == (
        f'ALTER PUBLICATION "{pub}" SET (publish_generated_columns = none); '
        "or set publish_generated_columns: true on the source"
    )
    with pytest.raises(SetupError):
        prepare_capture(db.dsn, slot, pub, ["public.g"], "app")


def test_the_stream_sends_them_only_where_published(db):
    table(db)
    plain = db.create_publication("g")
    slots = {plain: db.create_slot()}
    if newest(db):
        sent = unique("pub")
        db.execute(
            f"CREATE PUBLICATION {sent} FOR TABLE g WITH (publish_generated_columns = stored)"
        )
        slots[sent] = db.create_slot()
    db.execute("INSERT INTO g (id, a) VALUES (1, 21)")
    records = {pub: [r.record for r in decode_all(db, slot, pub)] for pub, slot in slots.items()}
    assert records.pop(plain) == ['{"id":1,"a":21}']
    assert list(records.values()) == ([['{"id":1,"a":21,"b":42}']] if newest(db) else [])


@pytest.mark.spark
def test_a_backfill_reads_the_columns_the_stream_sends(
    spark: Any, db: TestDatabase, target: str, tmp_path: Path
) -> None:
    """18 with the setting: `b` in the stream's inserts and in the reads, in the Postgres
    mirror and in a Delta table; 15: in neither, and the mirror's and the lake table's `b`
    (made from the source's definition) stay empty."""
    table(db)
    db.execute("INSERT INTO g (id, a) SELECT g, g FROM generate_series(1, 6) g")
    out = tmp_path / "out"
    cfg = config(db, tmp_path, unique("pub"), unique("slot"), [
        files("files", out),
        {"name": "mirror", "source": "app", "destination": {"type": "postgres", "dsn": target}},
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "delta" / "{table}")}},
    ], tables=["public.g"], publish_generated_columns=newest(db))  # fmt: skip
    db.slots.append(cfg.sources[0].slot_name)
    store = BackfillStore(cfg.state_dsn)
    with supervised(Runtime(cfg, spark=spark).start()) as rt:
        db.execute("INSERT INTO g (id, a) SELECT g + 100, g FROM generate_series(1, 6) g")
        ids = [b.id for sink in ("files", "mirror", "delta")
               for b in request(cfg, store, sink, chunk_size=4, target_seconds=0)]  # fmt: skip
        run_until_done(rt, store, ids)

        def delivered() -> bool:
            rt.poll()
            p = rt.progress()
            return all(p.get(n) and p[n].delivered >= 6 for n in ("files", "mirror", "delta"))

        wait_until(delivered, 60, message=lambda: f"{rt.progress()}")
        wait_until(lambda: len([m for m in messages(out) if m["action"] == "insert"]) == 6, 60)
    got = messages(out)
    reads = {m["record"]["id"]: m["record"] for m in got if m["action"] == "read"}
    inserts = {m["record"]["id"]: m["record"] for m in got if m["action"] == "insert"}
    assert sorted(reads) == [*range(1, 7), *range(101, 107)]
    for i in range(1, 7):
        expected = {"id": i, "a": i, "b": 2 * i} if newest(db) else {"id": i, "a": i}
        assert reads[i] == expected
        # a row read is the stream's insert of it: the same columns, in the same order
        assert list(reads[i + 100].items()) == list(inserts[i + 100].items())
        assert inserts[i + 100] == {**expected, "id": i + 100}
    want = [(i, a, 2 * a if newest(db) else None)
            for i, a in [*((g, g) for g in range(1, 7)), *((g + 100, g) for g in range(1, 7))]]  # fmt: skip
    mirrored = table_text(target, "public.g", set())
    assert sorted((int(r["id"]), int(r["a"]), None if r["b"] is None else int(r["b"]))
                  for r in mirrored) == want  # fmt: skip
    lake = sorted((r["id"], r["a"], r["b"]) for r in delta_rows(tmp_path / "delta" / "g"))
    assert lake == want
    # each backfill knows its table's OID (its rows carry it: the mirror's claim)
    (oid,) = db.execute("SELECT 'public.g'::regclass::oid::int8")[0]
    assert (
        store._run("SELECT table_oid FROM {backfills} WHERE id = ANY(%s)", (ids,)) == [(oid,)] * 3
    )
