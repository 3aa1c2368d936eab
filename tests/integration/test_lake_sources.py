"""The lake sinks' record of which source table (by OID) each lake table was written from."""

from __future__ import annotations

from walstream.lake.sources import Change, LakeSources

T_OID, NEW_T_OID = 16400, 16500


def test_a_rename_is_seen_even_after_a_new_table_took_the_old_name_first(db) -> None:  # type: ignore[no-untyped-def]
    # t was renamed to u and a new table created as t; the sink meets the new t first.
    books = LakeSources(db.dsn, "walstream")
    assert books.changed("lake", T_OID, "public", "t") is None  # first write: nothing to say
    writer = LakeSources(db.dsn, "walstream")  # another process: nothing cached
    assert writer.changed("lake", NEW_T_OID, "public", "t") == Change(
        "recreated", ("public", "t"), T_OID
    )
    assert writer.changed("lake", T_OID, "public", "u") == Change("renamed", ("public", "t"), T_OID)
    # Both are recorded as they are now: the next process has nothing to say.
    again = LakeSources(db.dsn, "walstream")
    assert again.changed("lake", NEW_T_OID, "public", "t") is None
    assert again.changed("lake", T_OID, "public", "u") is None


def test_a_table_dropped_and_created_again_is_seen_once_and_sinks_are_apart(db) -> None:  # type: ignore[no-untyped-def]
    LakeSources(db.dsn, "walstream").changed("lake", T_OID, "public", "t")
    books = LakeSources(db.dsn, "walstream")
    assert books.changed("other", NEW_T_OID, "public", "t") is None  # another sink's record
    assert books.changed("lake", NEW_T_OID, "public", "t") == Change(
        "recreated", ("public", "t"), T_OID
    )
    assert LakeSources(db.dsn, "walstream").changed("lake", NEW_T_OID, "public", "t") is None
