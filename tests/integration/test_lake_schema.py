"""Schema changes at the source, mid-stream, in the lake tables (Delta and Iceberg)."""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique
from tests.lake import delta_rows, iceberg_rows, run_config
from walstream.config import parse_config
from walstream.decode.table_shape import RENAMED_FIX
from walstream.delivery.parking import ParkingLot
from walstream.postgres.replication import connect
from walstream.runtime import Runtime
from walstream.testing import wait_until

pytestmark = [pytest.mark.spark]


class DeltaRun:
    """`walstream run`'s runtime with one Delta sink `lake` (table path `tmp_path/delta/{table}`)
    on publication `pub`, and its parking lot (pauses)."""

    def __init__(self, spark: Any, db: Any, tmp_path: Path, pub: str, **sink: Any) -> None:
        slot = unique("slot")
        db.slots.append(slot)
        self.delta = tmp_path / "delta"
        cfg = parse_config(run_config(db, tmp_path, slot, pub, [
            {"name": "lake", "source": "app", **sink,
             "destination": {"type": "delta", "path": str(self.delta / "{table}")}},
        ]))  # fmt: skip
        self.runtime = Runtime(cfg, spark=spark).start()
        self.lot = ParkingLot(cfg.state_dsn)

    def delivered(self, n: int) -> bool:
        self.runtime.poll()
        return bool((p := self.runtime.progress().get("lake")) and p.delivered >= n)

    def wait_delivered(self, n: int) -> None:
        wait_until(lambda: self.delivered(n), 120, interval=0.2,
                   message=lambda: f"{self.runtime.progress()}")  # fmt: skip

    def wait_paused(self) -> str:
        """The pause's reason, once the sink pauses."""
        wait_until(lambda: "lake" in self.lot.paused(), 120, message="the sink was not paused")
        return self.lot.paused()["lake"] or ""


def test_added_dropped_and_widened_columns_mid_stream(spark, db, tmp_path):
    """Every table sink (Delta, Iceberg, each as mirror — copy-on-write and merge-on-read —
    and changelog, and the Postgres mirror) follows an added, a dropped and three widened
    columns."""
    db.execute("CREATE TABLE s (id int PRIMARY KEY, a int, b real, c numeric(6,2), d text)")
    pub = db.create_publication("s")
    slot = unique("slot")
    db.slots.append(slot)
    mirror_db = unique("mirror")
    db.execute(f"CREATE DATABASE {mirror_db}")
    mirror_dsn = db.server.dsn(mirror_db)
    cfg = parse_config(run_config(db, tmp_path, slot, pub, [
        {"name": "delta", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "delta" / "{table}")}},
        {"name": "iceberg", "source": "app",
         "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path / "wh")}}},
        # changelog tables: their files are written on the executors
        {"name": "delta-log", "source": "app",
         "destination": {"type": "delta", "mode": "changelog",
                         "path": str(tmp_path / "delta-log" / "{table}")}},
        {"name": "iceberg-log", "source": "app",
         "destination": {"type": "iceberg", "mode": "changelog", "table": "log.{table}",
                         "catalog": {"warehouse": str(tmp_path / "wh")}}},
        {"name": "pg", "source": "app", "destination": {"type": "postgres", "dsn": mirror_dsn}},
        {"name": "delta-mor", "source": "app",
         "destination": {"type": "delta", "path": str(tmp_path / "delta-mor" / "{table}"),
                         "updates": "merge_on_read"}},
        {"name": "iceberg-mor", "source": "app",
         "destination": {"type": "iceberg", "table": "mor.{table}", "updates": "merge_on_read",
                         "catalog": {"warehouse": str(tmp_path / "wh")}}},
    ]))  # fmt: skip
    sinks = ("delta", "iceberg", "delta-log", "iceberg-log", "pg", "delta-mor", "iceberg-mor")
    runtime = Runtime(cfg, spark=spark).start()
    total = 0

    def step(*sql: str, changes: int) -> None:
        """Run the statements; wait until both sinks took their changes."""
        nonlocal total
        for s in sql:
            db.execute(s)
        total += changes

        def done() -> bool:
            runtime.poll()
            p = runtime.progress()
            return all(p.get(n) and p[n].delivered >= total for n in sinks)

        wait_until(done, 120, interval=0.2, message=lambda: f"{sql}: {runtime.progress()}")

    try:
        step("INSERT INTO s VALUES (1, 1, 1.5, 10.25, 'one'), (2, 2, 2.5, 20.5, 'two')", changes=2)
        step("ALTER TABLE s ADD COLUMN e text",
             "INSERT INTO s VALUES (3, 3, 3.5, 30, 'three', 'e3')",
             "UPDATE s SET e = 'e1' WHERE id = 1", changes=2)  # fmt: skip
        step("ALTER TABLE s DROP COLUMN d", "INSERT INTO s VALUES (4, 4, 4.5, 40, 'e4')",
             "UPDATE s SET a = 22 WHERE id = 2", changes=2)  # fmt: skip
        step("ALTER TABLE s ALTER COLUMN a TYPE bigint",
             "ALTER TABLE s ALTER COLUMN b TYPE double precision",
             "ALTER TABLE s ALTER COLUMN c TYPE numeric(12,2)",
             "UPDATE s SET a = 5000000000, b = 0.1, c = 1234567890.12 WHERE id = 3", changes=1)  # fmt: skip
    finally:
        runtime.stop()

    want = [
        (1, 1, 1.5, Decimal("10.25"), "one", "e1"),
        (2, 22, 2.5, Decimal("20.50"), None, None),  # changed after the drop: d is NULL
        (3, 5_000_000_000, 0.1, Decimal("1234567890.12"), None, "e3"),  # widened, changed
        (4, 4, 4.5, Decimal("40.00"), None, "e4"),
    ]
    for name, rows in (
        ("delta", delta_rows(tmp_path / "delta" / "s")),
        ("iceberg", iceberg_rows(db.dsn, "public.s")),
        ("delta-mor", delta_rows(tmp_path / "delta-mor" / "s")),
        ("iceberg-mor", iceberg_rows(db.dsn, "mor.s")),
    ):
        got = sorted((r["id"], r["a"], r["b"], r["c"], r["d"], r["e"]) for r in rows)
        assert got == want, name
    # the Postgres mirror follows the source's own table: d dropped, e added, a/b/c widened
    columns = (
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'public.s'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attname"
    )
    with connect(mirror_dsn, autocommit=True) as conn:
        mirrored = conn.execute("SELECT id, a, b, c, e FROM public.s ORDER BY id").fetchall()
        mirrored_columns = conn.execute(columns).fetchall()
    db.execute(f"DROP DATABASE IF EXISTS {mirror_db} WITH (FORCE)")
    assert mirrored_columns == [tuple(r) for r in db.execute(columns)]
    assert ("a", "bigint") in mirrored_columns and ("c", "numeric(12,2)") in mirrored_columns
    assert mirrored == [(i, a, b, c, e) for i, a, b, c, _, e in want]
    # every change a row, the added column from its first change on, `a` widened to bigint
    want_log = [
        ("insert", 1, 1, "one", None), ("insert", 2, 2, "two", None),
        ("insert", 3, 3, "three", "e3"), ("update", 1, 1, "one", "e1"),
        ("insert", 4, 4, None, "e4"), ("update", 2, 22, None, None),
        ("update", 3, 5_000_000_000, None, "e3"),
    ]  # fmt: skip
    for name, rows in (
        ("delta-log", delta_rows(tmp_path / "delta-log" / "s")),
        ("iceberg-log", iceberg_rows(db.dsn, "log.s")),
    ):
        got_log = [(r["_op"], r["id"], r["a"], r["d"], r["e"])
                   for r in sorted(rows, key=lambda r: (r["_lsn"], r["_seq"]))]  # fmt: skip
        assert got_log == want_log, name


def test_a_type_change_that_does_not_widen_pauses_the_sink_with_the_fix(spark, db, tmp_path):
    db.execute("CREATE TABLE n (id int PRIMARY KEY, a int)")
    pub = db.create_publication("n")
    slot = unique("slot")
    db.slots.append(slot)
    cfg = parse_config(run_config(db, tmp_path, slot, pub, [
        {"name": "lake", "source": "app",
         "destination": {"type": "iceberg", "catalog": {"warehouse": str(tmp_path)}}},
    ]))  # fmt: skip
    runtime = Runtime(cfg, spark=spark).start()
    lot = ParkingLot(cfg.state_dsn)
    try:
        db.execute("INSERT INTO n VALUES (1, 1)")
        wait_until(
            lambda: runtime.poll() or ((p := runtime.progress().get("lake")) and p.delivered),
            120, interval=0.2, message=lambda: f"{runtime.progress()}",
        )  # fmt: skip
        db.execute("ALTER TABLE n ALTER COLUMN a TYPE text")
        db.execute("INSERT INTO n VALUES (2, 'two')")
        wait_until(lambda: "lake" in lot.paused(), 120, message="the sink was not paused")
    finally:
        runtime.stop()
    reason = lot.paused()["lake"] or ""
    assert "column a is int32 there but string in the source now" in reason
    assert "drop it and backfill" in reason
    assert [(r["id"], r["a"]) for r in iceberg_rows(db.dsn, "public.n")] == [(1, 1)]


def test_a_table_renamed_before_its_changes_are_written_pauses_instead_of_leaving_them_out(
    spark, db, tmp_path
):
    """The publication has one table, renamed while the sink is behind: the batch's changes
    under the old name are not dropped (the sink writes the publication's tables, which no
    longer include that name); the sink pauses, saying what happened and what to do."""
    db.execute("CREATE TABLE r (id int PRIMARY KEY, a int)")
    run = DeltaRun(spark, db, tmp_path, db.create_publication("r"))
    try:
        db.execute("INSERT INTO r VALUES (1, 1)")
        run.wait_delivered(1)
        run.lot.set_paused("lake", True, "behind")  # the sink falls behind the rename
        db.execute("INSERT INTO r VALUES (2, 2)")
        db.execute("ALTER TABLE r RENAME TO r2")
        db.execute("INSERT INTO r2 VALUES (3, 3)")
        run.lot.set_paused("lake", False)
        reason = run.wait_paused()
    finally:
        run.runtime.stop()
    # Which check meets it first depends on when the sink read the publication's tables:
    # after the rename, r is not among them; before, r is gone from the catalog.
    assert (
        "the batch has a change of public.r (" in reason
        and "no longer has under that name (renamed or dropped since)" in reason
    ) or "table public.r does not exist in the source (any more)" in reason, reason
    assert reason.endswith(f"(fix: {RENAMED_FIX})"), reason
    assert [(r["id"], r["a"]) for r in delta_rows(run.delta / "r")] == [(1, 1)]
    assert not (run.delta / "r2").exists()  # nothing of the batch was written


def test_a_renamed_table_pauses_the_sink_before_a_new_lake_table_starts_without_its_rows(
    spark, db, tmp_path
):
    """The sink is caught up when the table is renamed: the first change under the new
    name would start a lake table holding only the rows changed since. The sink notices
    the table by its OID and pauses, naming both lake tables and both ways on; resumed, it
    goes on into the new name's table."""
    db.execute("CREATE TABLE q (id int PRIMARY KEY, a int)")
    run = DeltaRun(spark, db, tmp_path, db.create_publication("q"))
    delta = run.delta
    try:
        db.execute("INSERT INTO q VALUES (1, 1), (2, 2)")
        run.wait_delivered(2)
        db.execute("ALTER TABLE q RENAME TO q2")
        db.execute("UPDATE q2 SET a = 20 WHERE id = 2")
        reason = run.wait_paused()
        assert not (delta / "q2").exists()
        run.lot.set_paused("lake", False)  # resume: start the new name's table anew
        run.wait_delivered(3)
    finally:
        run.runtime.stop()
    oid = db.execute("SELECT 'public.q2'::regclass::oid::int8")[0][0]
    assert (f"lake: source table public.q2 is public.q renamed (the same table, OID {oid}): "
            f"this sink wrote its rows to {delta / 'q'}, and its changes from now on would "
            f"start {delta / 'q2'} with only the rows they touch") in reason  # fmt: skip
    assert "walstream backfill lake --table public.q2" in reason
    assert sorted((r["id"], r["a"]) for r in delta_rows(delta / "q")) == [(1, 1), (2, 2)]
    assert [(r["id"], r["a"]) for r in delta_rows(delta / "q2")] == [(2, 20)]


def test_a_table_dropped_and_created_again_pauses_the_sink_before_mixing_their_rows(
    spark, db, tmp_path
):
    """A DROP sends no deletes: the lake table still holds the dropped table's rows. A new
    table under the same name (another OID) pauses the sink before its first change is
    written into them; resumed (after emptying the lake table, as the reason says), it
    goes on."""
    db.execute("CREATE TABLE d (id int PRIMARY KEY, a int)")
    # FOR ALL TABLES: the new d is in it too
    run = DeltaRun(spark, db, tmp_path, db.create_publication(), tables=["public.d"])
    delta = run.delta
    try:
        db.execute("INSERT INTO d VALUES (1, 1), (2, 2)")
        run.wait_delivered(2)
        old = db.execute("SELECT 'public.d'::regclass::oid::int8")[0][0]
        db.execute("DROP TABLE d")
        db.execute("CREATE TABLE d (id int PRIMARY KEY, a int)")
        db.execute("INSERT INTO d VALUES (7, 7)")
        reason = run.wait_paused()
        assert sorted((r["id"], r["a"]) for r in delta_rows(delta / "d")) == [(1, 1), (2, 2)]
        shutil.rmtree(delta / "d")  # what the reason says: empty or remove it, then resume
        run.lot.set_paused("lake", False)
        run.wait_delivered(3)
    finally:
        run.runtime.stop()
    new = db.execute("SELECT 'public.d'::regclass::oid::int8")[0][0]
    assert (f"lake: source table public.d is a new table (OID {new}): this sink wrote another "
            f"table under that name (OID {old}, since dropped or renamed), and {delta / 'd'} "
            "still holds its rows") in reason  # fmt: skip
    assert [(r["id"], r["a"]) for r in delta_rows(delta / "d")] == [(7, 7)]


def test_a_batch_without_rows_of_the_dropped_table_goes_on(spark, db, tmp_path, monkeypatch):
    """The sink's one table dropped between the batch reading the publication's tables and
    reading that table's columns (forced here: the publication is read as it was before the
    DROP). A batch holding none of its rows writes nothing and goes on; the table's next
    change (a new table under its name) pauses the sink with the reason that fits it."""
    from walstream.lake import writer as tables

    db.execute("CREATE TABLE d (id int PRIMARY KEY, a int)")
    db.execute("CREATE TABLE e (id int PRIMARY KEY)")
    monkeypatch.setattr(tables, "publication_tables", lambda conn, pub: [("public", "d")])
    run = DeltaRun(spark, db, tmp_path, db.create_publication(), tables=["public.d"])

    def batches() -> int:
        run.runtime.poll()
        return run.runtime.progress()["lake"].batches

    try:
        db.execute("INSERT INTO d VALUES (1, 1)")
        run.wait_delivered(1)
        before = batches()
        db.execute("DROP TABLE d")
        db.execute("INSERT INTO e VALUES (1)")  # a batch of the source without rows of d
        wait_until(lambda: run.lot.paused() or batches() > before, 120,
                   message="no batch ran after the DROP")  # fmt: skip
        assert run.lot.paused() == {}
        db.execute("CREATE TABLE d (id int PRIMARY KEY, a int)")
        db.execute("INSERT INTO d VALUES (7, 7)")
        reason = run.wait_paused()
    finally:
        run.runtime.stop()
    assert "lake: source table public.d is a new table" in reason, reason
    assert [(r["id"], r["a"]) for r in delta_rows(run.delta / "d")] == [(1, 1)]
