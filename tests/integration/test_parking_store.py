"""The parking lot's store: a change's records park as parts, and a table made by an older
walstream is migrated in place."""

from __future__ import annotations

from walstream.delivery.parking import PARKED, ParkingLot
from walstream.sinks.base import Message


def test_a_changes_records_park_as_parts_and_an_old_table_is_migrated(db):
    """A primary-key update in `format: debezium` is three records at one cursor (delete,
    tombstone, create): each parks as its own part, in order, once however often it is
    parked. A table made when the key was (sink, lsn, seq, tombstone) gets `part`, its
    tombstones part 1."""
    lot = ParkingLot(db.dsn, "oldpark")
    db.execute("CREATE SCHEMA oldpark")
    db.execute("""CREATE TABLE oldpark.parked_messages (
        id bigserial PRIMARY KEY, sink text NOT NULL, group_key text NOT NULL,
        lsn bigint NOT NULL, seq int NOT NULL, tombstone boolean NOT NULL,
        status text NOT NULL CHECK (status IN ('parked', 'dead')),
        attempts int NOT NULL DEFAULT 0, next_attempt_at timestamptz,
        errors jsonb NOT NULL DEFAULT '[]', key bytea, value bytea, route text,
        table_name text NOT NULL, action text NOT NULL, sink_config jsonb,
        untransformed boolean NOT NULL DEFAULT false,
        created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (sink, lsn, seq, tombstone))""")  # fmt: skip
    for tomb, value in ((False, b"d"), (True, None)):
        db.execute("INSERT INTO oldpark.parked_messages (sink, group_key, lsn, seq, tombstone, "
                   "status, value, table_name, action) VALUES ('k', 'g', 5, 0, %s, 'parked', %s, "
                   "'public.t', 'delete')", (tomb, value))  # fmt: skip
    lot.ensure()
    lot.ensure()  # at every start: nothing more
    assert [(p.message.value, p.message.part) for p in lot.group("k", "g")] == [
        (b"d", 0),
        (None, 1),
    ]

    def record(part: int, value: bytes | None, key: bytes) -> Message:
        return Message(9, 1, value, key, None, "public.t", "update", group="h", part=part)

    moved = [record(0, b"delete", b"old"), record(1, None, b"old"), record(2, b"create", b"new")]
    lot.park("k", [(m, PARKED, None, 0, None) for m in moved])
    lot.park("k", [(m, PARKED, None, 0, None) for m in moved])  # a replayed batch
    parked = lot.group("k", "h")
    assert [(p.message.part, p.message.value, p.message.key) for p in parked] == [
        (0, b"delete", b"old"), (1, None, b"old"), (2, b"create", b"new"),
    ]  # fmt: skip
