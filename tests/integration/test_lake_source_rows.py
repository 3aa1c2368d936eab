"""Where a lake sink reads an unchanged TOAST value nothing else has: the source row, by key,
in the lake's types (a uuid key as its text, as the lake holds it)."""

from __future__ import annotations

import uuid

import pytest

from walstream.decode.table_shape import load_shape, rows_by_key
from walstream.errors import SinkError


def test_rows_by_a_composite_key_in_the_lake_types_and_a_value_they_cannot_hold(db):
    db.execute("CREATE TYPE tint AS ENUM ('a', 'b')")
    db.execute("CREATE TABLE t (region text, id uuid, big text, d date, tags tint[], "
               "PRIMARY KEY (region, id))")  # fmt: skip
    ids = [uuid.uuid4() for _ in range(3)]
    db.execute("INSERT INTO t VALUES ('eu', %s, 'x', '2024-01-02', '{a,NULL}'), "
               "('us east', %s, NULL, NULL, NULL), ('eu', %s, 'z', 'infinity', '{}')",
               (ids[0], ids[1], ids[2]))  # fmt: skip
    shape = load_shape(db.conn, "public", "t")
    keys = [("eu", str(ids[0])), ("us east", str(ids[1])), ("eu", str(uuid.uuid4()))]
    got = rows_by_key(db.conn, shape, keys)
    assert set(got) == set(keys[:2])  # a key the table does not have is absent
    first = got[("eu", str(ids[0]))]
    assert (first["big"], str(first["d"]), first["tags"]) == ("x", "2024-01-02", ["a", None])
    with pytest.raises(SinkError, match="cannot hold") as e:
        rows_by_key(db.conn, shape, [("eu", str(ids[2]))])
    assert "columns: exclude" in (e.value.fix or "")
